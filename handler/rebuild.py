"""Lambda entry point of the snapshot rebuild: ``handler.rebuild.handler``.

Invoked by the EventBridge schedule (any event without ``org_id``, e.g.
``infra/events/schedule.json``): every registered organization is rebuilt;
``SnapshotBuilder.rebuild`` publishes only when the ledger holds entries the
current generation has not applied. Invoked directly with
``{"org_id": "acme"}`` (``infra/events/rebuild-org.json``), only that
organization is rebuilt; ``"from_scratch": true`` replays its whole ledger
and publishes even when nothing is new.

Each organization gets exactly one JSON line on stdout (CloudWatch Logs)::

    {"event": "rebuild", "org_id": "acme", "status": "published", "generation": 7,
     "published": true, "entries_applied": 12, "claim_count": 5210,
     "seconds": 1.84, "bytes": 4194304, ...}

``status`` is one of ``published``, ``unchanged``, ``conflict`` (another
rebuild published first: its generation serves, nothing is lost),
``failed`` (the error is in the line) or ``deferred`` (the invocation ran
short of time before starting it; the next run picks it up). The function
returns a summary of the same lines. Conflicts are reported, not raised; a
failed organization does not stop the others, but the invocation then ends
in an error so the function's ``Errors`` metric (and any alarm on it) sees it.

The function runs with reserved concurrency 1 (template.yaml), so scheduled
runs never overlap; a direct invoke racing a scheduled run is safe anyway
(the pointer swap is compare-and-swap; the loser reports ``conflict``).
"""

from __future__ import annotations

import json
import sys
import time

from core.config import Settings
from core.keys import ORG_ID
from core.rebuild import RebuildConflict, read_pointer
from core.service import Service

# Start no new organization with less than this much of the invocation left:
# a rebuild cut off by the Lambda timeout wastes its work (the previous
# generation keeps serving, so it is never harmful).
TIME_MARGIN_MS = 60_000

service = Service(Settings.from_env())


class RebuildFailed(Exception):
    """At least one organization failed; the others were still rebuilt."""


def _target(event) -> tuple[list[str], bool]:
    event = event if isinstance(event, dict) else {}
    from_scratch = event.get("from_scratch", False)
    if not isinstance(from_scratch, bool):
        raise ValueError("from_scratch must be true or false")
    org_id = event.get("org_id")
    organizations = service.ledger.organizations()
    if org_id is None:
        return organizations, from_scratch
    if not isinstance(org_id, str) or not ORG_ID.match(org_id):
        raise ValueError("org_id must be 1-63 characters of a-z, 0-9, '_' or '-'")
    if org_id not in organizations:
        raise ValueError(f"no organization {org_id!r} is registered in {service.store.url}")
    return [org_id], from_scratch


def _remaining_ms(context) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return float(remaining()) if remaining else float("inf")


def rebuild_one(org_id: str, from_scratch: bool) -> dict:
    started = time.monotonic()
    line = {"event": "rebuild", "org_id": org_id, "from_scratch": from_scratch}
    try:
        result = service.builder(org_id).rebuild(from_scratch=from_scratch)
    except RebuildConflict:
        pointer, _ = read_pointer(service.store, org_id)
        return {**line, "status": "conflict", "published": False, "entries_applied": 0,
                "generation": pointer["generation"] if pointer else 0,
                "seconds": round(time.monotonic() - started, 3), "bytes": None}
    except Exception as exc:  # reported per organization; the rest still run
        return {**line, "status": "failed", "published": False, "entries_applied": 0,
                "generation": None, "seconds": round(time.monotonic() - started, 3), "bytes": None,
                "error": f"{type(exc).__name__}: {exc}"}
    return {**line, "status": "published" if result.published else "unchanged",
            "published": result.published, "generation": result.generation,
            "entries_applied": result.entries_applied, "claim_count": result.claim_count,
            "content_hash": result.content_hash, "snapshot_key": result.snapshot_key,
            "seconds": round(result.seconds, 3), "bytes": result.snapshot_bytes}


def handler(event, context=None) -> dict:
    started = time.monotonic()
    organizations, from_scratch = _target(event)
    lines = []
    for org_id in organizations:
        if _remaining_ms(context) < TIME_MARGIN_MS:
            line = {"event": "rebuild", "org_id": org_id, "from_scratch": from_scratch,
                    "status": "deferred", "published": False, "entries_applied": 0,
                    "generation": None, "seconds": 0.0, "bytes": None}
        else:
            line = rebuild_one(org_id, from_scratch)
        print(json.dumps(line, sort_keys=True), file=sys.stdout, flush=True)
        lines.append(line)
    summary = {"organizations": len(lines),
               "published": [x["org_id"] for x in lines if x["status"] == "published"],
               "unchanged": [x["org_id"] for x in lines if x["status"] == "unchanged"],
               "conflicts": [x["org_id"] for x in lines if x["status"] == "conflict"],
               "failed": [x["org_id"] for x in lines if x["status"] == "failed"],
               "deferred": [x["org_id"] for x in lines if x["status"] == "deferred"],
               "results": lines,
               "seconds": round(time.monotonic() - started, 3)}
    if summary["failed"]:
        errors = "; ".join(f"{x['org_id']}: {x['error']}" for x in lines if x["status"] == "failed")
        raise RebuildFailed(f"{len(summary['failed'])} of {len(lines)} organizations failed ({errors})")
    return summary
