"""Building the candidate index: whole from FTS5, or incrementally.

``build_lexical_index`` writes ``lex_stats`` and ``lex_postings`` whole from
FTS5 itself (an ``fts5vocab`` instance table, so tokenization is FTS5's by
construction; row sizes from ``claims_fts_docsize``). ``update_lexical_index``
is the incremental build: every FTS insert or delete moves N, avgdl and df,
hence *every* contribution, so it patches only the lists of the rows that
changed (their tokens from FTS5's own tokenizer, checked against the
averages record and the docsize table; any disagreement falls back to the
whole build) and then recomputes every list's contributions from its stored
``tfdl``. Both give byte-identical tables (tests/test_lexical.py).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections import defaultdict

import apsw

from core.lexical.bm25 import (FTS_TOKENIZER_ARGS, LEX_DDL, LEX_VERSION, TF_SHIFT, idf_for, price_list,
                               read_averages, varint)
from core.lexical.libm import LIBM_META_KEY, platform_fingerprint, priced_here, recorded_fingerprint
from core.meta_table import write_meta

_INSERT = "INSERT INTO lex_postings(subject_id, term, n, ub, rowids, contribs, tfdl) VALUES(?, ?, ?, ?, ?, ?, ?)"


def _write_stats(db: apsw.Connection, averages: bytes, n_rows: int, n_tokens: int, rowid_type: str) -> None:
    db.execute("DELETE FROM lex_stats")
    db.execute("INSERT INTO lex_stats(id, version, n_rows, n_tokens, averages, rowid_type, byteorder)"
               " VALUES(1, ?, ?, ?, ?, ?, ?)",
               (LEX_VERSION, n_rows, n_tokens, averages, rowid_type, sys.byteorder))
    # both build paths price every list after this, with this process's log()
    write_meta(db, **{LIBM_META_KEY: platform_fingerprint()})


def _rowid_type(db: apsw.Connection) -> str:
    max_rowid = db.execute("SELECT coalesce(max(rowid), 0) FROM claims").fetchone()[0]
    return "i" if max_rowid < 2**31 else "q"


def build_lexical_index(db: apsw.Connection) -> dict:
    """(Re)create lex_stats and lex_postings whole from claims_fts and claims.

    Run inside the build's write transaction after the last change to
    claims_fts."""
    db.execute("DROP TABLE IF EXISTS lex_stats; DROP TABLE IF EXISTS lex_postings")
    db.execute(LEX_DDL)
    averages, n_rows, n_tokens = read_averages(db)
    rowid_type = _rowid_type(db)
    _write_stats(db, averages, n_rows, n_tokens, rowid_type)
    if n_rows == 0:
        return {"mode": "whole", "n_rows": 0, "terms": 0, "postings": 0, "lists": 0}
    avgdl = float(n_tokens) / float(n_rows)
    doclen: dict[int, int] = {}
    for rowid, size in db.execute("SELECT id, sz FROM claims_fts_docsize"):
        doclen[rowid] = varint(size, 0)[0]
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
            tfdl.append(tf << TF_SHIFT | doclen[rowid])
        out = []
        for subject, (rows, tfdl) in by_subject.items():
            contribs, ub = price_list(idf, avgdl, tfdl)
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
    averages, n_rows, n_tokens = read_averages(db)
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
            if size is None or varint(size[0], 0)[0] != len(tokens):
                return build_lexical_index(db)
        tf: dict[str, int] = {}
        for tok in tokens:
            tf[tok] = tf.get(tok, 0) + 1
        for tok, count in tf.items():
            removed, added = edits.setdefault((subject_id, tok), (set(), {}))
            if sign > 0:
                added[rowid] = count << TF_SHIFT | len(tokens)
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
            contribs, ub = price_list(idf[term], avgdl, tfdl)
            out.append((ub, contribs.tobytes(), subject_id, term))
        db.executemany("UPDATE lex_postings SET ub = ?, contribs = ? WHERE subject_id = ? AND term = ?", out)
        stats["lists"] += len(out)
        after = batch[-1][:2]
    return stats
