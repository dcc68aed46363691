"""``titen serve``'s rebuilds: one process builds, the server processes ask it.

``titen serve`` is a supervisor process plus ``--workers`` server processes
(``core.serving``). Rebuilding is CPU work in Python; inside a server it
held the one GIL that process's requests need (measured under a 4-client
bulk load: ~40% of the server's GIL time, writes queued behind it). So the
supervisor builds, and the servers only ask:

- ``request(org)`` after a write (``RebuildClient`` sends it from a thread
  of its own): the supervisor's timer folds a burst into one rebuild a
  quarter of a second later (``core.service``), as the SQS FIFO queue does
  on Lambda;
- ``rebuild(org, …)`` for ``POST /v1/admin/rebuild``: the server waits for
  the supervisor's answer, then serves the result.

Rules this enforces:
- every rebuild of ``titen serve`` runs in the supervisor, one at a time per
  organization, with the one kept file under the cache directory (so an
  erasure's rebuild reaches every kept copy);
- after each publish the supervisor rings a *bell* (a counter in shared
  memory) that every server's snapshot reader looks at per request, so a
  new generation is served at the next request, not after the TTL;
- a write whose request cannot reach the supervisor is still acknowledged
  (the ledger holds it; the next write, the next admin rebuild or the next
  start of ``titen serve`` builds it) and is logged, as an enqueue failure
  is on Lambda.

The channel is ``multiprocessing.managers`` on loopback TCP with a random
key the supervisor hands its servers at spawn.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from multiprocessing.managers import BaseManager

from core.errors import TitenError, Unavailable, disk_full
from core.snapshot.build import RebuildResult

log = logging.getLogger("titen")


def _channel() -> type[BaseManager]:
    """A manager class of its own: ``register`` is per class, and a host and
    a client in one process (the tests) must not share a registry."""
    return type("RebuildChannel", (BaseManager,), {})


class Rebuilds:
    """What the supervisor offers its servers (the object behind the channel)."""

    def __init__(self, service):
        self.service = service  # the supervisor's Service: auto_rebuild, serves nothing

    def request(self, org_id: str) -> int:
        return self.service.schedule_rebuild(org_id)

    def rebuild(self, org_id: str, from_scratch: bool, force: bool) -> RebuildResult:
        try:
            return self.service.rebuild(org_id, from_scratch=from_scratch, force=force)
        except TitenError:
            raise
        except Exception as exc:  # sent back as an answer; the traceback stays in this log
            log.exception("rebuild of %s failed", org_id)
            if disk_full(exc):
                raise Unavailable("the rebuild failed: a disk of this machine is full (the data directory or "
                                  "TITEN_CACHE_DIR); free space and rebuild again") from None
            raise Unavailable(f"the rebuild failed ({type(exc).__name__}); see the server's log") from None


def host(service) -> tuple[tuple[str, int], bytes]:
    """Offer ``service``'s rebuilds on loopback from a thread of this
    process; (address, key) for the servers."""
    import secrets

    rebuilds = Rebuilds(service)
    channel = _channel()
    channel.register("rebuilds", callable=lambda: rebuilds)
    authkey = secrets.token_bytes(32)
    server = channel(address=("127.0.0.1", 0), authkey=authkey).get_server()
    threading.Thread(target=server.serve_forever, name="titen-rebuild-host", daemon=True).start()
    return server.address, authkey


class BegunCount:
    """The supervisor's count of scheduled rebuilds begun, in shared memory,
    read by every server on every write (``RebuildClient``).

    Read and moved under an ``flock`` on a file beside the caches: the lock
    orders a server's stored write before its read of the count, and the
    supervisor's move before its listing of the ledger, on any CPU. The
    kernel drops an ``flock`` when its holder dies; a multiprocessing lock
    held by a server killed mid-read would stall every rebuild for good."""

    def __init__(self, raw, lock_path: str):
        self._raw, self._path = raw, lock_path
        self._fd: int | None = None
        self._threads = threading.Lock()  # one flock per process: its threads take turns
        self._descriptor()  # the file exists before any server is spawned

    def __getstate__(self):  # into a spawned server: the shared value and the path, no descriptor
        return {"raw": self._raw, "lock_path": self._path}

    def __setstate__(self, state):
        self.__init__(state["raw"], state["lock_path"])

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @property
    def value(self) -> int:
        with self._threads:
            fd = self._descriptor()
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                return self._raw.value
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def current(self) -> int:
        """The count as its only writer (the supervisor) reads it: no lock."""
        return self._raw.value

    def increment(self) -> None:
        with self._threads:
            fd = self._descriptor()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._raw.value += 1
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


class RebuildClient:
    """A server process's way to the supervisor's rebuilds (thread-safe: each
    thread gets its own connection).

    ``request`` does not wait for the supervisor: it notes the organization
    and a sender thread passes it on, so a write answers without a round
    trip, and a burst of writes costs one message per organization while a
    message is on its way (measured under a 4-client load: the round trip
    took ~10% of a server's GIL time). The write is stored before it is
    noted, and the supervisor's rebuild lists the ledger after it receives
    the request, so the rebuild applies the write.

    With ``begun`` (the supervisor's count of scheduled rebuilds begun, in
    shared memory) most writes send nothing: the answer to a request is the
    count at which the organization's rebuild was pending, and while the
    count has not moved that rebuild has not listed the ledger, so it will
    apply a write stored now. A write then costs one read of the count; a
    bulk load sends about one message per rebuild, not one per write."""

    def __init__(self, rebuilds, begun=None, written=None):
        self._rebuilds = rebuilds  # the proxy of the supervisor's Rebuilds
        self._begun = begun
        self._written = written  # moved by every write: the supervisor spaces rebuilds while it moves
        self._covered: dict[str, int] = {}  # org -> the count at which its rebuild was pending
        self._wanted: set[str] = set()
        self._signal = threading.Condition()
        threading.Thread(target=self._send, name="titen-rebuild-requests", daemon=True).start()

    @classmethod
    def connect(cls, address: tuple[str, int], authkey: bytes, begun=None, written=None) -> "RebuildClient":
        channel = _channel()
        channel.register("rebuilds")
        manager = channel(address=tuple(address), authkey=authkey)
        manager.connect()
        return cls(manager.rebuilds(), begun, written)

    def request(self, org_id: str) -> None:
        if self._written is not None:
            self._written.value += 1  # unlocked: two servers losing one increment still move it
        # the count is read after the write was stored: equal to the one a
        # pending rebuild was noted at, that rebuild lists the ledger later
        if self._begun is not None and self._covered.get(org_id) == self._begun.value:
            return
        with self._signal:
            if org_id not in self._wanted:  # already noted: the message on its way covers it
                self._wanted.add(org_id)
                self._signal.notify()

    def _send(self) -> None:
        while True:
            with self._signal:
                while not self._wanted:
                    self._signal.wait()
                wanted, self._wanted = self._wanted, set()
            for org_id in wanted:
                try:
                    pending_at = self._rebuilds.request(org_id)
                    if isinstance(pending_at, int):
                        self._covered[org_id] = pending_at
                except Exception as exc:  # the write is stored and was acknowledged: say so here
                    log.error("asking for a rebuild of %s failed (%s); the write is stored and the next "
                              "rebuild applies it", org_id, type(exc).__name__)

    def rebuild(self, org_id: str, *, from_scratch: bool = False, force: bool = False) -> RebuildResult:
        try:
            return self._rebuilds.rebuild(org_id, from_scratch, force)
        except TitenError:
            raise
        except Exception as exc:
            raise Unavailable(f"the rebuild process did not answer ({type(exc).__name__}); "
                              "restart titen serve") from None
