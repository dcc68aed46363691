"""Who may read what: the visibility rule, as SQL and as a plain check.

docs/api.md §6: ``private`` records are read only by the principal that wrote
them, ``team`` records by principals whose key lists the record's
workspace, ``organization`` records by everyone in the organization. The
SQL form is embedded *inside* candidate and lookup queries, so a record the
caller may not read never leaves SQLite; the Python form guards records read
straight from the ledger (writes citing fresh observations, context runs).
"""

from __future__ import annotations

from core.keys import Principal


def can_read(principal: Principal, visibility: str, workspace_id: str | None, owner_id: str) -> bool:
    if visibility == "organization":
        return True
    if visibility == "team":
        return workspace_id is not None and workspace_id in principal.workspaces
    return visibility == "private" and owner_id == principal.principal_id


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
