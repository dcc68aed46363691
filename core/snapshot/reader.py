"""The serving side of snapshots: one read-only generation per organization.

Rules: a reader asks for ``current.json`` at most every ``ttl_seconds`` per
organization (conditionally, by ETag); on change it gets the new generation
into its cache directory, opens it read-only and swaps it in as one
reference assignment. It gets it by one of two roads (``core.snapshot.chain``):

- **deltas**: when the generation it serves is on the new pointer's chain,
  it copies that file and applies the deltas after it, each verified by page
  digest (``core.snapshot.delta``): a few megabytes for a few new claims;
- **whole**: otherwise, or when that road fails in any way (a delta
  missing, damaged, or based on another file), the chain's whole file,
  verified by sha256, and the deltas after it. A fall-back is remembered
  and ``/readyz`` says why (``last_delta_fallback``). Any failure on that
path keeps the old generation serving and is remembered for ``/readyz``. At
most ``max_organizations`` snapshots are held (least recently used evicted,
their files deleted).

Never a silent wrong answer (docs/architecture.md, "Damaged snapshots"):

- only a file whose sha256 (whole) or page digest (after deltas) matched the pointer is ever opened (copies left
  in the cache by an earlier process are deleted, never reused); at each
  TTL check the open file's size is compared with the pointer's, and a
  forced refresh (after ``POST /v1/admin/rebuild``) hashes it again;
- a SQLite damage error while serving (``DAMAGE_ERRORS``) evicts that
  generation (``evict_damaged``): the request answers 503, ``/readyz`` says
  why, and the next request fetches and verifies the generation afresh;
- ``current`` returns ``None`` only when no generation is published; when
  one is but none verified is loaded it raises ``Unavailable``, so compile
  is a 503, never an empty pack.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field


from core.checksum import file_sha256
from core.errors import Unavailable
from core.instants import canonical, now_utc
from core.layout import pointer_key
from core.meta_table import all_meta
from core.observe.request_line import note_refresh_failure
from core.snapshot.chain import ChainBroken, Fetched, advance, fetch_whole, steps_after
from core.snapshot.pages import PageDigests, hash_file
from core.snapshot.generation import DAMAGE_ERRORS, Snapshot, open_readonly
from core.snapshot.schema import SCHEMA_VERSION
from core.storage import ObjectNotFound, Store

__all__ = ["DAMAGE_ERRORS", "Snapshot", "SnapshotReader", "SnapshotRejected", "SnapshotTooLarge", "open_readonly"]


POINTER_READ_FAILED = "reading the snapshot pointer failed"
MAX_BACKOFF_S = 60.0  # the longest wait between checks while the store keeps failing
# ... while nothing is served: each check may download a whole generation
# (into a cache disk that is full, say), so it backs off too, but a
# recovery is noticed within seconds, since every request is a 503 meanwhile
NOTHING_SERVED_MAX_BACKOFF_S = 5.0
# what a request holds while a refresh reads the pointer (``_OrgState.holding``)
READING, LOADING_ERASED = 1, 2
POINTER_READ_WAIT_S = 0.25
# a spare copy of the served file, never opened: the next deltas are applied
# to it in place, so a copy of the whole file is not on the way to serving
SHADOW = ".shadow"
# below this a copy costs milliseconds: no spare is kept
SHADOW_MIN_BYTES = 8 << 20


@dataclass
class _OrgState:
    snapshot: Snapshot | None = None
    etag: str | None = None
    checked_at: float = float("-inf")
    last_error: str | None = None
    refused_etag: str | None = None  # a pointer whose generation failed verification
    refusal: str | None = None  # why the pointer's generation was refused, until one loads
    published: bool | None = None  # does the store hold a pointer? None: not known yet
    last_eviction: str | None = None  # why the last served generation was evicted as damaged
    rung: int = 0  # the supervisor's bell count this state last refreshed for (titen serve)
    digests: PageDigests | None = None  # the page digests of the served generation's file
    last_load: dict | None = None  # how the last generation was got: road, bytes, deltas, seconds
    last_fallback: str | None = None  # why the deltas road was last left for the whole file
    failures: int = 0  # refreshes in a row the store failed (backoff: ``SnapshotReader.wait``)
    withdrawn: int | None = None  # a generation withdrawn because an erasure came after it
    # READING the pointer, or LOADING_ERASED a generation an erasure came
    # after the served one: requests wait (on ``lock``) rather than answer
    # from the served one, which the erasure may already be complete for —
    # for the read at most POINTER_READ_WAIT_S (a slow or failing store is the
    # documented gap), for the load until it ends
    holding: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def unavailable_reason(self) -> str | None:
        """Why nothing verified is served although a generation may exist."""
        if self.snapshot is not None or self.published is False:
            return None
        reason = self.last_error or self.last_eviction or "no generation verified yet"
        return f"no verified generation is loaded: {reason}"


class SnapshotReader:
    def __init__(self, store: Store, cache_dir: str, ttl_seconds: float = 5.0,
                 max_organizations: int = 16, on_open=None, max_bytes: int | None = None,
                 shadow_min_bytes: int = SHADOW_MIN_BYTES, bell=None):
        self.store = store
        # titen serve's supervisor counts its publishes in shared memory
        # (core.rebuild.host): a count an organization's state has not
        # refreshed for makes its check due now, whatever its TTL, and a
        # request waits for a refresh in flight rather than serve the older
        # generation (another server process may already serve the new one)
        self.bell = bell
        self.on_open = on_open
        self.cache_dir = cache_dir
        self.ttl = ttl_seconds
        self.max_organizations = max_organizations
        self.shadow_min_bytes = shadow_min_bytes
        self._orgs: OrderedDict[str, _OrgState] = OrderedDict()
        self._lock = threading.Lock()
        os.makedirs(cache_dir, exist_ok=True)
        # the disk budget of the cache, downloads in flight included
        # (docs/architecture.md, "The snapshot cache is bounded by bytes")
        self.max_bytes = max_bytes if max_bytes is not None else default_cache_bytes(cache_dir)
        # Copies left by an earlier process are never reused (a generation is
        # fetched and verified afresh); unlinking one another process still
        # has open is safe, its open handle keeps the data.
        for name in os.listdir(cache_dir):
            if name.endswith((".sqlite", ".part", SHADOW)):
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
        """The verified generation to serve now, refreshed if the TTL has
        passed; ``None`` only when the organization has no published
        generation. ``Unavailable`` when one is published but none verified
        is loaded (a damaged file, an unreachable store at start-up)."""
        snapshot, reason = self.check(org_id)
        if reason is not None:
            raise Unavailable(f"the snapshot of this organization is unavailable ({reason}); "
                              "retry shortly, or rebuild it")
        return snapshot

    def check(self, org_id: str) -> tuple[Snapshot | None, str | None]:
        """(the generation served, why none can be) refreshing if due; never raises."""
        state = self._state(org_id)
        rung = self.bell.value if self.bell is not None else 0
        if rung != state.rung or time.monotonic() - state.checked_at >= self.ttl:
            self.refresh(org_id, rung=rung)
        elif state.snapshot is None and state.published is not False:
            with state.lock:  # a first load in another thread stamped checked_at: wait for it
                pass
        elif state.holding:
            acquired = state.lock.acquire(timeout=POINTER_READ_WAIT_S)
            if not acquired and state.holding == LOADING_ERASED:
                acquired = state.lock.acquire()  # the generation an erasure came after: wait for it
            if acquired:
                state.lock.release()
            # else a slow pointer read: serve what is held, as when the store cannot be read
        snapshot = state.snapshot
        return snapshot, (state.unavailable_reason() if snapshot is None else None)

    def evict_damaged(self, org_id: str, exc: BaseException) -> str:
        """SQLite reported damage while serving: drop the generation served
        (its file deleted), remember why, and refetch at the next request."""
        state = self._state(org_id)
        with state.lock:
            old = state.snapshot
            generation = old.generation if old is not None else 0
            reason = (f"generation {generation} evicted at {canonical(now_utc())}: SQLite reported "
                      f"{type(exc).__name__} while serving it; fetching and verifying it again")
            if old is not None:
                state.snapshot, state.etag, state.refused_etag = None, None, None
                state.checked_at = float("-inf")
                state.last_eviction = reason
                self._discard(old)
        return reason

    def refresh(self, org_id: str, force: bool = False, rung: int | None = None) -> Snapshot | None:
        state = self._state(org_id)
        with state.lock:
            rung_seen = rung is None or rung == state.rung
            if not force and rung_seen and time.monotonic() - state.checked_at < self.wait(state):
                return state.snapshot
            try:
                return self._refresh(org_id, state, force)
            finally:
                if rung is not None:
                    state.rung = rung  # only now: a request checking meanwhile waits on the lock

    def wait(self, state: _OrgState) -> float:
        """Seconds between checks: the TTL, doubled for each refresh in a row
        the store failed, up to ``MAX_BACKOFF_S``. A refresh runs in the
        request that finds it due, and a throttled store can hold it for
        seconds (botocore's retries): backing off keeps that cost to a few
        requests instead of one per TTL, while the served generation keeps
        serving."""
        if not state.failures:
            return self.ttl
        longest = MAX_BACKOFF_S if state.snapshot is not None else NOTHING_SERVED_MAX_BACKOFF_S
        return min(longest, self.ttl * 2 ** min(state.failures, 8))

    def _refresh(self, org_id: str, state: _OrgState, force: bool) -> Snapshot | None:
        """Called with ``state.lock`` held."""
        state.checked_at = time.monotonic()
        failures_before = state.failures
        state.failures = 0
        try:
            snapshot = self._refresh_now(org_id, state, force)
        except BaseException:
            state.failures = failures_before + 1
            raise
        finally:
            state.holding = 0  # (set by _refresh_now for the read and the load it made)
        if state.last_error and not state.last_error.startswith("generation "):
            state.failures = failures_before + 1  # the store failed (a refusal is not retried anyway)
        return snapshot

    def _refresh_now(self, org_id: str, state: _OrgState, force: bool) -> Snapshot | None:
        self._check_open_file(state, full=force)
        # until the pointer is read, nobody knows whether an erasure came
        # after the served generation: requests wait for the read (briefly)
        state.holding = READING if state.snapshot is not None else 0
        try:
            obj = self.store.get_if_changed(pointer_key(org_id), state.etag)
        except ObjectNotFound:
            if state.snapshot is not None:  # the pointer vanished: keep what was verified
                return state.snapshot
            state.published, state.last_error = False, None
            return None  # no generation published yet: nothing to serve
        except Exception as exc:  # the store is unreachable: keep serving
            state.last_error = f"{POINTER_READ_FAILED}: {type(exc).__name__}"
            note_refresh_failure()  # the RefreshFailures metric (core/observe/metrics.py)
            return state.snapshot
        state.published = True
        if state.last_error and state.last_error.startswith(POINTER_READ_FAILED):
            state.last_error = None  # the store answers again
        if obj is None or obj.etag == state.refused_etag:
            return state.snapshot
        try:
            pointer = json.loads(obj.body)
            if not isinstance(pointer, dict):
                raise ValueError("the pointer is not a JSON object")
        except ValueError as exc:  # a damaged pointer: keep serving what was verified
            state.last_error = f"loading the new generation failed: {type(exc).__name__}"
            note_refresh_failure()
            return state.snapshot
        held = state.snapshot
        state.holding = LOADING_ERASED if (held is not None and int(pointer.get("erased_through") or 0)
                                           > held.generation) else 0
        try:
            snapshot, digests = self._load(org_id, state, pointer)
        except SnapshotRejected as exc:
            self._withdraw_erased(state, pointer)
            # the same bad generation is not fetched again; a new pointer is
            served = ("still serving generation %d" % state.snapshot.generation if state.snapshot
                      else "no generation is being served; compile answers 503 until a rebuild "
                           "publishes a verified one")
            state.last_error, state.refused_etag = f"{exc}; {served}", obj.etag
            state.refusal = None if isinstance(exc, SnapshotTooLarge) else str(exc)
            note_refresh_failure()
            return state.snapshot
        except Exception as exc:
            withdrawn = self._withdraw_erased(state, pointer) or (state.withdrawn if state.snapshot is None else None)
            state.withdrawn = withdrawn
            error = f"loading the new generation failed: {type(exc).__name__}" + (
                f"; generation {withdrawn} is no longer served: an erasure was carried out after it"
                if withdrawn else "")
            if error != state.last_error:  # the traceback once per run of the same failure; /readyz says it meanwhile
                logging.getLogger("titen").warning("%s: loading generation failed", org_id, exc_info=True)
            state.last_error = error
            note_refresh_failure()
            return state.snapshot
        old, state.snapshot, state.etag, state.last_error = state.snapshot, snapshot, obj.etag, None
        state.withdrawn = None
        state.digests, state.refusal = digests, None
        if old is not None and old.path != snapshot.path:
            self._discard(old)
        self._make_shadow(state, snapshot)
        return snapshot

    def _withdraw_erased(self, state: _OrgState, pointer: dict) -> int | None:
        """When the pointer says an erasure was carried out after the served
        generation (``erased_through``) and the new one cannot be loaded, the
        served one holds erased records: it is withdrawn (compile answers
        503) rather than served. Returns its generation, if withdrawn."""
        snap = state.snapshot
        if snap is None or int(pointer.get("erased_through") or 0) <= snap.generation:
            return None
        state.snapshot, state.etag = None, None
        self._discard(snap)
        return snap.generation

    def _check_open_file(self, state: _OrgState, *, full: bool) -> None:
        """Evict the served generation when its cached file no longer is the
        verified one: missing or of another size (cheap, every TTL check), or
        (``full``, on a forced refresh) of another sha256."""
        snap = state.snapshot
        if snap is None:
            return
        try:
            size = os.path.getsize(snap.path)
            damaged = size != int(snap.pointer.get("bytes", size))
            if not damaged and full:
                if snap.pointer.get("deltas"):  # made from deltas: its page digest is what is recorded
                    damaged = hash_file(snap.path, whole=False)[1].digest() != snap.pointer["digest"]
                else:
                    damaged = file_sha256(snap.path) != snap.pointer["sha256"]
            what = "its sha256 or size no longer matches the pointer"
        except OSError as exc:
            damaged, what = True, f"its cached file is unreadable ({type(exc).__name__})"
        if damaged:
            state.last_eviction = (f"generation {snap.generation} evicted at {canonical(now_utc())}: {what}; "
                                   "fetching and verifying it again")
            state.snapshot, state.etag, state.refused_etag = None, None, None
            self._discard(snap)

    def cached_bytes(self) -> int:
        """Bytes of the generations held (their pointers' sizes), their spare
        copies included."""
        with self._lock:
            states = list(self._orgs.values())
        return sum(int(st.snapshot.pointer.get("bytes", 0)) * (2 if os.path.exists(st.snapshot.path + SHADOW) else 1)
                   for st in states if st.snapshot is not None)

    def _make_shadow(self, state: _OrgState, snapshot: Snapshot) -> None:
        """Copy the generation just loaded, in the background, to its spare
        (``SHADOW``) when the cache budget has room for it; the next deltas
        road renames the spare into place instead of copying on its way."""
        size = int(snapshot.pointer.get("bytes", 0))
        if size < self.shadow_min_bytes or self.cached_bytes() + size > self.max_bytes:
            return

        def copy() -> None:
            part = snapshot.path + SHADOW + ".part"
            try:
                shutil.copyfile(snapshot.path, part)
                os.replace(part, snapshot.path + SHADOW)
                if state.snapshot is not snapshot or snapshot.retired:  # replaced meanwhile
                    os.unlink(snapshot.path + SHADOW)
            except OSError:
                pass
            finally:
                if os.path.exists(part):
                    try:
                        os.unlink(part)
                    except OSError:
                        pass

        threading.Thread(target=copy, name="snapshot-shadow", daemon=True).start()

    def _make_room(self, org_id: str, state: _OrgState, generation: int, needed: int) -> None:
        """Evict least recently used organizations' generations until
        ``needed`` more bytes fit in the budget; as a last resort this
        organization's own older generation (the new one replaces it).
        Called with ``state.lock`` held."""
        if needed > self.max_bytes:
            raise SnapshotTooLarge(
                f"generation {generation} needs {needed} bytes, more than this "
                f"instance's snapshot cache budget of {self.max_bytes} bytes (TITEN_CACHE_BYTES, derived "
                "from the ephemeral storage size); it cannot be served here")
        while self.cached_bytes() + needed > self.max_bytes:
            with self._lock:
                victims = [(o, st) for o, st in self._orgs.items() if o != org_id and st.snapshot is not None]
            evicted = False
            for other, st in victims:  # least recently used first
                if not st.lock.acquire(blocking=False):
                    continue  # loading right now: try the next one
                try:
                    old, st.snapshot, st.etag = st.snapshot, None, None
                    st.checked_at = float("-inf")
                finally:
                    st.lock.release()
                with self._lock:
                    if self._orgs.get(other) is st:
                        del self._orgs[other]
                if old is not None:
                    self._discard(old)
                evicted = True
                break
            if not evicted:
                if state.snapshot is not None:
                    old, state.snapshot = state.snapshot, None
                    self._discard(old)
                    continue
                return  # only files still being read by other requests are left

    def _load(self, org_id: str, state: _OrgState, pointer: dict) -> tuple[Snapshot, PageDigests]:
        generation = int(pointer["generation"])
        os.makedirs(self.cache_dir, exist_ok=True)  # (removed from under us: a sweep, an operator)
        self._make_room(org_id, state, generation, int(pointer.get("bytes", 0)))
        final = os.path.join(self.cache_dir, f"{org_id}-{generation:012d}-{secrets.token_hex(4)}.sqlite")
        tmp = final + ".part"
        started = time.monotonic()
        fetched = Fetched()
        held, digests, fallback = state.snapshot, None, None
        steps = steps_after(pointer, state.digests.digest()) if held is not None and state.digests else None
        try:
            if steps is not None:  # the deltas road, from the file served now
                try:
                    try:  # its spare copy, if made: no copy on the way
                        os.replace(held.path + SHADOW, tmp)
                        spare = True
                    except FileNotFoundError:
                        shutil.copyfile(held.path, tmp)
                        spare = False
                    digests = advance(self.store, steps, tmp, state.digests, fetched)
                    if digests.digest() != pointer.get("digest"):
                        raise ChainBroken("does not have its recorded page digest")
                except (ChainBroken, OSError) as exc:
                    digests, fetched = None, Fetched(downloaded=fetched.downloaded)
                    fallback = (f"generation {generation}: the deltas from generation {held.generation} "
                                f"failed ({exc}); the whole file was fetched instead")
            elif held is not None and pointer.get("deltas"):
                fallback = (f"generation {generation}: the generation served ({held.generation}) is not on its "
                            "chain of deltas; the whole file was fetched instead")
            if fallback:
                state.last_fallback = f"{fallback} at {canonical(now_utc())}"
            if digests is None:
                try:
                    digests = fetch_whole(self.store, pointer, tmp, fetched)
                except ChainBroken as exc:
                    raise SnapshotRejected(f"generation {generation} refused: {exc}") from None
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        state.last_load = {"generation": generation, "road": "deltas" if steps is not None and not fallback
                           else "whole", "downloaded_bytes": fetched.downloaded, "deltas": fetched.deltas,
                           "seconds": round(time.monotonic() - started, 4)}
        if steps is not None and not fallback:
            state.last_load["from"] = "spare copy" if spare else "copy"
        try:
            db = open_readonly(final, self.on_open)
            meta = all_meta(db)
        except DAMAGE_ERRORS as exc:
            os.unlink(final)
            raise SnapshotRejected(f"generation {generation} refused: SQLite reports {type(exc).__name__} "
                                   "on opening it") from None
        if int(meta.get("schema_version", 0)) != SCHEMA_VERSION:
            db.close()
            os.unlink(final)
            raise SnapshotRejected(
                f"generation {generation} refused: schema version {meta.get('schema_version')} is not "
                f"{SCHEMA_VERSION}; the next rebuild replays the ledger into the current schema")
        watermark = meta["watermark"]
        return Snapshot(org_id, generation, pointer, final, db, watermark, meta=meta, on_open=self.on_open), digests

    @staticmethod
    def _discard(snapshot: Snapshot) -> None:
        # Requests still holding a connection of the old generation finish on
        # it: the file is unlinked, not truncated, and its connections close
        # when released (Snapshot.retire).
        snapshot.retire()
        for path in (snapshot.path, snapshot.path + SHADOW):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def status(self, org_id: str) -> dict:
        state = self._state(org_id)
        snap = state.snapshot
        return {"generation": snap.generation if snap else 0,
                "generation_age_seconds": round(snap.age_seconds(), 3) if snap else None,
                "claim_count": snap.claim_count if snap else 0,
                "last_refresh_error": state.last_error,
                "last_eviction": state.last_eviction,
                "last_load": state.last_load,
                "last_delta_fallback": state.last_fallback,
                "unavailable": state.unavailable_reason()}

    def needs_repair(self, org_id: str) -> str | None:
        """Why the published generation was refused here, if it was: a
        rebuild should then build from the ledger rather than on it."""
        return self._state(org_id).refusal

    def check_held(self) -> None:
        """``check`` every organization still held: a follower's pass, which
        must not bring back one evicted meanwhile (``check`` makes the state
        of an organization it does not hold, and evicts another for it)."""
        for org_id in self.loaded():
            with self._lock:
                held = org_id in self._orgs
            if held:
                self.check(org_id)

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._orgs)

    def release(self) -> None:
        """Hold nothing any more (each generation's file deleted): for a
        process that checked generations but does not serve them."""
        with self._lock:
            states, self._orgs = list(self._orgs.values()), OrderedDict()
        for state in states:
            if state.snapshot is not None:
                self._discard(state.snapshot)


class SnapshotRejected(Exception):
    """A fetched generation failed verification and was not served."""


class SnapshotTooLarge(SnapshotRejected):
    """A generation larger than the whole cache budget: not damaged, just
    not servable by this instance (no rebuild repairs it)."""


def default_cache_bytes(cache_dir: str) -> int:
    """75% of the volume the cache lives on (on Lambda: /tmp, the function's
    ephemeral storage), when ``TITEN_CACHE_BYTES`` is not set."""
    import shutil
    return int(shutil.disk_usage(cache_dir).total * 0.75)

