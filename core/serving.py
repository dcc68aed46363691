"""``titen serve``'s processes: a supervisor that builds, servers that answer.

One Python process runs one thread of Python at a time, so one process
cannot use a second core for requests, and a rebuild inside it stalls them.
``titen serve`` therefore runs:

- the **supervisor** (this process): it rebuilds every organization at
  start, then hosts all rebuilds (``core.rebuild.host``) and keeps
  ``--workers`` server processes alive (uvicorn's own supervisor: a worker
  that dies is replaced);
- ``--workers`` **servers**, each a whole Service on the same store behind
  one listening socket, with its own snapshot cache directory
  (``<cache>/serve-<pid>``; a reader never shares files with another).

A server ends itself when its supervisor is gone. Everything the servers
share lives in the store: the ledger, keys,
idempotency records and pointers are safe across processes there exactly as
across Lambda instances. What a server keeps in memory (a key's cached
record, an open generation) is refreshed as on Lambda, and a new generation
is served at the next request after the supervisor's bell.

Mangum is not involved: on Lambda each instance is one process and one
request at a time (``handler/``).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing
import os
import socket
import sys
import threading
import time

from core.config import Settings
from core.snapshot.workfiles import hold_server_dir, release_server_dir, remove_dead_server_dirs

BEGUN_LOCK = ".rebuilds-begun.lock"  # beside the servers' cache directories


@dataclasses.dataclass
class ServerApp:
    """The app factory each server process calls (uvicorn pickles it into
    the spawned process: settings, the supervisor's address and key, and
    the counters in shared memory — the bell, the rebuilds begun, the
    writes stored — which a spawned process may inherit only this way)."""

    settings: Settings
    address: tuple[str, int]
    authkey: bytes
    bell: object
    begun: object
    written: object

    def __call__(self):
        from core.api.app import create_app
        from core.rebuild.host import RebuildClient
        from core.service import Service
        from core.storage import StoreError

        threading.Thread(target=_end_with, args=(os.getppid(),), name="titen-supervisor-watch",
                         daemon=True).start()
        cache_dir = hold_server_dir(self.settings.cache_dir)
        remove_dead_server_dirs(self.settings.cache_dir)
        # gone with the server when it exits through Python's exit; otherwise
        # (SIGTERM, a kill) with the next server's start or the next erasure
        atexit.register(release_server_dir, cache_dir)
        settings = dataclasses.replace(self.settings, cache_dir=cache_dir)
        rebuilds = RebuildClient.connect(self.address, self.authkey, self.begun, self.written)
        service = Service(settings, rebuilds=rebuilds, bell=self.bell)
        if service.vectors is not None:
            service.vectors.warm()
        try:
            held = service.ledger.organizations()[:settings.max_orgs]
        except StoreError:  # the store failing now: each organization loads at its first request
            logging.getLogger("titen").warning("listing the organizations failed; none loaded before requests",
                                               exc_info=True)
            held = []
        for org_id in held:
            service.reader.check(org_id)  # fetched and verified before the first request, as at start
        threading.Thread(target=follow, args=(service.reader,), kwargs={"poll": settings.local_store},
                         name="titen-bell", daemon=True).start()
        return create_app(service)


SUPERVISOR_CHECK_SECONDS = 0.5


def _end_with(supervisor: int) -> None:
    """A supervisor killed outright (SIGKILL, out of memory) cannot stop its
    servers, and without it no write would be rebuilt: a server ends itself
    once it is re-parented."""
    while os.getppid() == supervisor:
        time.sleep(SUPERVISOR_CHECK_SECONDS)
    os._exit(1)


BELL_CHECK_SECONDS = 0.1


def follow(reader, interval: float = BELL_CHECK_SECONDS, *, poll: bool,
           stop: threading.Event | None = None) -> None:
    """Refresh every organization this process holds when the supervisor's
    bell rings and, with ``poll``, whenever its pointer check is due (the
    reader's TTL), whether or not a request comes: an idle server must not
    keep an older generation (after an erasure, a copy of the erased text)
    in its cache. The bell tells of this supervisor's publishes only; on a
    local store another process's (``titen mcp``, ``titen rebuild``) is
    learnt by reading the pointer (every tenth of a second by default).
    ``stop``: ends it when set (a server's follower runs for its life)."""
    stop = stop or threading.Event()
    seen = reader.bell.value if reader.bell is not None else None
    while not stop.wait(interval):
        rung = reader.bell is not None and reader.bell.value != seen
        if rung:
            seen = reader.bell.value
        if rung or poll:
            try:
                reader.check_held()  # due now when the bell rang: the reader saw it too
            except Exception:  # never raises by contract; if it did, keep following
                logging.getLogger("titen").exception("refreshing the generations held failed")


CATCH_UP_SECONDS = 15
CATCH_UP_SHARE = 20  # a pass never takes more than a twentieth of the time
# ... but is never put off longer than this: a pass that took long because
# the store failed (botocore's patient retries, per organization) says
# nothing about the next one
CATCH_UP_MAX_WAIT_SECONDS = 300


def catch_up(service, interval: float = CATCH_UP_SECONDS, *, stop: threading.Event | None = None) -> None:
    """The supervisor's safety net, as the schedule is on Lambda: every
    ``interval`` seconds, rebuild each organization whose ledger holds an
    entry its published generation lacks (``Service.catch_up``). A write
    asks for its own rebuild; this catches the writes whose rebuild never
    ran, because the process that stored them ended first (a ``titen mcp``
    killed right after a write or an erasure), or because none was asked
    for (``titen import`` without ``--rebuild``). A local ledger is listed
    by walking its directory, so a pass over a large one is spaced by
    ``CATCH_UP_SHARE`` times its own duration."""
    stop = stop or threading.Event()
    wait = interval
    while not stop.wait(wait):
        started = time.monotonic()
        try:
            scheduled = service.catch_up()
        except Exception as exc:  # the store: tried again at the next pass
            logging.getLogger("titen").warning("checking the ledgers for entries no generation holds failed: %s",
                                               exc)
        else:
            for org_id in scheduled:
                logging.getLogger("titen").info("%s: the ledger holds entries no generation holds; rebuilding",
                                                org_id)
        wait = next_catch_up_wait(interval, time.monotonic() - started)


def next_catch_up_wait(interval: float, took: float) -> float:
    """Seconds until the next pass, after one that took ``took``."""
    return max(interval, min(CATCH_UP_SHARE * took, CATCH_UP_MAX_WAIT_SECONDS))


def standalone_service(settings: Settings, **kw):
    """A Service for a process that serves on its own beside whatever else
    uses the store (``titen mcp`` on the embedded store, perhaps beside
    ``titen serve``), kept to the rules of ``titen serve``'s servers:

    - its generations lie in a directory of its own (``<cache>/serve-<pid>``,
      held for its life): if the process is killed, the next erasure (or
      server start) removes them, where a copy left at the cache root would
      stay until some later process opened a reader there;
    - it follows the pointer from a thread, so an idle process drops an older
      generation soon after another process publishes: every
      ``TITEN_SNAPSHOT_TTL`` (a tenth of a second by default on a local
      store, where a read is a file read; core/config.py)."""
    from core.service import Service

    cache_dir = hold_server_dir(settings.cache_dir)
    remove_dead_server_dirs(settings.cache_dir)
    atexit.register(release_server_dir, cache_dir)
    service = Service(settings, reader_dir=cache_dir, **kw)
    threading.Thread(target=follow, args=(service.reader, max(settings.snapshot_ttl, BELL_CHECK_SECONDS)),
                     kwargs={"poll": True}, name="titen-follow", daemon=True).start()
    return service


@dataclasses.dataclass
class Shared:
    """The supervisor's counters in shared memory, handed to every server."""

    bell: object  # rung after each publish: a reader refreshes at its next request
    begun: object  # scheduled rebuilds begun (core.rebuild.host.RebuildClient)
    written: object  # writes stored by any server: rebuilds are spaced while it moves


def supervise(service) -> Shared:
    """Make ``service`` (built with ``auto_rebuild``, serving nothing) the
    supervisor: its publishes ring the bell, its scheduled rebuilds move
    ``begun``, and it reads ``written`` (core.service)."""
    from core.rebuild.host import BegunCount

    spawn = multiprocessing.get_context("spawn")
    # begun is read and moved under a lock (BegunCount says why); the bell
    # and written are hints, read without one
    os.makedirs(service.settings.cache_dir, exist_ok=True)
    begun = BegunCount(spawn.RawValue("Q", 0), os.path.join(service.settings.cache_dir, BEGUN_LOCK))
    shared = Shared(bell=spawn.RawValue("Q", 0), begun=begun, written=spawn.RawValue("Q", 0))
    ringing = threading.Lock()  # rebuilds of two organizations may publish at once

    def ring() -> None:
        with ringing:
            shared.bell.value += 1

    service.on_publish = ring
    service.begun, service.written = shared.begun, shared.written
    return shared


BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening before the supervisor
    touches the data directory: a port another ``titen serve`` holds (even
    one still starting up) stops this one here, before it rebuilds or sweeps
    caches in a directory that server may own. Listening at once matters:
    with SO_REUSEADDR a second socket may bind a port that is bound but not
    yet listening. A connection made before the servers start waits in the
    backlog. (As uvicorn binds: SO_REUSEADDR, IPv6 for a host with a colon;
    OSError when the address is taken or not this machine's.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(service, sock: socket.socket, *, host: str, workers: int, log_level: str) -> None:
    """Host ``service``'s rebuilds (the supervisor's Service: it builds and
    serves nothing) and run ``workers`` servers on ``sock`` (``bind``) until
    interrupted."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from core.api.edge import SERVER_SETTINGS, EnvelopeHttpToolsProtocol
    from core.rebuild.host import host as host_rebuilds

    shared = supervise(service)
    address, authkey = host_rebuilds(service)
    remove_dead_server_dirs(service.settings.cache_dir)
    threading.Thread(target=catch_up, args=(service,), name="titen-catch-up", daemon=True).start()
    port = sock.getsockname()[1]
    config = uvicorn.Config(ServerApp(service.settings, address, authkey, shared.bell, shared.begun,
                                      shared.written), factory=True, host=host,
                            port=port, workers=workers, log_level=log_level, access_log=log_level == "debug",
                            http=EnvelopeHttpToolsProtocol, **SERVER_SETTINGS)
    # listening since ``bind``, so a connection made once "listening" is
    # printed waits in the backlog for the first server process rather than
    # being refused while they start (about a second)
    print(f"titen listening on http://{host}:{port} with {workers} server process"
          f"{'es' if workers != 1 else ''} (store {service.store.url})", file=sys.stderr)
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
        # its servers are stopped and joined: their cache directories go with
        # them. A server's own exit does not remove its directory when it is
        # stopped by the supervisor's SIGTERM, which follows Ctrl-C's SIGINT
        remove_dead_server_dirs(service.settings.cache_dir)
