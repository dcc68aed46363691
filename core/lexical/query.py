"""The candidate index, queried: the best in-scope rows by bm25, exactly.

The phrases' tokens (FTS5's tokenizer, via ``Connection.fts5_tokenizer``)
→ their lists for the scope's subject (the stored blocks concatenated) and
their df → each posting's contribution priced now from its (tf, D) with
this index's N and avgdl (``bm25.contributions``; a list priced once is
kept for the connection, which is immutable) → every matching row's score summed in C (``numpy.bincount`` over the
lists concatenated in phrase order: the same additions in the same order as
FTS5's bm25(), so bit-identical sums) → the best rows by score,
scope-checked in that order by the caller's own predicate SQL until k are
in scope, then every row tying the k-th score, sorted by (bm25, claim_id)
as the FTS5 query orders them. How the platform's FTS5 adds the phrases
(plain or fused) is the probe's answer (``core.lexical.probe``).
"""

from __future__ import annotations

import json
import sys
import weakref
from array import array

import apsw
import numpy as np

from core.lexical.bm25 import (B, DL_MASK, FTS_TOKENIZER_ARGS, K1, LEX_VERSION, TF_SHIFT, contributions,
                               idf_for, read_averages)

# priced lists kept per connection, at most this many bytes each
PRICED_CACHE_BYTES = 16 << 20


class _State:
    __slots__ = ("ok", "tokenizer", "rowid_type", "rowid_dtype", "token_cache", "n_rows", "avgdl",
                 "priced", "priced_bytes", "indexes")

    def __init__(self, db: apsw.Connection):
        self.ok = False
        # a generation built before an index was added lacks it (LATER_INDEXES)
        self.indexes = frozenset(name for name, in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'"))
        self.token_cache: dict[str, str | None] = {}
        # (subject, readers, term) -> (rowids, contributions, tfdl, idf): a
        # snapshot connection never changes, so a list is priced once per
        # connection and set of readers
        self.priced: dict[tuple[str, tuple[str, ...], str], tuple] = {}
        self.priced_bytes = 0
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
        current, current_rows, _ = read_averages(db)
        self.ok = (version == LEX_VERSION and byteorder == sys.byteorder and bytes(averages) == current
                   and n_rows == current_rows)
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
        self.sql = f"SELECT c.rowid, c.claim_id FROM claims c NOT INDEXED WHERE c.rowid IN carray(?) AND {where}"
        self.params = params
        self.claim_id: dict[int, str] = {}   # in scope → claim_id
        self.checked: set[int] = set()
        self.out: set[int] = set()            # checked, not in scope
        self.complete = False                 # every in-scope row is in claim_id (``take``)

    def take(self, listed) -> None:
        """Every row of the scope (``listed``: rowid, claim_id) is known: a
        row is in scope exactly when it is among them, and no check queries."""
        self.claim_id.update(listed)
        self.complete = True

    def check(self, rowids) -> None:
        if self.complete:
            return
        todo = [r for r in rowids if r not in self.checked]
        if not todo:
            return
        self.checked.update(todo)
        ids = self.claim_id
        for rowid, claim_id in self.db.execute(self.sql, [apsw.carray(array("q", todo)), *self.params]):
            ids[rowid] = claim_id
        self.out.update(r for r in todo if r not in ids)


def _top_candidates(db: apsw.Connection, subject_id: str, readers, where: str, params: list,
                    terms, k: int, fused_last: bool = False,
                    narrowers=None) -> list[tuple[int, float]] | None:
    """``fused_last``: sum the last phrase of an odd count as fma(ratio, idf,
    sum so far), one rounding, as aarch64 builds of FTS5 do. ``narrowers``:
    (index, count SQL, params, listing SQL, params) of the scope through an
    index (``CompileScope.narrowers``)."""
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
    lists = _lists(db, state, subject_id, readers, distinct)  # token -> (rowids, contributions, tfdl, idf)
    phrases = [tok for tok in tokens if tok in lists]  # query order, repeats kept: one phrase each
    if not phrases:
        return []
    fused = fused_last and len(tokens) % 2 == 1 and len(tokens) > 1 and tokens[-1] in lists
    head = None
    if fused:
        # the plain sums rank and cut (an ulp from the fused ones); the fused
        # sums, exact, are computed for the finalists only
        last_rows, last_contribs = lists[tokens[-1]][:2]
        size = max(int(lists[tok][0][-1]) for tok in phrases) + 1
        head = (np.bincount(np.concatenate([lists[tok][0] for tok in phrases[:-1]]),
                            weights=np.concatenate([lists[tok][1] for tok in phrases[:-1]]), minlength=size)
                if len(phrases) > 1 else np.zeros(size))
        dense = head.copy()
        dense[last_rows] += last_contribs
        docs = np.flatnonzero(dense)
        scores = dense[docs]
    elif len(phrases) == 1:
        docs, scores = lists[phrases[0]][:2]
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
        if narrowers:
            # A scope the postings do not split on (a project, a time) may
            # admit few of the subject's matches, and checking them best first
            # by rowid then reaches nearly every one (40-60 ms at 50k for a
            # project, 120 ms for an `at` before the subject's memory). When
            # the scope, counted through an index (the count stops at the
            # matches left), holds fewer rows than are left to check, its rows
            # are listed instead and every match is decided.
            # The rows the checks would still read: all the matches left
            # when none was in scope so far, else about as many as the share
            # found in scope says reach k. Listing is taken only when it
            # reads fewer (a subject with a third of its claims lapsed
            # lists nothing: a few more checks find the k), and the count
            # stops there.
            left = n - m if not in_scope else min(n - m, m * k // len(in_scope) - m + 1)
            listing = None
            for index, count_sql, count_params, list_sql, list_params in narrowers:
                if index in state.indexes:
                    (size,), = db.execute(count_sql, [*count_params, left])
                    if size < left:
                        listing = (list_sql, list_params)
                        break
            narrowers = None  # counted once
            if listing is not None:
                scope.take(db.execute(*listing))
                listed = np.fromiter(ids, dtype=docs.dtype, count=len(ids))
                keep = np.flatnonzero(np.isin(docs, listed))
                in_scope = keep[np.argsort(-scores[keep], kind="stable")].tolist()  # as if all were checked
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
        final = _fused_sums(state, finalists, head, last_rows, lists[tokens[-1]][2], lists[tokens[-1]][3])
    else:
        final = scores[in_scope].tolist()
    best = sorted((-1.0 * score, ids[rowid], rowid) for score, rowid in zip(final, finalists.tolist()))
    return [(rowid, bm25) for bm25, _, rowid in best[:k]]


def _lists(db: apsw.Connection, state: _State, subject_id: str, readers, distinct: list[str]) -> dict:
    """The subject's lists of ``distinct`` tokens that ``readers`` may read
    (``core.scope.reader_tags``), priced: token → (rowids, contributions,
    tfdl, idf), rowids ascending. Postings of claims the caller may not read
    are in other lists, never read here: no work of this step grows with
    them (docs/api.md §9.3)."""
    readers = tuple(sorted(set(readers)))
    lists = {}
    todo = []
    for term in distinct:
        hit = state.priced.get((subject_id, readers, term))
        if hit is not None:
            lists[term] = hit
        else:
            todo.append(term)
    if not todo:
        return lists
    marks = ",".join("?" * len(todo))
    blocks: dict[str, list] = {}
    # Each (reader, term) pair is one lookup of the whole key: with IN lists
    # SQLite may seek (subject_id, reader) alone and filter the terms, which
    # the statistics make look cheap when most subjects are small, and then
    # read every posting block of a large subject. CROSS JOIN fixes the loop
    # order, so every key column is an equality.
    for term, reader, first, rowids, tfdl in db.execute(
            "SELECT lex_postings.term, lex_postings.reader, first_rowid, rowids, tfdl"
            " FROM json_each(?) AS r CROSS JOIN json_each(?) AS t CROSS JOIN lex_postings"
            " WHERE lex_postings.subject_id = ? AND lex_postings.reader = r.value AND lex_postings.term = t.value",
            [json.dumps(readers, ensure_ascii=False), json.dumps(todo, ensure_ascii=False), subject_id]):
        blocks.setdefault(term, []).append((reader, first, rowids, tfdl))
    if not blocks:
        return lists
    df = dict(db.execute(f"SELECT term, df FROM lex_terms WHERE term IN ({marks})", todo))
    for term, found in blocks.items():
        found.sort(key=lambda block: (block[0], block[1]))
        if len(found) == 1:
            rowids = np.frombuffer(found[0][2], dtype=state.rowid_dtype)
            tfdl = np.frombuffer(found[0][3], dtype=np.uint64)
        else:
            rowids = np.frombuffer(b"".join(block[2] for block in found), dtype=state.rowid_dtype)
            tfdl = np.frombuffer(b"".join(block[3] for block in found), dtype=np.uint64)
            if found[0][0] != found[-1][0]:  # lists of two readers: one ascending list
                order = np.argsort(rowids, kind="stable")
                rowids, tfdl = rowids[order], tfdl[order]
        idf = idf_for(state.n_rows, df[term])
        priced = (rowids, contributions(idf, tfdl, state.avgdl), tfdl, idf)
        lists[term] = priced
        size = rowids.nbytes * 2 + tfdl.nbytes * 2
        if state.priced_bytes + size > PRICED_CACHE_BYTES:
            state.priced.clear()
            state.priced_bytes = 0
        if size <= PRICED_CACHE_BYTES:
            state.priced[(subject_id, readers, term)] = priced
            state.priced_bytes += size
    return lists


def _fused_sums(state, finalists: np.ndarray, head: np.ndarray, last_rows: np.ndarray,
                last_tfdl: np.ndarray, last_idf: float) -> list[float]:
    """fma(ratio, idf, head sum) for rows holding the last phrase, with one
    rounding (exact rationals: no math.fma before Python 3.13); the head sum
    alone for the others."""
    from fractions import Fraction
    avgdl = state.avgdl
    idf = Fraction(last_idf)
    at = np.searchsorted(last_rows, finalists)
    out = []
    for rowid, i in zip(finalists.tolist(), at.tolist()):
        s = float(head[rowid])
        if i < len(last_rows) and int(last_rows[i]) == rowid:
            key = int(last_tfdl[i])
            tf, dl = float(key >> TF_SHIFT), float(key & DL_MASK)
            ratio = (tf * (K1 + 1.0)) / (tf + K1 * (1 - B + B * dl / avgdl))
            s = float(Fraction(ratio) * idf + Fraction(s))
        out.append(s)
    return out
