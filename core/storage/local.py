"""The embedded default store: one directory on local disk.

Rules it enforces, so that a crash can never leave a half-written object:
every write goes to a temporary file in the target directory, is fsynced,
then moved into place (``os.link`` for put-if-absent, which fails atomically
when the name exists; ``os.replace`` for compare-and-swap), and the directory
itself is fsynced. Put-if-absent of a body (every ledger entry, every
compile's run) writes an unnamed ``O_TMPFILE`` inode and links it by its
descriptor where the platform has one: no name is created and unlinked per
write. On ext4 without a journal each unlinked temporary made the next
inode allocations scan past it (``recently_deleted``), measured at ~15% of
a server's CPU under a 4-client write load. Compare-and-swap and delete
serialize on an advisory lock (``fcntl.flock``), which also holds between processes sharing the directory,
so ``titen keys create`` and ``titen serve`` can share one store.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import os
import secrets
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Callable, Iterator

from core.checksum import file_sha256
from core.storage.contract import ObjectNotFound, PreconditionFailed, Store, StoredObject, StoreError

_TMP_PREFIX = ".tmp-"
# O_TMPFILE is Linux's (3.11+) and needs the file system's support; the
# first refusal turns it off for this process
_UNNAMED = hasattr(os, "O_TMPFILE")
_NO_UNNAMED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOSYS}
_LOCK_NAME = ".lock"


# ETags are opaque (S3's are not always an MD5 either); sha256 is ~3x faster
# than MD5 here (SHA extensions), which counts on a 500 MB snapshot upload
def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest() + '"'


def _write_all(fd: int, body: bytes) -> None:
    view = memoryview(body)
    while view:
        view = view[os.write(fd, view):]


def _file_etag(path: str) -> str:
    return '"' + file_sha256(path) + '"'


def _disk_failure_is_store_failure(method):
    """The disk failing (full, read-only, unreadable, a file where a directory
    belongs) is the store failing: ``StoreError``, as S3's errors are, which
    every route answers 503 ``UNAVAILABLE`` rather than as a bug. The
    contract's own outcomes (ObjectNotFound, PreconditionFailed) pass as they are."""
    @functools.wraps(method)
    def call(self, key, *args, **kwargs):
        try:
            return method(self, key, *args, **kwargs)
        except OSError as exc:
            raise StoreError(f"the local store at {self.root} failed to {method.__name__.replace('_', ' ')} "
                             f"{key}: {exc.strerror or exc}") from exc
    return call


class LocalStore(Store):
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        os.makedirs(self.root, exist_ok=True)
        self._thread_lock = threading.Lock()

    # -- paths -------------------------------------------------------------

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise StoreError(f"invalid store key: {key!r}")
        return os.path.join(self.root, *parts)

    @contextmanager
    def _locked(self):
        # flock is per open file description: it excludes other processes;
        # the thread lock excludes other threads of this one.
        with self._thread_lock:
            fd = os.open(os.path.join(self.root, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _write_temp(self, path: str, body: bytes | None = None, source: str | None = None) -> str:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, _TMP_PREFIX + secrets.token_hex(8))
        if source is None:
            self._write_body(tmp, body or b"")
            return tmp
        os.makedirs(directory, exist_ok=True)
        try:
            shutil.copyfile(source, tmp)  # a kernel-side copy (sendfile) where the platform has one
            with open(tmp, "ab") as f:
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _remove_partial(tmp)  # a full disk: a partial copy would hold the space a retry needs
            raise
        return tmp

    @staticmethod
    def _write_body(tmp: str, body: bytes) -> None:
        """Create, write and fsync ``tmp`` with bare descriptors: every
        compile stores its run this way before answering, and the buffered
        file object and a makedirs per write cost a tenth of that wait. The
        directory is created only when the first attempt finds it missing."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        try:
            _write_all(fd, body)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _remove_partial(tmp)
            raise
        os.close(fd)

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- contract ------------------------------------------------------------

    @_disk_failure_is_store_failure
    def get(self, key: str) -> StoredObject:
        try:
            with open(self._path(key), "rb") as f:
                body = f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        return StoredObject(key, body, _etag(body))

    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        obj = self.get(key)
        return None if etag is not None and obj.etag == etag else obj

    def list_keys(self, prefix: str, start_after: str | None = None, *,
                  page_size: int | None = None) -> Iterator[str]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = os.path.join(self.root, *base.split("/")) if base else self.root
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                if name.startswith("."):
                    continue
                key = rel + name
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    found.append(key)
        found.sort()
        return iter(found)

    def list_modified(self, prefix: str) -> Iterator[tuple[str, float]]:
        for key in self.list_keys(prefix):
            try:
                yield key, os.stat(os.path.join(self.root, *key.split("/"))).st_mtime
            except FileNotFoundError:
                continue

    @_disk_failure_is_store_failure
    def remove_stale_temporaries(self, prefix: str, older_than_seconds: float) -> int:
        """A write killed between creating its temp file and linking it
        leaves ``.tmp-…`` beside the objects. One older than any write takes
        is removed; a younger one may be a live writer's."""
        top = os.path.join(self.root, *prefix.rstrip("/").split("/")) if prefix.strip("/") else self.root
        limit = time.time() - older_than_seconds
        removed = 0
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if not name.startswith(_TMP_PREFIX):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if os.stat(path).st_mtime < limit:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    continue
        return removed

    @_disk_failure_is_store_failure
    def put_if_absent(self, key: str, body: bytes) -> str:
        path = self._path(key)
        if not self._put_unnamed(path, key, body):
            tmp = self._write_temp(path, body)
            self._link_into_place(tmp, path, key)
        return _etag(body)

    def _put_unnamed(self, path: str, key: str, body: bytes) -> bool:
        """Put-if-absent through an ``O_TMPFILE`` inode linked into place;
        False (nothing written) where the platform or file system has none."""
        global _UNNAMED
        if not _UNNAMED:
            return False
        directory, name = os.path.split(path)
        flags = os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC
        try:
            try:
                fd = os.open(directory, flags, 0o644)
            except FileNotFoundError:
                os.makedirs(directory, exist_ok=True)
                fd = os.open(directory, flags, 0o644)
        except OSError as exc:
            if exc.errno in _NO_UNNAMED:
                _UNNAMED = False
                return False
            raise
        try:
            _write_all(fd, body)
            os.fsync(fd)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                try:
                    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
                except FileExistsError:
                    raise PreconditionFailed(f"{key} already exists") from None
                except FileNotFoundError:  # no /proc: a temporary name after all
                    _UNNAMED = False
                    return False
                # the inode's link count rose with the link: without a
                # journal only its own fsync puts that on disk (the
                # directory's does not), and an entry naming an inode that
                # counts no link is lost at the next crash
                os.fsync(fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            os.close(fd)
        return True

    def _link_into_place(self, tmp: str, path: str, key: str) -> None:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise PreconditionFailed(f"{key} already exists") from None
        finally:
            os.unlink(tmp)
        self._fsync_dir(os.path.dirname(path))

    @_disk_failure_is_store_failure
    def compare_and_swap(self, key: str, body: bytes, expected_etag: str) -> str:
        path = self._path(key)
        with self._locked():
            try:
                current = self.get(key)
            except ObjectNotFound:
                raise PreconditionFailed(f"{key} does not exist") from None
            if current.etag != expected_etag:
                raise PreconditionFailed(f"{key} changed")
            tmp = self._write_temp(path, body)
            os.replace(tmp, path)
            self._fsync_dir(os.path.dirname(path))
        return _etag(body)

    @_disk_failure_is_store_failure
    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._locked():
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            self._fsync_dir(os.path.dirname(path))

    def purge(self, key: str) -> None:
        self.delete(key)  # a replaced or deleted file leaves no older version here

    def purge_prefix(self, prefix: str, keep: set[str], spare: Callable[[str], bool] | None = None) -> int:
        removed = 0
        for key in list(self.list_keys(prefix)):
            if key not in keep and not (spare and spare(key)):
                self.delete(key)
                removed += 1
        return removed

    @_disk_failure_is_store_failure
    def upload_file(self, key: str, path: str) -> str:
        target = self._path(key)
        # the ETag's digest reads the source beside the copy, not after it
        with ThreadPoolExecutor(max_workers=1) as pool:
            etag = pool.submit(_file_etag, path)
            tmp = self._write_temp(target, source=path)
            etag = etag.result()
        self._link_into_place(tmp, target, key)
        return etag

    def download_file(self, key: str, path: str) -> None:
        source = self._path(key)
        if not os.path.isfile(source):
            raise ObjectNotFound(key)
        try:
            shutil.copyfile(source, path)
        except OSError as exc:
            # the destination is the caller's disk (a reader's cache, a
            # build's work file): its failures stay the caller's OSError.
            # A kernel-side copy names both files in any error, the source
            # first, so its errno says whose: a full or read-only disk is
            # the destination's, a read error the store's.
            if exc.filename != source or exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise
            raise StoreError(f"the local store at {self.root} failed to download {key}: "
                             f"{exc.strerror or exc}") from exc


def _remove_partial(tmp: str) -> None:
    with suppress(OSError):
        os.unlink(tmp)
