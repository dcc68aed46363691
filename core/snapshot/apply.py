"""Applying one ledger entry to the work database: plain SQL, no decisions.

Every entry type inserts its canonical rows idempotently (``INSERT OR
IGNORE`` by id, upserts folded by version or feedback id, never by
arrival), so applying the same entry twice changes nothing and the order
entries arrive in does not matter. Each application names the claims whose
derived columns must be recomputed (``touched``); ``core.snapshot.projections``
recomputes them afterwards.
"""

from __future__ import annotations

import json

import apsw

from core.domain import TRUST_LEVELS
from core.instants import parse_instant
from core.ledger import ERASED, MOVED
from core.lexical import LexicalChanges
from core.snapshot.erase import Erasures


# what the ledger holds: the types applied here, and those with nothing to
# apply (context runs are read from the ledger itself; an erasure's
# completion, an erased entry's stub and a late entry's forwarding stub)
APPLIED_TYPES = frozenset({"observation", "consolidation", "batch", "transition", "feedback", "erasure"})
INERT_TYPES = frozenset({"context_run", "erasure_complete", ERASED, MOVED})


def apply_entry(db: apsw.Connection, entry: dict, touched: set[str], erasures: Erasures | None = None,
                lexical: LexicalChanges | None = None) -> None:
    """``erasures``: the organization's erasures (core/snapshot/erase.py),
    applied when an entry is one and enforced on every entry after.
    ``MalformedEntry`` when the entry is not one the ledger holds: a build
    never skips what it cannot read (the ledger is the only copy)."""
    kind = entry.get("type")
    if kind in INERT_TYPES:
        return
    if kind not in APPLIED_TYPES:
        raise MalformedEntry(f"unknown type {kind!r}" if "type" in entry else "no type")
    try:
        _apply_known(db, entry, touched, erasures, lexical)
    except KeyError as exc:
        raise MalformedEntry(f"a {kind} entry without its field {exc}") from None
    except (TypeError, AttributeError, apsw.ConstraintError) as exc:
        raise MalformedEntry(f"a {kind} entry whose fields do not read as one ({type(exc).__name__}: {exc})") from None


class MalformedEntry(Exception):
    """A ledger entry that is JSON but not an entry this build can apply;
    the build names its key (``core.ledger.DamagedEntry``)."""


def _apply_known(db: apsw.Connection, entry: dict, touched: set[str], erasures: Erasures | None,
                 lexical: LexicalChanges | None) -> None:
    if entry["type"] == "erasure":
        if erasures is not None:
            erasures.apply(entry, touched, lexical or LexicalChanges(record=False))
        return
    _apply(db, entry, touched)
    if erasures is not None and erasures.standing:
        erasures.enforce(entry, touched, lexical or LexicalChanges(record=False))


def _apply(db: apsw.Connection, entry: dict, touched: set[str]) -> None:
    kind = entry["type"]
    if kind == "observation":
        _insert_observation(db, entry["observation"])
        for claim in entry.get("claims", []):
            _insert_claim(db, claim, entry, touched)
        touched.update(_claims_citing(db, [entry["observation"]["observation_id"]]))
    elif kind == "consolidation":
        for claim in entry["claims"]:
            _insert_claim(db, claim, entry, touched)
    elif kind == "batch":
        observations, claims = entry["observations"], entry["claims"]
        if "import" in entry:
            # a line of an imported file is applied once, whichever entry
            # brings it (core/writes/importer.py keeps the ledger free of twins too)
            file_sha = entry["import"]["file_sha256"]
            fresh = set()
            for obs, line in zip(observations, entry["import"]["lines"]):
                if db.execute("INSERT OR IGNORE INTO import_lines(line_key, entry_id) VALUES(?, ?) RETURNING 1",
                              (f"{file_sha}:{line}", entry["entry_id"])).fetchone() is not None:
                    fresh.add(obs["observation_id"])
            observations = [o for o in observations if o["observation_id"] in fresh]
            claims = [c for c in claims if c["sources"][0]["observation_id"] in fresh]
        elif "batch_key" in entry:  # the import format before line identities
            batch_key = entry["batch_key"]
            row = db.execute("SELECT entry_id FROM import_batches WHERE batch_key=?", (batch_key,)).fetchone()
            if row is not None and row[0] <= entry["entry_id"]:
                return  # a re-run of an import: the earlier entry already holds this batch
            db.execute("INSERT OR REPLACE INTO import_batches(batch_key, entry_id) VALUES(?, ?)",
                       (batch_key, entry["entry_id"]))
        for obs in observations:
            _insert_observation(db, obs)
        for claim in claims:
            _insert_claim(db, claim, entry, touched)
    elif kind == "transition":
        db.execute(
            "INSERT INTO transitions(claim_id, from_version, action, entry_id, recorded_at, reason, new_claim_id)"
            " VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(claim_id, from_version) DO UPDATE SET"
            " action=excluded.action, entry_id=excluded.entry_id, recorded_at=excluded.recorded_at,"
            " reason=excluded.reason, new_claim_id=excluded.new_claim_id"
            " WHERE excluded.entry_id < transitions.entry_id",
            (entry["claim_id"], entry["expected_version"], entry["action"], entry["entry_id"],
             entry["recorded_at"], entry.get("reason"),
             entry["new_claim"]["claim_id"] if entry.get("new_claim") else None))
        touched.add(entry["claim_id"])
        if entry.get("new_claim"):
            _insert_claim(db, entry["new_claim"], entry, touched)
    elif kind == "feedback":
        if entry.get("claim_id"):
            db.execute(
                "INSERT INTO feedback(context_id, claim_id, feedback_id, outcome) VALUES(?, ?, ?, ?)"
                " ON CONFLICT(context_id, claim_id) DO UPDATE SET feedback_id=excluded.feedback_id,"
                " outcome=excluded.outcome WHERE excluded.feedback_id > feedback.feedback_id",
                (entry["context_id"], entry["claim_id"], entry["feedback_id"], entry["outcome"]))
            touched.add(entry["claim_id"])
    # context runs live in the ledger only: feedback reads them from there;
    # a stub an erasure left ("erased") holds nothing to apply.


def _insert_observation(db: apsw.Connection, obs: dict) -> None:
    db.execute(
        "INSERT OR IGNORE INTO observations(observation_id, org_id, subject_id, project_id, workspace_id,"
        " visibility, owner_id, kind, content, source_json, trust, occurred_at, created_at)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (obs["observation_id"], obs["org_id"], obs["subject_id"], obs.get("project_id"),
         obs.get("workspace_id"), obs["visibility"], obs["owner_id"], obs["kind"], obs["content"],
         json.dumps(obs["source"], sort_keys=True, separators=(",", ":"), ensure_ascii=False),
         obs["trust"], obs.get("occurred_at"), obs["created_at"]))


def _insert_claim(db: apsw.Connection, claim: dict, entry: dict, touched: set[str]) -> None:
    created_at = claim["created_at"]
    cursor = db.execute(
        "INSERT OR IGNORE INTO claims(claim_id, org_id, subject_id, project_id, workspace_id, visibility,"
        " owner_id, statement, kind, confidence, trust, trust_level, observer_id, valid_from, valid_to,"
        " created_at, created_s, entry_id) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING rowid",
        (claim["claim_id"], claim["org_id"], claim["subject_id"], claim.get("project_id"),
         claim.get("workspace_id"), claim["visibility"], claim["owner_id"], claim["statement"],
         claim["kind"], claim["confidence"], claim["trust"], TRUST_LEVELS[claim["trust"]],
         claim.get("observer_id"), claim["valid_from"], claim.get("valid_to"), created_at,
         parse_instant(created_at).timestamp(), entry["entry_id"]))
    if cursor.fetchone() is None:
        return
    db.executemany("INSERT OR IGNORE INTO claim_sources(claim_id, observation_id, relation) VALUES(?, ?, ?)",
                   [(claim["claim_id"], s["observation_id"], s["relation"]) for s in claim["sources"]])
    touched.add(claim["claim_id"])


def _claims_citing(db: apsw.Connection, observation_ids: list[str]) -> list[str]:
    marks = ",".join("?" * len(observation_ids))
    return [r[0] for r in db.execute(
        f"SELECT DISTINCT claim_id FROM claim_sources WHERE observation_id IN ({marks})", observation_ids)]
