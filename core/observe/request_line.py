"""One structured line per HTTP request, the same under ``titen serve`` and on Lambda.

Why it exists: an operator must be able to ask "which requests were slow,
failed, or for whom" of the logs alone (docs/operations.md, "Reading the
logs"). ``RequestLine`` is an ASGI middleware around the whole app, so every
request gets exactly one line — routed or not (404, 405), ``/mcp``,
``/openapi.json``, a crash — written when the answer has been sent::

    {"event": "request", "request_id": "req_…", "method": "POST", "route": "/v1/context/compile",
     "status": 200, "latency_ms": 41.7, "org_id": "acme", "candidates": 200, "items": 6,
     "used_tokens": 1187, "max_tokens": 1200, "vector": "disabled", "generation": 7,
     "generation_age_seconds": 12.4}

and, when metrics are on (``TITEN_METRICS=emf``), the request's metrics as
one EMF document (core.observe.metrics).

What the line may hold is an allowlist, each value checked against its
shape: the route *template* (``/v1/claims/{claim_id}/evidence``, never the
path with its ids), a method, a status, a latency, the organization, an
error code, compile's counts and states, the MCP method and tool name. A
task, a claim's or an observation's text, a reason, a key — anything a
caller wrote — has no field to go in.

The parts that know a request's facts note them through ``note_*``
functions (the key ring the organization, the error envelope the code,
compile its counts, the snapshot reader a failed refresh); they are no-ops
outside a request (the CLI, ``titen mcp``, the rebuild function). The facts
live in a context variable, which Starlette's thread pool carries into the
route's work.

``json`` (the default; Lambda) is one JSON object per line; ``text``
(``titen serve`` on a terminal) is the same facts for a person. Lines go to
stderr, metrics to stdout.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import threading
import time
from dataclasses import dataclass

from core.ids import new_id
from core.observe.emf import Metrics
from core.observe.metrics import request_groups

log = logging.getLogger("titen.observe")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
RPC_METHODS = frozenset({"initialize", "ping", "tools/list", "tools/call"})
VECTOR_STATES = frozenset({"disabled", "used", "error"})
_CODE = re.compile(r"^[A-Z][A-Z0-9_]{0,39}$")
_REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")
_LAMBDA_REQUEST_ID = re.compile(r"^[0-9a-f-]{36}$")


@dataclass
class Facts:
    """What the parts serving one request noted about it."""
    org_id: str | None = None
    code: str | None = None
    compiled: dict | None = None
    rpc_method: str | None = None
    tool: str | None = None
    refresh_failures: int = 0


_current: contextvars.ContextVar[Facts | None] = contextvars.ContextVar("titen_request_facts", default=None)


def note_organization(org_id: str) -> None:
    facts = _current.get()
    if facts is not None:
        facts.org_id = org_id


def note_error(code: str) -> None:
    """The code of the error envelope (or MCP error) this request answers."""
    facts = _current.get()
    if facts is not None:
        facts.code = code


def note_compile(*, candidates: int, items: int, used_tokens: int, max_tokens: int, vector: str,
                 generation: int, generation_age_seconds: float | None) -> None:
    facts = _current.get()
    if facts is not None:
        facts.compiled = {"candidates": candidates, "items": items, "used_tokens": used_tokens,
                          "max_tokens": max_tokens, "vector": vector, "generation": generation,
                          "generation_age_seconds": generation_age_seconds}


def note_rpc(message, tools) -> None:
    """``POST /mcp``: the JSON-RPC method (when it is one this server
    speaks) and, for ``tools/call``, the tool (when it is one of ``tools``)."""
    facts = _current.get()
    if facts is None or not isinstance(message, dict):
        return
    method = message.get("method")
    if isinstance(method, str):
        facts.rpc_method = (method if method in RPC_METHODS
                            else "notification" if method.startswith("notifications/") else "other")
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if method == "tools/call" and isinstance(name, str) and name in tools:
        facts.tool = name


def note_refresh_failure() -> None:
    """A snapshot refresh failed while serving this request (the previous
    generation, if any, kept serving)."""
    facts = _current.get()
    if facts is not None:
        facts.refresh_failures += 1


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def request_line(*, request_id: str | None, method: str, route: str | None, status: int, latency_ms: float,
                 facts: Facts, lambda_request_id: str | None = None) -> dict:
    """The line's fields, each checked against its shape (anything else is left out)."""
    line = {"event": "request",
            "request_id": request_id if request_id and _REQUEST_ID.match(request_id) else None,
            "method": method if method in METHODS else "OTHER", "route": route, "status": status,
            "latency_ms": round(latency_ms, 2),
            "org_id": facts.org_id}  # the authenticated key's organization (a stored record's)
    if isinstance(lambda_request_id, str) and _LAMBDA_REQUEST_ID.match(lambda_request_id):
        line["lambda_request_id"] = lambda_request_id
    code = facts.code or (f"HTTP_{status}" if status >= 400 else None)
    if code:
        line["code"] = code if _CODE.match(code) else "OTHER"
    compiled = facts.compiled
    if compiled is not None:
        for name in ("candidates", "items", "used_tokens", "max_tokens", "generation"):
            if _number(compiled.get(name)):
                line[name] = compiled[name]
        line["vector"] = compiled.get("vector") if compiled.get("vector") in VECTOR_STATES else "other"
        if _number(compiled.get("generation_age_seconds")):
            line["generation_age_seconds"] = round(compiled["generation_age_seconds"], 3)
    if facts.rpc_method:
        line["rpc_method"] = facts.rpc_method
    if facts.tool:
        line["tool"] = facts.tool
    if facts.refresh_failures:
        line["refresh_failures"] = facts.refresh_failures
    return line


def as_text(line: dict) -> str:
    """The line for a person: ``req_… POST /v1/context/compile 200 41.7ms org=acme …``."""
    words = [line["request_id"] or "-", line["method"], line["route"] or "(no route)", str(line["status"]),
             f"{line['latency_ms']:.1f}ms"]
    if line["org_id"]:
        words.append(f"org={line['org_id']}")
    if "code" in line:
        words.append(f"code={line['code']}")
    if "candidates" in line:
        words += [f"candidates={line['candidates']}", f"items={line.get('items')}",
                  f"tokens={line.get('used_tokens')}/{line.get('max_tokens')}", f"vector={line['vector']}",
                  f"generation={line.get('generation')}"]
    for name in ("rpc_method", "tool", "refresh_failures"):
        if name in line:
            words.append(f"{name}={line[name]}")
    return " ".join(words)


class RequestLine:
    """ASGI middleware: one line (and one metrics document) per HTTP request.

    A response without an ``x-request-id`` (``/openapi.json``) gets one, so
    every answer carries the id its line is logged under."""

    def __init__(self, app, *, metrics: Metrics | None = None, log_format: str | None = None, stream=None):
        self.app = app
        self.metrics = metrics
        self.text = log_format == "text"
        self._stream = stream
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        facts = Facts()
        token = _current.set(facts)
        started = time.perf_counter()
        answer = {"status": None, "request_id": None}

        async def sending(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                headers = list(message.get("headers") or [])
                found = next((v for k, v in headers if k.lower() == b"x-request-id"), None)
                if found is None:
                    answer["request_id"] = new_id("req")
                    message = {**message, "headers": headers + [(b"x-request-id", answer["request_id"].encode())]}
                else:
                    answer["request_id"] = found.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            # the app crashed past every handler: Starlette's outermost
            # middleware answers 500
            facts.code = facts.code or "INTERNAL"
            answer["status"] = answer["status"] or 500
            raise
        finally:
            _current.reset(token)
            try:
                self.report(scope, answer, (time.perf_counter() - started) * 1000, facts)
            except Exception:  # the answer is sent: a reporting bug must not fail it
                log.exception("writing the request line failed")

    def report(self, scope, answer: dict, latency_ms: float, facts: Facts) -> dict:
        route = scope.get("route")
        context = scope.get("aws.context")
        line = request_line(request_id=answer["request_id"], method=scope.get("method", ""),
                            route=getattr(route, "path", None), status=answer["status"] or 500,
                            latency_ms=latency_ms, facts=facts,
                            lambda_request_id=getattr(context, "aws_request_id", None))
        text = as_text(line) if self.text else json.dumps(line, separators=(",", ":"))
        stream = self._stream or sys.stderr  # looked up now: Lambda's (and a test's) current stderr
        with self._lock:
            stream.write(text + "\n")
            stream.flush()
        if self.metrics is not None:
            self.metrics.emit(request_groups(line), org_id=line["org_id"])
        return line
