"""Carrying an erasure out in the store: every ledger object that holds what it names.

The ledger is immutable for every purpose but this one. For an erasure of a
subject, or of one observation (and the claims it alone supports), among
the records created before the erasure:

- an entry holding only erased records is replaced by a content-free stub
  (``type: "erased"``): its key stays taken, so no retry, re-run import or
  takeover can write it again, and every older version of it is purged;
- an entry holding erased and other records (an observation batch, an
  import batch shared with other subjects, a consolidation of several
  claims) is rewritten without the erased ones, and its older versions
  purged;
- lifecycle transitions and feedback on erased claims are stubbed, each
  erased claim's lifecycle head is purged (every version), and the context
  runs compiled for the subject (found by the subject tag their ids carry,
  ``core.ids.subject_tag``, without reading every run) are stubbed when they
  are the subject's, or held an erased claim, or cited an erased
  observation; so is the feedback on such a run, a kept claim's included.

Where to look: the previous generation says which entries hold a subject's
or an observation's records (by entry id); entries written since its
watermark (less the skew window) are read and checked. Without a previous
generation that still holds the records, the whole ledger is read; what an
earlier, interrupted attempt already stubbed is then known by the hashes of
the ids each stub records (``TAKEN``).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

import apsw

from core.domain import capped_trust
from core.erasure.records import counted_hash, taken_hash, target_sha256
from core.ids import entry_of, parse_id, subject_tag, tag_of, uuid7_floor_hex, uuid7_ms
from core.layout import RUN_SUFFIX, claim_head_key, claim_heads_prefix, entry_hex_of, entry_key, ledger_prefix
from core.ledger import ERASED, ERASED_COUNTED, ERASED_RECORDS, MOVED, decode_entry, encode, observations_in
from core.meta_table import read_meta
from core.scope import can_read
from core.snapshot.erase import Requester
from core.storage import ObjectNotFound, PreconditionFailed, Store


@dataclass
class Target:
    """What one erasure names: records created before ``limit`` (its entry
    id) whose subject — or, for an observation, whose id — hashes to
    ``sha`` (core.erasure.records.target_sha256). ``target_id`` is the id
    itself while the erasure is pending (it finds the records fast); once
    complete only the hash is kept, and matching by hash alone still works
    (``titen erasures reapply`` after a restore)."""
    erasure_id: str
    kind: str                 # "subject" | "observation"
    org_id: str
    sha: str
    target_id: str | None = None
    subject_id: str | None = None   # the subject (of the observation), once known
    observations: set[str] = field(default_factory=set)   # erased observation ids
    claims: set[str] = field(default_factory=set)         # erased claim ids
    runs: set[str] = field(default_factory=set)           # stubbed context ids
    subject_tag: str | None = None  # core.ids.subject_tag of the subject, recorded for reapplying
    reader: str | None = None       # the requesting principal: its counts are of what it could read
    workspaces: tuple = ()          # ... and its workspaces, when it asked
    taken: set[str] = field(default_factory=set)  # hashes of ids an earlier attempt recorded taking (TAKEN)

    def __post_init__(self):
        if self.kind == "subject" and self.target_id is not None:
            self.subject_id = self.target_id

    @property
    def limit(self) -> str:
        return self.erasure_id[len("era_"):]

    def before(self, record_id: str) -> bool:
        return record_id.split("_", 1)[1] < self.limit

    def names(self, target_id: str) -> bool:
        return target_sha256(self.org_id, self.kind, target_id) == self.sha

    def drops_observation(self, obs: dict) -> bool:
        if not self.before(obs["observation_id"]):
            return False
        return self.names(obs["subject_id"] if self.kind == "subject" else obs["observation_id"])

    def recalled(self, record_id: str, found: set[str]) -> bool:
        """Whether an earlier attempt recorded taking ``record_id`` (by its
        hash); if so it joins ``found``, as if this attempt had found it."""
        if self.taken and taken_hash(self.org_id, record_id) in self.taken:
            found.add(record_id)
            return True
        return False

    def erases_observation(self, observation_id: str) -> bool:
        """One of the observations this erasure takes: found so far, or (for
        an observation) named by its hash."""
        if observation_id in self.observations or self.recalled(observation_id, self.observations):
            return True
        return self.kind == "observation" and self.before(observation_id) and self.names(observation_id)

    def takes_claim(self, claim_id: str | None) -> bool:
        return claim_id is not None and (claim_id in self.claims or self.recalled(claim_id, self.claims))

    def takes_run(self, context_id: str | None) -> bool:
        return context_id is not None and (context_id in self.runs or self.recalled(context_id, self.runs))

    def could_read(self, record: dict) -> bool:
        """Whether the requester could read an observation or claim (as an
        entry holds it): the counts it is told are of those."""
        return self.reader is not None and can_read(Requester(self.reader, tuple(self.workspaces)),
                                                     record["visibility"], record.get("workspace_id"),
                                                     record["owner_id"])

    def owns(self, entry: dict) -> bool:
        """Whether the requester could read a context run, or the pack a
        feedback entry was sent on (core.compile.record.context_run's rule:
        its own principal, through a key holding at least the workspaces of
        the key that compiled it): the packs and feedback it is told of.
        Feedback written before it recorded its pack's workspaces is told
        to the principal that sent it."""
        workspaces = (entry.get("scope") or {}).get("workspaces") if entry.get("type") == "context_run" \
            else entry.get("pack_workspaces")
        return (self.reader is not None and entry.get("actor") == self.reader
                and set(workspaces or ()) <= set(self.workspaces))

    def drops_claim(self, claim: dict) -> bool:
        """A claim of the subject, or one whose every supporting observation
        this erasure takes — whenever it was written: a claim written after
        the erasure was asked that cites only erased evidence goes too."""
        if self.takes_claim(claim["claim_id"]):
            return True
        if self.kind == "subject" and self.before(claim["claim_id"]) and self.names(claim["subject_id"]):
            return True
        supports = [s["observation_id"] for s in claim["sources"] if s["relation"] == "supports"]
        return bool(supports) and all(self.erases_observation(o) for o in supports)


@dataclass
class Purged:
    entries_rewritten: int = 0
    entries_stubbed: int = 0
    context_runs: int = 0
    feedback_entries: int = 0
    claim_heads: int = 0
    entries_settled: int = 0  # entries an earlier, interrupted attempt already stubbed or rewrote
    # of those, the requester's own (a pack and its feedback are their compiler's alone)
    visible_context_runs: int = 0
    visible_feedback_entries: int = 0
    # stubs an earlier, interrupted attempt of the same erasure left: by the
    # counts above they add to (the erasure's counts are of everything it took)
    earlier: dict = field(default_factory=dict)
    # the observations and claims the erasure took from the ledger, in this
    # attempt or an earlier one (``COUNTED``): by short hash, (kind, whether
    # the requester could read it). The build counts those no deletion of
    # its own did (core.snapshot.erase.Erased.count_taken): a build never
    # applies a record whose entry it read already stubbed (by an earlier
    # attempt, or a build racing it) or listed after it began
    taken_records: dict = field(default_factory=dict)

    def found_anything(self) -> bool:
        """Whether the ledger held anything the erasure names, in this attempt or an earlier one."""
        return bool(self.entries_rewritten or self.entries_stubbed or self.entries_settled or self.context_runs
                    or self.feedback_entries or self.claim_heads)

    def taken(self) -> dict:
        """What the erasure took, over every attempt: the counts it reports."""
        return {"context_runs": self.context_runs + self.earlier.get("context_runs", 0),
                "feedback": self.feedback_entries + self.earlier.get("feedback_entries", 0),
                "visible_context_runs": self.visible_context_runs + self.earlier.get("visible_context_runs", 0),
                "visible_feedback": self.visible_feedback_entries + self.earlier.get("visible_feedback_entries", 0)}


# Where a rewritten entry or a stub records, per erasure, a hash of each
# record id it took from the entry (``taken_hash``: never an id, never
# content). A retry that reads the whole ledger (a build from empty after an
# attempt that failed part-way) recognizes by them the claims, observations
# and packs an earlier attempt's stubs no longer name, so the transitions,
# heads, packs and citations of them still go.
TAKEN = ERASED_RECORDS
# Where the same records, per erasure, which of the observations and claims
# were which and which the requester could read, each once, by the first 16
# hex digits of the same hash (``counted_hash``; enough to tell a build's
# records apart, a quarter of the size): ``{"readable_observations",
# "other_observations", "readable_claims", "other_claims"}``, each present
# when not empty. Two builds may carry one erasure out at once; the one that
# loses the publish race may stub entries whose records no generation holds
# yet, and the winner, reading those stubs, would otherwise count nothing of
# them.
COUNTED = ERASED_COUNTED
COUNTED_LISTS = {("observations", True): "readable_observations", ("observations", False): "other_observations",
                 ("claims", True): "readable_claims", ("claims", False): "other_claims"}


# where a stub keeps the key of the Idempotency-Key record of the write it
# replaced (``LedgerPurge._forget_request``)
REQUEST_RECORD = "idempotency_record"


# what a stub of a pack or of feedback says of it, so that a retry of an
# interrupted erasure still counts it: its kind, and whether the requester
# could read the pack (``Target.owns``: the counts an erasure reports are of those)
COUNTED_KINDS = ("context_run", "feedback")


def stub(entry: dict, erasure_id: str, own: bool = False) -> dict:
    """``own``: a pack or feedback the requester could read (``Target.owns``)."""
    out = {"entry_id": entry["entry_id"], "type": ERASED, "org_id": entry.get("org_id"), "erasure_id": erasure_id}
    if entry.get("type") in COUNTED_KINDS:
        out["erased_kind"] = entry["type"]
        if own:
            out["requester_own"] = True
    if entry.get(TAKEN):  # another pending erasure's record, for its own retry
        out[TAKEN] = entry[TAKEN]
    if entry.get(COUNTED):
        out[COUNTED] = entry[COUNTED]
    record = (entry.get("idempotency") or {}).get("record") or entry.get(REQUEST_RECORD)
    if record:  # a hash of who wrote under which key, no content: a retry still finds the record to forget
        out[REQUEST_RECORD] = record
    return out


def rewrite(entry: dict, target: Target, trust_of: Callable[[str], str | None] = lambda _: None) -> dict | None:
    """The entry without what ``target`` erases: a stub when nothing is
    left, None when the entry holds none of it. Records it drops are added
    to ``target`` (so later entries see the claims found here), and their
    ids recorded in what it writes (``TAKEN``). A claim it keeps loses its
    citations of erased observations, and its trust is capped by the
    supporting evidence left (``trust_of`` an observation id: its trust,
    None when unknown), as the snapshot caps it."""
    recall(entry, target)
    new = _rewrite(entry, target, trust_of)
    if new is None:
        return None
    taken = _held(entry) - _held(new)
    return _counted(_recorded(new, target, taken), entry, target, taken)


def _counted(new: dict, entry: dict, target: Target, taken: set[str]) -> dict:
    """``new`` recording (``COUNTED``) which of the ids it no longer holds
    (``taken``) were observations and claims created in ``entry``, and which
    the requester could read, with what an earlier attempt of the same
    erasure recorded there."""
    claims = list(entry.get("claims", [])) + ([entry["new_claim"]] if entry.get("new_claim") else [])
    created = [("observations", o["observation_id"], o) for o in observations_in(entry)]
    created += [("claims", c["claim_id"], c) for c in claims]
    created = [c for c in created if c[1] in taken]
    if not created:
        return new
    earlier = (entry.get(COUNTED) or {}).get(target.erasure_id) or {}
    lists = {name: set(earlier.get(name, ())) for name in COUNTED_LISTS.values()}
    for kind, record_id, record in created:
        lists[COUNTED_LISTS[kind, target.could_read(record)]].add(counted_hash(target.org_id, record_id))
    return dict(new, **{COUNTED: {**new.get(COUNTED, {}),
                                  target.erasure_id: {name: sorted(v) for name, v in lists.items() if v}}})


def recall_counted(entry: dict, target: Target, into: dict) -> None:
    """Add to ``into`` (``Purged.taken_records``) the observations and
    claims ``entry`` records ``target`` took from it (``COUNTED``)."""
    counted = (entry.get(COUNTED) or {}).get(target.erasure_id) or {}
    for (kind, readable), name in COUNTED_LISTS.items():
        for sha in counted.get(name, ()):
            into[sha] = (kind, readable)


def _recorded(new: dict, target: Target, ids: set[str]) -> dict:
    if not ids:
        return new
    # with what an earlier rewrite by the same erasure recorded (a stub or
    # a rewrite keeps the entry's ``TAKEN``)
    hashes = set((new.get(TAKEN) or {}).get(target.erasure_id, ())) | {taken_hash(target.org_id, i) for i in ids}
    return dict(new, **{TAKEN: {**new.get(TAKEN, {}), target.erasure_id: sorted(hashes)}})


def stub_run(entry: dict, target: Target) -> dict:
    """The stub of a context run (its id recorded, for the feedback on it)
    or of feedback on a whole pack."""
    ids = {entry["context_id"]} if entry.get("type") == "context_run" else set()
    return _recorded(stub(entry, target.erasure_id, target.owns(entry)), target, ids)


def recall(entry: dict, target: Target) -> None:
    """Add to ``target`` what an earlier attempt of it recorded taking from ``entry``."""
    target.taken.update((entry.get(TAKEN) or {}).get(target.erasure_id) or ())


def _held(entry: dict) -> set[str]:
    """The ids of the observations and claims an entry holds."""
    kind = entry.get("type")
    ids = {o["observation_id"] for o in observations_in(entry)} | {c["claim_id"] for c in entry.get("claims", [])}
    if kind == "transition":
        ids.add(entry["claim_id"])
        if entry.get("new_claim"):
            ids.add(entry["new_claim"]["claim_id"])
    return ids


def _rewrite(entry: dict, target: Target, trust_of: Callable[[str], str | None]) -> dict | None:
    kind = entry.get("type")
    if kind == "observation":
        obs = entry["observation"]
        if target.drops_observation(obs):
            target.observations.add(obs["observation_id"])
            target.subject_id = target.subject_id or obs["subject_id"]
            target.claims.update(c["claim_id"] for c in entry.get("claims", []))
            return stub(entry, target.erasure_id)
        return _without_claims(entry, target, trust_of)
    if kind == "batch":
        keep, dropped = [], []
        for i, obs in enumerate(entry["observations"]):
            (dropped if target.drops_observation(obs) else keep).append(i)
        for i in dropped:
            obs = entry["observations"][i]
            target.observations.add(obs["observation_id"])
            target.subject_id = target.subject_id or obs["subject_id"]
        claims = _kept_claims(entry["claims"], target, trust_of)
        if not dropped and claims == entry["claims"]:
            return None
        if not keep:
            return stub(entry, target.erasure_id)
        out = dict(entry, observations=[entry["observations"][i] for i in keep], claims=claims)
        if "import" in entry:  # the imported lines stay aligned with the observations kept
            out["import"] = dict(entry["import"], lines=[entry["import"]["lines"][i] for i in keep])
        if "idempotency" in entry:
            erased_ids = {entry["observations"][i]["observation_id"] for i in dropped}
            out["idempotency"] = _answer_without(entry["idempotency"], erased_ids)
        return out
    if kind == "consolidation":
        return _without_claims(entry, target, trust_of)
    if kind == "transition":
        new_claim = entry.get("new_claim")
        if target.takes_claim(entry["claim_id"]) or (new_claim and target.drops_claim(new_claim)):
            if new_claim:
                target.claims.add(new_claim["claim_id"])
            return stub(entry, target.erasure_id)
        if new_claim:
            kept = _without_erased_evidence(new_claim, target, trust_of)
            return dict(entry, new_claim=kept) if kept is not new_claim else None
        return None
    if kind == "feedback":
        if target.takes_claim(entry.get("claim_id")) or target.takes_run(entry.get("context_id")):
            return stub(entry, target.erasure_id, target.owns(entry))
        return None
    return None


def _kept_claims(claims: list[dict], target: Target, trust_of: Callable[[str], str | None]) -> list[dict]:
    """The claims ``target`` does not drop, without their erased evidence;
    the dropped ones are added to ``target.claims``."""
    kept = []
    for claim in claims:
        if target.drops_claim(claim):
            target.claims.add(claim["claim_id"])
        else:
            kept.append(_without_erased_evidence(claim, target, trust_of))
    return kept


def _without_erased_evidence(claim: dict, target: Target, trust_of: Callable[[str], str | None]) -> dict:
    """The claim itself when it cites nothing erased; else a copy citing
    only what is left, its trust capped by the supporting evidence left."""
    sources = [s for s in claim["sources"] if not target.erases_observation(s["observation_id"])]
    if len(sources) == len(claim["sources"]):
        return claim
    supports = [trust_of(s["observation_id"]) for s in sources if s["relation"] == "supports"]
    return dict(claim, sources=sources, trust=capped_trust(claim["trust"], [t for t in supports if t]))


def _without_claims(entry: dict, target: Target, trust_of: Callable[[str], str | None]) -> dict | None:
    claims = entry.get("claims", [])
    kept = _kept_claims(claims, target, trust_of)
    if kept == claims:
        return None
    if not kept and entry["type"] == "consolidation":
        return stub(entry, target.erasure_id)
    return dict(entry, claims=kept)


def _answer_without(answer: dict, erased_ids: set[str]) -> dict:
    """A batch's stored answer with the erased items' results replaced."""
    data = answer.get("data") or {}
    results = []
    for item in data.get("results", []):
        if item.get("data", {}).get("observation_id") in erased_ids:
            item = {"index": item["index"], "error": {"code": "NOT_FOUND", "message": "this item was erased"}}
        results.append(item)
    return {**answer, "data": {**data, "results": results}}


PARALLEL = 16  # store round trips in flight: an erasure of many records is latency-bound on S3
# Ledger entries read by one purge are kept for the next erasure of the same
# build, up to this many bytes of their stored bodies: a build carrying out
# N erasures read the entries of the other N - 1 (and listed the whole
# ledger) once per erasure, so 300 erasures of unknown subjects held an
# organization's rebuild for two minutes.
READ_CACHE_BYTES = 16 * 1024 * 1024  # stored bytes; parsed, several times that in memory
# entries that hold no record any erasure takes: once read, a purge passes
# them by for its later erasures (an erasure's candidates hold the entries of
# every erasure asked since the last generation)
INERT_TYPES = frozenset({"erasure", "erasure_complete"})


class LedgerPurge:
    """One organization's erasures, carried out in its ledger."""

    def __init__(self, store: Store, org_id: str, skew_ms: int, progress: Callable[[str], None]):
        self.store = store
        self.org_id = org_id
        self.skew_ms = skew_ms
        self.progress = progress
        self.purged = Purged()
        self.known_keys: set[str] = set()
        # every ledger key, listed once per purge: the erasures it carries
        # out were all asked before it began, so a key of a record they name
        # that lands later is a late write, which no listing made per
        # erasure could promise to see either
        self._listed: list[str] | None = None
        self._cache: dict[str, tuple[str, str, dict] | None] = {}
        self._moved: dict[str, str] = {}  # the key holding a moved entry's records → the key read
        self._cached_bytes = 0
        self._sizes: dict[str, int] = {}
        self._cache_lock = threading.Lock()  # reads and rewrites run on the pool's threads
        self._inert: set[str] = set()  # keys of INERT_TYPES entries read so far
        self._records: list[tuple[str, str]] = []  # (record key, entry id) of keyed requests to forget

    def carry_out(self, target: Target, db: apsw.Connection | None) -> Purged:
        """What erasing ``target`` removed from the ledger. The store's
        round trips (reads, rewrites, version purges) run ``PARALLEL`` at a
        time; what to rewrite is decided in key order, so a claim found in
        one entry is known to the transitions and feedback after it."""
        self.purged = Purged()
        self.trusts: dict[str, str | None] = {}
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            self.pool = pool
            candidates = [k for k in self._candidates(target, db) if k not in self._inert]
            read = _once(self._read_all(candidates))
            # every key read, as listed and as resolved (a moved stub's and its entry's)
            read_keys = set(candidates) | {found[0] for found in read}
            writes, settled = [], []
            feedback_kept = []  # feedback on a claim that stays: it may still go with its pack
            for found in read:
                key, etag, entry = found
                if entry.get("type") in INERT_TYPES:
                    self._inert.add(key)
                    continue
                new = rewrite(entry, target, self._trust_of)
                # what it takes now and what an earlier attempt took
                recall_counted(entry if new is None else new, target, self.purged.taken_records)
                if new is not None:
                    writes.append((key, etag, new))
                    self._count(entry, new, target)
                    self._keyed(entry, new, target)
                elif self._settled(key, entry, target):
                    self._count_earlier(entry, target)
                    settled.append(key)
                    self.purged.entries_settled += 1
                    self._keyed(entry, entry, target)
                elif entry.get("type") == "feedback":
                    feedback_kept.append(found)
            redo = lambda current: rewrite(current, target, self._trust_of)  # noqa: E731
            list(pool.map(lambda w: self._replace(*w, redo), writes))
            # an entry this erasure already rewrote, in a build that failed
            # before its older versions went: they go now
            list(pool.map(self.store.purge_history, settled))
            self._purge_runs(target)
            self._purge_feedback_on_runs(target, feedback_kept, read_keys)
            if target.taken:  # claims an earlier attempt took are named here only by hash: so are their heads
                for key in self.store.list_keys(claim_heads_prefix(self.org_id)):
                    target.takes_claim("claim_" + entry_hex_of(key))
            heads = [claim_head_key(self.org_id, hex_) for hex_ in
                     (parse_id(c, "claim") for c in sorted(target.claims)) if hex_ is not None]
            list(pool.map(self.store.purge, heads))
            self.purged.claim_heads += len(heads)
            records, self._records = self._records, []
            list(pool.map(lambda r: self._forget_request(*r, target.erasure_id), records))
        return self.purged

    def _keyed(self, entry: dict, new: dict | None = None, target: Target | None = None) -> None:
        """An entry this erasure stubs or takes records from (``new``: what it
        becomes), written under an Idempotency-Key: its record goes on the
        list of requests to forget. One that only loses a citation keeps its
        record: its stored answer still stands, and a retry replays it."""
        if new is not None and new.get("type") != ERASED and target.erasure_id not in (new.get(TAKEN) or {}):
            return
        record = (entry.get("idempotency") or {}).get("record") or entry.get(REQUEST_RECORD)
        if record:
            self._records.append((record, entry["entry_id"]))

    def _forget_request(self, record_key: str, entry_id: str, erasure_id: str) -> None:
        """A keyed write's record keeps, for 24 hours, a sha256 of its request
        — the erased text and ids among what it hashed — so that a retry
        replays or conflicts. Once the entry is rewritten that hash goes: a
        retry's answer (409, erased) needs only the entry. Every older
        version of the record goes with it. A record another request holds
        now (it expired and was replaced) is left alone."""
        for _ in range(8):
            try:
                current = self.store.get(record_key)
            except ObjectNotFound:
                return
            record = json.loads(current.body)
            if record.get("entry_id") != entry_id or record.get("request_hash") is None:
                break
            forgotten = dict(record, request_hash=None, erased=erasure_id)
            try:
                self.store.compare_and_swap(record_key, json.dumps(forgotten).encode(), current.etag)
                break
            except PreconditionFailed:
                continue
        self.store.purge_history(record_key)

    def _settled(self, key: str, entry: dict, target: Target) -> bool:
        """An entry needing no rewrite that this erasure may have rewritten
        before: its stub, one that records what it took, or one the previous
        generation says held its records."""
        return ((entry.get("type") == ERASED and entry.get("erasure_id") == target.erasure_id)
                or target.erasure_id in (entry.get(TAKEN) or {}) or key in self.known_keys)

    # -- where to look -----------------------------------------------------------

    def _ledger_keys(self) -> list[str]:
        """Every key of the organization's ledger (runs included), in key order."""
        if self._listed is None:
            self._listed = sorted(self.store.list_keys(ledger_prefix(self.org_id)))
        return self._listed

    def _candidates(self, target: Target, db: apsw.Connection | None) -> list[str]:
        """Ledger keys that may hold what ``target`` erases, in key order."""
        prefix = ledger_prefix(self.org_id)
        known = self._known_entries(target, db) if db is not None else None
        self.known_keys = {entry_key(self.org_id, hex_) for hex_ in known or ()}
        if known is None:
            self.progress(f"{self.org_id}: erasure {target.erasure_id}: reading the whole ledger")
            return [k for k in self._ledger_keys() if not k.endswith(RUN_SUFFIX)]
        watermark = read_meta(db, "watermark") or ""
        start_after = prefix + uuid7_floor_hex(uuid7_ms(watermark) - self.skew_ms) if watermark else ""
        recent = [k for k in self._ledger_keys() if k > start_after and not k.endswith(RUN_SUFFIX)]
        return sorted(set(recent) | {entry_key(self.org_id, hex_) for hex_ in known})

    def _known_entries(self, target: Target, db: apsw.Connection) -> set[str] | None:
        """Entry ids the previous generation says hold the target's records;
        None when it cannot say (it applied this erasure already, or only the
        target's hash is known)."""
        if target.target_id is None:
            return None
        try:
            if db.execute("SELECT 1 FROM erasures WHERE erasure_id = ?", (target.erasure_id,)).fetchone():
                return None
        except apsw.SQLError:  # a generation older than erasures: its tables say nothing of them
            return None
        limit = target.limit
        entries: set[str] = set()
        if target.kind == "subject":
            observations = [o for o, in db.execute(
                "SELECT observation_id FROM observations WHERE subject_id = ? AND observation_id < ?",
                (target.target_id, "obs_" + limit))]
            claims = db.execute("SELECT claim_id, entry_id FROM claims WHERE subject_id = ? AND claim_id < ?",
                                (target.target_id, "claim_" + limit)).fetchall()
            # claims written since the erasure was asked, citing what it takes
            entries.update(e for e, in db.execute(
                "SELECT DISTINCT c.entry_id FROM claim_sources s JOIN claims c USING(claim_id)"
                " WHERE c.subject_id = ? AND c.claim_id >= ? AND s.observation_id < ?",
                (target.target_id, "claim_" + limit, "obs_" + limit)))
        else:
            observations = [target.target_id]
            entries.add(entry_of(target.target_id[len("obs_"):]))
            claims = []
            for claim_id, entry_id in db.execute(
                    "SELECT c.claim_id, c.entry_id FROM claim_sources s JOIN claims c USING(claim_id)"
                    " WHERE s.observation_id = ?", (target.target_id,)):
                entries.add(entry_id)  # every claim citing it loses the citation
                others = db.execute("SELECT count(*) FROM claim_sources WHERE claim_id = ? AND relation = 'supports'"
                                    " AND observation_id != ?", (claim_id, target.target_id)).fetchone()[0]
                if others == 0:  # it alone supports the claim: the claim goes too
                    claims.append((claim_id, entry_id))
            subject = db.execute("SELECT subject_id FROM observations WHERE observation_id = ?",
                                 (target.target_id,)).fetchone()
            target.subject_id = subject[0] if subject else target.subject_id
        entries.update(entry_of(o[len("obs_"):]) for o in observations)
        claim_ids = [c for c, _ in claims]
        target.claims.update(claim_ids)
        entries.update(e for _, e in claims)
        for chunk in _chunks(claim_ids, 500):
            marks = ",".join("?" * len(chunk))
            entries.update(e for e, in db.execute(
                f"SELECT entry_id FROM transitions WHERE claim_id IN ({marks})", chunk))
            entries.update(entry_of(f[len("fb_"):]) for f, in db.execute(
                f"SELECT feedback_id FROM feedback WHERE claim_id IN ({marks})", chunk))
        return entries

    # -- rewriting -------------------------------------------------------------------

    def _trust_of(self, observation_id: str) -> str | None:
        """An observation's trust, read from its ledger entry once per
        purge; None when it is not there (erased, or never written)."""
        if observation_id not in self.trusts:
            self.trusts[observation_id] = self._read_trust(observation_id)
        return self.trusts[observation_id]

    def _read_trust(self, observation_id: str) -> str | None:
        hex_ = parse_id(observation_id, "obs")
        found = self._read(entry_key(self.org_id, entry_of(hex_))) if hex_ else None
        if found is None:
            return None
        return next((o["trust"] for o in observations_in(found[2]) if o["observation_id"] == observation_id), None)

    def _read(self, key: str) -> tuple[str, str, dict] | None:
        """(key, ETag, entry) of a ledger key, through a moved stub to the key
        holding the records; None when absent. Kept for the purge's next
        erasure (``READ_CACHE_BYTES``) until this purge rewrites it; callers
        never change the entry they get."""
        with self._cache_lock:
            if key in self._cache:
                return self._cache[key]
        found, size = self._read_store(key)
        with self._cache_lock:
            if found is not None and self._cached_bytes + size <= READ_CACHE_BYTES:
                self._cache[key] = found
                self._sizes[key] = size
                self._cached_bytes += size
                if found[0] != key:
                    self._moved[found[0]] = key
        return found

    def _read_all(self, keys: list[str]) -> list[tuple[str, str, dict] | None]:
        """``_read`` of each key, in order: the store's reads on the pool, the
        cache's here (a pool task per cached entry cost more than the read)."""
        with self._cache_lock:
            cached = {k: self._cache[k] for k in keys if k in self._cache}
        missing = [k for k in keys if k not in cached]
        fetched = dict(zip(missing, self.pool.map(self._read, missing)))
        return [cached[k] if k in cached else fetched[k] for k in keys]

    def _read_store(self, key: str) -> tuple[tuple[str, str, dict] | None, int]:
        try:
            obj = self.store.get(key)
        except ObjectNotFound:
            return None, 0
        size = len(obj.body)
        entry = decode_entry(key, obj.body)
        if entry.get("type") == MOVED:  # a late entry: its records live under the key it names
            key = key.replace(entry["entry_id"], entry["moved_to"])
            try:
                obj = self.store.get(key)
            except ObjectNotFound:
                return None, 0
            size += len(obj.body)
            entry = decode_entry(key, obj.body)
        return (key, obj.etag, entry), size

    def _forget(self, key: str) -> None:
        """Drop what the cache holds of ``key`` (read directly or through a moved stub)."""
        with self._cache_lock:
            read_as = self._moved.pop(key, None)
            for cached in (key, read_as):
                if cached is not None and self._cache.pop(cached, None) is not None:
                    self._cached_bytes -= self._sizes.pop(cached, 0)

    def _count(self, entry: dict, new: dict, target: Target) -> None:
        if new.get("type") == ERASED:
            self.purged.entries_stubbed += 1
            if entry.get("type") == "feedback":
                self._count_feedback(entry, target)
        else:
            self.purged.entries_rewritten += 1

    def _count_earlier(self, entry: dict, target: Target) -> None:
        """Count a pack or feedback stub an earlier attempt of ``target`` left."""
        if entry.get("type") != ERASED or entry.get("erasure_id") != target.erasure_id:
            return
        kind = {"context_run": "context_runs", "feedback": "feedback_entries"}.get(entry.get("erased_kind"))
        if kind is None:
            return
        earlier = self.purged.earlier
        earlier[kind] = earlier.get(kind, 0) + 1
        if entry.get("requester_own"):
            earlier["visible_" + kind] = earlier.get("visible_" + kind, 0) + 1

    def _count_feedback(self, entry: dict, target: Target) -> None:
        self.purged.feedback_entries += 1
        if target.owns(entry):
            self.purged.visible_feedback_entries += 1

    def _replace(self, key: str, etag: str, new: dict, redo: Callable[[dict], dict | None]) -> None:
        """Write ``new`` over the entry read with ``etag``. If another purge
        changed it since (two builds of one organization may run at once),
        ``redo`` computes this erasure's rewrite of what is there now: the
        rewrite of the copy read earlier would put back what the other
        purge took. ``redo`` answering None: nothing is left to take."""
        self._forget(key)
        body = encode(new)
        for _ in range(5):
            try:
                self.store.compare_and_swap(key, body, etag)
                break
            except PreconditionFailed:  # another purge got there: read it again
                current = self.store.get(key)
                if current.body == body:
                    break
                again = redo(decode_entry(key, current.body))
                if again is None:
                    break
                body, etag = encode(again), current.etag
        self.store.purge_history(key)

    def _tag(self, target: Target) -> str | None:
        return subject_tag(self.org_id, target.subject_id) if target.subject_id else target.subject_tag

    def _purge_runs(self, target: Target, within: set[str] | None = None) -> None:
        """Stub the subject's context runs (and feedback on them) that this
        erasure names: the subject's own from before it was asked, or any,
        whenever compiled, that holds an erased claim or cites an erased
        observation as an item's or a conflict's evidence (a pack compiled
        while the erasure was pending copied erased text; a stored pack
        keeps no erased id). Runs carry the subject tag in their ids.
        ``within``: only these ledger keys (``sweep_late``)."""
        tag = self._tag(target)
        if tag is None:
            return
        keys = [k for k in (self._ledger_keys() if within is None else sorted(within))
                if k.endswith(RUN_SUFFIX) and tag_of(entry_hex_of(k)) == tag]
        feedback, writes, settled = [], [], []
        for found in self._read_all(keys):
            if found is None:
                continue
            key, etag, entry = found
            if self._settled(key, entry, target):  # stubbed by an earlier, failed attempt
                recall(entry, target)
                self._count_earlier(entry, target)
                settled.append(key)
                self.purged.entries_settled += 1
                self._keyed(entry)
                if entry.get("erased_kind") == "context_run":  # feedback on it goes too
                    target.runs.add("ctx_" + entry_hex_of(key))
                continue
            if entry.get("type") == "feedback":
                feedback.append(found)
                continue
            if entry.get("type") != "context_run":
                continue
            items = [i["claim_id"] for i in entry.get("items", [])]
            subject = entry.get("scope", {}).get("subject_id")
            if ((target.kind == "subject" and entry_hex_of(key) < target.limit and subject is not None
                 and target.names(subject))
                    or any([target.takes_claim(i) for i in items]) or _cites(entry, target)):
                target.runs.add(entry["context_id"])
                writes.append((key, etag, stub_run(entry, target)))
                self._keyed(entry)
                self.purged.context_runs += 1
                if target.owns(entry):
                    self.purged.visible_context_runs += 1
        for key, etag, entry in feedback:  # feedback on a whole pack: it goes with its run
            if target.takes_run(entry.get("context_id")):
                writes.append((key, etag, stub_run(entry, target)))
                self._keyed(entry)
                self._count_feedback(entry, target)
        # a run or feedback another purge stubbed meanwhile stays its stub
        redo = lambda current: None if current.get("type") == ERASED else stub_run(current, target)  # noqa: E731
        list(self.pool.map(lambda w: self._replace(*w, redo), writes))
        list(self.pool.map(self.store.purge_history, settled))

    def _purge_feedback_on_runs(self, target: Target, kept: list, read_keys: set[str],
                                within: set[str] | None = None) -> None:
        """Feedback on one claim of a pack this erasure stubbed goes with the
        pack, even when that claim stays (the pack cited an erased
        observation, or held another, erased claim): the feedback named the
        pack's context. Feedback carries its pack's subject tag in its id,
        so every one on the subject's packs is found by listing, repeats
        included (a snapshot keeps only the last per pack and claim).
        ``kept``: feedback entries this purge read and left."""
        if not target.runs and not target.taken:
            return
        tag = self._tag(target)
        # feedback is sent after its pack: none is older than the oldest pack
        # this erasure stubbed (less the skew window); packs stubbed by an
        # earlier attempt and known by hash alone leave no such bound
        oldest = None if target.taken else min(
            (uuid7_floor_hex(uuid7_ms(c[len("ctx_"):]) - self.skew_ms) for c in target.runs), default=None)
        keys = {k for k in (self._ledger_keys() if within is None else within)
                if not k.endswith(RUN_SUFFIX) and tag is not None and tag_of(entry_hex_of(k)) == tag
                and (oldest is None or entry_hex_of(k) >= oldest)}
        more = [found for found in _once(self._read_all(sorted(keys - read_keys))) if found[0] not in read_keys]
        writes, settled = [], []
        for key, etag, entry in [*kept, *more]:
            if entry.get("type") == "feedback" and target.takes_run(entry.get("context_id")):
                writes.append((key, etag, stub_run(entry, target)))
                self._count_feedback(entry, target)
                self._keyed(entry)
            elif key in keys and self._settled(key, entry, target):  # stubbed by an earlier, failed attempt
                self._count_earlier(entry, target)
                settled.append(key)
                self.purged.entries_settled += 1
                self._keyed(entry)
        redo = lambda current: None if current.get("type") == ERASED else stub_run(current, target)  # noqa: E731
        list(self.pool.map(lambda w: self._replace(*w, redo), writes))
        list(self.pool.map(self.store.purge_history, settled))

    def sweep_late(self, carried: list[tuple[Target, Purged]]) -> None:
        """After the erasures' generation is published and every reader has
        had its TTL to load it, before they read complete: the packs
        compiled (and the feedback sent) since this purge listed the ledger,
        from the generation before, go as the others did. From here no
        reader serves that generation, so no later pack can hold what was
        erased. ``carried``: each erasure with its counts, which this adds to.
        One more listing of the ledger, whatever their number."""
        if self._listed is None or not carried:
            return
        before = set(self._listed)
        self._listed = None
        late = {k for k in self._ledger_keys() if k not in before}
        if not late:
            return
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            self.pool = pool
            for target, purged in carried:
                self.purged = purged
                self._purge_runs(target, within=late)
                self._purge_feedback_on_runs(target, [], set(), within=late)
                records, self._records = self._records, []
                list(pool.map(lambda r: self._forget_request(*r, target.erasure_id), records))


def _once(read: list) -> list[tuple[str, str, dict]]:
    """What was read, each entry once: a moved stub and the entry it points
    to (both listed) resolve to the same key."""
    seen: set[str] = set()
    out = []
    for found in read:
        if found is not None and found[0] not in seen:
            seen.add(found[0])
            out.append(found)
    return out


def _cites(run: dict, target: Target) -> bool:
    """Whether a run's stored pack cites an observation ``target`` erases."""
    pack = run.get("pack") or {}
    cited = [o for part in ("items", "conflicts") for i in pack.get(part, []) for o in i.get("evidence_ids", [])]
    return any(target.erases_observation(o) for o in cited)


def _chunks(values: list, size: int) -> Iterable[list]:
    for start in range(0, len(values), size):
        yield values[start:start + size]
