"""What every write shares: its store, and how it lands.

A write is validated and authorized completely, resolved to final values
(``core.writes.records``), and only then appended to the ledger as one
entry — so a rejected write leaves no trace, and the rebuild is a pure
apply of what was accepted. Appending claims the write's Idempotency-Key
first (``core.writes.idempotency``) and tells ``on_write`` afterwards (the
local rebuild timer, or the rebuild queue on Lambda).
"""

from __future__ import annotations

from typing import Callable

from core.keys import Principal
from core.layout import entry_key
from core.ledger import Ledger
from core.snapshot.reader import SnapshotReader
from core.storage import Store
from core.writes.idempotency import Attempt


class WriteDesk:
    def __init__(self, store: Store, reader: SnapshotReader, on_write: Callable[[str], None] | None = None):
        self.store = store
        self.ledger = Ledger(store)
        self.reader = reader
        self.on_write = on_write or (lambda org_id: None)

    def _append(self, principal: Principal, entry_type: str, payload: dict, attempt: Attempt,
                status: int, result: dict) -> dict:
        """Claim the idempotency key (if any), then store the entry with its answer."""
        hex_ = attempt.entry_hex
        attempt.claim(entry_key(principal.org_id, hex_))
        entry = self.ledger.append(principal.org_id, entry_type, {**payload, **attempt.answer(status, result)},
                                   actor=principal.principal_id, entry_hex=hex_)
        self.on_write(principal.org_id)
        return entry
