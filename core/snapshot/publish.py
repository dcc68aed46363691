"""Publication: upload a built file as a new generation, then swap the pointer.

The rule: **single publisher**. Two rebuilds racing both upload (under
distinct keys) but only one compare-and-swap of the pointer succeeds; the
loser deletes its upload and gets ``RebuildConflict``. A crash before the
swap leaves the previous generation serving. After a swap, generation files
no longer in the pointer's history are deleted; after an erasure
(``only_generation``) the new generation is the only one kept, and every
other generation file, with every version the bucket keeps of it, is purged.
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from core.checksum import file_sha256
from core.instants import canonical, now_utc
from core.layout import pointer_key, snapshot_generation, snapshot_key, snapshots_prefix
from core.snapshot.pointer import encode_pointer, history_with
from core.storage import PreconditionFailed, Store


class RebuildConflict(Exception):
    """Another rebuild published first; this one's upload was withdrawn."""


def publish(store: Store, org_id: str, work: str, size: int, generation: int, pointer: dict | None,
            etag: str | None, fields: dict, progress: Callable[[str], None],
            before_swap: Callable[[], None] | None = None, only_generation: bool = False) -> tuple[str, str]:
    """Upload ``work`` as ``generation`` and swap the pointer read with
    ``etag`` (None: no pointer yet) to a record of it plus ``fields``
    (content hash, claim count, watermark, vector state). (key, sha256)."""
    key = snapshot_key(org_id, generation, secrets.token_hex(4))
    progress(f"{org_id}: uploading generation {generation} ({size} bytes)")
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing beside the upload: both only read the file
        sha = pool.submit(file_sha256, work)
        store.upload_file(key, work)
        sha = sha.result()
    history = history_with(None if only_generation else pointer, generation, key, sha)
    # rollback reads it: no generation older than the last erasure exists any more
    erased_through = generation if only_generation else (pointer or {}).get("erased_through")
    if erased_through:
        fields = {**fields, "erased_through": erased_through}
    record = {"org_id": org_id, "generation": generation, "snapshot_key": key, "sha256": sha, "bytes": size,
              "content_hash": fields["content_hash"], "claim_count": fields["claim_count"],
              "published_at": canonical(now_utc()), "history": history,
              **{k: v for k, v in fields.items() if k not in ("content_hash", "claim_count")}}
    try:
        if before_swap:
            before_swap()
        if etag is None:
            store.put_if_absent(pointer_key(org_id), encode_pointer(record))
        else:
            store.compare_and_swap(pointer_key(org_id), encode_pointer(record), etag)
    except PreconditionFailed:
        store.delete(key)
        raise RebuildConflict(f"{org_id}: another rebuild published first") from None
    except BaseException:
        store.delete(key)
        raise
    if only_generation:
        removed = store.purge_prefix(snapshots_prefix(org_id), keep={key, pointer_key(org_id)})
        progress(f"{org_id}: purged {removed} stored versions of older generations")
    else:
        retire_old_generations(store, org_id, generation, {h["snapshot_key"] for h in history})
    return key, sha


def retire_old_generations(store: Store, org_id: str, generation: int, keep: set[str]) -> None:
    """Delete generation files up to ``generation`` that ``keep`` does not name."""
    for key in store.list_keys(snapshots_prefix(org_id)):
        number = snapshot_generation(key)
        if key not in keep and number is not None and number <= generation:
            store.delete(key)
