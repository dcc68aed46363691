"""Rebuild requests: one small SQS FIFO message asks for an organization's rebuild.

Why it exists: on Lambda a write must become compile-visible in seconds, not
at the next scheduled run (docs/architecture.md, "Freshness on Lambda"). A
write the ledger accepted sends one message to the rebuild queue
(``TITEN_REBUILD_QUEUE_URL``); the rebuild function consumes it. The queue
is an SQS FIFO queue, and the rules are:

- **MessageGroupId = the organization.** SQS delivers a group's messages one
  at a time (the next only once the previous is deleted), so one rebuild of
  an organization runs at a time while different organizations rebuild in
  parallel. The pointer's compare-and-swap stays the last word if two ever
  overlap.
- **MessageDeduplicationId = organization + a time bucket of
  ``BUCKET_SECONDS``.** SQS drops a message whose deduplication id it has
  seen in the last five minutes, so a burst of writes yields at most one
  message per organization per bucket. A write folded into an earlier
  message must still be applied: the message carries the end of its bucket
  (``not_before``). The consumer rebuilds at once (so the write that sent
  the message is visible without waiting); if that rebuild listed the ledger
  before ``not_before + CLOCK_MARGIN_SECONDS``, it waits for that instant
  (``wait_for_bucket``) and rebuilds once more, still holding the message
  (and so its group). Every write of the bucket was in the ledger before its
  enqueue, so the later listing sees it. The rebuild reads the ledger, never
  the message.
- **A message already covered is acknowledged without work**: the pointer
  records when its generation's ledger listing started
  (``ledger_listed_at``); a message whose bucket ended before that (with the
  margin) asks for nothing the serving generation lacks.
- **A failed enqueue never fails the write.** The ledger is canonical and the
  scheduled safety net (``core/rebuild/backlog.py``) enqueues every organization
  whose ledger holds entries past its published watermark. A failure is
  logged as one line and counted (``failures``).

One second: a burst of writes costs at most one message per second per
organization (and, since the consumer acknowledges covered requests without
work, about one rebuild per rebuild-duration), while the follow-up rebuild a
folded write may need comes at most 1.25 s after its bucket opened. A longer
bucket saves nothing the rebuild is not already saving (requests arriving
during a rebuild are covered by the next one) and delays those folded writes
by its length; a shorter one sends more messages for no gain in latency
(a lone write is rebuilt at once either way).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from core.errors import ValidationError
from core.instants import canonical, from_ms, parse_instant
from core.keys import ORG_ID
from core.snapshot.pointer import read_pointer

BUCKET_SECONDS = 1.0
# Clocks of Lambda environments follow Amazon Time Sync (well under a
# millisecond apart); a quarter second keeps a wide margin.
CLOCK_MARGIN_SECONDS = 0.25

log = logging.getLogger("titen.rebuild_queue")


def bucket_of(epoch_seconds: float) -> int:
    return int(epoch_seconds // BUCKET_SECONDS)


def bucket_end(bucket: int) -> float:
    return (bucket + 1) * BUCKET_SECONDS


def message_for(org_id: str, now: float | None = None) -> dict:
    """The SendMessage arguments (without QueueUrl) for one rebuild request."""
    now = time.time() if now is None else now
    bucket = bucket_of(now)
    body = {"org_id": org_id, "not_before": canonical(from_ms(int(bucket_end(bucket) * 1000)))}
    return {"MessageBody": json.dumps(body, sort_keys=True, separators=(",", ":")),
            "MessageGroupId": org_id, "MessageDeduplicationId": f"{org_id}-{bucket}"}


class RebuildRequestInvalid(ValidationError):
    """A queue message that is not a rebuild request (it is never retried)."""


def parse_request(body: str) -> tuple[str, float]:
    """(organization, not_before as epoch seconds) of a message body."""
    try:
        data = json.loads(body)
        org_id, not_before = data["org_id"], parse_instant(data["not_before"]).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise RebuildRequestInvalid(f"not a rebuild request: {type(exc).__name__}") from None
    if not isinstance(org_id, str) or not ORG_ID.fullmatch(org_id):
        raise RebuildRequestInvalid("not a rebuild request: bad org_id")
    return org_id, not_before


def wait_for_bucket(not_before: float, *, sleep=time.sleep, clock=time.time) -> float:
    """Sleep until every write folded into this request is surely in the
    ledger; returns the seconds waited. Never longer than one bucket and the
    margin: a bucket ends at most that far after its message was sent, and a
    message dated later (a forged or hand-written one) must not hold its
    organization's message group and the invocation until then."""
    remaining = min(not_before + CLOCK_MARGIN_SECONDS - clock(), BUCKET_SECONDS + CLOCK_MARGIN_SECONDS)
    if remaining > 0:
        sleep(remaining)
        return remaining
    return 0.0


def covered(pointer: dict | None, not_before: float) -> bool:
    """Whether the published generation's ledger listing started after this
    request's bucket closed, so it already holds every write the request
    stands for."""
    listed_at = (pointer or {}).get("ledger_listed_at")
    if not listed_at:
        return False
    return parse_instant(listed_at).timestamp() >= not_before + CLOCK_MARGIN_SECONDS


def serve_request(store, org_id: str, not_before: float, rebuild) -> dict:
    """One organization's queued request, given ``rebuild()`` (runs the
    organization's rebuild, returns its log line with a ``status``):

    - ``covered`` when the serving generation already holds it (no rebuild);
    - otherwise rebuilt at once — the write that sent it becomes visible
      without waiting — and, when that rebuild listed the ledger before the
      request's bucket closed, rebuilt once more after it closed, for writes
      folded into the request meanwhile;
    - ``failed`` (the message is retried) when a rebuild failed, or when a
      rival publisher won with a listing older than the bucket's end.
    """
    pointer, _ = read_pointer(store, org_id)
    if covered(pointer, not_before):
        return {"status": "covered", "generation": pointer["generation"], "published": False}
    line = rebuild()
    if line["status"] in ("published", "unchanged", "conflict"):
        pointer, _ = read_pointer(store, org_id)
        if not covered(pointer, not_before):
            waited = wait_for_bucket(not_before)
            again = rebuild()
            if again["status"] == "unchanged":  # nothing was folded in meanwhile
                line = {**line, "follow_up": "unchanged"}
            else:
                line = {**again, "first": {k: line.get(k) for k in ("status", "generation", "entries_applied")}}
            line["waited_seconds"] = round(waited, 3)
    if line["status"] == "conflict":
        pointer, _ = read_pointer(store, org_id)
        if not covered(pointer, not_before):
            line = {**line, "status": "failed", "error": "a rival rebuild published an older listing; retried"}
    return line


class RebuildQueue:
    """Sends rebuild requests to one SQS FIFO queue."""

    def __init__(self, queue_url: str, client=None):
        self.queue_url = queue_url
        # created here, at start-up (the Lambda init phase), not on the first write
        self.client = client if client is not None else self._make_client(queue_url)
        self._lock = threading.Lock()
        self.sent = 0
        self.failures = 0

    @staticmethod
    def _make_client(queue_url: str):
        import os
        import re

        import boto3
        from botocore.config import Config

        found = re.match(r"https://sqs\.([a-z0-9-]+)\.", queue_url)
        region = (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                  or (found.group(1) if found else None))
        # A write waits for this call: short timeouts, few retries; the
        # schedule catches anything that does not get through.
        return boto3.client("sqs", region_name=region, config=Config(
            connect_timeout=1, read_timeout=2, retries={"mode": "standard", "max_attempts": 2}))

    def request(self, org_id: str) -> bool:
        """Ask for ``org_id``'s rebuild. Never raises: True when sent."""
        try:
            self.client.send_message(QueueUrl=self.queue_url, **message_for(org_id))
        except Exception as exc:  # the write stands; the schedule enqueues it later
            with self._lock:
                self.failures += 1
            log.warning("rebuild request for %s not sent (%s: %s); the scheduled run will catch it up",
                        org_id, type(exc).__name__, exc)
            return False
        with self._lock:
            self.sent += 1
        return True
