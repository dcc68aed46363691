"""A claim and the sources its reader may see: ``GET /v1/claims/{id}/evidence`` and ``titen_evidence``.

One function serves the HTTP route and the MCP tool, so both apply the same
scope check and the same visibility rule (docs/api.md, evidence): a claim the
caller may not read is ``NOT_FOUND`` exactly like one that does not exist,
and a claim contradicted only by evidence this reader may not see reads as
``active``. It reads the snapshot through a connection leased for the request
(an apsw connection is used by one thread at a time).
"""

from __future__ import annotations

from core.errors import NotFound
from core.keys import Principal
from core.scope import disputed_for, readable_evidence, reported_status
from core.snapshot.lookups import claim_for_reader, observations_for_reader
from core.snapshot.reader import Snapshot, SnapshotReader


def claim_evidence(reader: SnapshotReader, principal: Principal, claim_id: str) -> tuple[dict, dict]:
    """(data, meta) of the evidence answer; ``meta`` names the generation read."""
    principal.require("context:compile")
    snapshot = reader.current(principal.org_id)
    if snapshot is None:
        raise NotFound(f"claim {claim_id} not found")
    with snapshot.lease():  # a connection of its own
        return _claim_evidence(snapshot, principal, claim_id)


def _claim_evidence(snapshot: Snapshot, principal: Principal, claim_id: str) -> tuple[dict, dict]:
    row = claim_for_reader(snapshot.db, principal, claim_id)
    if row is None:
        raise NotFound(f"claim {claim_id} not found")
    sources = readable_evidence(principal, row["evidence_json"])
    observed = observations_for_reader(snapshot.db, principal, [o for o, _ in sources])
    status = reported_status(row["status"], disputed_for(principal, row["disputed"], row["dispute_public"],
                                                         row["evidence_json"]))
    claim = {"claim_id": row["claim_id"], "claim": row["statement"], "kind": row["kind"],
             "confidence": row["confidence"], "trust": row["trust"], "status": status,
             "version": row["version"], "subject_id": row["subject_id"], "project_id": row["project_id"],
             "visibility": row["visibility"], "observer_id": row["observer_id"],
             "valid_from": row["valid_from"], "valid_to": row["valid_to"],
             "created_at": row["created_at"], "superseded_by": row["superseded_by"]}
    evidence_list = [{**observed[o], "relation": relation} for o, relation in sources if o in observed]
    return {"claim": claim, "evidence": evidence_list}, {"generation": snapshot.generation}
