"""Who may read what: the visibility rule, and the claim as its reader sees it.

docs/api.md §6: ``private`` records are read only by the principal that
wrote them, ``team`` records by principals whose key lists the record's
workspace, ``organization`` records by everyone in the organization. The
SQL form is embedded *inside* candidate and lookup queries, so a record the
caller may not read never leaves SQLite; the Python form guards records read
straight from the ledger (writes citing fresh observations, context runs).

A claim's evidence is filtered the same way, and that decides how the claim
reads: contradicting evidence the reader may not see neither marks nor
scores the claim for them (``disputed_for``), and such a claim reports
``active`` (``reported_status``). Compile, the evidence route and the MCP
tools all ask here.
"""

from __future__ import annotations

import json

from core.keys import Principal


def can_read(principal: Principal, visibility: str, workspace_id: str | None, owner_id: str) -> bool:
    if visibility == "organization":
        return True
    if visibility == "team":
        return workspace_id is not None and workspace_id in principal.workspaces
    return visibility == "private" and owner_id == principal.principal_id


def reader_tag(visibility: str, workspace_id: str | None, owner_id: str) -> str:
    """Who may read a record, as one value an index partitions on (the
    candidate postings, the vector rows): ``can_read`` as membership in
    ``reader_tags``."""
    if visibility == "organization":
        return "org"
    if visibility == "team":
        return f"team:{workspace_id}" if workspace_id is not None else "none"
    return f"private:{owner_id}"


def reader_tags(principal: Principal) -> list[str]:
    """The ``reader_tag`` values this principal may read."""
    return ["org", f"private:{principal.principal_id}", *(f"team:{w}" for w in principal.workspaces)]


def visibility_sql(principal: Principal, alias: str = "c") -> tuple[str, list]:
    """A predicate over ``alias.visibility/workspace_id/owner_id`` and its params."""
    parts = [f"{alias}.visibility = 'organization'",
             f"({alias}.visibility = 'private' AND {alias}.owner_id = ?)"]
    params: list = [principal.principal_id]
    if principal.workspaces:
        marks = ",".join("?" * len(principal.workspaces))
        parts.append(f"({alias}.visibility = 'team' AND {alias}.workspace_id IN ({marks}))")
        params.extend(principal.workspaces)
    return "(" + " OR ".join(parts) + ")", params


def readable_evidence(principal: Principal, evidence_json: "str | list") -> list[tuple[str, str]]:
    """(observation_id, relation) of a claim's sources this principal may
    read; ``evidence_json`` is the claim's stored evidence list
    (``core.snapshot.projections``: id, relation, visibility, workspace, owner),
    as stored or already parsed."""
    out = []
    entries = json.loads(evidence_json) if isinstance(evidence_json, str) else evidence_json
    for observation_id, relation, visibility, workspace_id, owner_id in entries:
        if visibility is not None and can_read(principal, visibility, workspace_id, owner_id):
            out.append((observation_id, relation))
    return out


def disputed_for(principal: Principal, disputed: bool, dispute_public: bool, evidence_json: str | None) -> bool:
    """Whether this reader sees the claim contradicted. ``dispute_public``:
    contradicted by evidence every reader of the organization may see, so
    the evidence list is read only when it is not."""
    if dispute_public:
        return True
    if not disputed:
        return False
    return any(rel == "contradicts" for _, rel in readable_evidence(principal, evidence_json))


def reported_status(status: str, disputed: bool) -> str:
    """The status a reader is shown: ``disputed`` only when it sees the dispute."""
    return "active" if status == "disputed" and not disputed else status
