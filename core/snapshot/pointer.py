"""The pointer: ``current.json``, the generation an organization serves now.

Readers poll it (by ETag); the rebuild swaps it by compare-and-swap; the
backlog check reads its watermark. Its fields:

| field | meaning |
| generation, bytes, digest | the file served: its size and page digest (core/snapshot/pages.py) |
| snapshot_key, sha256 | a generation published as a whole file: its key and the file's sha256 |
| full, deltas | a generation published as a delta: the whole file of an earlier generation (its generation, snapshot_key, sha256, bytes, digest) and the deltas that take it here, oldest first (generation, key, bytes, base_digest, digest) |
| content_hash, claim_count | what the file holds (core/snapshot/content_hash.py) |
| published_at | when the swap happened |
| watermark | the newest ledger entry the generation applied |
| ledger_listed_at | every entry stored before this instant is in the generation |
| history | the last ``KEEP_GENERATIONS`` generations, newest first, kept for rollback: each as ``entry_of`` makes it (a whole file, or a whole file and deltas) |
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


def history_with(pointer: dict | None, entry: dict, keep: int = KEEP_GENERATIONS) -> list[dict]:
    """The pointer's history with a new generation's entry in front, ``keep`` long."""
    return ([entry] + (pointer.get("history", []) if pointer else []))[:keep]


def entry_of(record: dict) -> dict:
    """How to get a generation's file back (a pointer or a history entry):
    the fields naming it, whole file or whole file plus deltas."""
    keys = ("generation", "bytes", "digest", "full", "deltas") if record.get("deltas") else \
        ("generation", "snapshot_key", "sha256", "bytes", "digest")
    return {k: record[k] for k in keys if k in record}


def full_of(record: dict) -> dict:
    """The whole file a generation is made from (itself, when published whole)."""
    if record.get("deltas"):
        return record["full"]
    return {"generation": record["generation"], "snapshot_key": record["snapshot_key"],
            "sha256": record["sha256"], **{k: record[k] for k in ("bytes", "digest") if k in record}}


def deltas_of(record: dict) -> list[dict]:
    """The deltas from ``full_of(record)`` to the generation, oldest first."""
    return list(record.get("deltas") or ())


def stored_keys(record: dict) -> set[str]:
    """Every store key a generation's file is made from."""
    return {full_of(record)["snapshot_key"], *(d["key"] for d in deltas_of(record))}
