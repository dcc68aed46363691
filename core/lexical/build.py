"""Building the candidate index: whole from FTS5, or incrementally.

``build_lexical_index`` writes ``lex_stats``, ``lex_postings`` and
``lex_terms`` whole from FTS5 itself (an ``fts5vocab`` instance table, so
tokenization is FTS5's by construction; row sizes from
``claims_fts_docsize``). ``update_lexical_index`` is the incremental build:
postings hold only each row's own (tf, D), never a bm25 contribution (those
depend on N, avgdl and df, which every insert moves, and are priced at
query time: ``core.lexical.query``), so it edits only the blocks of the
lists the changed rows are in (their tokens from FTS5's own tokenizer,
checked against the averages record and the docsize table; any
disagreement falls back to the whole build) and those terms' df. Both
builds hold the same lists and df, cut into blocks differently
(tests/test_lexical.py).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections import defaultdict

import apsw

from core.lexical.bm25 import (BLOCK_POSTINGS, FTS_TOKENIZER_ARGS, LEX_DDL, LEX_VERSION, TAIL_POSTINGS, TF_SHIFT,
                               read_averages, varint)
from core.lexical.libm import LIBM_META_KEY, platform_fingerprint
from core.lexical.words import index_text
from core.meta_table import write_meta
from core.scope import reader_tag

_INSERT = ("INSERT INTO lex_postings(subject_id, reader, term, first_rowid, n, rowids, tfdl)"
           " VALUES(?, ?, ?, ?, ?, ?, ?)")


def _write_stats(db: apsw.Connection, averages: bytes, n_rows: int, n_tokens: int, rowid_type: str) -> None:
    db.execute("DELETE FROM lex_stats")
    db.execute("INSERT INTO lex_stats(id, version, n_rows, n_tokens, averages, rowid_type, byteorder)"
               " VALUES(1, ?, ?, ?, ?, ?, ?)",
               (LEX_VERSION, n_rows, n_tokens, averages, rowid_type, sys.byteorder))
    # what built it (informational: contributions are priced by the reader)
    write_meta(db, **{LIBM_META_KEY: platform_fingerprint()})


def _rowid_type(db: apsw.Connection) -> str:
    max_rowid = db.execute("SELECT coalesce(max(rowid), 0) FROM claims").fetchone()[0]
    return "i" if max_rowid < 2**31 else "q"


WRITE_BATCH = 4096  # posting rows per executemany in a whole build


def build_lexical_index(db: apsw.Connection) -> dict:
    """(Re)create lex_stats and lex_postings whole from claims_fts and claims.

    Run inside the build's write transaction after the last change to
    claims_fts."""
    db.execute("DROP TABLE IF EXISTS lex_stats; DROP TABLE IF EXISTS lex_postings; DROP TABLE IF EXISTS lex_terms")
    db.execute(LEX_DDL)
    averages, n_rows, n_tokens = read_averages(db)
    rowid_type = _rowid_type(db)
    _write_stats(db, averages, n_rows, n_tokens, rowid_type)
    if n_rows == 0:
        return {"mode": "whole", "n_rows": 0, "terms": 0, "postings": 0, "lists": 0}
    doclen: dict[int, int] = {}
    for rowid, size in db.execute("SELECT id, sz FROM claims_fts_docsize"):
        doclen[rowid] = varint(size, 0)[0]
    # each posting's list: its claim's subject and who may read it, so a
    # compile reads only the lists its caller may read
    subject_of = {rowid: (subject_id, reader_tag(visibility, workspace_id, owner_id))
                  for rowid, subject_id, visibility, workspace_id, owner_id in db.execute(
                      "SELECT rowid, subject_id, visibility, workspace_id, owner_id FROM claims WHERE indexed = 1")}
    if len(doclen) != n_rows or sum(doclen.values()) != n_tokens or not doclen.keys() <= subject_of.keys():
        raise RuntimeError("claims_fts statistics disagree with its docsize table or with claims.indexed")

    db.execute("DROP TABLE IF EXISTS temp.lex_vocab")
    db.execute("CREATE VIRTUAL TABLE temp.lex_vocab USING fts5vocab(main, 'claims_fts', 'instance')")
    stats = {"mode": "whole", "n_rows": n_rows, "terms": 0, "postings": 0, "lists": 0}

    # Rows are written in batches, not per term: a vocabulary of half a
    # million terms (CJK bigrams: most occur once) spent more time in one
    # statement per term than in the postings themselves.
    out: list[tuple] = []
    terms: list[tuple[str, int]] = []

    def write() -> None:
        db.executemany(_INSERT, out)
        db.executemany("INSERT INTO lex_terms(term, df) VALUES(?, ?)", terms)
        out.clear()
        terms.clear()

    def flush(term: str, docs: list[int], tfs: list[int]) -> None:
        before = len(out)
        if len(docs) == 1:  # the common case in a large vocabulary: one list of one posting
            rowid = docs[0]
            subject, reader = subject_of[rowid]
            out.append((subject, reader, term, rowid, 1, array(rowid_type, docs).tobytes(),
                        array("Q", (tfs[0] << TF_SHIFT | doclen[rowid],)).tobytes()))
        else:
            by_list: dict[tuple[str, str], tuple[array, array]] = defaultdict(
                lambda: (array(rowid_type), array("Q")))
            for rowid, tf in zip(docs, tfs):
                rows, tfdl = by_list[subject_of[rowid]]
                rows.append(rowid)
                tfdl.append(tf << TF_SHIFT | doclen[rowid])
            for (subject, reader), (rows, tfdl) in by_list.items():
                for at in range(0, len(rows), BLOCK_POSTINGS):
                    block = rows[at:at + BLOCK_POSTINGS]
                    out.append((subject, reader, term, block[0], len(block), block.tobytes(),
                                tfdl[at:at + BLOCK_POSTINGS].tobytes()))
        terms.append((term, len(docs)))
        stats["terms"] += 1
        stats["postings"] += len(docs)
        stats["lists"] += len(out) - before
        if len(out) >= WRITE_BATCH:
            write()

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
    write()
    db.execute("DROP TABLE temp.lex_vocab")
    return stats


class LexicalChanges:
    """The rows a build inserted into or deleted from claims_fts, in order.

    The builder records each change as it makes it, with the claim's
    statement as written; ``update_lexical_index`` turns them into
    posting-list edits, tokenizing what claims_fts holds of each statement
    (``index_text``), so no caller can hand it other words than the index's."""

    def __init__(self, record: bool = True):
        # a build from empty writes the index whole: nothing to remember
        self.record = record
        # (rowid, subject_id, reader, statement, +1 | -1); reader: core.scope.reader_tag
        self.rows: list[tuple[int, str, str, str, int]] = []

    def inserted(self, rowid: int, subject_id: str, reader: str, statement: str) -> None:
        if self.record:
            self.rows.append((rowid, subject_id, reader, statement, 1))

    def deleted(self, rowid: int, subject_id: str, reader: str, statement: str) -> None:
        if self.record:
            self.rows.append((rowid, subject_id, reader, statement, -1))


class _List:
    """One (subject, reader, term) list's blocks, edited in memory, written
    back by block: only the blocks an edit touched are rewritten."""

    def __init__(self, db: apsw.Connection, subject_id: str, reader: str, term: str, rowid_type: str):
        self.db, self.subject_id, self.reader, self.term, self.rowid_type = db, subject_id, reader, term, rowid_type
        self.firsts: list[int] = []
        self.blocks: list[tuple[array, array]] = []
        for first, rowids, tfdl in db.execute(
                "SELECT first_rowid, rowids, tfdl FROM lex_postings WHERE subject_id = ? AND reader = ? AND term = ?"
                " ORDER BY first_rowid", (subject_id, reader, term)):
            rows, inputs = array(rowid_type), array("Q")
            rows.frombytes(rowids)
            inputs.frombytes(tfdl)
            self.firsts.append(first)
            self.blocks.append((rows, inputs))
        self.original = set(self.firsts)
        self.dirty: set[int] = set()  # indexes into blocks

    def _holding(self, rowid: int) -> int:
        """The block whose range holds ``rowid`` (-1: before every block)."""
        return bisect_left(self.firsts, rowid + 1) - 1

    def remove(self, rowid: int) -> bool:
        b = self._holding(rowid)
        if b < 0:
            return False
        rows, inputs = self.blocks[b]
        i = bisect_left(rows, rowid)
        if i < len(rows) and rows[i] == rowid:
            del rows[i]
            del inputs[i]
            self.dirty.add(b)
            return True
        return False

    def add(self, rowid: int, key: int) -> bool:
        """Insert or replace one posting; True when the row is new to the list."""
        b = self._holding(rowid)
        if b >= 0:
            rows, inputs = self.blocks[b]
            i = bisect_left(rows, rowid)
            if i < len(rows) and rows[i] == rowid:
                inputs[i] = key
                self.dirty.add(b)
                return False
            if b == len(self.blocks) - 1 and i == len(rows) and len(rows) >= TAIL_POSTINGS:
                b = -2  # past a full last block: a new one
            else:
                rows.insert(i, rowid)
                inputs.insert(i, key)
                self.dirty.add(b)
                return True
        if b == -1 and self.blocks:  # before the first block: it grows downwards (a new key)
            rows, inputs = self.blocks[0]
            rows.insert(0, rowid)
            inputs.insert(0, key)
            self.firsts[0] = rowid
            self.dirty.add(0)
            return True
        rows, inputs = array(self.rowid_type, [rowid]), array("Q", [key])
        self.firsts.append(rowid)
        self.blocks.append((rows, inputs))
        self.dirty.add(len(self.blocks) - 1)
        return True

    def write(self) -> None:
        keep = set()
        for b in sorted(self.dirty):
            first, (rows, inputs) = self.firsts[b], self.blocks[b]
            if rows and rows[0] != first:  # its first row left: the block is keyed by its new first
                first = self.firsts[b] = rows[0]
            if rows:
                keep.add(first)
        for b in sorted(self.dirty):
            first, (rows, inputs) = self.firsts[b], self.blocks[b]
            if not rows:
                continue
            if first in self.original:
                self.db.execute("UPDATE lex_postings SET n = ?, rowids = ?, tfdl = ? WHERE subject_id = ?"
                                " AND reader = ? AND term = ? AND first_rowid = ?",
                                (len(rows), rows.tobytes(), inputs.tobytes(), self.subject_id, self.reader,
                                 self.term, first))
            else:
                self.db.execute(_INSERT, (self.subject_id, self.reader, self.term, first, len(rows),
                                          rows.tobytes(), inputs.tobytes()))
        live = {first for first, (rows, _) in zip(self.firsts, self.blocks) if rows}
        for gone in self.original - live:
            self.db.execute("DELETE FROM lex_postings WHERE subject_id = ? AND reader = ? AND term = ?"
                            " AND first_rowid = ?", (self.subject_id, self.reader, self.term, gone))


def update_lexical_index(db: apsw.Connection, changes: LexicalChanges, progress=None) -> dict:
    """Bring lex_stats/lex_postings/lex_terms up to date after ``changes`` to
    claims_fts: the same lists and df ``build_lexical_index`` would write,
    touching only the blocks of the lists the changes are in. Run it in a
    transaction after the one that made the changes: FTS5 writes its
    statistics out when that one commits.

    Falls back to the whole build when there is no current-version index to
    start from, when the rowid width must grow, or when the changes do not
    account exactly for the index's new statistics."""
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
    if not changes.rows and (n_rows, n_tokens) == (old_rows, old_tokens):
        # nothing entered or left the index: every list is still exact
        return {"mode": "unchanged", "n_rows": n_rows, "terms": 0, "postings": 0, "lists": 0, "edited": 0}

    # 1. the changed rows' postings, from FTS5's own tokenizer
    tokenizer = db.fts5_tokenizer(*FTS_TOKENIZER_ARGS)
    edits: dict[tuple[str, str, str], tuple[set[int], dict[int, int]]] = {}
    rows_delta = tokens_delta = 0
    for rowid, subject_id, reader, statement, sign in changes.rows:
        tokens = tokenizer(index_text(statement).encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None,
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
            removed, added = edits.setdefault((subject_id, reader, tok), (set(), {}))
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

    # 2. edit the touched lists' blocks, and their terms' df
    df_moved: dict[str, int] = {}
    postings = 0
    for (subject_id, reader, term), (removed, added) in sorted(edits.items()):
        edited = _List(db, subject_id, reader, term, rowid_type)
        moved = 0
        for rowid in sorted(removed):
            moved -= edited.remove(rowid)
        for rowid in sorted(added):
            moved += edited.add(rowid, added[rowid])
        edited.write()
        df_moved[term] = df_moved.get(term, 0) + moved
        postings += len(removed) + len(added)
    for term, moved in sorted(df_moved.items()):
        if not moved:
            continue
        found = db.execute("SELECT df FROM lex_terms WHERE term = ?", (term,)).fetchone()
        df = (found[0] if found else 0) + moved
        if df < 0:
            progress("candidate index: a term's df went negative; building it whole")
            return build_lexical_index(db)
        if df == 0:
            db.execute("DELETE FROM lex_terms WHERE term = ?", (term,))
        elif found:
            db.execute("UPDATE lex_terms SET df = ? WHERE term = ?", (df, term))
        else:
            db.execute("INSERT INTO lex_terms(term, df) VALUES(?, ?)", (term, df))
    return {"mode": "incremental", "n_rows": n_rows, "terms": len(df_moved), "postings": postings,
            "lists": len(edits), "edited": len(edits)}
