"""This platform's FTS5 arithmetic: how its bm25() adds the phrases.

The SQLite inside apsw is compiled C and a compiler may contract a
multiply-add, which moves a sum by an ulp. Once per process a small probe
index compares both summation models with the FTS5 query; the candidate
step uses the model that matched, or lets FTS5 answer.
"""

from __future__ import annotations

import apsw

from core.lexical import query
from core.lexical.bm25 import FTS_DDL
from core.lexical.build import build_lexical_index

PROBE_MAX_PHRASES = 9
_PROBE_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
                "kilo", "lima")
_modes: dict[int, str] | None = None


def phrase_count_mode(n: int) -> str | None:
    """How this platform's FTS5 bm25() adds n phrases: "plain" (each
    contribution rounded, then summed in phrase order), "fused" (the same, but
    the odd last phrase folded in by one fused multiply-add, as aarch64 builds
    do), or None when neither model matches (the FTS5 query answers).

    Counts 1..PROBE_MAX_PHRASES are probed; beyond that a count gets the
    model that matched every probed count (above 1) of its parity, if one did."""
    global _modes
    if _modes is None:
        _modes = _probe_modes()
    if n <= PROBE_MAX_PHRASES:
        return _modes.get(n)
    # one phrase sums the same either way, so it says nothing about the others
    probed = {_modes.get(count) for count in range(2, PROBE_MAX_PHRASES + 1) if count % 2 == n % 2}
    return probed.pop() if len(probed) == 1 else None


def phrase_count_exact(n: int) -> bool:
    return phrase_count_mode(n) is not None


def _probe_modes() -> dict[int, str]:
    db = apsw.Connection(":memory:")
    # the columns of claims the index and its scope check read, and the
    # snapshot's own FTS table and tokenizer
    db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
               "CREATE TABLE claims(rowid INTEGER PRIMARY KEY, claim_id TEXT NOT NULL, subject_id TEXT NOT NULL,"
               " indexed INTEGER NOT NULL, visibility TEXT NOT NULL DEFAULT 'organization', workspace_id TEXT,"
               " owner_id TEXT NOT NULL DEFAULT 'p');" + FTS_DDL)
    words = _PROBE_WORDS
    with db:
        for i in range(60):
            # deterministic, uneven term frequencies and lengths
            text = " ".join(words[(i * j + j * j) % len(words)] for j in range(3 + i % 9))
            db.execute("INSERT INTO claims(rowid, claim_id, subject_id, indexed) VALUES(?, ?, 's', 1)",
                       (i + 1, f"c{i:03d}"))
            db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (i + 1, text))
    with db:
        build_lexical_index(db)
    sql = ("SELECT c.rowid, bm25(claims_fts) FROM claims_fts JOIN claims c ON c.rowid = claims_fts.rowid"
           " WHERE claims_fts MATCH ? AND c.subject_id = ? ORDER BY 2, c.claim_id LIMIT 200")
    modes = {}
    for n in range(1, PROBE_MAX_PHRASES + 1):
        for mode in ("plain", "fused"):
            agree = True
            for shift in range(4):
                terms = [words[(shift + 3 * j) % len(words)] for j in range(n)]
                expected = [tuple(row) for row in db.execute(sql, (" OR ".join(f'"{t}"' for t in terms), "s"))]
                agree = agree and query._top_candidates(db, "s", ("org",), "c.subject_id = ?", ["s"], terms, 200,
                                                        fused_last=mode == "fused") == expected
            if agree:
                modes[n] = mode
                break
    db.close()
    return modes
