"""Exact top-k BM25 candidates without FTS5's bm25() over every match.

The compile candidate query is ``claims_fts MATCH '"t1" OR "t2" ...'`` joined
to ``claims`` under the scope predicates, ``ORDER BY bm25(claims_fts),
claim_id LIMIT k``. FTS5 computes bm25() for *every* matching row, and on a
Zipf vocabulary a frequent term matches most of the index, so the query costs
O(all postings of all terms). This module answers the same question exactly
(same rowids, bit-identical bm25 values, same order) from auxiliary tables
written at snapshot build time, summed in C.

Build side, run on the work database after the last change to
``claims_fts``:

- ``lex_stats``: the FTS5 statistics bm25() uses — N (rows in the index) and
  the total token count, read from the FTS5 averages record itself — and the
  raw averages record, so a reader can check the tables still describe the
  index it sits next to.
- ``lex_postings(subject_id, term, n, ub, rowids, contribs, tfdl)``: for every
  subject and every indexed token, the rowids of that subject's indexed
  claims containing the token (ascending, packed int32/int64), parallel to
  them each posting's exact bm25 contribution (packed float64), computed
  with FTS5's formula and operation order::

      idf = log((N - df + 0.5) / (df + 0.5)), 1e-6 if <= 0   (df over the whole index)
      c   = idf * ((tf * (k1 + 1.0)) / (tf + k1 * (1 - b + b * D / avgdl)))

  with k1 = 1.2, b = 0.75, D the row's token count, avgdl = total / N, and
  the raw inputs ``tf << 32 | D`` (packed uint64). ``ub`` is the largest
  contribution in the list.

``build_lexical_index`` writes them whole from FTS5 itself (an ``fts5vocab``
instance table, so tokenization is FTS5's by construction; row sizes from
``claims_fts_docsize``). ``update_lexical_index`` is the incremental build:
every FTS insert or delete moves N, avgdl and df, hence *every*
contribution, so it patches only the lists of the rows that changed (their
tokens from FTS5's own tokenizer, checked against the averages record and
the docsize table; any disagreement falls back to the whole build) and then
recomputes every list's contributions from its stored ``tfdl`` — one
dictionary of the list's distinct (tf, D) pairs, mapped over the list in C.
Both give byte-identical tables (tests/test_lexical.py).

Query side (``top_candidates``): the phrases' tokens (same tokenizer, via
``Connection.fts5_tokenizer``) → their lists for the scope's subject, read as
numpy views of the stored blobs → every matching row's score summed in C
(``numpy.bincount`` over the lists concatenated in phrase order: the same
additions in the same order as FTS5's bm25(), so bit-identical sums) → the
best rows by score, scope-checked in that order by the caller's own predicate
SQL until k are in scope, then every row tying the k-th score, sorted by
(bm25, claim_id) as the FTS5 query orders them. Whenever an exact answer
cannot be guaranteed (tables missing or stale, a term that is not exactly one
token, contributions priced by another libm's log(): see
``platform_fingerprint``) ``top_candidates`` returns None and the caller runs
the FTS5 query (``core.retrieval.fts_candidates``), which stays the
reference.

numpy is a runtime dependency for this step alone: scoring a frequent term's
list (hundreds of thousands of postings at 342k claims) in Python costs tens
of milliseconds; MaxScore pruning in Python (this module's previous answer)
halved that, the C loop cuts it by another 2-4x and needs no pruning.
"""

from __future__ import annotations

import hashlib
import logging
import math
import platform
import struct
import sys
import weakref
from array import array
from bisect import bisect_left
from collections import defaultdict

import apsw
import numpy as np

LEX_VERSION = 2
K1 = 1.2
B = 0.75
FTS_TOKENIZER_ARGS = ("porter", ["unicode61", "remove_diacritics", "2"])

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

_AVERAGES_SQL = "SELECT block FROM claims_fts_data WHERE id = 1"


# -- shared ------------------------------------------------------------------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite/FTS5 varint at buf[i:] → (value, next offset)."""
    v = 0
    for _ in range(8):
        c = buf[i]
        i += 1
        v = (v << 7) | (c & 0x7F)
        if not c & 0x80:
            return v, i
    return (v << 8) | buf[i], i + 1


def _averages(db: apsw.Connection) -> tuple[bytes, int, int]:
    row = db.execute(_AVERAGES_SQL).fetchone()
    blob = bytes(row[0]) if row is not None else b""
    if not blob:  # a new, empty index
        return blob, 0, 0
    n_rows, i = _varint(blob, 0)
    n_tokens, _ = _varint(blob, i)  # one column: statement
    return blob, n_rows, n_tokens


def idf_for(n_rows: int, df: int) -> float:
    idf = math.log((n_rows - df + 0.5) / (df + 0.5))
    return idf if idf > 0.0 else 1e-6


def contribution(idf: float, tf: float, doclen: float, avgdl: float) -> float:
    """One phrase's term of FTS5's bm25 sum, in FTS5's operation order."""
    return idf * ((tf * (K1 + 1.0)) / (tf + K1 * (1 - B + B * doclen / avgdl)))


# -- the libm the stored contributions were priced with ----------------------------
#
# Every other step of a contribution is IEEE arithmetic, the same everywhere;
# log() is the C library's, and FTS5 calls the log() of the machine serving
# the query. A snapshot built on one platform (an operator's x86_64 laptop)
# and served on another (arm64 Lambda) therefore equals the serving FTS5 only
# if both libms agree. The builder records its fingerprint in the snapshot's
# meta table under LIBM_META_KEY; a reader whose own fingerprint differs does
# not use the stored contributions (the FTS5 query answers), and the next
# build on the reader's platform prices every list again.

LIBM_META_KEY = "lexical_libm"
_fingerprint: str | None = None


def _log_inputs() -> list[float]:
    """The fingerprint's fixed inputs, made without libm (exact operations
    only): idf arguments (N - df + 0.5) / (df + 0.5) over index sizes 1..10^7
    and their document frequencies, and 2048 doubles spread over 2^-12..2^28."""
    xs = []
    n = 1
    while n <= 10**7:
        df = 1
        while df <= n:
            xs.append((n - df + 0.5) / (df + 0.5))
            df = df * 3 // 2 + 1
        n = n * 5 // 4 + 1
    state = 0x9E3779B97F4A7C15
    for _ in range(2048):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        xs.append(math.ldexp(1.0 + (state >> 12) / 2**52, (state % 41) - 12))
    return xs


def platform_fingerprint() -> str:
    """This process's libm, as '<machine> log:<digest>': the digest (the first
    16 hex digits of the sha256 of the exact bits of math.log on the fixed
    inputs) is what is compared; the machine name is for the reader of a
    report."""
    global _fingerprint
    if _fingerprint is None:
        xs = _log_inputs()
        bits = struct.pack(f"<{len(xs)}d", *map(math.log, xs))
        _fingerprint = f"{platform.machine()} log:{hashlib.sha256(bits).hexdigest()[:16]}"
    return _fingerprint


def priced_here(recorded: str | None) -> bool:
    """Whether contributions priced under the ``recorded`` fingerprint equal
    this platform's (None: not recorded, so unknown)."""
    return recorded is not None and recorded.rpartition(" log:")[2] == platform_fingerprint().rpartition(" log:")[2]


def recorded_fingerprint(db: apsw.Connection) -> str | None:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (LIBM_META_KEY,)).fetchone()
    except apsw.SQLError:  # no meta table
        return None
    return row[0] if row is not None else None


# -- build -------------------------------------------------------------------

_INSERT = "INSERT INTO lex_postings(subject_id, term, n, ub, rowids, contribs, tfdl) VALUES(?, ?, ?, ?, ?, ?, ?)"
_TF_SHIFT = 32
_DL_MASK = (1 << _TF_SHIFT) - 1


def _contribs(idf: float, avgdl: float, tfdl: array) -> tuple[array, float]:
    """A list's contributions (and their maximum) from its packed (tf, D)
    inputs; both build paths price postings here, so they agree bit for bit."""
    table = {key: contribution(idf, float(key >> _TF_SHIFT), float(key & _DL_MASK), avgdl)
             for key in set(tfdl)}
    return array("d", map(table.__getitem__, tfdl)), max(table.values())


def _write_stats(db: apsw.Connection, averages: bytes, n_rows: int, n_tokens: int, rowid_type: str) -> None:
    db.execute("DELETE FROM lex_stats")
    db.execute("INSERT INTO lex_stats(id, version, n_rows, n_tokens, averages, rowid_type, byteorder)"
               " VALUES(1, ?, ?, ?, ?, ?, ?)",
               (LEX_VERSION, n_rows, n_tokens, averages, rowid_type, sys.byteorder))
    # both build paths price every list after this, with this process's log()
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (LIBM_META_KEY, platform_fingerprint()))


def _rowid_type(db: apsw.Connection) -> str:
    max_rowid = db.execute("SELECT coalesce(max(rowid), 0) FROM claims").fetchone()[0]
    return "i" if max_rowid < 2**31 else "q"


def build_lexical_index(db: apsw.Connection) -> dict:
    """(Re)create lex_stats and lex_postings whole from claims_fts and claims.

    Run inside the build's write transaction after the last change to
    claims_fts."""
    db.execute("DROP TABLE IF EXISTS lex_stats; DROP TABLE IF EXISTS lex_postings")
    db.execute(LEX_DDL)
    averages, n_rows, n_tokens = _averages(db)
    rowid_type = _rowid_type(db)
    _write_stats(db, averages, n_rows, n_tokens, rowid_type)
    if n_rows == 0:
        return {"mode": "whole", "n_rows": 0, "terms": 0, "postings": 0, "lists": 0}
    avgdl = float(n_tokens) / float(n_rows)
    doclen: dict[int, int] = {}
    for rowid, size in db.execute("SELECT id, sz FROM claims_fts_docsize"):
        doclen[rowid] = _varint(size, 0)[0]
    subject_of = dict(db.execute("SELECT rowid, subject_id FROM claims WHERE indexed = 1"))
    if len(doclen) != n_rows or sum(doclen.values()) != n_tokens or not doclen.keys() <= subject_of.keys():
        raise RuntimeError("claims_fts statistics disagree with its docsize table or with claims.indexed")

    db.execute("DROP TABLE IF EXISTS temp.lex_vocab")
    db.execute("CREATE VIRTUAL TABLE temp.lex_vocab USING fts5vocab(main, 'claims_fts', 'instance')")
    stats = {"mode": "whole", "n_rows": n_rows, "terms": 0, "postings": 0, "lists": 0}

    def flush(term: str, docs: list[int], tfs: list[int]) -> None:
        idf = idf_for(n_rows, len(docs))
        by_subject: dict[str, tuple[array, array]] = defaultdict(lambda: (array(rowid_type), array("Q")))
        for rowid, tf in zip(docs, tfs):
            rows, tfdl = by_subject[subject_of[rowid]]
            rows.append(rowid)
            tfdl.append(tf << _TF_SHIFT | doclen[rowid])
        out = []
        for subject, (rows, tfdl) in by_subject.items():
            contribs, ub = _contribs(idf, avgdl, tfdl)
            out.append((subject, term, len(rows), ub, rows.tobytes(), contribs.tobytes(), tfdl.tobytes()))
        db.executemany(_INSERT, out)
        stats["terms"] += 1
        stats["postings"] += len(docs)
        stats["lists"] += len(out)

    term = None
    docs: list[int] = []
    tfs: list[int] = []
    # the instance table streams in (term, doc, col, offset) order
    for t, doc, tf in db.execute("SELECT term, doc, count(*) FROM temp.lex_vocab GROUP BY term, doc"):
        if t != term:
            if term is not None:
                flush(term, docs, tfs)
            term, docs, tfs = t, [], []
        docs.append(doc)
        tfs.append(tf)
    if term is not None:
        flush(term, docs, tfs)
    db.execute("DROP TABLE temp.lex_vocab")
    return stats


class LexicalChanges:
    """The rows a build inserted into or deleted from claims_fts, in order.

    The builder records each change as it makes it; ``update_lexical_index``
    turns them into posting-list edits."""

    def __init__(self, record: bool = True):
        # a build from empty writes the index whole: nothing to remember
        self.record = record
        self.rows: list[tuple[int, str, str, int]] = []  # (rowid, subject_id, statement, +1 | -1)

    def inserted(self, rowid: int, subject_id: str, statement: str) -> None:
        if self.record:
            self.rows.append((rowid, subject_id, statement, 1))

    def deleted(self, rowid: int, subject_id: str, statement: str) -> None:
        if self.record:
            self.rows.append((rowid, subject_id, statement, -1))


def update_lexical_index(db: apsw.Connection, changes: LexicalChanges, progress=None) -> dict:
    """Bring lex_stats/lex_postings up to date after ``changes`` to claims_fts;
    the same tables ``build_lexical_index`` would write, faster. Run it in a
    transaction after the one that made the changes: FTS5 writes its
    statistics out when that one commits.

    Falls back to the whole build when there is no current-version index to
    start from, when the rowid width must grow, or when the changes do not
    account exactly for the index's new statistics. Lists priced with another
    libm (see ``platform_fingerprint``) are priced again even if nothing
    changed."""
    progress = progress or (lambda message: None)
    try:
        row = db.execute("SELECT version, n_rows, n_tokens, rowid_type, byteorder FROM lex_stats"
                         " WHERE id = 1").fetchone()
    except apsw.SQLError:
        row = None
    rowid_type = _rowid_type(db)
    if row is None or row[0] != LEX_VERSION or row[4] != sys.byteorder or row[3] != rowid_type:
        return build_lexical_index(db)
    _, old_rows, old_tokens, _, _ = row
    averages, n_rows, n_tokens = _averages(db)
    recorded = recorded_fingerprint(db)
    foreign = not priced_here(recorded)
    if not changes.rows and (n_rows, n_tokens) == (old_rows, old_tokens) and not foreign:
        # nothing entered or left the index: every list is still exact
        return {"mode": "unchanged", "n_rows": n_rows, "terms": 0, "postings": 0, "lists": 0, "edited": 0}
    if foreign:
        progress(f"candidate index: priced under libm {recorded!r}, here {platform_fingerprint()!r};"
                 " pricing every list again")

    # 1. the changed rows' postings, from FTS5's own tokenizer
    tokenizer = db.fts5_tokenizer(*FTS_TOKENIZER_ARGS)
    edits: dict[tuple[str, str], tuple[set[int], dict[int, int]]] = {}
    rows_delta = tokens_delta = 0
    for rowid, subject_id, statement, sign in changes.rows:
        tokens = tokenizer(statement.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None,
                           include_offsets=False, include_colocated=False)
        rows_delta += sign
        tokens_delta += sign * len(tokens)
        if sign > 0:
            size = db.execute("SELECT sz FROM claims_fts_docsize WHERE id = ?", (rowid,)).fetchone()
            if size is None or _varint(size[0], 0)[0] != len(tokens):
                return build_lexical_index(db)
        tf: dict[str, int] = {}
        for tok in tokens:
            tf[tok] = tf.get(tok, 0) + 1
        for tok, count in tf.items():
            removed, added = edits.setdefault((subject_id, tok), (set(), {}))
            if sign > 0:
                added[rowid] = count << _TF_SHIFT | len(tokens)
                removed.discard(rowid)
            else:
                added.pop(rowid, None)
                removed.add(rowid)
    if n_rows != old_rows + rows_delta or n_tokens != old_tokens + tokens_delta:
        progress("candidate index: the changes do not account for the new statistics; building it whole")
        return build_lexical_index(db)
    _write_stats(db, averages, n_rows, n_tokens, rowid_type)
    if n_rows == 0:
        db.execute("DELETE FROM lex_postings")
        return {"mode": "incremental", "n_rows": 0, "terms": 0, "postings": 0, "lists": 0, "edited": 0}

    # 2. edit the touched lists (rowids and inputs only; priced in step 3)
    for (subject_id, term), (removed, added) in sorted(edits.items()):
        found = db.execute("SELECT rowids, tfdl FROM lex_postings WHERE subject_id = ? AND term = ?",
                           (subject_id, term)).fetchone()
        rows, tfdl = array(rowid_type), array("Q")
        if found is not None:
            rows.frombytes(found[0])
            tfdl.frombytes(found[1])
        for rowid in removed:
            i = bisect_left(rows, rowid)
            if i < len(rows) and rows[i] == rowid:
                del rows[i]
                del tfdl[i]
        for rowid in sorted(added):
            i = bisect_left(rows, rowid)
            if i < len(rows) and rows[i] == rowid:
                tfdl[i] = added[rowid]
            else:
                rows.insert(i, rowid)
                tfdl.insert(i, added[rowid])
        if not rows:
            db.execute("DELETE FROM lex_postings WHERE subject_id = ? AND term = ?", (subject_id, term))
        elif found is None:
            # priced in step 3 like every other list
            db.execute(_INSERT, (subject_id, term, len(rows), 0.0, rows.tobytes(), b"", tfdl.tobytes()))
        else:
            db.execute("UPDATE lex_postings SET n = ?, rowids = ?, tfdl = ? WHERE subject_id = ? AND term = ?",
                       (len(rows), rows.tobytes(), tfdl.tobytes(), subject_id, term))

    # 3. N, avgdl and df moved: price every list again
    avgdl = float(n_tokens) / float(n_rows)
    df = dict(db.execute("SELECT term, sum(n) FROM lex_postings GROUP BY term"))
    idf = {term: idf_for(n_rows, d) for term, d in df.items()}
    stats = {"mode": "incremental", "n_rows": n_rows, "terms": len(df), "postings": sum(df.values()),
             "lists": 0, "edited": len(edits)}
    after: tuple = ("", "")
    while True:
        batch = db.execute("SELECT subject_id, term, tfdl FROM lex_postings WHERE (subject_id, term) > (?, ?)"
                           " ORDER BY subject_id, term LIMIT 2000", after).fetchall()
        if not batch:
            break
        out = []
        for subject_id, term, raw in batch:
            tfdl = array("Q")
            tfdl.frombytes(raw)
            contribs, ub = _contribs(idf[term], avgdl, tfdl)
            out.append((ub, contribs.tobytes(), subject_id, term))
        db.executemany("UPDATE lex_postings SET ub = ?, contribs = ? WHERE subject_id = ? AND term = ?", out)
        stats["lists"] += len(out)
        after = batch[-1][:2]
    return stats


# -- query -------------------------------------------------------------------

class _State:
    __slots__ = ("ok", "tokenizer", "rowid_type", "rowid_dtype", "token_cache", "vocab_rows", "n_rows", "avgdl",
                 "libm")

    def __init__(self, db: apsw.Connection):
        self.ok = False
        self.vocab_rows = None  # the fts5vocab table the fused sums read df from, once created
        self.token_cache: dict[str, str | None] = {}
        try:
            row = db.execute("SELECT version, n_rows, averages, rowid_type, byteorder, n_tokens FROM lex_stats"
                             " WHERE id = 1").fetchone()
        except apsw.SQLError:
            return  # no lex tables in this snapshot
        if row is None:
            return
        version, n_rows, averages, self.rowid_type, byteorder, n_tokens = row
        self.n_rows = n_rows
        self.avgdl = float(n_tokens) / float(n_rows) if n_rows else 0.0
        self.rowid_dtype = np.int32 if self.rowid_type == "i" else np.int64
        current, current_rows, _ = _averages(db)
        self.ok = (version == LEX_VERSION and byteorder == sys.byteorder and bytes(averages) == current
                   and n_rows == current_rows)
        self.libm = recorded_fingerprint(db)
        if self.ok and not priced_here(self.libm):
            # priced by another libm (or by a build that did not say): the
            # contributions may be an ulp from this platform's FTS5
            self.ok = False
            logging.getLogger("titen").warning(
                "candidate index priced under libm %r, here %r: the FTS5 query answers until a build here",
                self.libm, platform_fingerprint())
        self.tokenizer = db.fts5_tokenizer(*FTS_TOKENIZER_ARGS)

    def token(self, term: str) -> str | None:
        """The single FTS5 query token for a planned term, or None."""
        tok = self.token_cache.get(term, "")
        if tok == "":
            toks = self.tokenizer(term.encode(), apsw.FTS5_TOKENIZE_QUERY, None,
                                  include_offsets=False, include_colocated=False)
            tok = toks[0] if len(toks) == 1 else None
            if len(self.token_cache) > 100_000:
                self.token_cache.clear()
            self.token_cache[term] = tok
        return tok


# Snapshot connections are immutable (opened ?immutable=1), so what a
# connection's lex tables look like is decided once per connection. A state
# holds the connection's FTS5 tokenizer, which holds the connection, so the
# weak key alone would never let go: the reader calls ``forget`` when it
# retires a generation, and a retired connection is never cached again.
_STATES: "weakref.WeakKeyDictionary[apsw.Connection, _State]" = weakref.WeakKeyDictionary()
_RETIRED: "weakref.WeakSet[apsw.Connection]" = weakref.WeakSet()


def _state(db: apsw.Connection) -> _State:
    state = _STATES.get(db)
    if state is None:
        state = _State(db)
        if db not in _RETIRED:
            _STATES[db] = state
    return state


def forget(db: apsw.Connection) -> None:
    """Drop what is cached for a retired snapshot connection, so it can be freed."""
    _RETIRED.add(db)
    _STATES.pop(db, None)


class _Scope:
    """Lazy, batched scope checks through the caller's own predicate SQL."""

    def __init__(self, db: apsw.Connection, where: str, params: list):
        self.db = db
        self.sql = f"SELECT c.rowid, c.claim_id FROM claims c WHERE c.rowid IN carray(?) AND {where}"
        self.params = params
        self.claim_id: dict[int, str] = {}   # in scope → claim_id
        self.checked: set[int] = set()
        self.out: set[int] = set()            # checked, not in scope

    def check(self, rowids) -> None:
        todo = [r for r in rowids if r not in self.checked]
        if not todo:
            return
        self.checked.update(todo)
        ids = self.claim_id
        for rowid, claim_id in self.db.execute(self.sql, [apsw.carray(array("q", todo)), *self.params]):
            ids[rowid] = claim_id
        self.out.update(r for r in todo if r not in ids)


# -- this platform's FTS5 arithmetic --------------------------------------------

PROBE_MAX_PHRASES = 9
_PROBE_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
                "kilo", "lima")
_modes: dict[int, str] | None = None


def phrase_count_mode(n: int) -> str | None:
    """How this platform's FTS5 bm25() adds n phrases: "plain" (each
    contribution rounded, then summed in phrase order), "fused" (the same, but
    the odd last phrase folded in by one fused multiply-add, as aarch64 builds
    do), or None when neither model matches (the FTS5 query answers).

    The SQLite inside apsw is compiled C and a compiler may contract a
    multiply-add, which moves a sum by an ulp. So once per process a small
    probe index compares both models with the FTS5 query for
    1..PROBE_MAX_PHRASES phrases; beyond that a count gets the model that
    matched every probed count (above 1) of its parity, if one did."""
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
    from core.snapshot_schema import DDL  # the snapshot's own tables and tokenizer
    db = apsw.Connection(":memory:")
    db.execute(DDL)
    words = _PROBE_WORDS
    with db:
        for i in range(60):
            # deterministic, uneven term frequencies and lengths
            text = " ".join(words[(i * j + j * j) % len(words)] for j in range(3 + i % 9))
            db.execute("INSERT INTO claims(rowid, claim_id, org_id, subject_id, visibility, owner_id, statement,"
                       " kind, confidence, trust, trust_level, valid_from, created_at, created_s, entry_id, indexed)"
                       " VALUES(?, ?, 'o', 's', 'organization', 'u', ?, 'semantic_fact', 1, 'observed', 1, 't', 't',"
                       " 0, 'e', 1)", (i + 1, f"c{i:03d}", text))
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
                agree = agree and _top_candidates(db, "s", "c.subject_id = ?", ["s"], terms, 200,
                                                  fused_last=mode == "fused") == expected
            if agree:
                modes[n] = mode
                break
    db.close()
    return modes


def top_candidates(db: apsw.Connection, subject_id: str, where: str, params: list,
                   terms, k: int = 200) -> list[tuple[int, float]] | None:
    """(rowid, bm25) of the k best in-scope matches of '"t1" OR "t2" ...', best
    first, equal to the FTS5 candidate query; None when the lex tables cannot
    answer exactly (the caller then runs the FTS5 query).

    ``where``/``params`` are the scope predicate over alias ``c`` (as built by
    CompileScope.where); ``subject_id`` is the subject that predicate pins."""
    mode = phrase_count_mode(len(terms))
    if mode is None:
        return None
    return _top_candidates(db, subject_id, where, params, terms, k, fused_last=mode == "fused")


def _top_candidates(db: apsw.Connection, subject_id: str, where: str, params: list,
                    terms, k: int, fused_last: bool = False) -> list[tuple[int, float]] | None:
    """``fused_last``: sum the last phrase of an odd count as fma(ratio, idf,
    sum so far), one rounding, as aarch64 builds of FTS5 do."""
    state = _state(db)
    if not state.ok:
        return None
    if k <= 0:
        return []
    tokens = []
    for term in terms:
        tok = state.token(term)
        if tok is None:
            return None
        tokens.append(tok)
    if not tokens:
        return []
    distinct = list(dict.fromkeys(tokens))
    marks = ",".join("?" * len(distinct))
    lists = {}  # token -> (rowids, contributions), views of the stored blobs
    for term, rowids, contribs in db.execute(
            f"SELECT term, rowids, contribs FROM lex_postings WHERE subject_id = ? AND term IN ({marks})",
            [subject_id, *distinct]):
        lists[term] = (np.frombuffer(rowids, dtype=state.rowid_dtype), np.frombuffer(contribs, dtype=np.float64))
    phrases = [tok for tok in tokens if tok in lists]  # query order, repeats kept: one phrase each
    if not phrases:
        return []
    fused = fused_last and len(tokens) % 2 == 1 and len(tokens) > 1 and tokens[-1] in lists
    head = None
    if fused:
        # the plain sums rank and cut (an ulp from the fused ones); the fused
        # sums, exact, are computed for the finalists only
        last_rows, last_contribs = lists[tokens[-1]]
        size = max(int(lists[tok][0][-1]) for tok in phrases) + 1
        head = (np.bincount(np.concatenate([lists[tok][0] for tok in phrases[:-1]]),
                            weights=np.concatenate([lists[tok][1] for tok in phrases[:-1]]), minlength=size)
                if len(phrases) > 1 else np.zeros(size))
        dense = head.copy()
        dense[last_rows] += last_contribs
        docs = np.flatnonzero(dense)
        scores = dense[docs]
    elif len(phrases) == 1:
        docs, scores = lists[phrases[0]]
    else:
        # FTS5 sums a row's phrase contributions in phrase order, from 0.0;
        # bincount adds its weights into each bin in input order: the lists
        # concatenated in phrase order give the same float sums, bit for bit
        dense = np.bincount(np.concatenate([lists[tok][0] for tok in phrases]),
                            weights=np.concatenate([lists[tok][1] for tok in phrases]))
        docs = np.flatnonzero(dense)  # every contribution is > 0
        scores = dense[docs]
    scope = _Scope(db, where, params)
    ids = scope.claim_id
    # the best m by score, scope-checked in that order, until k are in scope
    n = len(docs)
    m = min(n, k + (k >> 2))
    while True:
        top = np.argpartition(-scores, m - 1)[:m] if m < n else np.arange(n)
        top = top[np.argsort(-scores[top], kind="stable")]
        rowids = docs[top].tolist()
        scope.check(rowids)
        in_scope = [i for i, rowid in zip(top.tolist(), rowids) if rowid in ids]
        if len(in_scope) >= k or m == n:
            break
        m = min(n, m * 4)
    if len(in_scope) >= k:
        # every row tying the k-th score competes on claim_id, as in ORDER BY
        cut = scores[in_scope[k - 1]]
        if fused:
            cut = cut - 4 * np.spacing(cut)  # any row the fused sum may lift past the k-th
        tied = np.flatnonzero(scores >= cut)
        rowids = docs[tied].tolist()
        scope.check(rowids)
        in_scope = [i for i, rowid in zip(tied.tolist(), rowids) if rowid in ids]
    finalists = docs[in_scope]
    if fused:
        final = _fused_sums(db, state, tokens[-1], finalists, head, last_rows,
                            _tfdl(db, subject_id, tokens[-1]))
    else:
        final = scores[in_scope].tolist()
    best = sorted((-1.0 * score, ids[rowid], rowid) for score, rowid in zip(final, finalists.tolist()))
    return [(rowid, bm25) for bm25, _, rowid in best[:k]]


def _tfdl(db: apsw.Connection, subject_id: str, token: str) -> np.ndarray:
    """One list's packed (tf, D) inputs."""
    raw = db.execute("SELECT tfdl FROM lex_postings WHERE subject_id = ? AND term = ?", (subject_id, token)).fetchone()
    return np.frombuffer(raw[0], dtype=np.uint64)


def _fused_sums(db: apsw.Connection, state, token: str, finalists: np.ndarray, head: np.ndarray,
                last_rows: np.ndarray, last_tfdl: np.ndarray) -> list[float]:
    """fma(ratio, idf, head sum) for rows holding the last phrase, with one
    rounding (exact rationals: no math.fma before Python 3.13); the head sum
    alone for the others."""
    from fractions import Fraction
    n_rows, avgdl = state.n_rows, state.avgdl
    if state.vocab_rows is None:
        db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.lex_vocab_rows"
                   " USING fts5vocab(main, 'claims_fts', 'row')")
        state.vocab_rows = True
    df = db.execute("SELECT doc FROM temp.lex_vocab_rows WHERE term = ?", (token,)).fetchone()[0]
    idf = Fraction(idf_for(n_rows, df))
    at = np.searchsorted(last_rows, finalists)
    out = []
    for rowid, i in zip(finalists.tolist(), at.tolist()):
        s = float(head[rowid])
        if i < len(last_rows) and int(last_rows[i]) == rowid:
            key = int(last_tfdl[i])
            tf, dl = float(key >> _TF_SHIFT), float(key & _DL_MASK)
            ratio = (tf * (K1 + 1.0)) / (tf + K1 * (1 - B + B * dl / avgdl))
            s = float(Fraction(ratio) * idf + Fraction(s))
        out.append(s)
    return out
