"""Lambda entry point of the HTTP API: ``handler.api.handler``.

Everything is built once per execution environment, at import (the Lambda
init phase), and reused by every invocation that environment serves: the
S3 client, the key cache and the snapshots held in /tmp (those of
``TITEN_PRELOAD_ORGS`` loaded here, at import). Mangum runs the ASGI
lifespan on *every* invocation, so nothing may hide in a lifespan hook
(``lifespan="off"``).

Configuration comes from the environment (``core.config``): ``TITEN_STORE``
(``s3://bucket/prefix``), ``TITEN_SNAPSHOT_TTL``, ``TITEN_EMBEDDER``;
snapshots are cached under ``TITEN_CACHE_DIR``, which defaults to
``/tmp/titen`` for an S3 store.
"""

import base64
import json
import logging

from mangum import Mangum

from core.config import Settings
from core.api.app import create_app
from core.ids import new_id
from core.service import Service
from core.storage import deadline

log = logging.getLogger("titen")

deadline.bound_requests()  # before the store is opened: its S3 attempts fit in a request's time
service = Service(Settings.from_env())
# the snapshots of TITEN_PRELOAD_ORGS, loaded here in the init phase; any
# other organization's is loaded by its first request (its id comes from
# the caller's key, so it cannot be known before)
service.preload()
app = create_app(service)
asgi = Mangum(app, lifespan="off")


def readable(event) -> bool:
    """Whether ``event`` is an API Gateway HTTP API (payload 2.0) event
    Mangum can read: version 2.0; a method, a path and a source address;
    headers an object of strings when present, with a Host and an
    X-Forwarded-Port Mangum can read a port from; a query string and a body
    strings when present, the body base64 when marked so; cookies a list
    of strings. Each is a field Mangum reads without checking it, so one
    that is not so raised inside Mangum, a 500 logged as a server fault."""
    try:
        http = event["requestContext"]["http"]
        if event.get("version") != "2.0":
            return False
        if not all(isinstance(http.get(field), str) for field in ("method", "path", "sourceIp")):
            return False
        if not isinstance(event.get("rawPath"), str):
            return False
        headers = event.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in headers.items()):
            return False
        if not _port_readable(headers):
            return False
        if not isinstance(event.get("rawQueryString", ""), str):
            return False
        cookies = event.get("cookies")
        if cookies is not None and not (isinstance(cookies, list) and all(isinstance(c, str) for c in cookies)):
            return False
        body = event.get("body")
        if body is not None and not isinstance(body, str):
            return False
        if event.get("isBase64Encoded") and body is not None:
            base64.b64decode(body, validate=True)
        return True
    except (KeyError, TypeError, AttributeError, ValueError):
        return False


def _port_readable(headers: dict) -> bool:
    """As Mangum reads the server's port: from ``host:port``, else from
    X-Forwarded-Port (API Gateway sets both; the app never uses them)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    host = lowered.get("host", "mangum")
    if ":" in host:
        parts = host.split(":")
        return len(parts) == 2 and parts[1].isascii() and parts[1].isdigit()
    port = lowered.get("x-forwarded-port", "80")
    return port.isascii() and port.isdigit()


# time kept back from the invocation's remaining time for the answer
# itself: the app's 503, Mangum's response, Lambda's return
ANSWER_MARGIN_SECONDS = 3.0  # (and a retry's backoff sleep, at most 2 s here: core/storage/s3.py)


def _store_seconds(context) -> float:
    """How long this invocation's store calls may take: what is left of
    the function's timeout (29 s in the template, under API Gateway's 30),
    less the margin, so a slow store ends in the 503 envelope, not in the
    gateway's bare error (core/storage/deadline.py)."""
    try:
        left_ms = context.get_remaining_time_in_millis()
    except AttributeError:  # a hand-made context: no bound is known
        return float("inf")
    return left_ms / 1000 - ANSWER_MARGIN_SECONDS


def _answer(status: int, code: str, message: str, request_id: str) -> dict:
    body = {"error": {"code": code, "message": message}, "meta": {"request_id": request_id}}
    return {"statusCode": status, "isBase64Encoded": False, "body": json.dumps(body, separators=(",", ":")),
            "headers": {"content-type": "application/json", "x-request-id": request_id,
                        "cache-control": "no-store"}}


def handler(event, context):
    """Mangum; an event it cannot read (API Gateway never sends one, but a
    hand-made ``sam local invoke`` event may: a body marked base64 that is
    not, no method, another source's event) gets the 400 envelope instead of
    an exception, which API Gateway would turn into its own bare 500. A
    readable event whose handling raises past the app (the app answers its
    own errors, so this is a fault here) is the 500 envelope, its traceback
    logged under the request id: a server fault never counts as the
    caller's."""
    if not readable(event):
        request_id = new_id("req")
        log.warning("unreadable event [%s]", request_id)
        return _answer(400, "VALIDATION_ERROR",
                       "not an API Gateway HTTP API event (payload format 2.0) this function can read", request_id)
    try:
        with deadline.within(_store_seconds(context)):
            return asgi(event, context)
    except Exception:
        request_id = new_id("req")
        log.exception("the API function failed outside the app [%s]", request_id)
        return _answer(500, "INTERNAL", f"internal error; quote request id {request_id}", request_id)
