"""The serving side of snapshots: one read-only generation per organization.

Rules: a reader asks for ``current.json`` at most every ``ttl_seconds`` per
organization (conditionally, by ETag); on change it fetches the new file into
its cache directory, verifies the sha256 recorded in the pointer, opens it
read-only and swaps it in as one reference assignment. Any failure on that
path keeps the old generation serving and is remembered for ``/readyz``. At
most ``max_organizations`` snapshots are held (least recently used evicted,
their files deleted).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import apsw

from core.instants import now_utc, parse_instant
from core.rebuild import file_sha256, pointer_key
from core.snapshot_schema import SCHEMA_VERSION
from core.store import ObjectNotFound, Store
from core.tokens import TOKENIZER_ID


POINTER_READ_FAILED = "reading the snapshot pointer failed"


@dataclass
class Snapshot:
    org_id: str
    generation: int
    pointer: dict
    path: str
    db: apsw.Connection
    watermark: str
    item_views: dict = field(default_factory=dict)  # claim_id -> compile's per-generation item view
    claim_facts: dict = field(default_factory=dict)  # rowid -> compile's per-generation ClaimFacts
    meta: dict = field(default_factory=dict)  # the snapshot's meta table

    @property
    def item_tokens_trusted(self) -> bool:
        """Whether the item counts stored at build were made with this
        process's tokenizer (name and merge-table hash); if not, compile
        counts every item itself."""
        return self.meta.get("item_tokenizer") == TOKENIZER_ID

    @property
    def claim_count(self) -> int:
        return int(self.pointer.get("claim_count", 0))

    def age_seconds(self) -> float:
        return max(0.0, (now_utc() - parse_instant(self.pointer["published_at"])).total_seconds())


@dataclass
class _OrgState:
    snapshot: Snapshot | None = None
    etag: str | None = None
    checked_at: float = float("-inf")
    last_error: str | None = None
    refused_etag: str | None = None  # a pointer whose generation failed verification
    lock: threading.Lock = field(default_factory=threading.Lock)


def open_readonly(path: str, on_open=None) -> apsw.Connection:
    db = apsw.Connection(f"file:{path}?immutable=1",
                         flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    db.execute("PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY")
    if on_open is not None:
        on_open(db)  # e.g. load sqlite-vec, only when vectors are configured
    return db


class SnapshotReader:
    def __init__(self, store: Store, cache_dir: str, ttl_seconds: float = 5.0,
                 max_organizations: int = 16, on_open=None):
        self.store = store
        self.on_open = on_open
        self.cache_dir = cache_dir
        self.ttl = ttl_seconds
        self.max_organizations = max_organizations
        self._orgs: OrderedDict[str, _OrgState] = OrderedDict()
        self._lock = threading.Lock()
        os.makedirs(cache_dir, exist_ok=True)
        # Copies left by an earlier process are never reused (a generation is
        # fetched and verified afresh); unlinking one another process still
        # has open is safe, its open handle keeps the data.
        for name in os.listdir(cache_dir):
            if name.endswith((".sqlite", ".part")):
                try:
                    os.unlink(os.path.join(cache_dir, name))
                except FileNotFoundError:
                    pass

    def _state(self, org_id: str) -> _OrgState:
        with self._lock:
            state = self._orgs.get(org_id)
            if state is None:
                state = self._orgs[org_id] = _OrgState()
            self._orgs.move_to_end(org_id)
            evicted = []
            while len(self._orgs) > self.max_organizations:
                _, old = self._orgs.popitem(last=False)
                evicted.append(old)
        for old in evicted:
            if old.snapshot is not None:
                self._discard(old.snapshot)
        return state

    def current(self, org_id: str) -> Snapshot | None:
        """The generation to serve now, refreshed if the TTL has passed."""
        state = self._state(org_id)
        if time.monotonic() - state.checked_at >= self.ttl:
            self.refresh(org_id)
        return state.snapshot

    def refresh(self, org_id: str, force: bool = False) -> Snapshot | None:
        state = self._state(org_id)
        with state.lock:
            if not force and time.monotonic() - state.checked_at < self.ttl:
                return state.snapshot
            state.checked_at = time.monotonic()
            try:
                obj = self.store.get_if_changed(pointer_key(org_id), state.etag)
            except ObjectNotFound:
                return state.snapshot  # no generation published yet: nothing to serve
            except Exception as exc:  # the store is unreachable: keep serving
                state.last_error = f"{POINTER_READ_FAILED}: {type(exc).__name__}"
                return state.snapshot
            if state.last_error and state.last_error.startswith(POINTER_READ_FAILED):
                state.last_error = None  # the store answers again
            if obj is None or obj.etag == state.refused_etag:
                return state.snapshot
            try:
                snapshot = self._load(org_id, json.loads(obj.body))
            except SnapshotRejected as exc:
                # the same bad generation is not fetched again; a new pointer is
                state.last_error, state.refused_etag = str(exc), obj.etag
                return state.snapshot
            except Exception as exc:
                state.last_error = f"loading the new generation failed: {type(exc).__name__}"
                return state.snapshot
            old, state.snapshot, state.etag, state.last_error = state.snapshot, snapshot, obj.etag, None
            if old is not None and old.path != snapshot.path:
                self._discard(old)
            return snapshot

    def _load(self, org_id: str, pointer: dict) -> Snapshot:
        generation = int(pointer["generation"])
        final = os.path.join(self.cache_dir, f"{org_id}-{generation:012d}-{secrets.token_hex(4)}.sqlite")
        tmp = final + ".part"
        try:
            self.store.download_file(pointer["snapshot_key"], tmp)
            actual = file_sha256(tmp)
            if actual != pointer["sha256"]:
                raise SnapshotRejected(
                    f"generation {generation} refused: its sha256 {actual[:12]}… does not match the "
                    f"recorded {pointer['sha256'][:12]}…; still serving the previous generation")
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        db = open_readonly(final, self.on_open)
        meta = dict(db.execute("SELECT key, value FROM meta"))
        if int(meta.get("schema_version", 0)) != SCHEMA_VERSION:
            db.close()
            os.unlink(final)
            raise SnapshotRejected(
                f"generation {generation} refused: schema version {meta.get('schema_version')} is not "
                f"{SCHEMA_VERSION}; the next rebuild replays the ledger into the current schema")
        watermark = meta["watermark"]
        return Snapshot(org_id, generation, pointer, final, db, watermark, meta=meta)

    @staticmethod
    def _discard(snapshot: Snapshot) -> None:
        # Requests still holding the old connection finish on it: the file is
        # unlinked, not truncated, and the connection closes when released.
        try:
            os.unlink(snapshot.path)
        except FileNotFoundError:
            pass

    def status(self, org_id: str) -> dict:
        state = self._state(org_id)
        snap = state.snapshot
        return {"generation": snap.generation if snap else 0,
                "generation_age_seconds": round(snap.age_seconds(), 3) if snap else None,
                "claim_count": snap.claim_count if snap else 0,
                "last_refresh_error": state.last_error}

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._orgs)


class SnapshotRejected(Exception):
    """A fetched generation failed verification and was not served."""
