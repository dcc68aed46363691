"""Which organizations' ledgers hold entries their published generation lacks.

Why it exists: the scheduled run is the safety net behind the rebuild queue
(a failed enqueue, a message that ended in the dead-letter queue). It must
cost what changed, not what exists: deciding by downloading each
organization's snapshot made an idle organization as expensive as a busy one
(docs/operations.md, "Freshness on Lambda").

The rule: read the pointer (``current.json``, one small GET), then list the
ledger strictly after the watermark it records (the newest entry the
generation applied), ``PAGE_SIZE`` keys per request. The first entry that a
rebuild would apply — anything but a context run (``*.run.json``), which no
snapshot needs — means a rebuild is due. An organization with nothing new
costs one pointer read and one list call (more list calls only when more
than ``PAGE_SIZE`` context runs were recorded since its last generation).
No snapshot is ever read here.

- No pointer yet: due when the ledger holds any entry a rebuild would apply.
- A pointer that records no watermark (published before watermarks were):
  due; that rebuild republishes it with one.
- An entry stored by a clock lagging behind the watermark sorts before it and
  is not seen here; the write's own rebuild request applies it (each rebuild
  re-reads ``TITEN_SKEW_SECONDS`` behind its watermark).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.layout import RUN_SUFFIX, ledger_prefix, pointer_key
from core.storage import ObjectNotFound, Store

PAGE_SIZE = 10


@dataclass(frozen=True)
class Backlog:
    org_id: str
    due: bool
    generation: int  # the published generation (0: none yet)
    reason: str


def backlog(store: Store, org_id: str) -> Backlog:
    try:
        pointer = json.loads(store.get(pointer_key(org_id)).body)
    except ObjectNotFound:
        pointer = None
    generation = int(pointer["generation"]) if pointer else 0
    if pointer is not None and "watermark" not in pointer:
        return Backlog(org_id, True, generation, "pointer records no watermark")
    if pointer is not None and pointer.get("erasures"):
        # published, but the build stopped before finishing them (a purge
        # refused): the next build finishes them (ErasureWork.recover)
        from core.erasure import records
        unfinished = {r["erasure_id"] for r in records.pending(store, org_id)} & set(pointer["erasures"])
        if unfinished:
            return Backlog(org_id, True, generation, f"erasure {min(unfinished)} is published but not complete")
    prefix = ledger_prefix(org_id)
    watermark = pointer["watermark"] if pointer else ""
    start_after = prefix + watermark + "~" if watermark else None  # past "<hex>.json" and "<hex>.run.json"
    for key in store.list_keys(prefix, start_after, page_size=PAGE_SIZE):
        if not key.endswith(RUN_SUFFIX):
            return Backlog(org_id, True, generation, f"ledger entry {key.rsplit('/', 1)[1]} is not applied")
    return Backlog(org_id, False, generation, "nothing new")
