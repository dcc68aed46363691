"""The HTTP API (docs/api.md): one Starlette app for ``titen serve`` and Lambda.

The routes and what each answers; how every route authenticates, reads its
body and maps its failures is ``core.api.endpoint``.
"""

from __future__ import annotations

import re
import sys

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from core.api.endpoint import endpoint, log, mcp_endpoint
from core.api.envelope import Serialized, error_response, one_header
from core.api.evidence import claim_evidence
from core.errors import Internal, MethodNotAllowed, NotFound, TitenError, echo, printable
from core.ids import new_id
from core.keys import Principal
from core.observe.request_line import RequestLine
from core.service import WRITE_ROUTES, Service
from core.snapshot.lookups import readable_claim_count
from core.snapshot.reader import DAMAGE_ERRORS, Snapshot
from core.writes.idempotency import HEADER as IDEMPOTENCY_HEADER, parse_key as parse_idempotency_key


class ExactRoute(Route):
    """A route whose path must match to its last character. Starlette ends
    its path pattern with ``$``, which in Python also matches before a final
    line feed, so ``/v1/context/compile%0A`` ran the compile; an unknown
    path is 404 (docs/api.md §1)."""

    def __init__(self, path: str, endpoint, *, methods: list[str]):
        super().__init__(path, endpoint, methods=methods)
        pattern = self.path_regex.pattern
        self.path_regex = re.compile((pattern[:-1] if pattern.endswith("$") else pattern) + r"\Z")


class IdRoute(ExactRoute):
    """A route with an id in its path that leaves alone the fixed paths
    other routes own: ``GET /v1/context/compile`` is the compile route's
    405 (``Allow: POST``), not a stored pack named ``compile`` that is not
    found, and ``DELETE /v1/observations/batch`` likewise."""

    def __init__(self, path: str, endpoint, *, methods: list[str], fixed: frozenset[str]):
        super().__init__(path, endpoint, methods=methods)
        self.fixed = fixed

    def matches(self, scope):
        if scope["type"] == "http" and scope["path"] in self.fixed:
            return Match.NONE, {}
        return super().matches(scope)


async def openapi_json(request: Request) -> Response:
    """The OpenAPI 3.1 document (core/api/openapi.py), no key needed; built on first use."""
    from core.api.openapi import document_json
    return Response(document_json(), media_type="application/json", headers={"cache-control": "no-cache"})


# Every token count releases the GIL (tiktoken encodes outside it), and a
# thread that then wants it back waits for whoever took it to yield: up to
# the interpreter's switch interval, 5 ms by default. With route work on
# the thread pool and the local rebuild beside it, that wait, not the count,
# was most of what exact counting cost a compile over HTTP (bench/README.md,
# "The GIL switch interval"). The serving process yields every 0.2 ms.
GIL_SWITCH_INTERVAL_S = 0.0002


def _readable_claims(snapshot: Snapshot | None, principal: Principal) -> int:
    if snapshot is None:
        return 0
    with snapshot.lease():  # a connection of its own
        return readable_claim_count(snapshot.db, principal)


class HeadAnswersWithoutBody:
    """HTTP: the answer to HEAD is the GET's status and headers, no body.
    uvicorn drops the body itself (``titen serve``); Mangum, on Lambda, sends
    whatever the app sends."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def sending(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)
        await self.app(scope, receive, sending)


def create_app(service: Service) -> Starlette:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    @endpoint(service, auth=False, inline=True)
    def healthz(request, principal, body):
        return 200, {"status": "ok"}, {}

    @endpoint(service, auth=False)
    def readyz(request, principal, body):
        org = reader = None
        authorization = one_header(request, "Authorization")
        if authorization:
            reader = service.keys.authenticate(authorization)
            org = reader.org_id
        orgs = [org] if org else service.reader.loaded()
        checks = {o: service.reader.check(o) for o in orgs}
        unavailable = [reason for _, reason in checks.values() if reason]
        claim_count = None
        if reader is not None and not checks[org][1]:
            # not_ready (a published generation that no verified copy serves):
            # null, as a 0 would read as an organization with nothing in it
            try:
                claim_count = _readable_claims(checks[org][0], reader)
            except DAMAGE_ERRORS as exc:  # as on every route: evicted, refetched and verified next time
                unavailable.append(service.snapshot_damaged(org, exc).message)
        states = [service.reader.status(o) for o in orgs]
        loaded = [s for s in states if s["generation"]]
        newest = max(loaded, key=lambda s: s["generation"], default=None)
        vector_state, vector_error = service.vector_status(orgs)
        data = {"status": "not_ready" if unavailable else "ready",
                "generation": newest["generation"] if newest else 0,
                "generation_age_seconds": newest["generation_age_seconds"] if newest else None,
                # a count of records is the caller's own: the claims its key may
                # read; without a key, none (no tenant's count reaches a stranger)
                "claim_count": claim_count,
                "vector": vector_state,
                "organizations": len(loaded),
                "last_refresh_error": next((s["last_refresh_error"] for s in states
                                            if s["last_refresh_error"]), None),
                "last_eviction": next((s["last_eviction"] for s in states if s["last_eviction"]), None),
                # a generation got whole because its deltas could not be applied here
                "last_delta_fallback": next((s["last_delta_fallback"] for s in states
                                             if s["last_delta_fallback"]), None)}
        if unavailable:
            data["reason"] = unavailable[0]
        if vector_error:
            data["vector_error"] = vector_error
        return (503 if unavailable else 200), data, {}

    def write(route: str):
        """A write route: the service runs it, replaying a retried key."""
        @endpoint(service, body=True)
        def run(request, principal, body):
            key = parse_idempotency_key(one_header(request, IDEMPOTENCY_HEADER))
            outcome = service.write(principal, route, dict(request.path_params), body, key)
            return outcome.status, outcome.data, ({} if outcome.replay is None
                                                  else {"idempotent_replay": outcome.replay})
        return run

    @endpoint(service)
    def evidence(request, principal, body):
        data, meta = claim_evidence(service.reader, principal, request.path_params["claim_id"])
        return 200, data, meta

    @endpoint(service, body=True)
    def compile_context(request, principal, body):
        outcome = service.compiler.compile(principal, body)
        return 200, Serialized(outcome.data_json), outcome.meta

    @endpoint(service)
    def stored_context(request, principal, body):
        return 200, service.compiler.stored_pack(principal, request.path_params["context_id"]), {}

    @endpoint(service)
    def erase_subject(request, principal, body):
        return 202, service.erasures.erase_subject(principal, request.path_params["subject_id"]), {}

    @endpoint(service)
    def erase_observation(request, principal, body):
        return 202, service.erasures.erase_observation(principal, request.path_params["observation_id"]), {}

    @endpoint(service)
    def erasure_status(request, principal, body):
        return 200, service.erasures.status(principal, request.path_params["erasure_id"]), {}

    @endpoint(service)
    def admin_rebuild(request, principal, body):
        principal.require("admin")
        result = service.rebuild(principal.org_id)
        # as on /readyz, a count of records is the caller's own: admin runs
        # the organization's rebuilds but does not widen what its key reads
        # (another principal's private claims stay out of the count)
        served, reason = service.reader.check(principal.org_id)
        # a generation this process could not load (a full cache disk, say)
        # is not the one whose claims it would count
        serving = reason is None and (served.generation if served is not None else 0) == result.generation
        try:
            claim_count = _readable_claims(served, principal) if serving else None
        except DAMAGE_ERRORS as exc:  # refetched and verified by the next request, as everywhere
            service.snapshot_damaged(principal.org_id, exc)
            claim_count = None
        return 200, {"generation": result.generation, "published": result.published,
                     "entries_applied": result.entries_applied, "content_hash": result.content_hash,
                     "claim_count": claim_count, "snapshot_bytes": result.snapshot_bytes,
                     "seconds": round(result.seconds, 3), "notes": list(result.notes)}, {}

    fixed = frozenset({"/v1/context/compile", *(path for path in (route.split(" ", 1)[1] for route in WRITE_ROUTES)
                                                 if "{" not in path)})
    routes = [
        ExactRoute("/healthz", healthz, methods=["GET"]),
        ExactRoute("/readyz", readyz, methods=["GET"]),
        *(ExactRoute(route.split(" ", 1)[1], write(route), methods=["POST"]) for route in WRITE_ROUTES),
        ExactRoute("/v1/claims/{claim_id}/evidence", evidence, methods=["GET"]),
        ExactRoute("/v1/context/compile", compile_context, methods=["POST"]),
        IdRoute("/v1/context/{context_id}", stored_context, methods=["GET"], fixed=fixed),
        ExactRoute("/v1/admin/rebuild", admin_rebuild, methods=["POST"]),
        ExactRoute("/v1/subjects/{subject_id}", erase_subject, methods=["DELETE"]),
        IdRoute("/v1/observations/{observation_id}", erase_observation, methods=["DELETE"], fixed=fixed),
        ExactRoute("/v1/erasures/{erasure_id}", erasure_status, methods=["GET"]),
        ExactRoute("/mcp", mcp_endpoint(service), methods=["POST"]),
        ExactRoute("/openapi.json", openapi_json, methods=["GET"]),
    ]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        request_id = new_id("req")
        # (the scope's path: request.url re-parses it, and urlsplit drops line breaks)
        path = printable(echo(request.scope.get("path", "")))
        if exc.status_code == 405:
            response = error_response(MethodNotAllowed(f"{printable(echo(request.method))} is not allowed on {path}"),
                                      request_id)
            # RFC 9110 §15.5.6: a 405 names the methods the route has
            response.headers["allow"] = (exc.headers or {}).get("Allow", "")
            return response
        if exc.status_code == 404:
            return error_response(NotFound(f"no route {path}"), request_id)
        err = TitenError(exc.detail or "error")
        err.status, err.code = exc.status_code, "VALIDATION_ERROR" if exc.status_code < 500 else "INTERNAL"
        return error_response(err, request_id)

    async def crash(request: Request, exc: Exception) -> Response:
        request_id = new_id("req")
        log.exception("unhandled error [%s]", request_id)
        return error_response(Internal(f"internal error; quote request id {request_id}"), request_id)

    # one line (and one metrics document) per request: core/observe/request_line.py
    observe = Middleware(RequestLine, metrics=service.metrics, log_format=service.settings.log_format)
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: crash},
                    middleware=[Middleware(HeadAnswersWithoutBody), observe])
    # a path with a slash too many is an unknown route (404 in the envelope),
    # not a bare 307 to the route without it
    app.router.redirect_slashes = False
    app.state.service = service
    return app
