"""How long the request being answered may still wait on the store.

On Lambda the API function has 29 s and API Gateway waits 30: past them
the caller gets the gateway's bare error, with no request id, instead of
the 503 envelope (docs/api.md §3). A store that throttles or hangs costs
each call up to its retries' backoff and timeouts, and a request makes
several calls in a row, so without a bound a slow store turned into that
bare error. The Lambda adapter (``handler/api.py``) sets a deadline from
the invocation's remaining time; the S3 store (``core.storage.s3``) begins
no call after it, and no retry that could outlast it, and fails the call
as a ``StoreError`` instead, which every route answers 503 UNAVAILABLE.
Nothing else sets one: the rebuild function, the CLI and ``titen serve``
wait for the store as long as its retries take.

A context variable, so it follows the request into the worker thread its
route runs in (anyio copies the context) and never leaks into another.
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from typing import Iterator

from core.storage.contract import StoreError


class DeadlinePassed(StoreError):
    """The request's time for the store is spent: a 503 like any store
    failure, logged in one line (the store itself may be healthy)."""


_DEADLINE: ContextVar[float | None] = ContextVar("titen_store_deadline", default=None)
_BOUNDED = False  # this process answers requests with deadlines (the Lambda API function)


def bound_requests() -> None:
    """Called by a process whose requests carry deadlines, before it opens
    its store: its S3 attempts then wait seconds, not a minute, to connect
    or read (``core.storage.s3``), so one attempt fits in a request's time.
    Other processes keep botocore's patient timeouts: a rebuild uploading a
    large snapshot may wait for S3's answer to its last byte."""
    global _BOUNDED
    _BOUNDED = True


def requests_bounded() -> bool:
    return _BOUNDED


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Store calls made in the block end by ``seconds`` from now."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the deadline (negative once past), or ``None``
    when no deadline is set."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()
