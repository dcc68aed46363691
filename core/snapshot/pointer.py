"""The pointer: ``current.json``, the generation an organization serves now.

Readers poll it (by ETag); the rebuild swaps it by compare-and-swap; the
backlog check reads its watermark. Its fields:

| field | meaning |
| generation, snapshot_key, sha256, bytes | the file served, and how to verify it |
| content_hash, claim_count | what the file holds (core/snapshot/content_hash.py) |
| published_at | when the swap happened |
| watermark | the newest ledger entry the generation applied |
| ledger_listed_at | every entry stored before this instant is in the generation |
| history | the last ``KEEP_GENERATIONS`` published files, newest first, kept for rollback |
| vector | the vector index's fingerprint, layout and status, when vectors are on |
| rolled_back_to | set by a rollback: the generation whose file this one serves again |
| erasures | set by a build that carried erasures out: their counts, by erasure id |
| erased_through | the generation of the last erasure: every older generation was deleted |
"""

from __future__ import annotations

import json

from core.layout import pointer_key
from core.storage import ObjectNotFound, Store

KEEP_GENERATIONS = 5


def read_pointer(store: Store, org_id: str) -> tuple[dict | None, str | None]:
    """(the pointer, its ETag), or (None, None) before the first publication."""
    try:
        obj = store.get(pointer_key(org_id))
    except ObjectNotFound:
        return None, None
    return json.loads(obj.body), obj.etag


def encode_pointer(record: dict) -> bytes:
    return json.dumps(record, indent=1).encode()


def history_with(pointer: dict | None, generation: int, snapshot_key: str, sha256: str,
                 keep: int = KEEP_GENERATIONS) -> list[dict]:
    """The pointer's history with a new generation in front, ``keep`` long."""
    return ([{"generation": generation, "snapshot_key": snapshot_key, "sha256": sha256}]
            + (pointer.get("history", []) if pointer else []))[:keep]
