"""Housekeeping the rebuild does for its organization, beside the build.

Two kinds of leftovers are removed, neither of which any reader needs:

- idempotency records older than their 24-hour window
  (core/writes/idempotency.py): found by the listing's last-modified time, read
  before deletion, so one a new write replaced a moment ago stays;
- temporary files of writes killed before they linked their object into
  place (local store only: ``.tmp-…``, never listed as keys), once older
  than any write takes.

It runs at most every ``INTERVAL_SECONDS`` per organization and process,
so a busy organization does not list its records on every rebuild, and it
never fails a rebuild: a leftover only costs space until the next run.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from core.instants import now_utc, parse_instant
from core.layout import IDEMPOTENCY_TTL_SECONDS, idempotency_prefix, org_prefix
from core.storage import ObjectNotFound, Store

INTERVAL_SECONDS = 600
STALE_TEMPORARY_SECONDS = 3600
_last_run: dict[tuple[str, str], float] = {}
_guard = threading.Lock()


def due(store: Store, org_id: str, interval: float = INTERVAL_SECONDS) -> bool:
    """Whether this process should sweep the organization now (and, if so,
    not again for ``interval`` seconds)."""
    now = time.monotonic()
    with _guard:
        last = _last_run.get((store.url, org_id))
        if last is not None and now - last < interval:
            return False
        _last_run[(store.url, org_id)] = now
        return True


def sweep(store: Store, org_id: str, *, ttl_seconds: int = IDEMPOTENCY_TTL_SECONDS) -> dict:
    """Remove the organization's expired records and stale temporaries."""
    removed = {"idempotency_records": 0, "temporary_files": 0}
    try:
        cutoff = time.time() - ttl_seconds
        limit = now_utc().timestamp() - ttl_seconds
        for key, modified in list(store.list_modified(idempotency_prefix(org_id))):
            if modified > cutoff:
                continue  # a record is written (or replaced) when it is created
            try:
                record = json.loads(store.get(key).body)
            except ObjectNotFound:
                continue
            if parse_instant(record["created_at"]).timestamp() <= limit:
                store.delete(key)
                removed["idempotency_records"] += 1
        removed["temporary_files"] = store.remove_stale_temporaries(org_prefix(org_id), STALE_TEMPORARY_SECONDS)
    except Exception:  # never fails the build: the next sweep tries again
        logging.getLogger("titen").exception("housekeeping of %s failed", org_id)
    return removed
