"""Schema-level test data: rows written straight into a snapshot database
(``core.snapshot.schema.DDL``), for tests of the parts below the builder
(the lexical index, the content hash) and for infra/arm64_check.py.

``insert_claim`` writes one ``claims`` row: the columns given, plus a default
for every NOT NULL column without a schema default that is not given
(``CLAIM_DEFAULTS``); every other column keeps its schema default (``status``
active, ``indexed`` 0, ...). It writes nothing to ``claims_fts``: a test
indexes what it means to index, as the builder does.
"""

from __future__ import annotations

import apsw

T0 = "2026-01-01T00:00:00.000000Z"

# the NOT NULL columns of ``claims`` that have no DEFAULT in the schema
CLAIM_DEFAULTS = {
    "org_id": "org",
    "subject_id": "s1",
    "visibility": "organization",
    "owner_id": "u1",
    "kind": "semantic_fact",
    "confidence": 0.9,
    "trust": "observed",
    "trust_level": 1,
    "valid_from": T0,
    "created_at": T0,
    "created_s": 0.0,
    "entry_id": "e",
}


def insert_claim(db: apsw.Connection, claim_id: str, statement: str, **columns) -> int:
    """Insert one claim row and return its rowid; ``columns`` are any other
    ``claims`` columns (they override ``CLAIM_DEFAULTS``)."""
    row = {"claim_id": claim_id, "statement": statement, **CLAIM_DEFAULTS, **columns}
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    return db.execute(f"INSERT INTO claims({names}) VALUES({marks}) RETURNING rowid",
                      tuple(row.values())).fetchone()[0]
