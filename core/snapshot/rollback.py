"""Rollback: serve a kept older generation again, as a new generation number.

Readers pick it up like any new generation. The ledger stays canonical: the
next rebuild starts from the rolled-back file and re-applies every entry
after its watermark, so rollback is for a bad *build* — pause the rebuild
schedule while the cause is fixed (docs/operations.md).
"""

from __future__ import annotations

import os
import secrets
import tempfile

import apsw

from core.checksum import file_sha256
from core.instants import canonical, now_utc
from core.layout import pointer_key
from core.meta_table import read_meta
from core.snapshot.pointer import KEEP_GENERATIONS, encode_pointer, history_with, read_pointer
from core.storage import Store


def rollback(store: Store, org_id: str, generation: int) -> dict:
    """Swap the pointer to the kept ``generation``'s file (verified first)."""
    pointer, etag = read_pointer(store, org_id)
    if pointer is None:
        raise ValueError(f"{org_id} has no published snapshot")
    target = next((h for h in pointer.get("history", []) if h["generation"] == generation), None)
    if target is None and generation < pointer.get("erased_through", 0):
        raise ValueError(f"generation {generation} no longer exists: every generation before "
                         f"{pointer['erased_through']} was deleted when an erasure was carried out, and a "
                         "rollback never brings erased records back")
    if target is None:
        kept = ", ".join(str(h["generation"]) for h in pointer.get("history", []))
        raise ValueError(f"generation {generation} is not kept; kept generations: {kept}")
    work = os.path.join(tempfile.gettempdir(), f"rollback-{secrets.token_hex(6)}.sqlite")
    try:
        store.download_file(target["snapshot_key"], work)
        size = os.path.getsize(work)
        if file_sha256(work) != target["sha256"]:
            raise ValueError(f"generation {generation} fails its sha256 check; not rolled back")
        db = apsw.Connection(work, flags=apsw.SQLITE_OPEN_READONLY)
        digest = read_meta(db, "content_hash")
        claims = int(read_meta(db, "claim_count"))
        watermark = read_meta(db, "watermark") or ""
        db.close()
    finally:
        if os.path.exists(work):
            os.unlink(work)
    new_generation = pointer["generation"] + 1
    history = history_with(pointer, new_generation, target["snapshot_key"], target["sha256"],
                           keep=KEEP_GENERATIONS + 1)
    record = {"org_id": org_id, "generation": new_generation, "snapshot_key": target["snapshot_key"],
              "sha256": target["sha256"], "bytes": size, "content_hash": digest,
              "claim_count": claims, "published_at": canonical(now_utc()), "rolled_back_to": generation,
              "watermark": watermark,
              "history": history,
              **({"erased_through": pointer["erased_through"]} if pointer.get("erased_through") else {})}
    store.compare_and_swap(pointer_key(org_id), encode_pointer(record), etag)
    return {"org_id": org_id, "generation": new_generation, "serving": generation}
