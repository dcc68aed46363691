"""Turning a validated write body into final records: pure, no I/O.

Defaults applied, trust and visibility checked against the writer's key,
validity windows made canonical, the claim record assembled; what a write
stores is decided here and nowhere else, so the routes, the batch route and
``titen import`` resolve a body the same way.
"""

from __future__ import annotations

from core.bodies import OBSERVATION
from core.errors import Forbidden, ValidationError, echo
from core.instants import canonical
from core.keys import Principal
from core.validation import Fields


def check_trust(principal: Principal, trust: str | None, path: str) -> None:
    if trust == "policy_approved":
        raise ValidationError(f"{path}: policy_approved is never accepted from a write")
    if trust == "verified" and not principal.has("memory:verify"):
        raise Forbidden(f"{path}: verified needs the memory:verify scope")


def check_workspace(principal: Principal, visibility: str, workspace_id: str | None, path: str) -> None:
    if visibility == "team" and workspace_id is None:
        raise ValidationError(f"{path}: workspace_id is required for team visibility")
    if workspace_id is not None and workspace_id not in principal.workspaces:
        raise Forbidden(f"{path}: this key is not a member of workspace {echo(workspace_id)}")


def claim_fields(f: Fields, path: str, *, created_at: str, require_core: bool = True) -> dict:
    claim = {
        "statement": f.take("statement", required=require_core),
        "kind": f.take("kind", required=require_core),
        "confidence": f.take("confidence", required=require_core),
        "observer_id": f.take("observer_id"),
    }
    valid_from = f.take("valid_from")
    valid_to = f.take("valid_to")
    if valid_from and valid_to and valid_to <= valid_from:
        raise ValidationError(f"{path}.valid_to must be later than valid_from")
    claim["valid_from"] = canonical(valid_from) if valid_from else None
    claim["valid_to"] = canonical(valid_to) if valid_to else None
    if claim["valid_to"] and not claim["valid_from"] and claim["valid_to"] <= created_at:
        raise ValidationError(f"{path}.valid_to must be later than valid_from (which defaults to now)")
    return claim


def claim_record(principal: Principal, hex_: str, fields: dict, created_at: str, **scope) -> dict:
    return {"claim_id": f"claim_{hex_}", "org_id": principal.org_id, "owner_id": principal.principal_id,
            "subject_id": scope["subject_id"], "project_id": scope["project_id"],
            "visibility": scope["visibility"], "workspace_id": scope["workspace_id"],
            "statement": fields["statement"], "kind": fields["kind"], "confidence": fields["confidence"],
            "trust": scope["trust"], "observer_id": fields.get("observer_id"),
            "valid_from": fields.get("valid_from") or created_at, "valid_to": fields.get("valid_to"),
            "created_at": created_at, "sources": scope["sources"]}


def build_observation(principal: Principal, body: dict, observation_id: str, claim_id: str,
                      created_at: str, path: str = "body") -> tuple[dict, list[dict]]:
    """Validate one observation body into its final records (no I/O)."""
    f = Fields(body, path, OBSERVATION)
    subject_id = f.take("subject_id")
    project_id = f.take("project_id")
    workspace_id = f.take("workspace_id")
    kind = f.take("kind")
    content = f.take("content")
    src = f.take("source")
    source = {"type": src.take("type"), "ref": src.take("ref")}
    if src.raw("id") is not None:
        source["id"] = src.take("id")
    trust = f.take("trust")
    check_trust(principal, trust, "trust" if path == "body" else f"{path}.trust")
    visibility = f.take("visibility")
    check_workspace(principal, visibility, workspace_id, path)
    occurred = f.take("occurred_at")
    claim_f = f.take("claim")
    observation = {"observation_id": observation_id, "org_id": principal.org_id,
                   "subject_id": subject_id, "project_id": project_id, "workspace_id": workspace_id,
                   "visibility": visibility, "owner_id": principal.principal_id, "kind": kind,
                   "content": content, "source": source, "trust": trust,
                   "occurred_at": canonical(occurred) if occurred else None, "created_at": created_at}
    claims = []
    if claim_f is not None:
        fields = claim_fields(claim_f, "claim" if path == "body" else f"{path}.claim", created_at=created_at)
        claims.append(claim_record(principal, claim_id[len("claim_"):], fields, created_at,
                                   subject_id=subject_id, project_id=project_id,
                                   visibility=visibility, workspace_id=workspace_id, trust=trust,
                                   sources=[{"observation_id": observation_id, "relation": "supports"}]))
    return observation, claims


def observation_answer(observation: dict, claims: list[dict]) -> dict:
    return {"observation_id": observation["observation_id"],
            "claim_id": claims[0]["claim_id"] if claims else None,
            "subject_id": observation["subject_id"], "project_id": observation["project_id"],
            "trust": observation["trust"], "visibility": observation["visibility"],
            "created_at": observation["created_at"]}
