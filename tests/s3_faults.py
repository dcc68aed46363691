"""A fault layer over a real boto3 S3 client (moto behind it), through
botocore's own event hooks: not a fake of S3. Every attempt botocore sends
passes ``before-send``, where the layer may, at a given rate:

- **refuse** it with a 500 ``InternalError`` or a 503 ``SlowDown`` (throttling):
  the request is re-aimed at a bucket that does not exist, so moto applies
  nothing, and the fault answer is what botocore sees;
- answer 500 **after** moto applied it (the answer lost; the harshest 5xx);
- **drop** the connection before sending (``ConnectionClosedError``);
- **slow** a read (GET/HEAD/LIST) down by ``slow_seconds``;
- answer a conditional PUT with 409 ``ConditionalRequestConflict`` (refused);
- **race** the publish: just before a pointer compare-and-swap, run a
  competing rebuild (``on_race``), so the swap meets a real 412 from moto.

botocore's standard retry mode (jittered exponential backoff) retries the
5xx, throttling and connection faults; the store handles 409 and 412. At most
``max_in_a_row`` consecutive attempts of one thread are faulted, so a call is
never faulted past botocore's retry budget. ``counts`` tallies what was
injected, by kind and by operation.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from io import BytesIO
from urllib.parse import urlsplit, urlunsplit

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError

NOWHERE = "titen-fault-nowhere"


class _Raw(BytesIO):
    def stream(self, **kwargs):
        data = self.read()
        if data:
            yield data


def _error(url: str, status: int, code: str, message: str) -> AWSResponse:
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>fault</RequestId></Error>").encode()
    return AWSResponse(url, status, {"content-type": "application/xml"}, _Raw(body))


class FaultLayer:
    def __init__(self, client, bucket: str, *, rate: float = 0.3, seed: int = 12,
                 max_in_a_row: int = 2, slow_seconds: float = 0.02, race_rate: float = 0.0, on_race=None):
        self.bucket = bucket
        self.rate = rate
        self.rng = random.Random(seed)
        self.max_in_a_row = max_in_a_row
        self.slow_seconds = slow_seconds
        self.race_rate = race_rate
        self.on_race = on_race
        self.enabled = False
        self.counts: Counter = Counter()
        self.by_operation: Counter = Counter()
        self.calls: Counter = Counter()  # every call while enabled, faulted or not
        self._lock = threading.Lock()
        self._local = threading.local()
        client.meta.events.register_first("before-send.s3", self.before_send)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def suppressed(self):
        """``with layer.suppressed():`` this thread's calls pass untouched."""
        layer = self

        class _Quiet:
            def __enter__(self):
                layer._local.quiet = getattr(layer._local, "quiet", 0) + 1

            def __exit__(self, *exc):
                layer._local.quiet -= 1
        return _Quiet()

    def _refuse(self, request) -> None:
        """Re-aim the request at a bucket that does not exist: nothing applies."""
        parts = urlsplit(request.url)
        host, path = parts.netloc, parts.path
        if host.startswith(self.bucket + "."):
            host = NOWHERE + host[len(self.bucket):]
        else:
            path = path.replace("/" + self.bucket, "/" + NOWHERE, 1)
        request.url = urlunsplit((parts.scheme, host, path, parts.query, parts.fragment))

    def before_send(self, request, event_name: str, **kwargs):
        if not self.enabled or getattr(self._local, "quiet", 0):
            return None
        operation = event_name.rsplit(".", 1)[-1]
        in_a_row = getattr(self._local, "in_a_row", 0)
        with self._lock:
            self.calls[operation] += 1
            roll = self.rng.random()
            kind_roll = self.rng.random()
            race_roll = self.rng.random()
        headers = request.headers
        conditional_put = request.method == "PUT" and ("If-Match" in headers or "If-None-Match" in headers)
        is_pointer_cas = conditional_put and "If-Match" in headers and request.url.split("?")[0].endswith(
            "/snapshots/current.json")
        if is_pointer_cas and self.on_race is not None and race_roll < self.race_rate:
            self._tally("race_412", operation)
            with self.suppressed():
                self.on_race()  # a competing publisher swaps the pointer first: moto answers 412
            return None
        if in_a_row >= self.max_in_a_row or roll >= self.rate:
            self._local.in_a_row = 0
            return None
        self._local.in_a_row = in_a_row + 1
        read = request.method in ("GET", "HEAD")
        if read and kind_roll < 0.15:
            self._tally("slow_read", operation)
            self._local.in_a_row = 0  # a slow answer is still an answer
            time.sleep(self.slow_seconds)
            return None
        if conditional_put and kind_roll < 0.3:
            self._tally("conflict_409", operation)
            self._refuse(request)
            return _error(request.url, 409, "ConditionalRequestConflict",
                          "A conflicting conditional operation is currently in progress against this resource.")
        if kind_roll < 0.5:
            self._tally("throttle_503", operation)
            self._refuse(request)
            return _error(request.url, 503, "SlowDown", "Please reduce your request rate.")
        if kind_roll < 0.7:
            self._tally("refused_500", operation)
            self._refuse(request)
            return _error(request.url, 500, "InternalError", "We encountered an internal error.")
        if kind_roll < 0.85:
            self._tally("applied_then_500", operation)
            return _error(request.url, 500, "InternalError", "We encountered an internal error.")
        self._tally("connection_dropped", operation)
        raise ConnectionClosedError(endpoint_url=request.url)

    def _tally(self, kind: str, operation: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            self.by_operation[operation] += 1
