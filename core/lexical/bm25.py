"""FTS5's bm25, written out: its constants, its formula in its operation
order, the statistics record it reads, and the tokenizer both sides share.

The rule this module holds: a contribution computed here equals, bit for
bit, the term FTS5's bm25() adds for a phrase, on a platform whose libm
agrees (``core.lexical.libm``). ``FTS_TOKENIZER`` is the one spelling of the
snapshot's FTS5 tokenizer: the schema creates ``claims_fts`` with it, the
candidate index tokenizes with it.
"""

from __future__ import annotations

import math
from array import array

import apsw

LEX_VERSION = 2
K1 = 1.2
B = 0.75
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"
# the same tokenizer as apsw's Connection.fts5_tokenizer takes it
FTS_TOKENIZER_ARGS = (FTS_TOKENIZER.split()[0], FTS_TOKENIZER.split()[1:])
# contentless: the statement text lives once, in claims
FTS_DDL = f"""
CREATE VIRTUAL TABLE claims_fts USING fts5(
  statement, content='', contentless_delete=1, tokenize='{FTS_TOKENIZER}');
"""

LEX_DDL = """
CREATE TABLE lex_stats(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL,
  n_rows INTEGER NOT NULL,
  n_tokens INTEGER NOT NULL,
  averages BLOB NOT NULL,
  rowid_type TEXT NOT NULL,
  byteorder TEXT NOT NULL
);
CREATE TABLE lex_postings(
  subject_id TEXT NOT NULL,
  term TEXT NOT NULL,
  n INTEGER NOT NULL,
  ub REAL NOT NULL,
  rowids BLOB NOT NULL,
  contribs BLOB NOT NULL,
  tfdl BLOB NOT NULL,
  PRIMARY KEY(subject_id, term)
) WITHOUT ROWID;
"""

AVERAGES_SQL = "SELECT block FROM claims_fts_data WHERE id = 1"


def varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite/FTS5 varint at buf[i:] → (value, next offset)."""
    v = 0
    for _ in range(8):
        c = buf[i]
        i += 1
        v = (v << 7) | (c & 0x7F)
        if not c & 0x80:
            return v, i
    return (v << 8) | buf[i], i + 1


def read_averages(db: apsw.Connection) -> tuple[bytes, int, int]:
    row = db.execute(AVERAGES_SQL).fetchone()
    blob = bytes(row[0]) if row is not None else b""
    if not blob:  # a new, empty index
        return blob, 0, 0
    n_rows, i = varint(blob, 0)
    n_tokens, _ = varint(blob, i)  # one column: statement
    return blob, n_rows, n_tokens


def idf_for(n_rows: int, df: int) -> float:
    idf = math.log((n_rows - df + 0.5) / (df + 0.5))
    return idf if idf > 0.0 else 1e-6


def contribution(idf: float, tf: float, doclen: float, avgdl: float) -> float:
    """One phrase's term of FTS5's bm25 sum, in FTS5's operation order."""
    return idf * ((tf * (K1 + 1.0)) / (tf + K1 * (1 - B + B * doclen / avgdl)))


# postings' raw inputs: tf << 32 | D, packed uint64
TF_SHIFT = 32
DL_MASK = (1 << TF_SHIFT) - 1


def price_list(idf: float, avgdl: float, tfdl: array) -> tuple[array, float]:
    """A list's contributions (and their maximum) from its packed (tf, D)
    inputs; both build paths price postings here, so they agree bit for bit."""
    table = {key: contribution(idf, float(key >> TF_SHIFT), float(key & DL_MASK), avgdl)
             for key in set(tfdl)}
    return array("d", map(table.__getitem__, tfdl)), max(table.values())
