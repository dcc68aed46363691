"""A build's work files hold a whole snapshot, claims' text included: a
build removes its own however it ends, and the files of a build whose
process was killed are swept by the next one (core/snapshot/workfiles.py),
never the files of a build still running."""

import os
from pathlib import Path
import subprocess
import sys

import pytest

from core.snapshot import workfiles
from core.snapshot.workfiles import WorkFile

# a process that starts a work file, writes to it and its side files, and is
# killed outright (SIGKILL: no finally runs)
KILLED_BUILD = """
import os, signal, sys
from core.snapshot.workfiles import WorkFile
held = WorkFile(sys.argv[1], "build-acme-")
for suffix in ("", "-wal", ".part-1-2"):
    with open(held.path + suffix, "wb") as f:
        f.write(b"the secret statement")
print(held.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_build(work_dir) -> str:
    done = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(work_dir)], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == -9, done.stderr
    return done.stdout.strip()


def test_the_files_of_a_killed_build_are_swept_with_its_lock(tmp_path):
    path = killed_build(tmp_path)
    assert os.path.exists(path)
    assert workfiles.sweep(str(tmp_path)) == 3
    assert os.listdir(tmp_path) == []


def test_a_running_builds_file_is_never_swept_even_from_its_own_process(tmp_path):
    held = WorkFile(str(tmp_path), "build-acme-")
    with open(held.path, "wb") as f:
        f.write(b"in progress")
    assert workfiles.sweep(str(tmp_path)) == 0
    assert os.path.exists(held.path)
    held.release()


def test_a_work_file_with_no_lock_file_is_swept(tmp_path):
    """As an earlier release left them."""
    (tmp_path / "build-acme-0123456789ab.sqlite").write_bytes(b"old")
    (tmp_path / "seed-0123456789ab.sqlite-journal").write_bytes(b"old")
    assert workfiles.sweep(str(tmp_path)) == 2
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["kept-acme.sqlite", "kept-acme.json", "builder.txt", "acme-000000000001.sqlite"])
def test_files_that_are_not_work_files_are_left_alone(tmp_path, name):
    (tmp_path / name).write_bytes(b"x")
    killed_build(tmp_path)
    workfiles.sweep(str(tmp_path))
    assert os.listdir(tmp_path) == [name]


def test_release_removes_the_work_file_its_side_files_and_its_lock(tmp_path):
    held = WorkFile(str(tmp_path), "seed-")
    for suffix in ("", "-wal", "-shm", "-journal"):
        (tmp_path / (os.path.basename(held.path) + suffix)).write_bytes(b"x")
    held.release()
    assert os.listdir(tmp_path) == []


def test_release_after_the_work_file_was_moved_away_to_be_kept(tmp_path):
    held = WorkFile(str(tmp_path), "build-acme-")
    with open(held.path, "wb") as f:
        f.write(b"published")
    os.replace(held.path, tmp_path / "kept-acme.sqlite")
    held.release()
    assert os.listdir(tmp_path) == ["kept-acme.sqlite"]


def test_a_sweep_that_fails_at_the_start_of_a_build_is_reported_and_the_build_goes_on(tmp_path, monkeypatch):
    from core.snapshot.build import SnapshotBuilder
    from core.storage.local import LocalStore
    from core.writes.importer import import_file
    from test_import import PRINCIPAL, write_ndjson

    store = LocalStore(str(tmp_path / "s"))
    import_file(store, PRINCIPAL, write_ndjson(tmp_path / "a.ndjson", 3), batch_size=10)

    def denied(work_dir):
        raise PermissionError(13, "Permission denied", work_dir)

    monkeypatch.setattr(workfiles, "sweep", denied)
    said = []
    built = SnapshotBuilder(store, "acme", work_dir=str(tmp_path / "w"), progress=said.append).rebuild()
    assert built.published and built.claim_count == 3
    assert any("work files of earlier builds not removed" in line for line in said)


def test_drain_waits_only_for_builds_that_started_before_the_erasures_generation(tmp_path, monkeypatch):
    from core.errors import Unavailable
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    newer = WorkFile(str(tmp_path), "build-acme-", base=5)  # started from the erasure's generation: nothing erased
    assert workfiles.drain(str(tmp_path), "acme", 5) == 0
    older = WorkFile(str(tmp_path), "build-acme-", base=4)  # started before it: may hold the erased text
    with pytest.raises(Unavailable, match="still holds a work file"):
        workfiles.drain(str(tmp_path), "acme", 5)
    older.release()
    assert workfiles.drain(str(tmp_path), "acme", 5) == 0
    newer.release()


def test_drain_leaves_other_organizations_files_alone(tmp_path):
    """Even one it cannot take: another organization's build never holds an erasure up."""
    other = WorkFile(str(tmp_path), "build-acme-eu-")
    with open(other.path, "wb") as f:
        f.write(b"acme-eu's snapshot")
    (tmp_path / "build-acme-eu-0123456789ab.sqlite").write_bytes(b"left by acme-eu's killed build")
    assert workfiles.drain(str(tmp_path), "acme", 5) == 0
    assert os.path.exists(other.path) and (tmp_path / "build-acme-eu-0123456789ab.sqlite").exists()
    other.release()


def test_a_build_that_carried_no_erasure_out_completes_none(tmp_path):
    """A pending erasure whose entry the build did not list (it came during
    the build) is left to the next build: nothing to wait for, nothing marked."""
    from core.erasure.work import ErasureWork
    from core.storage.local import LocalStore
    work = ErasureWork(LocalStore(str(tmp_path)), "acme", 600)
    work.targets = [({"erasure_id": "era_" + "1" * 32}, None)]
    assert not work.completes(None) and not work.completes({})
    assert work.completes({"era_" + "1" * 32: {}})


# -- the cache directories of titen serve's server processes ---------------------

HOLD_LOCK = str(Path(__file__).resolve().parent / "hold_lock.py")  # a process holding a lock


def test_a_server_whose_pid_names_a_directory_another_live_server_holds_takes_another_name(tmp_path):
    """The same pid in another PID namespace sharing the cache directory: the
    server neither blocks on the other's lock nor shares its directory."""
    import subprocess
    import sys

    from core.snapshot.workfiles import SERVE_DIR_PREFIX, hold_server_dir, remove_dead_server_dirs
    taken = tmp_path / f"{SERVE_DIR_PREFIX}{os.getpid()}"
    taken.mkdir()
    other = subprocess.Popen([sys.executable, HOLD_LOCK, str(taken) + ".lock"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        mine = hold_server_dir(str(tmp_path))
        assert mine != str(taken) and os.path.basename(mine).startswith(f"{SERVE_DIR_PREFIX}{os.getpid()}-")
        assert remove_dead_server_dirs(str(tmp_path)) == (0, [])  # both live: neither is swept
        assert taken.exists() and os.path.isdir(mine)
    finally:
        other.kill()
        other.wait()


def test_a_server_locks_the_lock_file_still_linked_at_its_path(tmp_path, monkeypatch):
    """A sweep that removed a dead server of the same pid may unlink the lock
    file a starting server has just opened: the server must hold the file
    linked at the path, or the next sweep would find its directory unlocked."""
    import fcntl

    from core.snapshot import workfiles
    real_flock = fcntl.flock
    lock_path = tmp_path / f"{workfiles.SERVE_DIR_PREFIX}{os.getpid()}.lock"
    lock_path.touch()
    swept = []

    def flock(fd, op):
        if not swept:  # the sweeper, between our open and our lock
            swept.append(True)
            os.unlink(lock_path)
        return real_flock(fd, op)
    monkeypatch.setattr(workfiles.fcntl, "flock", flock)
    path = workfiles.hold_server_dir(str(tmp_path))
    monkeypatch.undo()
    held = workfiles._held_server_locks[-1]
    assert swept and os.stat(path + ".lock").st_ino == os.fstat(held).st_ino


def test_a_work_file_whose_lock_cannot_be_written_leaves_no_lock_to_wait_for(tmp_path, monkeypatch):
    """A full disk refuses the lock file's one write: the failed build must
    not leave a held lock, which every erasure's drain would wait out as a
    running build until the process ended."""
    import errno
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    open_before = len(os.listdir("/proc/self/fd"))

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(workfiles.os, "write", full_disk)
    with pytest.raises(OSError):
        WorkFile(str(tmp_path), "build-acme-", base=0)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    assert len(os.listdir("/proc/self/fd")) == open_before
    assert workfiles.drain(str(tmp_path), "acme", 5) == 0
