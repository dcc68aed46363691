"""The ledger: the canonical, append-only record of every accepted write.

Each accepted write is one immutable JSON object at
``orgs/<org>/ledger/<uuid7 hex>.json``, created with put-if-absent; the
write is acknowledged only after that call returns. Nothing else is ever the
only copy of accepted data: snapshots are derived from these objects and can
always be rebuilt from them.

An entry whose record has its own id (an observation, a context run) uses
that id's hex as its key, so the record can be read back directly and at
once — before any rebuild — by id.

**Late entries.** A write completed long after its id was minted (a retry
taking over an Idempotency-Key, a re-run finishing a killed import, the next
writer finishing a claim's pending transition) must still reach the next
snapshot, but the rebuild lists only a skew window behind its watermark. An
id older than ``LATE_AFTER_SECONDS`` is therefore stored under a fresh key
first, then a small *moved* stub is put at its own key, pointing there:
readers by id follow the stub, the rebuild passes stubs over. Two writers of
one late entry can both store it (each checks, then writes); they store the
same records under the same ids, which every apply treats as one.
"""

from __future__ import annotations

import json
import time
from typing import Iterator

from core.ids import entry_hex as new_entry_hex
from core.ids import minted_at, uuid7_ms
from core.layout import ENTRY_SUFFIX, ORGANIZATIONS_PREFIX, entry_key, ledger_prefix, organization_key
from core.storage import ObjectNotFound, PreconditionFailed, Store, StoreError


class DamagedEntry(StoreError):
    """A ledger object that is not a JSON object: a build cannot apply it and
    will not skip it (the ledger is the only copy), so it stops, naming it."""


def decode_entry(key: str, body: bytes) -> dict:
    """The ledger entry stored at ``key``; ``DamagedEntry`` naming the key
    when the bytes are not one."""
    try:
        entry = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DamagedEntry(f"ledger entry {key} is damaged ({exc}): restore it, e.g. from the bucket's "
                           "previous version of the object, and run the rebuild again") from None
    if not isinstance(entry, dict):
        raise DamagedEntry(f"ledger entry {key} is damaged (not a JSON object): restore it, e.g. from the "
                           "bucket's previous version of the object, and run the rebuild again")
    return entry


LATE_AFTER_SECONDS = 60  # well inside the rebuild's skew window (core/snapshot/build.py)
MOVED = "moved"
# what an erasure leaves at the key of an entry it emptied (core/erasure/purge.py):
# the key stays taken, so no retry or re-run can write the entry again
ERASED = "erased"
# on a stub or an entry an erasure rewrote without some of its records: the
# sha256 of each record id taken, per erasure id (core/erasure/purge.py)
ERASED_RECORDS = "erased_records"
# on the same: per erasure id, which of the observations and claims taken
# were which, and which its requester could read, each by the first 16 hex
# digits of the same sha256 (core/erasure/purge.py): a build that meets the
# entry already stubbed, so never applies its records, still counts them
ERASED_COUNTED = "erased_counted"


def observations_in(entry: dict) -> list[dict]:
    """The observations an entry holds: an observation entry's one, a
    batch's (an import batch included), none for any other type."""
    kind = entry.get("type")
    if kind == "observation":
        return [entry["observation"]]
    return entry.get("observations", []) if kind == "batch" else []


def encode(entry: dict) -> bytes:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()


class Ledger:
    def __init__(self, store: Store):
        self.store = store

    def append(self, org_id: str, entry_type: str, payload: dict, *, actor: str,
               entry_hex: str | None = None, suffix: str = ENTRY_SUFFIX,
               serialized: dict[str, str] | None = None) -> dict:
        """Durably store one entry; returns it (with ``entry_id``, ``recorded_at``).

        ``serialized``: fields whose values are already JSON text in this
        encoding, stored after ``payload``'s (and returned as that text) — a
        compile's pack is encoded once, for its budget estimate, its response
        and its run."""
        entry_hex = entry_hex or new_entry_hex()
        entry = {"entry_id": entry_hex, "type": entry_type, "org_id": org_id, "actor": actor,
                 "recorded_at": minted_at(entry_hex), **payload}
        body = encode(entry)
        if serialized:
            fields = "".join(f",{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in serialized.items())
            body = body[:-1] + fields.encode() + b"}"
            entry.update(serialized)
        self.store_entry(org_id, entry_hex, body, suffix)
        return entry

    def store_entry(self, org_id: str, entry_hex: str, body: bytes, suffix: str = ENTRY_SUFFIX) -> str:
        """Put-if-absent of one encoded entry under its id; ``PreconditionFailed``
        when the entry is stored already. A late id goes under a fresh key
        behind a moved stub (module docstring). Returns the key the entry
        itself was stored under."""
        key = entry_key(org_id, entry_hex, suffix)
        if time.time() * 1000 - uuid7_ms(entry_hex) < LATE_AFTER_SECONDS * 1000:
            self.store.put_if_absent(key, body)
            return key
        try:
            self.store.get(key)
            raise PreconditionFailed(f"{key} already exists")
        except ObjectNotFound:
            pass
        fresh = new_entry_hex()
        stored_at = entry_key(org_id, fresh, suffix)
        self.store.put_if_absent(stored_at, body)
        try:
            self.store.put_if_absent(key, encode({"entry_id": entry_hex, "type": MOVED, "org_id": org_id,
                                                  "moved_to": fresh}))
        except PreconditionFailed:
            pass  # stored meanwhile by its first writer: the same records twice, applied once
        return stored_at

    def read(self, org_id: str, entry_hex: str, suffix: str = ENTRY_SUFFIX) -> dict | None:
        """The entry with this id (following a moved stub), or None."""
        return self.read_key(entry_key(org_id, entry_hex, suffix), missing_ok=True)

    def keys_after(self, org_id: str, start_after: str | None) -> Iterator[str]:
        return self.store.list_keys(ledger_prefix(org_id), start_after=start_after)

    def read_key(self, key: str, *, missing_ok: bool = False) -> dict | None:
        """The entry at ``key``, following a moved stub (the rebuild reads
        stubs as they are: ``read_raw``)."""
        try:
            entry = decode_entry(key, self.store.get(key).body)
            if entry.get("type") == MOVED:
                moved = key.replace(entry["entry_id"], entry["moved_to"])
                entry = decode_entry(moved, self.store.get(moved).body)
        except ObjectNotFound:
            if missing_ok:
                return None
            raise
        return entry

    def read_raw(self, key: str) -> dict:
        return decode_entry(key, self.store.get(key).body)

    def register_organization(self, org_id: str) -> None:
        """Record that an organization exists, so the rebuild can find it
        without listing every ledger (``organizations/<org>``)."""
        try:
            self.store.put_if_absent(organization_key(org_id), b"{}")
        except PreconditionFailed:
            pass

    def organizations(self) -> list[str]:
        return [key[len(ORGANIZATIONS_PREFIX):] for key in self.store.list_keys(ORGANIZATIONS_PREFIX)]
