"""The service object: one store, its ledger, keys, snapshots and commands.

Built once per process (module level on Lambda, at start-up for ``titen
serve``) and shared by the HTTP app and the CLI. With ``auto_rebuild`` (the
local mode) a write schedules an in-process rebuild of its organization a
moment later, so a write is compile-visible within about a second. With a
rebuild queue (``TITEN_REBUILD_QUEUE_URL``, on Lambda) a write instead sends
its organization's rebuild request to that queue (``core.rebuild.queue``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time

from core.compile.compiler import Compiler
from core.config import Settings
from core.erasure.requests import ErasureDesk
from core.errors import Conflict, Unavailable
from core.ids import parse_id, tag_of
from core.keys import KeyRing
from core.ledger import Ledger
from core.observe.emf import Metrics
from core.snapshot.build import RebuildResult, SnapshotBuilder
from core.snapshot.publish import RebuildConflict
from core.snapshot.reader import SnapshotReader
from core.storage import StoreError, open_store
from core.writes import Writes
from core.writes.feedback import FeedbackDesk
from core.writes.idempotency import Idempotency, Outcome

AUTO_REBUILD_DELAY = 0.25
# A scheduled rebuild that failed (the store down, a damaged entry) is tried
# again after 1, 2, 4 … seconds, at most a minute apart: its writes were
# acknowledged, and on a local host no schedule would ever catch them up.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
# how long POST /v1/admin/rebuild on Lambda waits for the rebuild function:
# under the API function's 29 s timeout, so a longer rebuild is the 503
# envelope rather than API Gateway's own 5xx (the rebuild goes on and publishes)
REMOTE_REBUILD_WAIT_SECONDS = 25.0


def retry_delay(failed: int) -> float:
    """Seconds before the next try after ``failed`` failures in a row: 1, 2,
    4 … at most a minute (the exponent capped, so it never overflows)."""
    return min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(failed - 1, 16))


LOAD_SPACING = 3  # while writes keep coming, at most a quarter of the time rebuilding
QUIET_SECONDS = 0.05  # no write for this long: the writes paused


class _Count:
    """A counter with the ``value`` of a multiprocessing Value."""
    value = 0


class Service:
    def __init__(self, settings: Settings, *, auto_rebuild: bool = False, store=None, embedder=None,
                 rebuilds=None, serves: bool = True, bell=None, reader_dir: str | None = None):
        """``rebuilds``: a server process of ``titen serve`` asks its
        supervisor for every rebuild (``core.rebuild.host``); ``serves``
        False: the supervisor itself, which builds but serves nothing;
        ``bell``: the supervisor's publish counter this reader looks at per
        request (core.serving sets the supervisor's ``on_publish`` to ring it; a builder calls it
        before an erasure it carried out is marked complete); ``reader_dir``:
        where this process keeps the generations it serves, when not the
        cache directory itself (a directory of its own, held for its life:
        core.serving.standalone_service)."""
        self.settings = settings
        self.metrics = Metrics.from_settings(settings)  # EMF on stdout when TITEN_METRICS=emf
        self.store = store or open_store(settings.store_url)
        self.ledger = Ledger(self.store)
        self.keys = KeyRing(self.store)
        # The vector path exists only when configured: otherwise nothing
        # vector-related is imported or loaded and compile says "disabled".
        self.embedder = embedder
        self.vectors = None
        on_open = None
        if self.embedder is None and settings.embedder:
            from core.vectors import from_spec
            self.embedder = from_spec(settings.embedder)
        if self.embedder is not None and settings.embed_calibration:
            from core.vectors.calibration import Calibration
            calibration = Calibration.parse(settings.embed_calibration)
            self.embedder.fingerprint = self.embedder.fingerprint.with_calibration(calibration)
        if self.embedder is not None:
            from core.vectors.index import load_sqlite_vec
            from core.vectors.search import VectorSearch
            self.vectors = VectorSearch(self.embedder, settings.embed_timeout_ms / 1000)

            def on_open(db):
                try:
                    load_sqlite_vec(db)
                except Exception:  # served lexical-only; compile says vector "error"
                    logging.getLogger("titen").exception("loading sqlite-vec failed")
        self.vector_state = "used" if self.vectors is not None else "disabled"
        self.reader = SnapshotReader(self.store, reader_dir or settings.cache_dir, settings.snapshot_ttl,
                                     settings.max_orgs,
                                     on_open=on_open, max_bytes=settings.cache_bytes, bell=bell)
        self.auto_rebuild = auto_rebuild
        self.rebuilds = rebuilds
        self.serves = serves
        self.on_publish = None  # called (no arguments) the moment this process publishes a generation
        self.rebuild_queue = None
        if settings.rebuild_queue_url and not auto_rebuild:
            from core.rebuild.queue import RebuildQueue
            self.rebuild_queue = RebuildQueue(settings.rebuild_queue_url)
        on_write = (rebuilds.request if rebuilds is not None
                    else self.schedule_rebuild if auto_rebuild
                    else self.rebuild_queue.request if self.rebuild_queue else None)
        self.on_write = on_write
        self.writes = Writes(self.store, self.reader, on_write)
        self.compiler = Compiler(self.ledger, self.reader, self.vector_state, self.vectors)
        self.feedback = FeedbackDesk(self.ledger, on_write)
        self.idempotency = Idempotency(self.store)
        self.erasures = ErasureDesk(self.store, on_write)
        self._rebuild_locks: dict[str, threading.RLock] = {}
        self._pending: set[str] = set()  # organizations with a scheduled rebuild not yet begun
        self._last_rebuild: dict[str, tuple[float, float]] = {}  # org -> (ended, seconds), monotonic
        self._failed_rebuilds: dict[str, int] = {}  # org -> scheduled rebuilds failed in a row
        self._guard = threading.Lock()
        # titen serve's supervisor replaces both with counters in shared
        # memory (core.serving): ``begun`` moves each time a scheduled
        # rebuild begins, ``written`` with every write any server stores
        self.begun = None
        self.written = _Count()

    def write(self, principal, route: str, params: dict, body, idempotency_key: str | None = None) -> Outcome:
        """Every write route, for every caller (HTTP, CLI, MCP): ``route`` is
        one of ``WRITE_ROUTES``; with a key, a retry replays the first answer
        (core/writes/idempotency.py, docs/api.md §12)."""
        scope, run = WRITE_ROUTES[route]
        principal.require(scope)  # before any record is read: a key without the scope learns nothing
        # feedback's entry id carries its pack's subject tag (core.ids.subject_tag), as the pack's id does
        context_hex = parse_id(params.get("context_id"), "ctx")
        try:
            outcome = self.idempotency.run(principal, route, idempotency_key, params, body,
                                           lambda attempt: run(self, principal, params, body, attempt),
                                           tag=tag_of(context_hex) if context_hex else None)
        except StoreError:
            # the entry may have landed with the store's answer lost: ask for
            # the rebuild it would have asked for (a rebuild with nothing new
            # costs a listing), or it waits for the schedule
            self._ask_rebuild(principal.org_id)
            raise
        if outcome.replay:
            # the first attempt stored its entry but may not have lived to ask
            self._ask_rebuild(principal.org_id)
        return outcome

    def _ask_rebuild(self, org_id: str) -> None:
        if self.on_write is None:
            return
        try:
            self.on_write(org_id)
        except Exception:  # never fails the answer: the schedule catches the write up
            logging.getLogger("titen").exception("asking for %s's rebuild failed", org_id)

    def builder(self, org_id: str, progress=None) -> SnapshotBuilder:
        return SnapshotBuilder(self.store, org_id, work_dir=os.path.join(self.settings.cache_dir, "build"),
                               skew_seconds=self.settings.skew_seconds, progress=progress,
                               embedder=self.embedder, keep_bytes=self.settings.rebuild_keep_bytes,
                               after_publish=self.on_publish, readers_ttl=self.settings.snapshot_ttl,
                               reader_cache_dir=self.settings.cache_dir)

    def rebuild(self, org_id: str, *, from_scratch: bool = False, force: bool = False,
                progress=None) -> RebuildResult:
        """Rebuild one organization and serve the result before returning.
        When this server refused the published generation (damaged,
        missing), the rebuild replays the ledger and publishes a new one
        whatever the ledger holds, and its ``notes`` say so."""
        repair = self.reader.needs_repair(org_id)
        note = (f"this server refused the published generation ({repair}): built from the ledger",) \
            if repair else ()
        if self.settings.rebuild_function:
            result = self._rebuild_remotely(org_id, from_scratch or bool(repair))
            return dataclasses.replace(result, notes=note + result.notes)
        with self._rebuild_lock(org_id):
            if self.rebuilds is not None:
                result = self.rebuilds.rebuild(org_id, from_scratch=from_scratch or bool(repair), force=force)
            else:
                result = self._build_here(org_id, from_scratch or bool(repair), force, progress)
            if self.serves:
                self.reader.refresh(org_id, force=True)
        if not repair and self.reader.needs_repair(org_id):
            # serving it showed the published generation damaged (e.g. a build
            # that started from this machine's intact kept copy): repair now
            return self.rebuild(org_id, force=force, progress=progress)
        with self._guard:
            self._failed_rebuilds.pop(org_id, None)  # the backoff starts afresh at the next failure
        return dataclasses.replace(result, notes=note + result.notes)

    def preload(self) -> None:
        """Load the snapshots of ``TITEN_PRELOAD_ORGS`` now (the Lambda API
        function calls it at import: the init phase, at full CPU, instead
        of an organization's first request). Never raises: an organization
        that cannot be loaded now is loaded, or refused, by its first
        request as usual."""
        for org_id in self.settings.preload_organizations:
            snapshot, reason = self.reader.check(org_id)
            if reason is not None:
                logging.getLogger("titen").warning("preloading %s's snapshot failed: %s", org_id, reason)
            elif snapshot is not None:
                logging.getLogger("titen").info("preloaded %s generation %s", org_id, snapshot.generation)

    def snapshot_damaged(self, org_id: str, exc: BaseException) -> Unavailable:
        """A request met a damaged snapshot file: evict it (refetched and
        verified at the next request) and answer this one with a 503."""
        reason = self.reader.evict_damaged(org_id, exc)
        logging.getLogger("titen").error("%s: %s", org_id, reason)
        return Unavailable(f"the snapshot of this organization is damaged and was evicted; it is being "
                           f"fetched and verified again, retry shortly ({reason})")

    def vector_status(self, org_ids: list[str]) -> tuple[str, str | None]:
        """(/readyz vector state, reason): disabled; enabled; or error when a
        loaded snapshot's vectors cannot serve the configured embedder."""
        if self.vectors is None:
            return "disabled", None
        for org_id in org_ids:
            snapshot, _ = self.reader.check(org_id)
            problem = self.vectors.problem(snapshot) if snapshot is not None else None
            if problem:
                return "error", f"{org_id}: {problem}"
        return "enabled", None

    def _rebuild_remotely(self, org_id: str, from_scratch: bool) -> RebuildResult:
        """On Lambda the API may not write snapshots (least privilege): it asks
        the rebuild function (the pointer's compare-and-swap settles a race
        with a queued rebuild of the same organization: 409)."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import (ClientError, ConnectionError as BotoConnectionError, HTTPClientError,
                                         ReadTimeoutError)

        # one attempt: a retry after a read timeout would start a second rebuild
        client = boto3.client("lambda", config=Config(read_timeout=REMOTE_REBUILD_WAIT_SECONDS, connect_timeout=5,
                                                      retries={"total_max_attempts": 1}))
        try:
            response = client.invoke(FunctionName=self.settings.rebuild_function,
                                     Payload=json.dumps({"org_id": org_id, "from_scratch": from_scratch}).encode())
        except client.exceptions.TooManyRequestsException:
            raise Conflict("a rebuild is already running; retry shortly") from None
        except ReadTimeoutError:
            raise Unavailable(f"the rebuild is still running after {REMOTE_REBUILD_WAIT_SECONDS:g} s; it publishes "
                              "when it is done (GET /readyz shows the generation served)") from None
        except (BotoConnectionError, HTTPClientError):
            raise Unavailable("the rebuild function could not be reached, or its answer was lost; the rebuild "
                              "may still publish (GET /readyz); retry shortly") from None
        except ClientError as exc:  # no such function, access denied: a deployment to fix, not a crash
            code = exc.response.get("Error", {}).get("Code", "error")
            raise Unavailable(f"the rebuild function could not be invoked ({code}): check the API function's "
                              "TITEN_REBUILD_FUNCTION and its permission to invoke it; the scheduled rebuild "
                              "still runs") from None
        summary = json.loads(response["Payload"].read() or b"{}")
        if response.get("FunctionError") or not summary.get("results"):
            raise Unavailable("the rebuild function failed; see its logs")
        line = summary["results"][0]
        if line.get("status") == "conflict":
            raise Conflict("another rebuild of this organization published first; retry")
        if line.get("status") not in ("published", "unchanged"):
            raise Unavailable(f"the rebuild did not complete ({line.get('status')}); see its logs")
        self.reader.refresh(org_id, force=True)
        return RebuildResult(org_id, line["generation"], line["published"], line.get("entries_applied", 0),
                             line.get("content_hash", ""), line.get("claim_count", 0), line.get("bytes", 0),
                             line.get("seconds", 0.0), line.get("snapshot_key"))

    def _build_here(self, org_id: str, from_scratch: bool, force: bool, progress) -> RebuildResult:
        for attempt in range(2):
            try:
                result = self.builder(org_id, progress).rebuild(from_scratch=from_scratch, force=force)
                break
            except RebuildConflict:
                if attempt:
                    raise Conflict("another rebuild of this organization published first; retry") from None
        return result

    def schedule_rebuild(self, org_id: str, *, delay: float = AUTO_REBUILD_DELAY, write: bool = True) -> int:
        """A rebuild of the organization ``AUTO_REBUILD_DELAY`` after a write.
        At most one waits per organization: a write while one is pending is
        folded into it (that rebuild lists the ledger after the write was
        stored). While writes keep coming, rebuilds are spaced by
        ``LOAD_SPACING`` times their own duration (``_run_scheduled``), so a
        bulk load is not slowed down by the generations it causes; once
        writes pause, the pending one runs at once.

        Returns the count of scheduled rebuilds begun so far (``begun``,
        read with the pending set): until that count moves, the rebuild
        pending now has not listed the ledger, so a write stored meanwhile
        needs no request of its own (``core.rebuild.host.RebuildClient``).
        ``write`` False: a retry, which is no write of its own."""
        with self._guard:
            if write:
                self.written.value += 1
            begun = self.begun.current() if self.begun is not None else 0
            if org_id in self._pending:
                return begun
            self._pending.add(org_id)
            timer = threading.Timer(delay, self._run_scheduled, args=(org_id,))
            timer.daemon = True
        timer.start()
        return begun

    def _run_scheduled(self, org_id: str) -> None:
        self._space_under_load(org_id)
        with self._rebuild_lock(org_id):  # behind a rebuild still running
            with self._guard:
                if org_id not in self._pending:
                    return  # taken meanwhile by finish_scheduled_rebuilds, which ran it
                self._pending.discard(org_id)  # from here a write needs a rebuild of its own
            # ... and its server asks again. Moved outside the guard: a server
            # holding the count's lock for long must not stall every request
            # (a request landing in between answers the old count, and the
            # move makes its server ask again). Moved before the ledger is listed.
            if self.begun is not None:
                try:
                    self.begun.increment()
                except OSError:  # unmoved, servers would skip this org's writes: pending again
                    logging.getLogger("titen").exception("moving the rebuilds-begun count failed")
                    self.schedule_rebuild(org_id, write=False)
                    return
            started = time.monotonic()
            try:
                self.rebuild(org_id)
            except Conflict:
                # another process on the store (titen rebuild, titen mcp beside
                # titen serve) published twice meanwhile; what it built may
                # have been listed before this write, so the write still needs
                # a rebuild of its own. Expected, so one line, no traceback.
                delay = self.retry_rebuild(org_id)
                logging.getLogger("titen").warning("in-process rebuild of %s: another process published "
                                                   "first; rebuilding again in %g s", org_id, delay)
            except Exception:
                delay = self.retry_rebuild(org_id)
                logging.getLogger("titen").exception("in-process rebuild of %s failed; trying again in %g s",
                                                     org_id, delay)
            with self._guard:
                self._last_rebuild[org_id] = (time.monotonic(), time.monotonic() - started)

    def retry_rebuild(self, org_id: str) -> float:
        """Schedule the organization's rebuild again after one that failed
        (its writes were acknowledged, and on a local host no schedule would
        catch them up): ``retry_delay`` after each failure in a row, until a
        rebuild succeeds. Returns the delay."""
        with self._guard:
            failed = self._failed_rebuilds[org_id] = self._failed_rebuilds.get(org_id, 0) + 1
        delay = retry_delay(failed)
        self.schedule_rebuild(org_id, delay=delay, write=False)
        return delay

    def finish_scheduled_rebuilds(self) -> list[tuple[str, Exception]]:
        """Run now every rebuild scheduled and not yet begun, and wait for
        one running. A process that ends (``titen mcp`` at the end of its
        input, or stopped) must not take its writes' rebuild with it: on a
        local store nothing else would apply them until another write of
        the organization, and an erasure would stay pending with its text
        served. Returns the organizations whose rebuild failed, and why."""
        with self._guard:
            orgs = sorted(set(self._pending) | set(self._rebuild_locks))
        failed = []
        for org_id in orgs:
            with self._rebuild_lock(org_id):  # behind one running
                with self._guard:
                    due = org_id in self._pending
                    self._pending.discard(org_id)
                if not due:
                    continue
                try:
                    self.rebuild(org_id)
                except Exception as exc:
                    failed.append((org_id, exc))
        return failed

    def catch_up(self) -> list[str]:
        """Schedule the rebuild of every organization whose ledger holds an
        entry its published generation lacks (``core.rebuild.backlog``: a
        pointer read and a listing after its watermark, no snapshot): the
        safety net of a long-lived process, as the schedule is on Lambda,
        for writes whose own rebuild never ran (a ``titen mcp`` killed
        right after a write, ``titen import`` without ``--rebuild``).
        Returns the organizations scheduled."""
        from core.rebuild.backlog import backlog

        scheduled = []
        for org_id in self.ledger.organizations():
            with self._guard:
                if org_id in self._pending:
                    continue
            try:
                due = backlog(self.store, org_id, skew_seconds=self.settings.skew_seconds).due
            except Exception as exc:  # one organization's fault holds up no other's catch-up
                logging.getLogger("titen").warning("checking %s's ledger for entries no generation holds failed: "
                                                   "%s: %s", org_id, type(exc).__name__, exc)
                continue
            if due:
                self.schedule_rebuild(org_id, write=False)
                scheduled.append(org_id)
        return scheduled

    def rebuild_all_later(self, failed: int = 0) -> None:
        """Schedule every organization's rebuild, when listing them failed
        (at start); a listing that fails again is retried on the same backoff."""
        try:
            orgs = self.ledger.organizations()
        except Exception:
            delay = retry_delay(failed + 1)
            logging.getLogger("titen").exception("listing the organizations failed; trying again in %g s", delay)
            timer = threading.Timer(delay, self.rebuild_all_later, kwargs={"failed": failed + 1})
            timer.daemon = True
            timer.start()
            return
        for org_id in orgs:
            self.schedule_rebuild(org_id, write=False)

    def _space_under_load(self, org_id: str) -> None:
        """Wait, while writes keep coming, until ``LOAD_SPACING`` times the
        last rebuild's duration has passed since it ended; return as soon
        as ``QUIET_SECONDS`` pass without a write. Measured on the 10k HTTP
        load (bench/load_http.py): spacing by 1x its duration kept the
        supervisor rebuilding half the time, about a quarter of two cores,
        and every generation also costs each server a refresh; 3x took the
        load from ~700 to ~840 claims/s."""
        with self._guard:
            last = self._last_rebuild.get(org_id)
        if last is None:
            return
        ended, took = last
        spaced_until = ended + LOAD_SPACING * took
        while (left := spaced_until - time.monotonic()) > 0:
            seen = self.written.value
            time.sleep(min(QUIET_SECONDS, left))
            if self.written.value == seen:
                return  # the writes paused: this rebuild has everything they stored

    def _rebuild_lock(self, org_id: str) -> threading.RLock:
        with self._guard:
            return self._rebuild_locks.setdefault(org_id, threading.RLock())


def _transition(action: str):
    from core.writes.transitions import TRANSITION_STATUS

    def run(service, principal, params, body, attempt):
        return TRANSITION_STATUS[action], service.writes.transition(principal, params["claim_id"], action, body,
                                                                    attempt)
    return "memory:write", run


# route -> (scope, run(service, principal, params, body, attempt) -> (status, data))
WRITE_ROUTES = {
    "POST /v1/observations": ("memory:write", lambda s, p, params, body, a: (
        201, s.writes.record_observation(p, body, a))),
    "POST /v1/observations/batch": ("memory:write", lambda s, p, params, body, a: (
        201, s.writes.record_observation_batch(p, body, a))),
    "POST /v1/consolidations": ("memory:write", lambda s, p, params, body, a: (
        201, s.writes.record_consolidation(p, body, a))),
    "POST /v1/claims/{claim_id}/supersede": _transition("supersede"),
    "POST /v1/claims/{claim_id}/revoke": _transition("revoke"),
    "POST /v1/claims/{claim_id}/expire": _transition("expire"),
    "POST /v1/context/{context_id}/feedback": ("context:feedback", lambda s, p, params, body, a: (
        201, s.feedback.record(p, params["context_id"], body, a))),
}
