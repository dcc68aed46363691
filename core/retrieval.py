"""Every SQL read of a snapshot, with scope as predicates inside the query.

Organization, subject, project, status, temporal validity and visibility are
WHERE clauses of the candidate and hydrate queries themselves, so a record
the caller may not read never reaches ranking, counts or normalization. The
same holds for by-id lookups: a claim the caller may not read is
indistinguishable from one that does not exist.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass

import apsw

from core.keys import Principal
from core.lexical import top_candidates
from core.planning import QueryPlan
from core.scope import can_read, visibility_sql
from core.snapshot import Snapshot

MAX_CANDIDATES = 200

CLAIM_FIELDS = ("rowid", "claim_id", "subject_id", "project_id", "workspace_id", "visibility", "owner_id",
                "statement", "kind", "confidence", "trust", "trust_level", "observer_id", "valid_from",
                "valid_to", "created_at", "created_s", "status", "version", "disputed", "dispute_public",
                "feedback_total", "feedback_positive", "feedback_negative", "evidence_json", "prefix_tokens")
CLAIM_COLUMNS = ", ".join(CLAIM_FIELDS)
COL = {name: i for i, name in enumerate(CLAIM_FIELDS)}


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
                   f"{alias}.status IN ('active', 'disputed')",
                   f"{alias}.valid_from <= ?", f"({alias}.valid_to IS NULL OR {alias}.valid_to > ?)", vis]
        params: list = [self.principal.org_id, self.subject_id, self.at, self.at, *vis_params]
        if self.project_id is not None:
            clauses.insert(2, f"{alias}.project_id = ?")
            params.insert(2, self.project_id)
        return " AND ".join(clauses), params


def lexical_candidates(snapshot: Snapshot, scope: CompileScope, plan: QueryPlan) -> list[tuple[int, float]]:
    """Step 2: (rowid, bm25) of the best in-scope FTS5 matches, best first.

    The precomputed postings (``core.lexical``) answer exactly what the FTS5
    query would — same rows, bit-identical bm25, same order — without scoring
    every match; when they cannot guarantee that, the FTS5 query runs."""
    where, params = scope.where()
    fast = top_candidates(snapshot.db, scope.subject_id, where, params, plan.terms, MAX_CANDIDATES)
    return fast if fast is not None else fts_candidates(snapshot.db, where, params, plan.match)


def fts_candidates(db, where: str, params: list, match: str, k: int = MAX_CANDIDATES) -> list[tuple[int, float]]:
    """The reference candidate query: FTS5 MATCH inside the scope, by bm25."""
    sql = (f"SELECT c.rowid, bm25(claims_fts) AS b FROM claims_fts JOIN claims c ON c.rowid = claims_fts.rowid"
           f" WHERE claims_fts MATCH ? AND {where} ORDER BY b, c.claim_id LIMIT {k}")
    return list(db.execute(sql, [match, *params]))


def hydrate(snapshot: Snapshot, scope: CompileScope, rowids: list[int]) -> list[tuple]:
    """Step 3: the claim rows for candidate ids, through the same scope."""
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
    sql = f"SELECT {columns} FROM claims c WHERE c.rowid IN carray(?) AND {where}"
    return list(snapshot.db.execute(sql, [apsw.carray(array("q", rowids)), *params]))


def disputed_for(principal: Principal, row: tuple) -> bool:
    """Whether this reader sees the claim contradicted. Contradicting evidence
    the reader may not read neither marks nor scores the claim for them."""
    if row[COL["dispute_public"]]:
        return True
    if not row[COL["disputed"]]:
        return False
    return any(rel == "contradicts" for _, rel in readable_evidence(principal, row[COL["evidence_json"]]))


def readable_evidence(principal: Principal, evidence_json: str) -> list[tuple[str, str]]:
    """(observation_id, relation) of the sources this principal may read."""
    out = []
    for observation_id, relation, visibility, workspace_id, owner_id in json.loads(evidence_json):
        if visibility is not None and can_read(principal, visibility, workspace_id, owner_id):
            out.append((observation_id, relation))
    return out


def claim_for_reader(snapshot: Snapshot | None, principal: Principal, claim_id: str) -> dict | None:
    """A claim by id if this principal may read it (any status), else None."""
    if snapshot is None:
        return None
    vis, vis_params = visibility_sql(principal, "c")
    cursor = snapshot.db.execute(
        f"SELECT {CLAIM_COLUMNS}, base_status, superseded_by FROM claims c"
        f" WHERE c.claim_id = ? AND c.org_id = ? AND {vis}", [claim_id, principal.org_id, *vis_params])
    row = cursor.fetchone()
    if row is None:
        return None
    names = [d[0] for d in cursor.getdescription()]
    return dict(zip(names, row))


def observations_for_reader(snapshot: Snapshot, principal: Principal, ids: list[str]) -> dict[str, dict]:
    if not ids:
        return {}
    vis, vis_params = visibility_sql(principal, "o")
    marks = ",".join("?" * len(ids))
    cursor = snapshot.db.execute(
        f"SELECT observation_id, subject_id, project_id, workspace_id, visibility, kind, content,"
        f" source_json, trust, occurred_at, created_at FROM observations o"
        f" WHERE o.observation_id IN ({marks}) AND o.org_id = ? AND {vis}",
        [*ids, principal.org_id, *vis_params])
    out = {}
    for row in cursor:
        record = dict(zip([d[0] for d in cursor.getdescription()], row))
        record["source"] = json.loads(record.pop("source_json"))
        out[record["observation_id"]] = record
    return out


def claim_sources(snapshot: Snapshot, claim_id: str) -> list[dict]:
    return [{"observation_id": o, "relation": r} for o, r in snapshot.db.execute(
        "SELECT observation_id, relation FROM claim_sources WHERE claim_id=? ORDER BY observation_id, relation",
        (claim_id,))]
