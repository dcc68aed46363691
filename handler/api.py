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

import json
import logging

from mangum import Mangum

from core.config import Settings
from core.api.app import create_app
from core.ids import new_id
from core.service import Service

log = logging.getLogger("titen")

service = Service(Settings.from_env())
# the snapshots of TITEN_PRELOAD_ORGS, loaded here in the init phase; any
# other organization's is loaded by its first request (its id comes from
# the caller's key, so it cannot be known before)
service.preload()
app = create_app(service)
asgi = Mangum(app, lifespan="off")


def handler(event, context):
    """Mangum; an event it cannot read (API Gateway never sends one, but a
    hand-made ``sam local invoke`` event may: a body marked base64 that is
    not, no method, another source's event) gets the 400 envelope instead of
    an exception, which API Gateway would turn into its own bare 500."""
    try:
        return asgi(event, context)
    except Exception as exc:  # the app's own errors are answered inside it: this is the event
        request_id = new_id("req")
        log.warning("unreadable event [%s]: %s: %s", request_id, type(exc).__name__, exc)
        body = {"error": {"code": "VALIDATION_ERROR",
                          "message": "not an API Gateway HTTP API event (payload format 2.0) this function can read"},
                "meta": {"request_id": request_id}}
        return {"statusCode": 400, "isBase64Encoded": False, "body": json.dumps(body, separators=(",", ":")),
                "headers": {"content-type": "application/json", "x-request-id": request_id,
                            "cache-control": "no-store"}}
