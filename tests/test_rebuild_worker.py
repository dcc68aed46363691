"""`titen serve`'s rebuild process: the same generations as an in-process
rebuild, served at once, and a dead child replaced (core/rebuild/worker.py)."""

import os
import signal
import time

import pytest

from bench.common import Served
from core.config import Settings
from core.errors import Unavailable
from core.rebuild.worker import RebuildWorker
from core.service import Service
from tests.conftest import Api


@pytest.fixture
def served(tmp_path):
    """A service whose rebuilds run in a child process, as under `titen serve`."""
    settings = Settings.from_env(data_dir=str(tmp_path / "titen"), env={"TITEN_SNAPSHOT_TTL": "0"})
    service = Service(settings)
    service.rebuild_worker = RebuildWorker(settings)
    yield Api(service)
    service.rebuild_worker.close()


def test_a_write_rebuilt_by_the_child_is_compile_visible_at_once(served):
    key = served.key()
    claim_id = served.observe(key, claim={"statement": "The staging cluster runs Postgres 16",
                                          "kind": "semantic_fact", "confidence": 0.9})["claim_id"]
    result = served.rebuild(key)
    assert result["published"] is True and result["claim_count"] == 1
    items = served.compile(key, "which Postgres does staging run").json()["data"]["items"]
    assert [item["claim_id"] for item in items] == [claim_id]


def test_the_child_builds_what_an_in_process_rebuild_builds(served, tmp_path):
    key = served.key()
    for n in range(3):
        served.observe(key, content=f"deploy {n} passed",
                       claim={"statement": f"deploy {n} passed its smoke test", "kind": "episodic_event",
                              "confidence": 0.8})
    in_child = served.rebuild(key)
    in_process = served.service.builder("acme").rebuild(from_scratch=True, force=True)
    assert in_child["content_hash"] == in_process.content_hash


def test_a_killed_child_fails_that_rebuild_and_the_next_one_starts_a_new_child(served):
    key = served.key()
    served.observe(key, claim={"statement": "The staging cluster runs Postgres 16", "kind": "semantic_fact",
                               "confidence": 0.9})
    worker = served.service.rebuild_worker
    worker.start()
    (child,) = worker._pool._processes.values()
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    with pytest.raises(Unavailable):
        worker.rebuild("acme")
    result = served.rebuild(key)
    assert result["published"] is True and result["claim_count"] == 1


def _children(pid: int) -> set[int]:
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(p) for p in f.read().split())
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_rebuild_process_does_not_outlive_a_killed_server(tmp_path):
    with Served(tmp_path / "titen") as server:
        rebuilders = [pid for pid in _children(server.pid) if "spawn_main" in _cmdline(pid)]
        assert len(rebuilders) == 1
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 30  # the child looks every 0.5 s
        while _alive(rebuilders[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(rebuilders[0])


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()
