"""A build's work files, and the ones a dead build left behind.

Why: a build writes an organization's whole snapshot into a work file
(``build-…``; ``seed-…`` holds the previous generation while a replay
carries its embeddings over) and removes it when it ends, however it ends —
but not when its process is killed (SIGKILL, out of memory, a Lambda
timeout). Such a file holds claims' text, and an erasure that completes
must leave no readable copy of what it erased (docs/api.md §16).

The rules:

- every work file has a lock file beside it (``<stem>.lock``) whose build
  holds an ``flock`` on it for as long as the work file exists; the kernel
  drops the lock when the process dies, however it dies;
- the lock file is created and locked before its work file exists and
  removed after it is gone, and a build starts only once it holds the lock
  of the file still linked at that path (a sweep may have removed the one it
  created), so a sweep never removes a live build's file;
- ``sweep`` removes the files of every stem whose lock it can take, and
  work files with no lock file at all (left by a release before this rule);
- a lock file holds the generation its build started from (the pointer it
  read before creating the file);
- before an erasure is marked complete, ``drain`` removes the
  organization's dead builds' files and waits (up to
  ``ERASURE_WAIT_SECONDS``) for its *running* builds that started from a
  generation older than the one that carried the erasure out: such a build
  (an operator's ``titen rebuild`` beside ``titen serve``) may hold the
  erased text in its work file until it ends, and it ends soon, since it
  can no longer publish. A build that started from that generation or a
  later one holds none, and is not waited for. So two builds never wait for
  each other: if A waits for B, B started before A published, and then B
  cannot publish (the pointer moved), so it never reaches a wait of its own.
  Only the organization's own files count (names carry the organization):
  another organization's builds, or a file of theirs that cannot be
  removed, never hold an erasure up. Past the wait the build fails and the
  erasure stays pending: the next build finishes it.

``titen serve``'s server processes keep their generations in
``<cache>/serve-<pid>`` (core/serving.py); a server gone (killed, replaced,
the run stopped) leaves its directory, and with it a generation from
before an erasure, behind. A server holds an ``flock`` on
``serve-<pid>.lock`` for its life (``hold_server_dir``), and
``remove_dead_server_dirs`` removes the directories whose lock it can take:
at a server's start, and before an erasure is marked complete.

An ``flock`` belongs to an open file, not to a process: two builds in one
process (two organizations on two threads) exclude each other like two
processes do. The lock file is a file of its own because closing any
descriptor of the work file would drop the POSIX locks SQLite holds on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import time
from typing import Callable

from core.errors import Unavailable

# a work file, its SQLite side files or a download into it in flight
# (``.sqlite.part-…``), or its lock file
_NAME = re.compile(r"(?P<stem>(?:build|seed)-[^/.]*)(?:\.sqlite.*|\.lock)", re.DOTALL)
SIDE_FILES = ("", "-journal", "-wal", "-shm")
# how long a build that carried out an erasure waits for the organization's
# other running builds to end before it gives up (a replay of 50k claims
# that embeds them all takes minutes)
ERASURE_WAIT_SECONDS = 600.0
_POLL_SECONDS = 0.1


class WorkFile:
    """A fresh work file path in ``work_dir``, held until ``release``;
    ``base``: the generation its build started from (0: none published)."""

    def __init__(self, work_dir: str, prefix: str, base: int = 0):
        while True:
            stem = os.path.join(work_dir, f"{prefix}{secrets.token_hex(6)}")
            try:
                fd = os.open(stem + ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(stem + ".lock").st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # swept between its creation and its lock: take another name
        try:
            os.write(fd, str(base).encode())
        except BaseException:
            # (a full disk): a lock left held would read as a running build
            # to every erasure's wait until this process ends
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stem + ".lock")
            os.close(fd)
            raise
        self._fd = fd
        self.stem = os.path.basename(stem)
        self._stem = stem
        self.path = stem + ".sqlite"

    def release(self) -> None:
        """Remove the work file (if still here: it may have been moved away to
        be kept) and its side files, then the lock."""
        if self._fd is None:
            return
        for suffix in SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path + suffix)
        # (a failed download removes its own partial file)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._stem + ".lock")
        os.close(self._fd)
        self._fd = None


def sweep(work_dir: str) -> int:
    """Remove the work files of builds that are gone; how many files went."""
    return _sweep(work_dir)[0]


def drain(work_dir: str, org_id: str, generation: int, *, own: WorkFile | None = None,
          progress: Callable[[str], None] = lambda message: None) -> int:
    """Remove the work files of ``org_id``'s dead builds, then wait until
    none of its running builds that started before ``generation`` (the one
    that carried an erasure out) holds a work file here
    (``ERASURE_WAIT_SECONDS`` at most); how many files went. Raises
    ``Unavailable`` when one still does."""
    mine = re.compile(f"(?:build|seed)-{re.escape(org_id)}-[0-9a-f]{{12}}")
    deadline = time.monotonic() + ERASURE_WAIT_SECONDS
    removed, told = 0, False
    while True:
        went, live = _sweep(work_dir, mine)
        removed += went
        running = sorted(stem for stem in live if (own is None or stem != own.stem)
                         and _base(work_dir, stem) < generation)
        if not running:
            return removed
        if time.monotonic() >= deadline:
            raise Unavailable(f"{org_id}: a running build still holds a work file of this organization "
                              f"({', '.join(running)}) after {ERASURE_WAIT_SECONDS:g} s, so the erasure stays "
                              "pending; the next rebuild completes it")
        if not told:
            progress(f"{org_id}: waiting for a running build of this organization to end ({', '.join(running)})")
            told = True
        time.sleep(_POLL_SECONDS)


def _base(work_dir: str, stem: str) -> int:
    """The generation a running build started from; 0 (oldest: waited
    for) when its lock file says none yet or is gone."""
    try:
        with open(os.path.join(work_dir, stem + ".lock"), "rb") as f:
            return int(f.read(32) or b"0")
    except (OSError, ValueError):
        return 0


def _sweep(work_dir: str, only: re.Pattern | None = None) -> tuple[int, list[str]]:
    """(files removed, stems of the builds still running); with ``only``,
    of the stems it matches."""
    try:
        names = os.listdir(work_dir)
    except FileNotFoundError:
        return 0, []
    stems: dict[str, list[str]] = {}
    for name in names:
        match = _NAME.fullmatch(name)
        if match and (only is None or only.fullmatch(match["stem"])):
            stems.setdefault(match["stem"], []).append(name)
    removed, live = 0, []
    for stem, files in stems.items():
        lock = os.path.join(work_dir, stem + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            fd = None  # no lock file: left by a build before this rule, or one that just ended
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                live.append(stem)
                continue  # a live build's
        elif os.path.exists(lock):
            live.append(stem)
            continue  # its build began after the listing
        try:
            for name in files:
                if name.endswith(".lock"):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(work_dir, name))
                    removed += 1
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
        finally:
            if fd is not None:
                os.close(fd)
    return removed, live


SERVE_DIR_PREFIX = "serve-"
_held_server_locks: list[int] = []  # this process's server directory locks, held until it ends
_held_server_dirs: list[str] = []  # and their directories


def hold_server_dir(cache_dir: str) -> str:
    """This server process's cache directory, ``<cache_dir>/serve-<pid>``,
    under an ``flock`` on ``serve-<pid>.lock`` held until the process ends
    (the kernel drops it however it ends). The lock comes first, so no
    sweep ever finds the directory unlocked while its server lives; and a
    lock, unlike a pid, means the same in every PID namespace. The lock is
    taken on the file still linked at that path (a sweep may unlink the
    one just opened, as for work files); a name whose lock another live
    server holds (the same pid in another namespace) gets a suffix."""
    os.makedirs(cache_dir, exist_ok=True)
    name = f"{SERVE_DIR_PREFIX}{os.getpid()}"
    while True:
        lock_path = os.path.join(cache_dir, name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            name = f"{SERVE_DIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
            continue
        try:
            linked = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            linked = False
        if linked:
            break
        os.close(fd)
    _held_server_locks.append(fd)
    path = os.path.join(cache_dir, name)
    os.makedirs(path, exist_ok=True)
    _held_server_dirs.append(path)
    return path


def release_server_dir(path: str) -> None:
    """Remove this server's directory and its lock file (a normal exit)."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + ".lock")


def remove_dead_server_dirs(cache_dir: str) -> tuple[int, list[str]]:
    """Remove the cache directories (``serve-<pid>``) of server processes
    that are gone: their generations are never served again, and an erased
    text must not stay in one. A directory is a dead server's when its lock
    can be taken (``hold_server_dir``); one without a lock file (a release
    before the locks) when its pid is not alive here. Returns (how many
    went, the paths that could not be removed)."""
    try:
        names = os.listdir(cache_dir)
    except FileNotFoundError:
        return 0, []
    removed, stuck = 0, []
    for name in names:
        pid = name[len(SERVE_DIR_PREFIX):].split("-", 1)[0]  # serve-<pid>, or serve-<pid>-<suffix>
        path = os.path.join(cache_dir, name)
        if not (name.startswith(SERVE_DIR_PREFIX) and pid.isdigit()) or not os.path.isdir(path) \
                or any(os.path.samefile(path, mine) for mine in _held_server_dirs if os.path.exists(mine)):
            continue
        lock_path = path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            if _alive(int(pid)):
                continue
            fd = None
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its server lives
            shutil.rmtree(path, ignore_errors=True)
            if os.path.exists(path):
                stuck.append(path)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
            removed += 1
        finally:
            if fd is not None:
                os.close(fd)
    return removed, stuck


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
