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

import apsw
import numpy as np

LEX_VERSION = 5
K1 = 1.2
B = 0.75
# Combining marks (M*) are word characters: unicode61's default ("L* N* Co")
# split Devanagari, Bengali, Tamil… words at each spacing vowel sign
# (core/lexical/marks.py).
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2 categories 'L* N* Co M*'"
# the same tokenizer as apsw's Connection.fts5_tokenizer takes it
FTS_TOKENIZER_ARGS = ("porter", ["unicode61", "remove_diacritics", "2", "categories", "L* N* Co M*"])
# contentless: the statement text lives once, in claims
FTS_DDL = f"""
CREATE VIRTUAL TABLE claims_fts USING fts5(
  statement, content='', contentless_delete=1, tokenize="{FTS_TOKENIZER}");
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
  reader TEXT NOT NULL,
  term TEXT NOT NULL,
  first_rowid INTEGER NOT NULL,
  n INTEGER NOT NULL,
  rowids BLOB NOT NULL,
  tfdl BLOB NOT NULL,
  PRIMARY KEY(subject_id, reader, term, first_rowid)
) WITHOUT ROWID;
CREATE TABLE lex_terms(
  term TEXT PRIMARY KEY,
  df INTEGER NOT NULL
) WITHOUT ROWID;
"""

# A (subject, reader, term) list is stored as blocks of ascending rowids keyed by
# their first rowid: the whole build cuts blocks of BLOCK_POSTINGS; the
# incremental build appends to the last block only while it holds fewer than
# TAIL_POSTINGS, else starts a new one. So a few new claims rewrite a few
# small rows (and a few pages of the file: core/snapshot/delta.py), while a
# frequent term is still read as a few hundred rows.
BLOCK_POSTINGS = 1024
TAIL_POSTINGS = 128

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


def ratios(tfdl: np.ndarray, avgdl: float) -> np.ndarray:
    """Each posting's ``(tf * (k1 + 1)) / (tf + k1 * (1 - b + b * D / avgdl))``
    from its packed (tf, D), elementwise in FTS5's operation order (every
    numpy ufunc rounds once, as the C expression does, so the values equal
    ``contribution``'s bit for bit once multiplied by idf)."""
    tf = (tfdl >> np.uint64(TF_SHIFT)).astype(np.float64)
    dl = (tfdl & np.uint64(DL_MASK)).astype(np.float64)
    return (tf * (K1 + 1.0)) / (tf + K1 * ((1 - B) + (B * dl) / avgdl))


def contributions(idf: float, tfdl: np.ndarray, avgdl: float) -> np.ndarray:
    """A list's bm25 contributions, priced now: with the N, avgdl and df of
    the index being queried and this process's log() (the libm FTS5 calls
    too), so stored postings never depend on corpus-wide statistics."""
    return idf * ratios(tfdl, avgdl)
