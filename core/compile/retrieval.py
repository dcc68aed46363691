"""Compile's SQL: the candidate and hydrate queries, with scope inside them.

Organization, subject, project, status, temporal validity and visibility
are WHERE clauses of the candidate and hydrate queries themselves
(``CompileScope.where``), so a record the caller may not read never reaches
ranking, counts or normalization.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import apsw

from core.compile.planning import QueryPlan
from core.domain import COMPILABLE_SQL
from core.keys import Principal
from core.lexical import top_candidates
from core.scope import reader_tags, visibility_sql
from core.snapshot.reader import Snapshot
from core.snapshot.schema import CLAIM_COLUMNS

MAX_CANDIDATES = 200


@dataclass(frozen=True)
class CompileScope:
    """Step 1 of compile: who asks, about whom, as of when."""
    principal: Principal
    subject_id: str
    project_id: str | None
    at: str  # canonical instant

    def where(self, alias: str = "c") -> tuple[str, list]:
        vis, vis_params = visibility_sql(self.principal, alias)
        clauses = [f"{alias}.org_id = ?", f"{alias}.subject_id = ?",
                   f"{alias}.status IN {COMPILABLE_SQL}",
                   f"{alias}.valid_from <= ?", f"({alias}.valid_to IS NULL OR {alias}.valid_to > ?)", vis]
        params: list = [self.principal.org_id, self.subject_id, self.at, self.at, *vis_params]
        if self.project_id is not None:
            clauses.insert(2, f"{alias}.project_id = ?")
            params.insert(2, self.project_id)
        return " AND ".join(clauses), params

    def narrowers(self) -> list[tuple[str, str, list, str, list]]:
        """Ways to list this scope's rows through an index, for the candidate
        step to take when they are fewer than the matches it has left to
        check one by one by rowid (``core.lexical.top_candidates``): each is
        (index, count SQL ending in ``LIMIT ?``, its params, listing SQL, its
        params). The count is a size to compare, not the scope: the listing
        runs the whole predicate.

        - a project, through ``claims_scope`` (subject, status, project): the
          postings are split by subject and reader, not by project;
        - the rows valid at ``at``, through ``claims_valid`` (subject,
          valid_from, valid_to): few when ``at`` lies before most of the
          subject's memory or after most of it has lapsed."""
        where, params = self.where()
        found = []
        if self.project_id is not None:
            found.append(("claims_scope",
                          f"SELECT count(*) FROM (SELECT 1 FROM claims c INDEXED BY claims_scope WHERE"
                          f" c.subject_id = ? AND c.status IN {COMPILABLE_SQL} AND c.project_id = ? LIMIT ?)",
                          [self.subject_id, self.project_id],
                          f"SELECT c.rowid, c.claim_id FROM claims c INDEXED BY claims_scope WHERE {where}", params))
        found.append(("claims_valid",
                      "SELECT count(*) FROM (SELECT 1 FROM claims c INDEXED BY claims_valid WHERE c.subject_id = ?"
                      " AND c.valid_from <= ? AND (c.valid_to IS NULL OR c.valid_to > ?) LIMIT ?)",
                      [self.subject_id, self.at, self.at],
                      f"SELECT c.rowid, c.claim_id FROM claims c INDEXED BY claims_valid WHERE {where}", params))
        return found


def lexical_candidates(snapshot: Snapshot, scope: CompileScope, plan: QueryPlan) -> list[tuple[int, float]]:
    """Step 2: (rowid, bm25) of the best in-scope FTS5 matches, best first.

    The precomputed postings (``core.lexical``) answer exactly what the FTS5
    query would — same rows, bit-identical bm25, same order — without scoring
    every match; when they cannot guarantee that, the FTS5 query runs."""
    where, params = scope.where()
    fast = top_candidates(snapshot.db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms,
                          MAX_CANDIDATES, scope.narrowers())
    return fast if fast is not None else fts_candidates(snapshot.db, where, params, plan.match)


def fts_candidates(db, where: str, params: list, match: str, k: int = MAX_CANDIDATES) -> list[tuple[int, float]]:
    """The reference candidate query: FTS5 MATCH inside the scope, by bm25."""
    return list(db.execute(fts_candidates_sql(where, k), [match, *params]))


def fts_candidates_sql(where: str, k: int) -> str:
    """CROSS JOIN keeps the MATCH the outer loop: with an index on the scope's
    columns (claims_valid) the planner may otherwise walk the subject's rows
    and run the MATCH once per row (0.8 s a query on 7,500 claims)."""
    return (f"SELECT c.rowid, bm25(claims_fts) AS b FROM claims_fts CROSS JOIN claims c ON c.rowid = claims_fts.rowid"
            f" WHERE claims_fts MATCH ? AND {where} ORDER BY b, c.claim_id LIMIT {k}")


def hydrate(snapshot: Snapshot, scope: CompileScope, rowids: list[int]) -> list[tuple]:
    """Step 3: the claim rows (``CLAIM_FIELDS``) for candidate ids, through the same scope."""
    return _scoped(snapshot, scope, rowids, CLAIM_COLUMNS)


def in_scope(snapshot: Snapshot, scope: CompileScope, rowids: list[int]) -> list[int]:
    """Step 3 for claims whose row the caller already holds from this
    generation: the hydrate query itself, reading back only the ids it admits."""
    return [rowid for rowid, in _scoped(snapshot, scope, rowids, "c.rowid")]


def hydrate_fields(snapshot: Snapshot, scope: CompileScope, rowids: list[int], fields: tuple[str, ...]) -> list[tuple]:
    """The hydrate query reading only ``fields`` (names from CLAIM_FIELDS)."""
    return _scoped(snapshot, scope, rowids, ", ".join(f"c.{name}" for name in fields))


def _scoped(snapshot: Snapshot, scope: CompileScope, rowids: list[int], columns: str) -> list[tuple]:
    if not rowids:
        return []
    where, params = scope.where()
    # ids bound as one carray: the planner then always reads claims by rowid
    # (with a literal IN list it may walk the subject's scope index instead)
    sql = f"SELECT {columns} FROM claims c NOT INDEXED WHERE c.rowid IN carray(?) AND {where}"
    return list(snapshot.db.execute(sql, [apsw.carray(array("q", rowids)), *params]))
