"""Lambda entry point of the snapshot rebuild: ``handler.rebuild.handler``.

The queue's SQS events, the EventBridge schedule and direct invokes all
arrive here; what each does is ``core.rebuild.runner``. The service (S3
client, SQS client) is built once per execution environment, at import.
"""

from __future__ import annotations

from core.config import Settings
from core.rebuild.runner import TIME_MARGIN_MS, RebuildFailed, RebuildRunner
from core.service import Service

service = Service(Settings.from_env())
queue = service.rebuild_queue  # None without TITEN_REBUILD_QUEUE_URL
runner = RebuildRunner(service)

__all__ = ["handler", "service", "queue", "runner", "RebuildFailed", "TIME_MARGIN_MS"]


def handler(event, context=None) -> dict:
    return runner.handle(event, context)
