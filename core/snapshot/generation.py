"""One loaded generation: its verified file, its meta table, its connections.

Requests read a generation concurrently. An apsw connection may not run in
two threads at once (``ThreadingViolationError``), so each request leases a
connection of its own for as long as it reads (``Snapshot.lease``); while a
thread holds a lease, ``snapshot.db`` is that thread's connection. A
generation opens a second, third… connection only when that many requests
read it at once, up to ``MAX_CONNECTIONS``; further requests wait for one to
come back. The file is opened read-only and ``immutable=1``: it never
changes while it is served (a new generation is a new file).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import apsw

from core.instants import now_utc, parse_instant
from core.lexical import forget
from core.snapshot.schema import ITEM_COUNTS

# Beyond two cores' worth of readers a further connection only adds page
# cache: requests beyond it wait (each holds one for a few milliseconds).
MAX_CONNECTIONS = 4

# SQLite errors that mean the file being read is damaged, not the request.
DAMAGE_ERRORS = (apsw.CorruptError, apsw.NotADBError, apsw.IOError, apsw.FormatError)


def open_readonly(path: str, on_open: Callable[[apsw.Connection], None] | None = None) -> apsw.Connection:
    db = apsw.Connection(f"file:{path}?immutable=1",
                         flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    db.execute("PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY")
    if on_open is not None:
        on_open(db)  # e.g. load sqlite-vec, only when vectors are configured
    return db


class Snapshot:
    """One generation of one organization, as served. Compared (and weakly
    keyed, by compile's catalog) by identity: one object per load."""

    def __init__(self, org_id: str, generation: int, pointer: dict, path: str, db: apsw.Connection,
                 watermark: str, meta: dict | None = None, on_open=None,
                 max_connections: int = MAX_CONNECTIONS):
        self.org_id = org_id
        self.generation = generation
        self.pointer = pointer
        self.path = path
        self.watermark = watermark
        self.meta = meta if meta is not None else {}
        self._on_open = on_open
        self._max = max_connections
        self._opened = [db]          # every connection of this generation (all forgotten on retire)
        self._free = [db]
        self._primary = db
        self._available = threading.Condition()
        self._held = threading.local()
        self.retired = False

    @property
    def db(self) -> apsw.Connection:
        """The connection this thread leased; outside a lease, the first one
        (for single-threaded callers: tests, the CLI, benches)."""
        return getattr(self._held, "db", None) or self._primary

    @contextmanager
    def lease(self) -> Iterator["Snapshot"]:
        """Hold one of this generation's connections for the block; re-entrant."""
        if getattr(self._held, "db", None) is not None:
            yield self
            return
        db = self._acquire()
        self._held.db = db
        try:
            yield self
        finally:
            self._held.db = None
            with self._available:
                self._free.append(db)
                self._available.notify()

    def _acquire(self) -> apsw.Connection:
        with self._available:
            while True:
                if self._free:
                    return self._free.pop()
                if len(self._opened) < self._max and not self.retired:
                    break
                self._available.wait()
            self._opened.append(None)  # the slot, taken before opening outside the lock
        try:
            db = open_readonly(self.path, self._on_open)
        except apsw.Error:
            # retired meanwhile (its file unlinked): wait for a connection
            # already open instead; they keep the unlinked file readable
            with self._available:
                self._opened.remove(None)
                while not self._free:
                    self._available.wait()
                return self._free.pop()
        with self._available:
            self._opened[self._opened.index(None)] = db
        return db

    def retire(self) -> None:
        """No longer served: open no more connections, and let the ones open
        be freed once the requests holding them finish (nothing cached may
        keep them: ``core.lexical.forget``)."""
        with self._available:
            self.retired = True
            connections = [db for db in self._opened if db is not None]
        for db in connections:
            forget(db)

    @property
    def connections(self) -> int:
        return len(self._opened)

    @property
    def item_tokens_trusted(self) -> bool:
        """Whether the item counts stored at build were made with this
        process's tokenizer (name and merge-table hash) and count what it
        expects (``ITEM_COUNTS``); if not, compile counts every item itself."""
        return self.meta.get("item_tokenizer") == ITEM_COUNTS

    @property
    def claim_count(self) -> int:
        return int(self.pointer.get("claim_count", 0))

    def age_seconds(self) -> float:
        return max(0.0, (now_utc() - parse_instant(self.pointer["published_at"])).total_seconds())
