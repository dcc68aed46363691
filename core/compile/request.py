"""A compile request, validated at the edge (docs/api.md §9): the one place
its fields are read from a body, defaults applied, instants made canonical."""

from __future__ import annotations

from dataclasses import dataclass

from core.bodies import COMPILE
from core.instants import canonical, now_utc
from core.validation import Fields


@dataclass(frozen=True)
class CompileRequest:
    subject_id: str
    task: str
    max_tokens: int
    project_id: str | None
    include_checkpoints: bool
    at: str      # canonical instant: validity and recency are evaluated as of it
    at_s: float  # the same instant in epoch seconds

    @classmethod
    def parse(cls, body: dict) -> "CompileRequest":
        f = Fields(body, "body", COMPILE)
        subject_id = f.take("subject_id")
        task = f.take("task")
        max_tokens = f.take("max_tokens")
        project_id = f.take("project_id")
        include_checkpoints = f.take("include_checkpoints")
        at = f.take("at") or now_utc()
        return cls(subject_id, task, max_tokens, project_id, include_checkpoints, canonical(at), at.timestamp())
