"""Reads of one record by id, for the routes that name one (evidence, lifecycle writes).

The caller's organization and visibility are predicates inside each query,
so a record the caller may not read is indistinguishable from one that
does not exist: both come back ``None`` (or absent), and the route answers
the same 404.
"""

from __future__ import annotations

import json

from core.keys import Principal
from core.scope import visibility_sql
from core.snapshot.schema import CLAIM_COLUMNS


def claim_for_reader(db, principal: Principal, claim_id: str) -> dict | None:
    """A claim by id if this principal may read it (any status), else None."""
    vis, vis_params = visibility_sql(principal, "c")
    cursor = db.execute(
        f"SELECT {CLAIM_COLUMNS}, base_status, superseded_by FROM claims c"
        f" WHERE c.claim_id = ? AND c.org_id = ? AND {vis}", [claim_id, principal.org_id, *vis_params])
    row = cursor.fetchone()
    if row is None:
        return None
    names = [d[0] for d in cursor.getdescription()]
    return dict(zip(names, row))


def readable_claim_count(db, principal: Principal) -> int:
    """How many claims of the snapshot (any status, any subject) this
    principal may read: what ``/readyz`` reports to a key, so that another
    principal's private or team claims are not counted (docs/api.md §8.10)."""
    vis, vis_params = visibility_sql(principal, "c")
    return db.execute(f"SELECT count(*) FROM claims c WHERE c.org_id = ? AND {vis}",
                      [principal.org_id, *vis_params]).fetchone()[0]


def observations_for_reader(db, principal: Principal, ids: list[str]) -> dict[str, dict]:
    """The observations among ``ids`` this principal may read, by id."""
    if not ids:
        return {}
    vis, vis_params = visibility_sql(principal, "o")
    marks = ",".join("?" * len(ids))
    cursor = db.execute(
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


def claim_sources(db, claim_id: str) -> list[dict]:
    """Every source of a claim (the caller has already read the claim itself)."""
    return [{"observation_id": o, "relation": r} for o, r in db.execute(
        "SELECT observation_id, relation FROM claim_sources WHERE claim_id=? ORDER BY observation_id, relation",
        (claim_id,))]
