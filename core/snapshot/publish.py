"""Publication: upload a built generation — a whole file, or a delta — then swap the pointer.

The rule: **single publisher**. Two rebuilds racing both upload (under
distinct keys) but only one compare-and-swap of the pointer succeeds; the
loser deletes its upload and gets ``RebuildConflict``. A crash before the
swap leaves the previous generation serving (an uploaded delta no pointer
names is never read, and is deleted with its generation). After a swap,
generation files and deltas no longer named by the pointer's history are
deleted; after an erasure (``only_generation``) the new generation is the
only one kept, and every other generation file and delta, with every
version the bucket keeps of it, is purged.

A delta generation's pointer names the whole file it starts from and the
deltas after it (``core.snapshot.pointer``); a whole-file generation names
itself, and starts a new chain.
"""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from core.instants import canonical, now_utc
from core.layout import delta_key, pointer_key, snapshot_generation, snapshot_key, snapshots_prefix
from core.snapshot.pages import PageDigests, hash_file
from core.snapshot.pointer import deltas_of, encode_pointer, entry_of, full_of, history_with, stored_keys
from core.storage import PreconditionFailed, Store


class RebuildConflict(Exception):
    """Another rebuild published first; this one's upload was withdrawn."""


@dataclass
class Published:
    key: str  # the object uploaded: the whole file, or the delta
    record: dict  # the pointer swapped in
    digests: PageDigests  # the generation's page digests
    uploaded_bytes: int


def publish(store: Store, org_id: str, work: str, size: int, generation: int, pointer: dict | None,
            etag: str | None, fields: dict, progress: Callable[[str], None],
            before_swap: Callable[[], None] | None = None, only_generation: bool = False) -> Published:
    """Upload ``work`` whole as ``generation`` and swap the pointer read with
    ``etag`` (None: no pointer yet) to a record of it plus ``fields``
    (content hash, claim count, watermark, vector state)."""
    key = snapshot_key(org_id, generation, secrets.token_hex(4))
    progress(f"{org_id}: uploading generation {generation} ({size} bytes)")
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing beside the upload: both only read the file
        hashed = pool.submit(hash_file, work)
        store.upload_file(key, work)
        sha, digests = hashed.result()
    record = {"org_id": org_id, "generation": generation, "snapshot_key": key, "sha256": sha, "bytes": size,
              "digest": digests.digest()}
    _swap(store, org_id, record, pointer, etag, fields, key, progress, before_swap, only_generation)
    return Published(key, record, digests, size)


def publish_delta(store: Store, org_id: str, raw: bytes, digests: PageDigests, size: int, generation: int,
                  pointer: dict, etag: str, fields: dict, progress: Callable[[str], None],
                  before_swap: Callable[[], None] | None = None) -> Published:
    """Upload the delta ``raw`` (``core.snapshot.delta``) taking the
    pointer's generation to ``generation``, and swap the pointer to a record
    naming the chain: the pointer's whole file and its deltas, plus this one."""
    key = delta_key(org_id, generation, secrets.token_hex(4))
    progress(f"{org_id}: uploading generation {generation} as a delta ({len(raw)} bytes)")
    store.put_if_absent(key, raw)
    step = {"generation": generation, "key": key, "bytes": len(raw), "base_digest": pointer["digest"],
            "digest": digests.digest()}
    record = {"org_id": org_id, "generation": generation, "bytes": size, "digest": digests.digest(),
              "full": full_of(pointer), "deltas": deltas_of(pointer) + [step]}
    _swap(store, org_id, record, pointer, etag, fields, key, progress, before_swap, False)
    return Published(key, record, digests, len(raw))


def _swap(store: Store, org_id: str, record: dict, pointer: dict | None, etag: str | None, fields: dict,
          uploaded: str, progress: Callable[[str], None], before_swap: Callable[[], None] | None,
          only_generation: bool) -> None:
    generation = record["generation"]
    history = history_with(None if only_generation else pointer, entry_of(record))
    # rollback reads it: no generation older than the last erasure exists any more
    erased_through = generation if only_generation else (pointer or {}).get("erased_through")
    if erased_through:
        fields = {**fields, "erased_through": erased_through}
    record.update({"content_hash": fields["content_hash"], "claim_count": fields["claim_count"],
                   "published_at": canonical(now_utc()), "history": history,
                   **{k: v for k, v in fields.items() if k not in ("content_hash", "claim_count")}})
    try:
        if before_swap:
            before_swap()
        if etag is None:
            store.put_if_absent(pointer_key(org_id), encode_pointer(record))
        else:
            store.compare_and_swap(pointer_key(org_id), encode_pointer(record), etag)
    except PreconditionFailed:
        store.delete(uploaded)
        raise RebuildConflict(f"{org_id}: another rebuild published first") from None
    except Exception as exc:
        # The swap's answer was lost, not necessarily the swap: a pointer that
        # landed names the upload, which must then stay (deleting it left the
        # published pointer naming a missing file). Unknown either way: keep
        # it; a later publication retires an upload no pointer names.
        if not _landed(store, org_id, record):
            raise
        progress(f"{org_id}: the pointer swap answered {type(exc).__name__} but landed: generation {generation} "
                 "is published")
    if only_generation:
        # an erasure is complete only once this has run; should it fail, the
        # next rebuild runs it again before marking it so (ErasureWork.recover)
        purge_older_generations(store, org_id, record)
        progress(f"{org_id}: purged every stored version of older generations")
    else:
        try:
            retire_old_generations(store, org_id, generation, set().union(*(stored_keys(h) for h in history)))
        except Exception as exc:  # housekeeping: the generation is published; the next publication retires them
            progress(f"{org_id}: generation {generation} published; retiring older files failed "
                     f"({type(exc).__name__}), left for the next publication")


def _landed(store: Store, org_id: str, record: dict) -> bool:
    """Whether the pointer now is ``record`` (read again after a lost answer)."""
    try:
        current = json.loads(store.get(pointer_key(org_id)).body)
    except Exception:
        return False
    return (current.get("generation") == record["generation"] and current.get("digest") == record["digest"]
            and stored_keys(current) == stored_keys(record))


def purge_older_generations(store: Store, org_id: str, record: dict) -> int:
    """Every version of every generation file and delta but those ``record``
    (the pointer) names, up to its generation: after an erasure, the only
    generation kept. A higher number is a build from this generation or a
    later one, so it holds nothing erased, and it may be a racing build's
    upload on its way to the pointer: it is spared."""
    def newer(key: str) -> bool:
        number = snapshot_generation(key)
        return number is not None and number > record["generation"]
    return store.purge_prefix(snapshots_prefix(org_id), keep=stored_keys(record) | {pointer_key(org_id)},
                              spare=newer)


def retire_old_generations(store: Store, org_id: str, generation: int, keep: set[str]) -> None:
    """Delete generation files and deltas up to ``generation`` that ``keep`` does not name."""
    for key in store.list_keys(snapshots_prefix(org_id)):
        number = snapshot_generation(key)
        if key not in keep and number is not None and number <= generation:
            store.delete(key)
