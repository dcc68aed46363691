"""Lambda entry point of the HTTP API: ``handler.api.handler``.

Everything is built once per execution environment, at import (the Lambda
init phase), and reused by every invocation that environment serves: the
S3 client, the key cache and the snapshot held in /tmp. Mangum runs the ASGI
lifespan on *every* invocation, so nothing may hide in a lifespan hook
(``lifespan="off"``).

Configuration comes from the environment (``core.config``): ``TITEN_STORE``
(``s3://bucket/prefix``), ``TITEN_SNAPSHOT_TTL``, ``TITEN_EMBEDDER``;
snapshots are cached under ``TITEN_CACHE_DIR``, which defaults to
``/tmp/titen`` for an S3 store.
"""

from mangum import Mangum

from core.config import Settings
from core.api.app import create_app
from core.service import Service

service = Service(Settings.from_env())
app = create_app(service)
handler = Mangum(app, lifespan="off")
