"""The ``meta`` table every snapshot file carries: string values by key.

Builders record what a reader must check before trusting a file (schema
version, watermark, tokenizer, the libm that priced the candidate index,
the vector fingerprint); this is the one way any part reads or writes it.
"""

from __future__ import annotations

import apsw


def read_meta(db: apsw.Connection, key: str) -> str | None:
    """One value (None if absent, or if the file has no meta table)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    except apsw.SQLError:
        return None
    return row[0] if row else None


def write_meta(db: apsw.Connection, **values) -> None:
    db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
                   [(k, str(v)) for k, v in values.items()])


def all_meta(db: apsw.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT key, value FROM meta"))
