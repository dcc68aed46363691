"""The rebuild function's work: what ``handler.rebuild.handler`` runs.

Three ways in (docs/architecture.md, "Freshness on Lambda"):

- **The rebuild queue** (an SQS event, ``infra/events/sqs-rebuild.json``):
  each record asks for one organization's rebuild (``core.rebuild.queue``).
  Records of the same organization in a batch are served by one rebuild;
  each organization is rebuilt on its own, all of them at the same time
  (one's follow-up wait holds up no other), a message naming an
  organization no one registered is dropped, and the answer is a partial-batch
  response, ``{"batchItemFailures": [{"itemIdentifier": <messageId>}, ...]}``,
  naming only the messages of organizations that failed, so SQS retries
  those alone (the queue's redrive policy moves a message that keeps failing
  to the dead-letter queue). A request the published generation already
  covers is acknowledged without rebuilding.
- **The EventBridge schedule** (any other event without ``org_id``, e.g.
  ``infra/events/schedule.json``): the safety net. Each registered
  organization costs one pointer read and one ledger listing
  (``core.rebuild.backlog``); only those with entries past their published watermark
  are enqueued (with ``TITEN_REBUILD_QUEUE_URL``; without one, e.g. ``sam
  local invoke``, they are rebuilt here, in turn). No snapshot is read to
  decide.
- **A direct invoke** with ``{"org_id": "acme"}`` (``infra/events/rebuild-org.json``)
  rebuilds that organization now; ``"from_scratch": true`` replays its whole
  ledger and publishes even when nothing is new.

Each organization gets exactly one JSON line on stdout (CloudWatch Logs)::

    {"event": "rebuild", "org_id": "acme", "status": "published", "generation": 7,
     "published": true, "entries_applied": 12, "claim_count": 5210,
     "seconds": 1.84, "bytes": 4194304, "freshness_lag_seconds": 2.31, ...}

``freshness_lag_seconds`` (a publishing build only) is how long the oldest
entry the build applied had been in the ledger when the generation was
published: what a write waited, at worst, to become compile-visible (plus
the readers' TTL). With ``TITEN_METRICS=emf`` every publishing build also
writes its metrics (seconds, entries applied, bytes, freshness lag) and
every ``failed`` line a ``RebuildFailures`` count, as EMF documents on
stdout (core.observe.metrics).

``status`` is one of ``published``, ``unchanged``, ``covered`` (a queued
request the serving generation already holds), ``enqueued`` (the schedule
asked the queue), ``conflict`` (another rebuild published first: its
generation serves, nothing is lost), ``failed`` (the error is in the line)
or ``deferred`` (the invocation ran short of time before starting it).
Scheduled and direct invocations return a summary of the same lines; a
failed organization does not stop the others, but the invocation then ends
in an error so the function's ``Errors`` metric (and any alarm on it) sees
it. Rebuilds of different organizations run in parallel (no reserved
concurrency of 1 any more): one writer per organization comes from the
queue's message group plus the pointer's compare-and-swap.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from core.keys import ORG_ID
from core.observe.emf import write_line
from core.observe.metrics import build_groups, failure_groups
from core.rebuild.backlog import backlog
from core.rebuild.queue import RebuildRequestInvalid, covered, parse_request, serve_request
from core.snapshot.pointer import read_pointer
from core.snapshot.publish import RebuildConflict

# Start no new organization with less than this much of the invocation left:
# a rebuild cut off by the Lambda timeout wastes its work (the previous
# generation keeps serving, so it is never harmful).
TIME_MARGIN_MS = 60_000
# the organizations of one SQS batch rebuild at the same time, four at most
# (a batch holds up to ten): each build is mostly storage and SQLite I/O and
# waits, which release the GIL, but each also holds a work file and its
# organization's kept copy in the environment's /tmp and memory
MAX_PARALLEL_ORGANIZATIONS = 4


class RebuildFailed(Exception):
    """At least one organization failed; the others were still rebuilt."""


def print_line(line: dict) -> None:
    """One JSON line on stdout: CloudWatch Logs on Lambda (whole, even from
    the threads of an SQS batch)."""
    write_line(json.dumps(line, sort_keys=True))


def _remaining_ms(context) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return float(remaining()) if remaining else float("inf")


def _line(org_id: str, status: str, generation, **extra) -> dict:
    return {"event": "rebuild", "org_id": org_id, "from_scratch": False, "status": status, "published": False,
            "entries_applied": 0, "generation": generation, "seconds": 0.0, "bytes": None, **extra}


def _is_sqs(event) -> bool:
    """An event with records is a batch of messages, never the schedule (a
    record that is not a well-formed SQS message is rejected on its own)."""
    records = event.get("Records") if isinstance(event, dict) else None
    return isinstance(records, list) and bool(records)


class RebuildRunner:
    """Runs rebuild events against one service; ``emit`` gets each line."""

    def __init__(self, service, emit=print_line):
        self.service = service
        self._print = emit

    def emit(self, line: dict) -> None:
        """One organization's line, and the metrics of a failure."""
        self._print(line)
        self.service.metrics.emit(failure_groups(line), org_id=line.get("org_id"))

    def handle(self, event, context=None) -> dict:
        if _is_sqs(event):
            return self.consume(event, context)
        started = time.monotonic()
        organizations, from_scratch = self._target(event)
        if isinstance(event, dict) and event.get("org_id") is not None:
            lines = []
            for org_id in organizations:
                line = self.rebuild_one(org_id, from_scratch)
                self.emit(line)
                lines.append(line)
        else:
            lines = self.scheduled(organizations, context)
        summary = {"organizations": len(lines),
                   "published": [x["org_id"] for x in lines if x["status"] == "published"],
                   "unchanged": [x["org_id"] for x in lines if x["status"] == "unchanged"],
                   "enqueued": [x["org_id"] for x in lines if x["status"] == "enqueued"],
                   "conflicts": [x["org_id"] for x in lines if x["status"] == "conflict"],
                   "failed": [x["org_id"] for x in lines if x["status"] == "failed"],
                   "deferred": [x["org_id"] for x in lines if x["status"] == "deferred"],
                   "results": lines,
                   "seconds": round(time.monotonic() - started, 3)}
        if summary["failed"]:
            errors = "; ".join(f"{x['org_id']}: {x['error']}" for x in lines if x["status"] == "failed")
            raise RebuildFailed(f"{len(summary['failed'])} of {len(lines)} organizations failed ({errors})")
        return summary

    def _target(self, event) -> tuple[list[str], bool]:
        event = event if isinstance(event, dict) else {}
        from_scratch = event.get("from_scratch", False)
        if not isinstance(from_scratch, bool):
            raise ValueError("from_scratch must be true or false")
        org_id = event.get("org_id")
        organizations = self.service.ledger.organizations()
        if org_id is None:
            if from_scratch:  # the scheduled pass would have ignored it
                raise ValueError("from_scratch needs org_id: a replay from empty is of one organization")
            return organizations, from_scratch
        if not isinstance(org_id, str) or not ORG_ID.fullmatch(org_id):
            raise ValueError("org_id must be 1-63 characters of a-z, 0-9, '_' or '-'")
        if org_id not in organizations:
            raise ValueError(f"no organization {org_id!r} is registered in {self.service.store.url}")
        return [org_id], from_scratch

    def rebuild_one(self, org_id: str, from_scratch: bool) -> dict:
        started = time.monotonic()
        line = {"event": "rebuild", "org_id": org_id, "from_scratch": from_scratch}
        try:
            result = self.service.builder(org_id).rebuild(from_scratch=from_scratch)
        except RebuildConflict:
            pointer, _ = read_pointer(self.service.store, org_id)
            return {**line, "status": "conflict", "published": False, "entries_applied": 0,
                    "generation": pointer["generation"] if pointer else 0,
                    "seconds": round(time.monotonic() - started, 3), "bytes": None}
        except Exception as exc:  # reported per organization; the rest still run
            return {**line, "status": "failed", "published": False, "entries_applied": 0,
                    "generation": None, "seconds": round(time.monotonic() - started, 3), "bytes": None,
                    "error": f"{type(exc).__name__}: {exc}"}
        line = {**line, "status": "published" if result.published else "unchanged",
                "published": result.published, "generation": result.generation,
                "entries_applied": result.entries_applied, "claim_count": result.claim_count,
                "content_hash": result.content_hash, "snapshot_key": result.snapshot_key,
                "seconds": round(result.seconds, 3), "bytes": result.snapshot_bytes,
                "published_bytes": result.published_bytes}
        if result.published and result.oldest_applied_ms is not None:
            line["freshness_lag_seconds"] = round(max(0.0, time.time() - result.oldest_applied_ms / 1000), 3)
        # every build's own metrics (a queued request may take two builds: core/rebuild/queue.py)
        self.service.metrics.emit(build_groups(line), org_id=org_id)
        return line

    def consume(self, event, context) -> dict:
        """An SQS batch: one rebuild per organization, the organizations at
        the same time (one's follow-up wait or slow build holds up no
        other); the failed ones' messages retried."""
        requests: dict[str, tuple[list[str], float]] = {}
        parsed: list[tuple[str, float, str]] = []
        for record in event["Records"]:
            # a rejected message is never retried: no rebuild can serve it (it leaves the queue)
            record = record if isinstance(record, dict) else {}
            message_id = record.get("messageId")
            try:
                if record.get("eventSource") != "aws:sqs" or not isinstance(message_id, str) or not message_id:
                    raise RebuildRequestInvalid("not an SQS message (eventSource aws:sqs, a messageId)")
                org_id, not_before = parse_request(record.get("body", ""))
            except RebuildRequestInvalid as exc:
                self.emit({"event": "rebuild", "status": "rejected", "message_id": message_id, "error": str(exc)})
                continue
            parsed.append((org_id, not_before, message_id))
        if parsed:
            try:
                registered = set(self.service.ledger.organizations())
            except Exception as exc:  # the store failed: every message is retried, none is lost
                for org_id in dict.fromkeys(org for org, _, _ in parsed):
                    self.emit(_line(org_id, "failed", None, error=f"listing the organizations failed: "
                                                                   f"{type(exc).__name__}: {exc}"))
                return {"batchItemFailures": [{"itemIdentifier": message_id} for _, _, message_id in parsed]}
        for org_id, not_before, message_id in parsed:
            if org_id not in registered:  # as a direct invoke refuses it: nothing is built for it
                self.emit({"event": "rebuild", "status": "rejected", "org_id": org_id, "message_id": message_id,
                           "error": f"no organization {org_id!r} is registered"})
                continue
            ids, latest = requests.get(org_id, ([], 0.0))
            requests[org_id] = (ids + [message_id], max(latest, not_before))

        def serve(org_id: str, ids: list[str], not_before: float) -> dict:
            if _remaining_ms(context) < TIME_MARGIN_MS:
                # too little time to build; enough for one pointer read, and a
                # request already covered is acknowledged, not redelivered
                # (redeliveries count toward the dead-letter queue)
                pointer, _ = read_pointer(self.service.store, org_id)
                line = (_line(org_id, "covered", pointer["generation"]) if covered(pointer, not_before)
                        else _line(org_id, "deferred", None))
            else:
                line = serve_request(self.service.store, org_id, not_before,
                                     lambda: self.rebuild_one(org_id, False))
                if line["status"] == "covered":
                    line = _line(org_id, "covered", line["generation"])
            line["messages"] = len(ids)
            self.emit(line)
            return line

        failures: list[str] = []
        if requests:
            with ThreadPoolExecutor(max_workers=min(len(requests), MAX_PARALLEL_ORGANIZATIONS),
                                    thread_name_prefix="titen-rebuild") as pool:
                served = {org_id: pool.submit(serve, org_id, ids, not_before)
                          for org_id, (ids, not_before) in requests.items()}
            for org_id, future in served.items():
                try:
                    line = future.result()
                except Exception as exc:  # rebuild_one reports its own; anything else still retries
                    line = _line(org_id, "failed", None, error=f"{type(exc).__name__}: {exc}")
                    self.emit(line)
                if line["status"] in ("failed", "deferred"):
                    failures.extend(requests[org_id][0])
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failures]}

    def scheduled(self, organizations: list[str], context) -> list[dict]:
        """The safety net: rebuild (or, with a queue, enqueue) only what is due."""
        queue = self.service.rebuild_queue
        lines = []
        for org_id in organizations:
            try:
                due = backlog(self.service.store, org_id, skew_seconds=self.service.settings.skew_seconds)
            except Exception as exc:
                line = _line(org_id, "failed", None, error=f"{type(exc).__name__}: {exc}")
            else:
                if not due.due:
                    line = _line(org_id, "unchanged", due.generation)
                elif queue is not None:
                    sent = queue.request(org_id)
                    line = _line(org_id, "enqueued" if sent else "failed", due.generation, reason=due.reason,
                                 **({} if sent else {"error": "the rebuild request could not be sent"}))
                elif _remaining_ms(context) < TIME_MARGIN_MS:
                    line = _line(org_id, "deferred", due.generation)
                else:
                    line = self.rebuild_one(org_id, False)
            self.emit(line)
            lines.append(line)
        return lines
