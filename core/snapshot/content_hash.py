"""The canonical content hash of a snapshot, kept up to date row by row.

The hash proves that an incremental build and a replay of the whole ledger
reached the same canonical content (docs/architecture.md, "Snapshots are derived"), so it must not depend on the
path taken — and an incremental build must not pay for re-reading every row.
It is therefore a multiset hash: per canonical table, the sum modulo 2**256
of sha256 over each row's canonical JSON; the content hash is sha256 over
the tables' sums. ``scan`` computes the sums from the rows; ``RowDigests``
keeps them current through temporary triggers while a build changes rows,
so both give the same value for the same content by construction (and
tests/test_rebuild.py checks it). The sums are stored in the snapshot's
``meta`` (``content_sums``) for the next build to start from.

Sums of hashes are not collision-resistant against an adversary who chooses
rows (generalized birthday attacks); the hash guards against build bugs, not
attackers — the ledger, not the snapshot, is the canonical record.
"""

from __future__ import annotations

import hashlib
import json

import apsw

# table → its canonical columns, in order (derived columns are left out
# where they are a cache of canonical ones: rowid, trust_level, created_s)
CANONICAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "claims": ("claim_id", "org_id", "subject_id", "project_id", "workspace_id", "visibility", "owner_id",
               "statement", "kind", "confidence", "trust", "observer_id", "valid_from", "valid_to", "created_at",
               "base_status", "status", "version", "superseded_by", "disputed", "dispute_public",
               "feedback_total", "feedback_positive", "feedback_negative", "evidence_json", "indexed",
               "prefix_tokens"),
    "observations": ("observation_id", "org_id", "subject_id", "project_id", "workspace_id", "visibility",
                     "owner_id", "kind", "content", "source_json", "trust", "occurred_at", "created_at"),
    "claim_sources": ("claim_id", "observation_id", "relation"),
    "transitions": ("claim_id", "from_version", "action", "recorded_at", "reason", "new_claim_id"),
    "feedback": ("context_id", "claim_id", "feedback_id", "outcome"),
}
MODULUS = 1 << 256
META_KEY = "content_sums"
_FUNCTION = "titen_content_row"


def row_digest(table: str, row) -> int:
    body = json.dumps(list(row), separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(f"{table}\x00{body}".encode()).digest(), "big")


def scan(db: apsw.Connection) -> dict[str, int]:
    """The sums, from every canonical row."""
    sums = {}
    for table, columns in CANONICAL_COLUMNS.items():
        total = 0
        for row in db.execute(f"SELECT {', '.join(columns)} FROM {table}"):
            total += row_digest(table, row)
        sums[table] = total % MODULUS
    return sums


def digest(sums: dict[str, int]) -> str:
    h = hashlib.sha256()
    for table in CANONICAL_COLUMNS:
        h.update(f"{table}:{sums[table]:064x}\n".encode())
    return h.hexdigest()


def encode(sums: dict[str, int]) -> str:
    return json.dumps({table: f"{sums[table]:064x}" for table in CANONICAL_COLUMNS}, separators=(",", ":"))


def decode(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    try:
        raw = json.loads(text)
        sums = {table: int(raw[table], 16) for table in CANONICAL_COLUMNS}
    except (ValueError, KeyError, TypeError):
        return None
    return sums


class RowDigests:
    """Keeps ``sums`` current while rows of the canonical tables change:
    temporary triggers (on this connection only) report every inserted,
    updated and deleted row. Every canonical write is a plain INSERT, an
    upsert or an UPDATE — never INSERT OR REPLACE, whose implicit delete
    fires no trigger."""

    def __init__(self, db: apsw.Connection, sums: dict[str, int]):
        self.db = db
        self.sums = dict(sums)
        db.create_scalar_function(_FUNCTION, self._row, -1)
        statements = []
        for table, columns in CANONICAL_COLUMNS.items():
            new = ", ".join(f"NEW.{c}" for c in columns)
            old = ", ".join(f"OLD.{c}" for c in columns)
            statements += [
                f"CREATE TEMP TRIGGER titen_sum_{table}_insert AFTER INSERT ON main.{table}"
                f" BEGIN SELECT {_FUNCTION}('{table}', 1, {new}); END;",
                f"CREATE TEMP TRIGGER titen_sum_{table}_delete AFTER DELETE ON main.{table}"
                f" BEGIN SELECT {_FUNCTION}('{table}', -1, {old}); END;",
                f"CREATE TEMP TRIGGER titen_sum_{table}_update AFTER UPDATE ON main.{table}"
                f" BEGIN SELECT {_FUNCTION}('{table}', -1, {old}), {_FUNCTION}('{table}', 1, {new}); END;",
            ]
        db.execute("\n".join(statements))

    def _row(self, table: str, sign: int, *row) -> None:
        self.sums[table] = (self.sums[table] + sign * row_digest(table, row)) % MODULUS

    def close(self) -> None:
        for table in CANONICAL_COLUMNS:
            for event in ("insert", "delete", "update"):
                self.db.execute(f"DROP TRIGGER IF EXISTS temp.titen_sum_{table}_{event}")
