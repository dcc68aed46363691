"""``titen serve``'s rebuilds run in a child process, beside the server.

A rebuild is CPU work in Python (applying entries, pricing postings,
hashing the file). In the serving process it holds the one GIL the HTTP
requests need: measured under a 4-client bulk load, the in-process rebuild
after writes took ~40% of the server's GIL time and writes queued behind it.
In a child process it runs on the other core and the server only waits for
its answer (a blocked thread that releases the GIL).

Rules:
- one child, so the server's rebuilds still run one at a time and only the
  child writes the kept file under the cache directory (the pointer's
  compare-and-swap settles a race with any other process, e.g. a
  ``titen rebuild`` run by hand);
- the child opens its own store and embedder from the same settings, so it
  builds exactly what an in-process rebuild would;
- the child never outlives the server (it watches for its parent's end);
- a child that dies (killed, out of memory) is replaced at the next
  rebuild; the rebuild it was running fails like an in-process one that
  raised, and the ledger still holds every write, so the next rebuild
  applies them.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from core.config import Settings
from core.errors import Unavailable
from core.snapshot.build import RebuildResult

PARENT_CHECK_SECONDS = 0.5
_service = None  # the child's own Service (rebuilds only), made once by _start


def _start(settings: Settings) -> None:
    global _service
    from core.service import Service

    _service = Service(settings)
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="titen-parent-watch").start()


def _exit_with(parent: int) -> None:
    """A server killed outright (SIGKILL, out of memory) never shuts its pool
    down: the child ends itself once it is re-parented. A build it was
    running is abandoned before its pointer swap, which is safe."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _rebuild(org_id: str, from_scratch: bool, force: bool) -> RebuildResult:
    return _service.builder(org_id).rebuild(from_scratch=from_scratch, force=force)


def _ready() -> bool:
    return _service is not None


class RebuildWorker:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._lock = threading.Lock()
        self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: the server has threads (uvicorn's loop, the
                # thread pool, timers) and forking a threaded process is unsafe
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start, initargs=(self.settings,))
            return self._pool

    def start(self) -> None:
        """Start the child now (its imports take a moment) rather than at the
        first write."""
        self._executor().submit(_ready).result()

    def rebuild(self, org_id: str, *, from_scratch: bool = False, force: bool = False) -> RebuildResult:
        pool = self._executor()
        try:
            return pool.submit(_rebuild, org_id, from_scratch, force).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None  # the next rebuild starts a new child
            raise Unavailable("the rebuild process ended unexpectedly; the next rebuild starts a new one") from None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
