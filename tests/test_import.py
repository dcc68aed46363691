"""titen import stores every line exactly once, wherever it is interrupted and
whatever --batch-size each run uses (docs/operations.md, core/importer.py).

The full-size run (20,000 lines, SIGKILL at 10 points) is bench/import_kill.py;
these are the same rules at a size the suite can afford."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.writes.importer import BLOCK_LINES, import_file
from core.layout import import_markers_prefix
from core.keys import Principal
from core.ledger import Ledger
from core.layout import ledger_prefix
from core.snapshot.build import SnapshotBuilder
from core.storage.local import LocalStore

ROOT = Path(__file__).resolve().parent.parent
PRINCIPAL = Principal(org_id="acme", principal_id="importer", key_id="cli",
                      scopes=frozenset({"admin", "memory:write", "memory:verify"}), workspaces=())


def write_ndjson(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "subject_id": "user_rama", "kind": "imported_source", "content": f"line {i}",
                "visibility": "organization", "source": {"type": "import", "ref": f"file#{i}"},
                "claim": {"statement": f"imported fact number {i}", "kind": "semantic_fact",
                          "confidence": 0.8}}) + "\n")
            if i % 37 == 0:
                f.write("\n")  # blank lines are not lines
    return str(path)


class Killed(BaseException):
    """The process died here: nothing in the importer may catch it."""


def kill_before_write(store, monkeypatch, n):
    """Die before the n-th durable write of the store (marker or entry)."""
    real = store.put_if_absent
    count = [0]

    def put_if_absent(key, body):
        count[0] += 1
        if count[0] == n:
            raise Killed(key)
        return real(key, body)

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)
    return count


def snapshot_state(store, work_dir, from_scratch=False):
    result = SnapshotBuilder(store, "acme", work_dir=str(work_dir)).rebuild(from_scratch=from_scratch)
    return result.claim_count, result.content_hash


def statements(store):
    import apsw
    from core.snapshot.pointer import read_pointer
    pointer, _ = read_pointer(store, "acme")
    path = "/tmp/check-%d.sqlite" % os.getpid()
    store.download_file(pointer["snapshot_key"], path)
    try:
        db = apsw.Connection(path)
        return [r[0] for r in db.execute("SELECT statement FROM claims ORDER BY statement")]
    finally:
        os.unlink(path)


LINES = 350  # four blocks, the last one partial


def writes_of_a_clean_run(tmp_path, src, batch_size):
    store = LocalStore(str(tmp_path / "probe"))
    count = kill_before_write(store, pytest.MonkeyPatch(), 10 ** 9)
    import_file(store, PRINCIPAL, src, batch_size=batch_size)
    return count[0]


@pytest.mark.parametrize("first,rerun", [(200, 100), (100, 1000), (1000, 500), (50, 200), (500, 7)])
def test_an_import_killed_at_any_write_and_rerun_with_another_batch_size_stores_every_line_once(
        tmp_path, monkeypatch, first, rerun):
    src = write_ndjson(tmp_path / "in.ndjson", LINES)
    total_writes = writes_of_a_clean_run(tmp_path, src, first)
    for n in range(1, total_writes + 1):
        store = LocalStore(str(tmp_path / f"s{n}"))
        with monkeypatch.context() as m:
            kill_before_write(store, m, n)
            with pytest.raises(Killed):
                import_file(store, PRINCIPAL, src, batch_size=first)
        work = tmp_path / f"w{n}"
        snapshot_state(store, work)  # a rebuild between the kill and the re-run
        import_file(store, PRINCIPAL, src, batch_size=rerun)
        claims, incremental = snapshot_state(store, work)
        assert claims == LINES, f"killed before write {n}"
        assert snapshot_state(store, work, from_scratch=True) == (LINES, incremental)
    assert statements(store) == sorted(f"imported fact number {i}" for i in range(LINES))


def test_a_run_killed_twice_in_a_row_still_ends_with_every_line_once(tmp_path, monkeypatch):
    src = write_ndjson(tmp_path / "in.ndjson", LINES)
    store = LocalStore(str(tmp_path / "s"))
    for n, batch_size in ((3, 200), (2, 100)):
        with monkeypatch.context() as m:
            kill_before_write(store, m, n)
            with pytest.raises(Killed):
                import_file(store, PRINCIPAL, src, batch_size=batch_size)
    import_file(store, PRINCIPAL, src, batch_size=1000)
    assert snapshot_state(store, tmp_path / "w")[0] == LINES


@pytest.mark.parametrize("rerun", [100, 500, 1000])
def test_a_finished_import_rerun_with_any_batch_size_writes_nothing(tmp_path, rerun):
    src = write_ndjson(tmp_path / "in.ndjson", LINES)
    store = LocalStore(str(tmp_path / "s"))
    import_file(store, PRINCIPAL, src, batch_size=500)
    before = list(store.list_keys(ledger_prefix("acme")))
    summary = import_file(store, PRINCIPAL, src, batch_size=rerun)
    assert summary["batches_written"] == 0 and summary["lines"] == LINES
    assert list(store.list_keys(ledger_prefix("acme"))) == before
    assert snapshot_state(store, tmp_path / "w")[0] == LINES


def test_batch_size_sets_the_lines_per_entry(tmp_path):
    src = write_ndjson(tmp_path / "in.ndjson", LINES)
    store = LocalStore(str(tmp_path / "s"))
    # blocks of 100, 100, 100, 50 lines: 4 + 4 + 4 + 2 entries of at most 30
    assert import_file(store, PRINCIPAL, src, batch_size=30)["batches_written"] == 14
    ledger = Ledger(store)
    sizes = [len(ledger.read_key(k)["observations"]) for k in store.list_keys(ledger_prefix("acme"))]
    assert max(sizes) == 30 and sum(sizes) == LINES


@pytest.mark.parametrize("sizes", [(500, 500), (100, 1000), (7, 300)])
def test_two_concurrent_imports_of_one_file_store_every_line_once(tmp_path, sizes):
    src = write_ndjson(tmp_path / "in.ndjson", 1000)
    store = LocalStore(str(tmp_path / "s"))
    errors = []

    def run(batch_size):
        try:
            import_file(store, PRINCIPAL, src, batch_size=batch_size)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    claims, incremental = snapshot_state(store, tmp_path / "w")
    assert claims == 1000
    assert snapshot_state(store, tmp_path / "w", from_scratch=True) == (1000, incremental)


def test_the_rebuild_applies_a_line_once_even_if_the_ledger_holds_it_twice(tmp_path):
    src = write_ndjson(tmp_path / "in.ndjson", 150)
    store = LocalStore(str(tmp_path / "s"))
    import_file(store, PRINCIPAL, src, batch_size=100)
    ledger = Ledger(store)
    first = ledger.read_key(next(store.list_keys(ledger_prefix("acme"))))
    # a twin of the first entry under another entry id and other record ids
    from core.ids import entry_hex, record_hex
    hex_ = entry_hex()
    twin = json.loads(json.dumps({k: first[k] for k in ("import", "observations", "claims")}))
    for pos, obs in enumerate(twin["observations"]):
        obs["observation_id"] = f"obs_{record_hex(hex_, 2 * pos + 1)}"
    for pos, claim in enumerate(twin["claims"]):
        claim["claim_id"] = f"claim_{record_hex(hex_, 2 * pos + 2)}"
        claim["sources"] = [{"observation_id": f"obs_{record_hex(hex_, 2 * pos + 1)}", "relation": "supports"}]
    ledger.append("acme", "batch", twin, actor="importer", entry_hex=hex_)
    claims, incremental = snapshot_state(store, tmp_path / "w")
    assert claims == 150
    assert snapshot_state(store, tmp_path / "w", from_scratch=True) == (150, incremental)


def test_another_file_with_the_same_lines_is_another_import(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    import_file(store, PRINCIPAL, write_ndjson(tmp_path / "a.ndjson", 20), batch_size=100)
    import_file(store, PRINCIPAL, write_ndjson(tmp_path / "b.ndjson", 30), batch_size=100)
    assert snapshot_state(store, tmp_path / "w")[0] == 50


# -- SIGKILL of the real command -------------------------------------------------

def titen(*args):
    return [sys.executable, "-m", "core.cli", *args]


def test_the_import_command_killed_with_sigkill_and_rerun_ends_with_every_line_once(tmp_path):
    n = 3000
    src = write_ndjson(tmp_path / "in.ndjson", n)
    data = str(tmp_path / "store")
    markers = Path(data) / "orgs" / "acme" / "imports"
    ledger = Path(data) / "orgs" / "acme" / "ledger"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = 0
    for kill_at, batch_size in ((2, 500), (9, 100), (14, 1000), (25, 100)):
        proc = subprocess.Popen(titen("import", src, "--org", "acme", "--data-dir", data,
                                      "--batch-size", str(batch_size)), cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            claimed = sum(len(files) for _, _, files in os.walk(markers)) if markers.exists() else 0
            if claimed >= kill_at:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        killed += proc.wait() == -signal.SIGKILL
    assert killed >= 2  # (a run may finish before its point on a fast machine; most must not)
    left = [p.name for p in ledger.iterdir() if p.name.startswith(".tmp-")] if ledger.exists() else []
    done = subprocess.run(titen("import", src, "--org", "acme", "--data-dir", data, "--batch-size", "500",
                                "--rebuild"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rebuilt = json.loads(done.stdout.splitlines()[-1])
    assert rebuilt["claim_count"] == n
    store = LocalStore(data)
    assert snapshot_state(store, tmp_path / "w", from_scratch=True) == (n, rebuilt["content_hash"])
    assert all(not k.rsplit("/", 1)[1].startswith(".") for k in store.list_keys(ledger_prefix("acme")))
    assert left == [] or all(name.startswith(".tmp-") for name in left)


def test_stale_temporary_files_in_the_ledger_are_removed_by_the_rebuild(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    import_file(store, PRINCIPAL, write_ndjson(tmp_path / "a.ndjson", 5), batch_size=100)
    ledger = tmp_path / "s" / "orgs" / "acme" / "ledger"
    leftover = ledger / ".tmp-00112233aabbccdd"
    leftover.write_bytes(b"{" * 424_000)
    os.utime(leftover, (time.time() - 7200,) * 2)
    said = []
    builder = SnapshotBuilder(store, "acme", work_dir=str(tmp_path / "w"), progress=said.append)
    assert builder.rebuild().claim_count == 5
    assert not leftover.exists() and builder.housekeeping["temporary_files"] == 1
    assert "acme: housekeeping removed 0 idempotency records, 1 temporary files" in said  # the operator sees it
    assert len(list(store.list_keys(import_markers_prefix("acme", "")[:-1]))) == 1  # the one block's marker
    assert BLOCK_LINES == 100


@pytest.mark.parametrize("change", ["a forbidden character, same length", "truncated"])
def test_a_file_changed_after_it_was_validated_stops_the_import_and_stores_nothing_unvalidated(tmp_path, change):
    """Lines are stored only as validated: a line that no longer hashes to
    what was validated stops the import, naming it (core/writes/importer.py)."""
    from core.writes.importer import FileChanged
    store = LocalStore(str(tmp_path / "store"))
    src = write_ndjson(tmp_path / "lines.ndjson", LINES)
    raw = Path(src).read_bytes()

    def progress(message):
        if message.startswith("validated"):  # between the validating read and the storing one
            if change == "truncated":
                Path(src).write_bytes(raw[:len(raw) // 2])
            else:
                # "line 2" → "\u202e" escaped is longer; a same-length swap: 6 bytes for 6 bytes
                Path(src).write_bytes(raw.replace(b'"line 2', b'"\\u202e'))

    with pytest.raises(FileChanged, match=r"lines\.ndjson:\d+: the file changed since it was validated"):
        import_file(store, PRINCIPAL, src, batch_size=100, progress=progress)
    stored = b"".join(store.get(k).body for k in store.list_keys(ledger_prefix("acme")))
    assert b"\\u202e" not in stored and "\u202e".encode() not in stored


def test_a_pipe_is_refused_before_anything_is_written(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    fifo = str(tmp_path / "lines.fifo")
    os.mkfifo(fifo)
    src = write_ndjson(tmp_path / "lines.ndjson", 3)

    def feed():
        try:
            with open(fifo, "wb") as w:
                w.write(Path(src).read_bytes())
        except BrokenPipeError:  # the importer closed it unread: what it should do
            pass
    threading.Thread(target=feed, daemon=True).start()
    outcome = []

    def run():  # in a thread: an importer that tried to read the pipe twice would wait forever
        try:
            import_file(store, PRINCIPAL, fifo)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
    importer = threading.Thread(target=run, daemon=True)
    importer.start()
    importer.join(timeout=10)
    assert outcome and "cannot be read twice" in str(outcome[0])
    assert list(store.list_keys("")) == []
