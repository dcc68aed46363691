"""The ledger: the canonical, append-only record of every accepted write.

Each accepted write is one immutable JSON object at
``orgs/<org>/ledger/<uuid7 hex>.json``, created with put-if-absent; the
write is acknowledged only after that call returns. Nothing else is ever the
only copy of accepted data: snapshots are derived from these objects and can
always be rebuilt from them.

An entry whose record has its own id (an observation, a context run) uses
that id's hex as its key, so the record can be read back directly and at
once — before any rebuild — by id.
"""

from __future__ import annotations

import json
from typing import Iterator

from core.ids import entry_hex as new_entry_hex
from core.instants import canonical, from_ms
from core.store import ObjectNotFound, PreconditionFailed, Store


def ledger_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/ledger/"


RUN_SUFFIX = ".run.json"


def entry_key(org_id: str, entry_hex: str, suffix: str = ".json") -> str:
    """Context runs (and feedback on a whole pack) take ``RUN_SUFFIX``: still
    ledger entries in key order, but the rebuild can pass them over by name,
    since no snapshot needs them — so an organization that only compiles is
    never republished."""
    return f"{ledger_prefix(org_id)}{entry_hex}{suffix}"


def encode(entry: dict) -> bytes:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()


class Ledger:
    def __init__(self, store: Store):
        self.store = store

    def append(self, org_id: str, entry_type: str, payload: dict, *, actor: str,
               entry_hex: str | None = None, suffix: str = ".json", serialized: dict[str, str] | None = None) -> dict:
        """Durably store one entry; returns it (with ``entry_id``, ``recorded_at``).

        ``serialized``: fields whose values are already JSON text in this
        encoding, stored after ``payload``'s (and returned as that text) — a
        compile's pack is encoded once, for its budget estimate, its response
        and its run."""
        entry_hex = entry_hex or new_entry_hex()
        entry = {"entry_id": entry_hex, "type": entry_type, "org_id": org_id, "actor": actor,
                 "recorded_at": canonical(from_ms(int(entry_hex[:12], 16))), **payload}
        body = encode(entry)
        if serialized:
            fields = "".join(f",{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in serialized.items())
            body = body[:-1] + fields.encode() + b"}"
            entry.update(serialized)
        self.store.put_if_absent(entry_key(org_id, entry_hex, suffix), body)
        return entry

    def read(self, org_id: str, entry_hex: str, suffix: str = ".json") -> dict | None:
        try:
            return json.loads(self.store.get(entry_key(org_id, entry_hex, suffix)).body)
        except ObjectNotFound:
            return None

    def keys_after(self, org_id: str, start_after: str | None) -> Iterator[str]:
        return self.store.list_keys(ledger_prefix(org_id), start_after=start_after)

    def read_key(self, key: str) -> dict:
        return json.loads(self.store.get(key).body)

    def register_organization(self, org_id: str) -> None:
        """Record that an organization exists, so the rebuild can find it
        without listing every ledger (``organizations/<org>``)."""
        try:
            self.store.put_if_absent(f"organizations/{org_id}", b"{}")
        except PreconditionFailed:
            pass

    def organizations(self) -> list[str]:
        return [key.split("/", 1)[1] for key in self.store.list_keys("organizations/")]
