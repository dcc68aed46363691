"""Rollback: serve a kept older generation again, as a new generation number.

Readers pick it up like any new generation. A kept generation that was
published as a delta is rolled back to with its chain (the whole file and
the deltas after it), all of which stay stored while its history entry
does (core/snapshot/publish.py); the rollback first makes the file from
them and verifies it. The ledger stays canonical: the
next rebuild starts from the rolled-back file and re-applies every entry
after its watermark, so rollback is for a bad *build* — pause the rebuild
schedule while the cause is fixed (docs/operations.md).
"""

from __future__ import annotations

import os
import secrets
import tempfile

import apsw

from core.errors import Conflict, NotFound
from core.instants import canonical, now_utc
from core.layout import pointer_key
from core.meta_table import read_meta
from core.snapshot.chain import ChainBroken, fetch_whole
from core.snapshot.pointer import KEEP_GENERATIONS, encode_pointer, entry_of, history_with, read_pointer
from core.storage import Store


def rollback(store: Store, org_id: str, generation: int) -> dict:
    """Swap the pointer to the kept ``generation``'s file (verified first)."""
    pointer, etag = read_pointer(store, org_id)
    if pointer is None:
        raise NotFound(f"{org_id} has no published snapshot")
    target = next((h for h in pointer.get("history", []) if h["generation"] == generation), None)
    if target is None and generation < pointer.get("erased_through", 0):
        raise NotFound(f"generation {generation} no longer exists: every generation before "
                         f"{pointer['erased_through']} was deleted when an erasure was carried out, and a "
                         "rollback never brings erased records back")
    if target is None:
        kept = ", ".join(str(h["generation"]) for h in pointer.get("history", []))
        raise NotFound(f"generation {generation} is not kept; kept generations: {kept}")
    work = os.path.join(tempfile.gettempdir(), f"rollback-{secrets.token_hex(6)}.sqlite")
    try:
        try:
            digests = fetch_whole(store, target, work)
        except ChainBroken as exc:
            raise Conflict(f"generation {generation} {exc}; not rolled back") from None
        size = os.path.getsize(work)
        db = apsw.Connection(work, flags=apsw.SQLITE_OPEN_READONLY)
        digest = read_meta(db, "content_hash")
        claims = int(read_meta(db, "claim_count"))
        watermark = read_meta(db, "watermark") or ""
        db.close()
    finally:
        if os.path.exists(work):
            os.unlink(work)
    new_generation = pointer["generation"] + 1
    served = {**entry_of(target), "generation": new_generation, "bytes": size, "digest": digests.digest()}
    history = history_with(pointer, served, keep=KEEP_GENERATIONS + 1)
    record = {"org_id": org_id, **served, "content_hash": digest,
              "claim_count": claims, "published_at": canonical(now_utc()), "rolled_back_to": generation,
              "watermark": watermark,
              "history": history,
              **({"erased_through": pointer["erased_through"]} if pointer.get("erased_through") else {})}
    store.compare_and_swap(pointer_key(org_id), encode_pointer(record), etag)
    return {"org_id": org_id, "generation": new_generation, "serving": generation}
