"""An erasure's status object: what was asked, by whom, and how far it got.

``orgs/<org>/erasures/<hex>.json`` (``core.layout.erasure_key``) answers
``GET /v1/erasures/{id}``. While the erasure is ``pending`` it holds the id
being erased (``pending_target``): the rebuild that carries the erasure out
needs it. When the erasure completes, the object is rewritten without it,
with the counts and ``completed_at``, and every older version of it is
purged, so what stays is content-free: who asked (and the workspaces of
the key it asked with), when, a hash of the id, and the counts of what it
could read. Content-free facts are appended to the ledger too (``type:
"erasure"`` when asked, ``"erasure_complete"`` when done, with the total
counts beside the told ones).
"""

from __future__ import annotations

import hashlib
import json

from core.layout import erasure_key, erasures_prefix
from core.storage import ObjectNotFound, PreconditionFailed, Store

TARGETS = ("subject", "observation")
COUNTED = ("observations", "claims", "context_runs", "feedback", "embeddings")


def target_sha256(org_id: str, target: str, target_id: str) -> str:
    """The hash an erasure keeps of what it erased (never the id itself)."""
    return hashlib.sha256(f"{org_id}\n{target}\n{target_id}".encode()).hexdigest()


def taken_hash(org_id: str, record_id: str) -> str:
    """The hash a stub keeps of each record id an erasure took from its entry."""
    return target_sha256(org_id, "record", record_id)


def counted_hash(org_id: str, record_id: str) -> str:
    """The short hash by which an erasure's counts tell records apart
    (``erased_counted``, core/erasure/purge.py): 64 bits, no collision
    among the records of one build to expect."""
    return taken_hash(org_id, record_id)[:16]


def encode(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def read(store: Store, org_id: str, erasure_hex: str) -> tuple[dict | None, str | None]:
    """(the status object, its ETag), or (None, None)."""
    try:
        obj = store.get(erasure_key(org_id, erasure_hex))
    except ObjectNotFound:
        return None, None
    return json.loads(obj.body), obj.etag


def pending(store: Store, org_id: str) -> list[dict]:
    """The organization's erasures not yet carried out, oldest first."""
    return _with_status(store, org_id, "pending")


def completed(store: Store, org_id: str) -> list[dict]:
    """The organization's completed erasures, oldest first."""
    return _with_status(store, org_id, "complete")


def _with_status(store: Store, org_id: str, status: str) -> list[dict]:
    out = []
    for key in store.list_keys(erasures_prefix(org_id)):
        try:
            record = json.loads(store.get(key).body)
        except ObjectNotFound:
            continue
        if record.get("status") == status:
            out.append(record)
    return sorted(out, key=lambda r: r["erasure_id"])


def complete(store: Store, org_id: str, record: dict, counts: dict, completed_at: str) -> dict:
    """Rewrite the status object content-free and purge its older versions
    (the pending one named the target)."""
    erasure_hex = record["erasure_id"][len("era_"):]
    key = erasure_key(org_id, erasure_hex)
    done = {k: v for k, v in record.items() if k != "pending_target"}
    done.update(status="complete", completed_at=completed_at, counts={k: counts.get(k, 0) for k in COUNTED})
    for _ in range(5):
        current, etag = read(store, org_id, erasure_hex)
        if current is None or current.get("status") == "complete":
            break
        try:
            store.compare_and_swap(key, encode(done), etag)
            break
        except PreconditionFailed:
            continue
    store.purge_history(key)
    return done
