"""Every route's wrapper: the one place a failure becomes an error envelope.

``endpoint`` assigns the request id, enforces the body rules, authenticates,
runs the route's work on Starlette's thread pool and wraps the answer in the
success envelope; every failure is mapped here, once, to the error
envelope. An unexpected exception becomes a plain ``INTERNAL`` with the
request id — the traceback goes to the log, never to the caller.
``mcp_endpoint`` does the same for ``POST /mcp``, in JSON-RPC's shapes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from core.api.envelope import error_response, json_response, one_header, read_body, read_raw, success_body
from core.api.mcp import (INVALID_PARAMS, INVALID_REQUEST, MESSAGE_DEPTH, METHOD_NOT_FOUND, PARSE_ERROR,
                          SERVER_ERROR, TOOLS, McpServer, RpcError, message_id, rpc_error)
from core.budget.items import dumps
from core.errors import Internal, RequestTimeout, TitenError, Unavailable, ValidationError, echo, printable
from core.bodies import IDENTIFIER_MAX
from core.ids import new_id
from core.observe.request_line import note_error, note_rpc
from core.snapshot.reader import DAMAGE_ERRORS
from core.storage import StoreError
from core.storage.deadline import DeadlinePassed
from core.validation import parse_json_value

if TYPE_CHECKING:
    from core.service import Service

log = logging.getLogger("titen.http")


async def authenticated(service: Service, request: Request):
    """The request's principal, or ``Unauthenticated``. A key looked up within
    the cache period needs no I/O: answered here, without a hop to the thread
    pool and back."""
    authorization = one_header(request, "Authorization")
    return service.keys.cached(authorization) or await run_in_threadpool(service.keys.authenticate, authorization)


def endpoint(service: Service, *, auth: bool = True, body: bool = False, inline: bool = False):
    """Wrap a synchronous route function. Its work (key lookups, SQLite,
    fsync, store calls, rebuilds) runs on Starlette's thread pool, never on
    the event loop, so ``/healthz`` answers while a rebuild runs
    (docs/architecture.md, "HTTP and errors"); ``inline`` is only for work
    that never blocks (``/healthz`` itself, so a full pool cannot delay it)."""
    def wrap(fn):
        async def run(request: Request) -> Response:
            request_id = new_id("req")
            principal = None
            for name, value in request.path_params.items():
                # no id is longer: cut before anything can look it up or echo it
                # (a subject id is the caller's identifier, up to 128 characters)
                # (an id holding a character no id has is unknown: escaped, it
                # still finds nothing and its NOT_FOUND quotes no control)
                request.path_params[name] = (value[:IDENTIFIER_MAX + 1] if name == "subject_id"
                                             else printable(echo(value)))
            try:
                if auth:
                    principal = await authenticated(service, request)
                payload = await read_body(request, service.settings.body_timeout) if body else None
                if inline:
                    status, data, meta = fn(request, principal, payload)
                else:
                    status, data, meta = await run_in_threadpool(fn, request, principal, payload)
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
            except DeadlinePassed as exc:  # the request's time, not the store's health: one line
                log.warning("%s [%s]", exc, request_id)
                return error_response(Unavailable("the store is unavailable; retry shortly"), request_id)
            except StoreError:
                log.exception("store failure [%s]", request_id)
                return error_response(Unavailable("the store is unavailable; retry shortly"), request_id)
            except Exception:
                log.exception("unhandled error [%s]", request_id)
                return error_response(Internal(f"internal error; quote request id {request_id}"), request_id)
        return run
    return wrap


def mcp_endpoint(service: Service):
    """``POST /mcp`` (core/api/mcp.py): one JSON-RPC message in, one JSON answer
    out (202 for a notification); protocol and key failures are JSON-RPC
    errors at their HTTP status, tool failures are tool results."""
    server = McpServer(service)

    async def run(request: Request) -> Response:
        request_id = new_id("req")
        message = None
        try:
            # the key first, as on every route (docs/api.md §3): a caller
            # without one learns nothing of how its body would have fared
            principal = await authenticated(service, request)
            raw = await read_raw(request, service.settings.body_timeout)
            try:
                message = parse_json_value(raw, MESSAGE_DEPTH)
            except ValidationError as exc:
                raise RpcError(PARSE_ERROR, exc.message, 400) from None
            note_rpc(message, TOOLS)  # the request line's rpc_method and tool
            # on the thread pool, like every route's work (docs/architecture.md, "Liveness")
            answer = await run_in_threadpool(server.handle, message, lambda: principal, request_id,
                                             request.headers.get("mcp-protocol-version"))
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
        except DeadlinePassed as exc:
            log.warning("%s [%s]", exc, request_id)
            return mcp_error(503, rpc_error(message_id(message), SERVER_ERROR, "the store is unavailable; retry "
                                            "shortly", {"code": "UNAVAILABLE"}), request_id)
        except StoreError:
            log.exception("store failure [%s]", request_id)
            return mcp_error(503, rpc_error(message_id(message), SERVER_ERROR, "the store is unavailable; retry "
                                            "shortly", {"code": "UNAVAILABLE"}), request_id)
        except Exception:
            log.exception("unhandled error [%s]", request_id)
            return mcp_error(500, rpc_error(message_id(message), SERVER_ERROR, f"internal error; quote request id "
                                            f"{request_id}", {"code": "INTERNAL"}), request_id)
        if answer is None:
            return Response(status_code=202, headers={"x-request-id": request_id, "cache-control": "no-store"})
        return json_response(200, dumps(answer), request_id)
    return run


# the request line's code for a JSON-RPC protocol error (data.code names the others)
RPC_CODES = {PARSE_ERROR: "PARSE_ERROR", INVALID_REQUEST: "INVALID_REQUEST", METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
             INVALID_PARAMS: "INVALID_PARAMS"}


def mcp_error(status: int, body: dict, request_id: str) -> Response:
    error = body["error"]
    note_error((error.get("data") or {}).get("code") or RPC_CODES.get(error["code"], "RPC_ERROR"))
    response = json_response(status, dumps(body), request_id)
    if status == 401:
        response.headers["www-authenticate"] = "Bearer"
    return response
