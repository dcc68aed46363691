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
- ``lex_postings(subject_id, reader, term, first_rowid, n, rowids, tfdl)``:
  for every subject, every reader (who may read the claim:
  ``core.scope.reader_tag``, so a compile reads only the lists its caller
  may read) and every indexed token, the rowids of those indexed claims
  containing the token (ascending, packed int32/int64) and,
  parallel to them, each posting's raw inputs ``tf << 32 | D`` (packed
  uint64: the row's term frequency and token count), cut into blocks keyed
  by their first rowid (``bm25.BLOCK_POSTINGS``, ``bm25.TAIL_POSTINGS``).
- ``lex_terms(term, df)``: each token's document frequency over the whole
  index.

No stored value depends on N, avgdl or df: a posting's bm25 contribution
is priced at query time, with FTS5's formula and operation order::

      idf = log((N - df + 0.5) / (df + 0.5)), 1e-6 if <= 0   (df over the whole index)
      c   = idf * ((tf * (k1 + 1.0)) / (tf + k1 * (1 - b + b * D / avgdl)))

  with k1 = 1.2, b = 0.75, avgdl = total / N, elementwise in numpy (one
  rounding per operation, as in C) and with this process's log() — the one
  its FTS5 calls — so the sums equal FTS5's bit for bit wherever they run.
  So a new claim changes only the blocks of the lists it is in and its
  terms' df: a few pages of the file, which is what lets a generation be
  published as a page delta (core/snapshot/delta.py).

``build.build_lexical_index`` writes them whole from FTS5 itself (an ``fts5vocab``
instance table, so tokenization is FTS5's by construction; row sizes from
``claims_fts_docsize``). ``build.update_lexical_index`` is the incremental build:
it edits the blocks of the lists of the rows that changed (their tokens
from FTS5's own tokenizer, checked against the averages record and the
docsize table; any disagreement falls back to the whole build) and their
terms' df. Both hold the same lists and df (tests/test_lexical.py).

Query side (``top_candidates`` here, the sums in ``query``): the phrases' tokens (same tokenizer, via
``Connection.fts5_tokenizer``) → their lists for the scope's subject, priced from their (tf, D) with the
index's N, avgdl and df (once per snapshot connection) → every matching row's score summed in C
(``numpy.bincount`` over the lists concatenated in phrase order: the same
additions in the same order as FTS5's bm25(), so bit-identical sums) → the
best rows by score, scope-checked in that order by the caller's own predicate
SQL until k are in scope, then every row tying the k-th score, sorted by
(bm25, claim_id) as the FTS5 query orders them. Whenever an exact answer
cannot be guaranteed (tables missing or stale, a term that is not exactly one
token) ``top_candidates`` returns None and the caller runs
the FTS5 query (``core.compile.retrieval.fts_candidates``), which stays the
reference.

numpy is a runtime dependency for this step alone: scoring a frequent term's
list (hundreds of thousands of postings at 342k claims) in Python costs tens
of milliseconds; MaxScore pruning in Python (an earlier answer)
halved that, the C loop cuts it by another 2-4x and needs no pruning.
"""

from __future__ import annotations

from core.lexical import probe, query
from core.lexical.bm25 import (B, FTS_DDL, FTS_TOKENIZER, FTS_TOKENIZER_ARGS, K1, LEX_VERSION, contribution,
                               idf_for)
from core.lexical.build import LexicalChanges, build_lexical_index, update_lexical_index
from core.lexical.libm import LIBM_META_KEY, platform_fingerprint, priced_here, recorded_fingerprint
from core.lexical.probe import PROBE_MAX_PHRASES, phrase_count_exact, phrase_count_mode
from core.lexical.query import forget

__all__ = ["B", "FTS_DDL", "FTS_TOKENIZER", "FTS_TOKENIZER_ARGS", "K1", "LEX_VERSION", "LIBM_META_KEY",
           "PROBE_MAX_PHRASES", "LexicalChanges", "build_lexical_index", "contribution", "forget", "idf_for",
           "phrase_count_exact", "phrase_count_mode", "platform_fingerprint", "priced_here", "recorded_fingerprint",
           "top_candidates", "update_lexical_index"]


def top_candidates(db, subject_id: str, readers, where: str, params: list, terms, k: int = 200,
                   narrowers: "list[tuple[str, str, list, str, list]] | None" = None):
    """(rowid, bm25) of the k best in-scope matches of '"t1" OR "t2" ...', best
    first, equal to the FTS5 candidate query; None when the lex tables cannot
    answer exactly (the caller then runs the FTS5 query).

    ``where``/``params`` are the scope predicate over alias ``c`` (as built by
    ``CompileScope.where``); ``subject_id`` is the subject that predicate pins
    and ``readers`` the caller's ``core.scope.reader_tags``: only their lists
    are read. ``narrowers`` (``CompileScope.narrowers``): counts and listings
    of the scope's rows through an index, for what the postings do not split
    on (a project, a time), one taken when it holds fewer rows than are left
    to check; one through an index this snapshot lacks is passed over.
    How this platform's FTS5 adds the phrases is the probe's answer."""
    mode = probe.phrase_count_mode(len(terms))
    if mode is None:
        return None
    return query._top_candidates(db, subject_id, readers, where, params, terms, k, fused_last=mode == "fused",
                                 narrowers=narrowers)
