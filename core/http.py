"""The HTTP API (docs/api.md): one Starlette app for ``titen serve`` and Lambda.

Every route goes through ``endpoint``: it assigns the request id, enforces
the body rules, authenticates, runs the command and wraps the answer in the
success envelope; every failure is mapped here, once, to the error envelope.
An unexpected exception becomes a plain ``INTERNAL`` with the request id —
the traceback goes to the log, never to the caller.
"""

from __future__ import annotations

import json
import sys
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from core.errors import (Internal, MethodNotAllowed, NotFound, PayloadTooLarge, RequestTimeout, TitenError,
                         Unavailable, ValidationError, echo)
from core.evidence import claim_evidence
from core.idempotency import HEADER as IDEMPOTENCY_HEADER, parse_key as parse_idempotency_key
from core.ids import new_id
from core.keys import Principal
from core.mcp import PARSE_ERROR, SERVER_ERROR, McpServer, RpcError, message_id, rpc_error
from core.packing import dumps
from core.service import WRITE_ROUTES, Service
from core.snapshot import DAMAGE_ERRORS
from core.store import StoreError
from core.validation import MAX_BODY_BYTES, parse_json_body, parse_json_value

log = logging.getLogger("titen.http")


def envelope(status: int, payload: dict, request_id: str) -> Response:
    return json_response(status, dumps(payload), request_id)


def json_response(status: int, body: str, request_id: str) -> Response:
    return Response(body, status_code=status, media_type="application/json",
                    headers={"x-request-id": request_id, "cache-control": "no-store"})


@dataclass(frozen=True)
class Serialized:
    """A route's ``data`` already serialized with ``dumps``: compile sends
    the very text it estimated against the budget, not a second encoding."""
    json: str


def success_body(data, meta: dict) -> str:
    """``dumps({"data": data, "meta": meta})``, byte for byte."""
    if isinstance(data, Serialized):
        return '{"data":' + data.json + ',"meta":' + dumps(meta) + "}"
    return dumps({"data": data, "meta": meta})


def error_response(exc: TitenError, request_id: str) -> Response:
    return envelope(exc.status, {"error": {"code": exc.code, "message": exc.message},
                                 "meta": {"request_id": request_id}}, request_id)


async def read_body(request: Request, timeout: float = 10.0) -> dict:
    """The JSON body, within the edge rules of ``read_raw``."""
    return parse_json_body(await read_raw(request, timeout))


async def read_raw(request: Request, timeout: float = 10.0) -> bytes:
    """The body's bytes, within the edge rules (docs/api.md §4): at most 1 MiB,
    never ``Content-Length`` with ``Transfer-Encoding``, and all of it within
    ``timeout`` seconds (``TITEN_BODY_TIMEOUT``, else 408)."""
    length = request.headers.get("content-length")
    if length is not None and "transfer-encoding" in request.headers:
        raise ValidationError("Content-Length together with Transfer-Encoding is refused")
    if length is not None and not length.isdigit():
        raise ValidationError("Content-Length must be a decimal number of bytes")
    if length and int(length) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is {length} bytes; the limit is {MAX_BODY_BYTES} (1 MiB)")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise PayloadTooLarge(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes (1 MiB)")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None
    return b"".join(chunks)


Handler = Callable[[Request, Principal | None, dict | None], Awaitable[tuple[int, dict, dict]] | tuple]


def endpoint(service: Service, *, auth: bool = True, body: bool = False, inline: bool = False,
             serial: bool = False):
    """Wrap a synchronous route function. Its work (key lookups, SQLite,
    fsync, store calls, rebuilds) runs on Starlette's thread pool, never on
    the event loop, so ``/healthz`` answers while a rebuild runs
    (docs/architecture.md, "HTTP and errors"); ``inline`` is only for work
    that never blocks (``/healthz`` itself, so a full pool cannot delay it).
    ``serial`` routes read the organization's snapshot: they hold its
    serving lock (``SnapshotReader.serving_lock``) while they run."""
    def wrap(fn):
        def call(request, principal, payload):
            if not serial:
                return fn(request, principal, payload)
            with service.reader.serving_lock(principal.org_id):
                return fn(request, principal, payload)

        async def run(request: Request) -> Response:
            request_id = new_id("req")
            principal = None
            for name, value in request.path_params.items():
                # no id is longer: cut before anything can look it up or echo it
                request.path_params[name] = echo(value)
            try:
                if auth:
                    principal = await run_in_threadpool(service.keys.authenticate,
                                                        request.headers.get("authorization"))
                payload = await read_body(request, service.settings.body_timeout) if body else None
                if inline:
                    status, data, meta = fn(request, principal, payload)
                else:
                    status, data, meta = await run_in_threadpool(call, request, principal, payload)
                return json_response(status, success_body(data, {"request_id": request_id, **meta}), request_id)
            except RequestTimeout as exc:
                response = error_response(exc, request_id)
                response.headers["connection"] = "close"  # the rest of the body is never read
                return response
            except TitenError as exc:
                return error_response(exc, request_id)
            except ClientDisconnect:  # nobody to answer: one line, no traceback
                log.warning("client disconnected before sending the whole body [%s %s %s]",
                            request_id, request.method, echo(request.url.path))
                return error_response(ValidationError("client disconnected"), request_id)
            except DAMAGE_ERRORS as exc:  # a damaged snapshot file: evicted, never served
                if principal is None:
                    raise
                return error_response(service.snapshot_damaged(principal.org_id, exc), request_id)
            except StoreError:
                log.exception("store failure [%s]", request_id)
                return error_response(Unavailable("the store is unavailable; retry shortly"), request_id)
            except Exception:
                log.exception("unhandled error [%s]", request_id)
                return error_response(Internal(f"internal error; quote request id {request_id}"), request_id)
        return run
    return wrap


def mcp_endpoint(service: Service):
    """``POST /mcp`` (core/mcp.py): one JSON-RPC message in, one JSON answer
    out (202 for a notification); protocol and key failures are JSON-RPC
    errors at their HTTP status, tool failures are tool results."""
    server = McpServer(service)

    async def run(request: Request) -> Response:
        request_id = new_id("req")
        message = None
        try:
            raw = await read_raw(request, service.settings.body_timeout)
            try:
                message = parse_json_value(raw)
            except ValidationError as exc:
                raise RpcError(PARSE_ERROR, exc.message, 400) from None
            # on the thread pool, like every route's work (docs/architecture.md, "Liveness")
            answer = await run_in_threadpool(
                server.handle, message, lambda: service.keys.authenticate(request.headers.get("authorization")),
                request_id, request.headers.get("mcp-protocol-version"))
        except RpcError as exc:
            return mcp_error(exc.status, rpc_error(message_id(message), exc.code, exc.message), request_id)
        except ClientDisconnect:  # nobody to answer: one line, no traceback
            log.warning("client disconnected before sending the whole body [%s POST /mcp]", request_id)
            return mcp_error(400, rpc_error(None, SERVER_ERROR, "client disconnected",
                                            {"code": "VALIDATION_ERROR"}), request_id)
        except TitenError as exc:  # the key (401), the body's size (413) or its arrival (408)
            response = mcp_error(exc.status, rpc_error(message_id(message), SERVER_ERROR, exc.message,
                                                       {"code": exc.code}), request_id)
            if isinstance(exc, RequestTimeout):
                response.headers["connection"] = "close"  # the rest of the body is never read
            return response
        except StoreError:
            log.exception("store failure [%s]", request_id)
            return mcp_error(503, rpc_error(message_id(message), SERVER_ERROR, "the store is unavailable; retry "
                                            "shortly", {"code": "UNAVAILABLE"}), request_id)
        except Exception:
            log.exception("unhandled error [%s]", request_id)
            return mcp_error(500, rpc_error(message_id(message), SERVER_ERROR, f"internal error; quote request id "
                                            f"{request_id}", {"code": "INTERNAL"}), request_id)
        if answer is None:
            return Response(status_code=202, headers={"x-request-id": request_id})
        return json_response(200, dumps(answer), request_id)
    return run


async def openapi_json(request: Request) -> Response:
    """The OpenAPI 3.1 document (core/openapi.py), no key needed; built on first use."""
    from core.openapi import document_json
    return Response(document_json(), media_type="application/json", headers={"cache-control": "no-cache"})


def mcp_error(status: int, body: dict, request_id: str) -> Response:
    response = json_response(status, dumps(body), request_id)
    if status == 401:
        response.headers["www-authenticate"] = "Bearer"
    return response


# Every token count releases the GIL (tiktoken encodes outside it), and a
# thread that then wants it back waits for whoever took it to yield: up to
# the interpreter's switch interval, 5 ms by default. With route work on
# the thread pool and the local rebuild beside it, that wait, not the count,
# was most of what exact counting cost a compile over HTTP (bench/README.md,
# "The GIL switch interval"). The serving process yields every 0.2 ms.
GIL_SWITCH_INTERVAL_S = 0.0002


def create_app(service: Service) -> Starlette:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    @endpoint(service, auth=False, inline=True)
    def healthz(request, principal, body):
        return 200, {"status": "ok"}, {}

    @endpoint(service, auth=False)
    def readyz(request, principal, body):
        org = None
        if request.headers.get("authorization"):
            org = service.keys.authenticate(request.headers["authorization"]).org_id
        orgs = [org] if org else service.reader.loaded()
        unavailable = [reason for _, reason in (service.reader.check(o) for o in orgs) if reason]
        states = [service.reader.status(o) for o in orgs]
        loaded = [s for s in states if s["generation"]]
        newest = max(loaded, key=lambda s: s["generation"], default=None)
        vector_state, vector_error = service.vector_status(orgs)
        data = {"status": "not_ready" if unavailable else "ready",
                "generation": newest["generation"] if newest else 0,
                "generation_age_seconds": newest["generation_age_seconds"] if newest else None,
                "claim_count": sum(s["claim_count"] for s in states),
                "vector": vector_state,
                "organizations": len(loaded),
                "last_refresh_error": next((s["last_refresh_error"] for s in states
                                            if s["last_refresh_error"]), None),
                "last_eviction": next((s["last_eviction"] for s in states if s["last_eviction"]), None)}
        if unavailable:
            data["reason"] = unavailable[0]
        if vector_error:
            data["vector_error"] = vector_error
        return (503 if unavailable else 200), data, {}

    def write(route: str):
        """A write route: the service runs it, replaying a retried key."""
        @endpoint(service, body=True)
        def run(request, principal, body):
            key = parse_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
            outcome = service.write(principal, route, dict(request.path_params), body, key)
            return outcome.status, outcome.data, ({} if outcome.replay is None
                                                  else {"idempotent_replay": outcome.replay})
        return run

    @endpoint(service, serial=True)
    def evidence(request, principal, body):
        data, meta = claim_evidence(service.reader, principal, request.path_params["claim_id"])
        return 200, data, meta

    @endpoint(service, body=True)  # Compiler.compile holds the serving lock itself
    def compile_context(request, principal, body):
        outcome = service.compiler.compile(principal, body)
        return 200, Serialized(outcome.data_json), outcome.meta

    @endpoint(service)
    def stored_context(request, principal, body):
        return 200, service.compiler.stored_pack(principal, request.path_params["context_id"]), {}

    @endpoint(service)
    def admin_rebuild(request, principal, body):
        principal.require("admin")
        result = service.rebuild(principal.org_id)
        return 200, {"generation": result.generation, "published": result.published,
                     "entries_applied": result.entries_applied, "content_hash": result.content_hash,
                     "claim_count": result.claim_count, "snapshot_bytes": result.snapshot_bytes,
                     "seconds": round(result.seconds, 3), "notes": list(result.notes)}, {}

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        *(Route(route.split(" ", 1)[1], write(route), methods=["POST"]) for route in WRITE_ROUTES),
        Route("/v1/claims/{claim_id}/evidence", evidence, methods=["GET"]),
        Route("/v1/context/compile", compile_context, methods=["POST"]),
        Route("/v1/context/{context_id}", stored_context, methods=["GET"]),
        Route("/v1/admin/rebuild", admin_rebuild, methods=["POST"]),
        Route("/mcp", mcp_endpoint(service), methods=["POST"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        request_id = new_id("req")
        if exc.status_code == 405:
            return error_response(MethodNotAllowed(f"{echo(request.method)} is not allowed on "
                                                   f"{echo(request.url.path)}"), request_id)
        if exc.status_code == 404:
            return error_response(NotFound(f"no route {echo(request.url.path)}"), request_id)
        err = TitenError(exc.detail or "error")
        err.status, err.code = exc.status_code, "VALIDATION_ERROR" if exc.status_code < 500 else "INTERNAL"
        return error_response(err, request_id)

    async def crash(request: Request, exc: Exception) -> Response:
        request_id = new_id("req")
        log.exception("unhandled error [%s]", request_id)
        return error_response(Internal(f"internal error; quote request id {request_id}"), request_id)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: crash})
    app.state.service = service
    return app


__all__ = ["create_app", "envelope", "json"]
