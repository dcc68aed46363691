"""Identifiers: ``<prefix>_<32 lowercase hex>`` over a UUIDv7.

UUIDv7 puts the millisecond timestamp first, so ids and ledger keys sort in
time order; that ordering is what the rebuild's watermark relies on. The
prefix is a reading aid only: authority always comes from the stored record.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

from core.instants import canonical, from_ms

PREFIXES = ("obs", "claim", "ctx", "fb", "req", "key", "org", "ent", "era")
_ID_RE = re.compile(r"^([a-z]+)_([0-9a-f]{32})$")
_lock = threading.Lock()
_last = [0, 0]  # last (ms, counter) so ids minted in one millisecond still sort


def uuid7_hex(ms: int | None = None) -> str:
    """A UUIDv7 as 32 lowercase hex digits, monotonic within this process."""
    with _lock:
        now = int(time.time() * 1000) if ms is None else ms
        if ms is None and now <= _last[0]:
            now, counter = _last[0], _last[1] + 1
            if counter > 0xFFF:
                now, counter = now + 1, 0
        else:
            counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        if ms is None:
            _last[0], _last[1] = now, counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (now & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return f"{value:032x}"


def entry_hex() -> str:
    """A UUIDv7 for a ledger entry, its last 16 bits zero: the records the
    entry creates are numbered into them (``record_hex``), so any record id
    locates its entry (``entry_of``) without an index."""
    return uuid7_hex()[:28] + "0000"


def record_hex(entry: str, index: int) -> str:
    assert entry.endswith("0000") and 0 < index <= 0xFFFF
    return f"{entry[:28]}{index:04x}"


def entry_of(record: str) -> str:
    return record[:28] + "0000"


def uuid7_floor_hex(ms: int) -> str:
    """The smallest UUIDv7 hex of a millisecond: a start key for listing."""
    return f"{(max(ms, 0) & ((1 << 48) - 1)) << 80:032x}"


def uuid7_ms(hex32: str) -> int:
    return int(hex32[:12], 16)


def minted_at(hex32: str) -> str:
    """The canonical instant of a UUIDv7's millisecond: when the ledger
    accepted the entry it names (``recorded_at``, a claim's ``created_at``)."""
    return canonical(from_ms(uuid7_ms(hex32)))


def subject_tag(org_id: str, subject_id: str) -> str:
    """Four hex digits of the subject's hash, written into the ids of the
    context runs compiled for it (``tagged``): an erasure of the subject
    finds its runs by listing ledger keys, without reading every run."""
    return hashlib.sha256(f"{org_id}\n{subject_id}".encode()).hexdigest()[:4]


TAG_AT = slice(24, 28)  # random bits of a UUIDv7, just before an entry id's 16 record bits


def tagged(hex32: str, tag: str) -> str:
    """``hex32`` with ``tag`` in place of four of its random hex digits."""
    return hex32[:TAG_AT.start] + tag + hex32[TAG_AT.stop:]


def tag_of(hex32: str) -> str:
    return hex32[TAG_AT]


def new_id(prefix: str) -> str:
    assert prefix in PREFIXES, prefix
    return f"{prefix}_{uuid7_hex()}"


def parse_id(value: object, prefix: str) -> str | None:
    """The hex part of a well-formed id with this prefix, else None."""
    if not isinstance(value, str):
        return None
    m = _ID_RE.fullmatch(value)
    if not m or m.group(1) != prefix:
        return None
    return m.group(2)
