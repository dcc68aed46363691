"""`titen serve`'s processes (core/serving.py, core/rebuild/host.py): a
supervisor that builds, server processes that answer, a bell between them."""

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import time

import pytest

from bench.common import Served
from core.config import Settings
from core.rebuild.host import RebuildClient, host
from core.serving import supervise
from core.snapshot.workfiles import SERVE_DIR_PREFIX
from core.service import Service
from core.snapshot.reader import SnapshotReader
from tests.conftest import Api

STATEMENT = {"statement": "The staging cluster runs Postgres 16", "kind": "semantic_fact", "confidence": 0.9}


def _settings(tmp_path, **env) -> Settings:
    return Settings.from_env(data_dir=str(tmp_path / "titen"), env=env)


@pytest.fixture
def supervised(tmp_path):
    """A server process's Service asking a supervisor's Service (hosted on
    loopback from this process) for its rebuilds, with the bell between
    them; a TTL of an hour, so only the bell can show a new generation."""
    supervisor = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    shared = supervise(supervisor)
    address, authkey = host(supervisor)
    server_settings = _settings(tmp_path, TITEN_SNAPSHOT_TTL="3600")
    server = Service(Settings(**{**server_settings.__dict__,
                                 "cache_dir": os.path.join(server_settings.cache_dir, "serve-test")}),
                     rebuilds=RebuildClient.connect(address, authkey, shared.begun, shared.written),
                     bell=shared.bell)
    return Api(server), supervisor, shared.bell


def _compiled_ids(api, key, task="which Postgres does staging run"):
    return [item["claim_id"] for item in api.compile(key, task).json()["data"]["items"]]


def test_a_write_is_rebuilt_by_the_supervisor_and_served_at_the_next_request(supervised):
    api, supervisor, bell = supervised
    key = api.key()
    claim_id = api.observe(key, claim=STATEMENT)["claim_id"]
    deadline = time.monotonic() + 30  # the supervisor's timer builds a quarter second after the write
    while bell.value == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bell.value == 1
    assert _compiled_ids(api, key) == [claim_id]


def test_the_supervisor_holds_no_generation_it_built(supervised):
    api, supervisor, _ = supervised
    key = api.key()
    api.observe(key, claim=STATEMENT)
    api.rebuild(key)
    assert supervisor.reader.cached_bytes() == 0 and not any(
        name.endswith(".sqlite") for name in os.listdir(supervisor.settings.cache_dir))


def test_an_admin_rebuild_is_built_by_the_supervisor_and_answered_with_its_result(supervised):
    api, supervisor, bell = supervised
    key = api.key()
    claim_id = api.observe(key, claim=STATEMENT)["claim_id"]
    result = api.rebuild(key)
    assert result["claim_count"] == 1 and result["generation"] >= 1
    assert _compiled_ids(api, key) == [claim_id]
    assert result["content_hash"] == supervisor.builder("acme").rebuild(from_scratch=True, force=True).content_hash


def test_a_reader_serves_a_new_generation_when_the_bell_rings_not_after_its_ttl(tmp_path):
    service = Service(_settings(tmp_path, TITEN_SNAPSHOT_TTL="0"))
    api = Api(service)
    key = api.key()
    api.observe(key, claim=STATEMENT)
    api.rebuild(key)
    bell = multiprocessing.get_context("spawn").RawValue("Q", 0)
    reader = SnapshotReader(service.store, str(tmp_path / "reader"), ttl_seconds=3600, bell=bell)
    assert reader.current("acme").claim_count == 1
    api.observe(key, claim={**STATEMENT, "statement": "The staging cluster runs Redis 7"})
    api.rebuild(key)
    assert reader.current("acme").claim_count == 1  # within its TTL, no bell: the generation it holds
    bell.value += 1
    assert reader.current("acme").claim_count == 2


def test_a_write_is_stored_and_acknowledged_when_the_supervisor_is_unreachable(tmp_path, caplog):
    class Gone:
        """The supervisor's proxy once its process is gone: every call fails."""

        def request(self, org_id):
            raise ConnectionRefusedError(111, "Connection refused")

        def rebuild(self, org_id, from_scratch, force):
            raise ConnectionRefusedError(111, "Connection refused")

    api = Api(Service(_settings(tmp_path), rebuilds=RebuildClient(Gone())))
    key = api.key()
    with caplog.at_level(logging.ERROR, logger="titen"):
        written = api.observe(key, claim=STATEMENT)
        assert _wait(lambda: "the write is stored" in caplog.text, 30)
    assert any(written["observation_id"][4:] in k for k in api.ledger_keys())
    response = api.post("/v1/admin/rebuild", b"", key)
    assert response.status_code == 503 and response.json()["error"]["code"] == "UNAVAILABLE"


def test_a_local_disk_failure_answers_503_unavailable_not_a_500(tmp_path):
    """The embedded store's disk failing (here a file where the ledger's
    directory belongs) is the store failing, as on S3: retry shortly."""
    import shutil

    api = Api(Service(_settings(tmp_path)))
    key = api.key()
    api.observe(key, claim=STATEMENT)
    api.rebuild(key)
    ledger = tmp_path / "titen" / "orgs" / "acme" / "ledger"
    assert ledger.is_dir()
    shutil.move(str(ledger), str(tmp_path / "ledger-aside"))
    ledger.write_bytes(b"not a directory")
    observe = {"subject_id": "user_rama", "kind": "tool_result", "content": "Another fact.",
               "source": {"type": "tool", "ref": "r"}}
    for response in (api.post("/v1/observations", observe, key), api.compile(key, "staging cluster")):
        assert response.status_code == 503, response.text
        assert response.json()["error"] == {"code": "UNAVAILABLE", "message": "the store is unavailable; retry shortly"}


class Asked:
    """A rebuild host that records each organization it is asked to rebuild."""

    def __init__(self):
        self.asked = []

    def request(self, org_id):
        self.asked.append(org_id)

    def rebuild(self, org_id, from_scratch, force):
        raise AssertionError("not asked to rebuild now")


def test_a_write_whose_answer_was_lost_still_asks_for_its_rebuild_and_so_does_its_replay(tmp_path, monkeypatch):
    """The entry landed, the store's answer did not: the write answers 503,
    and its retry under the same key replays the stored answer. Either way
    the organization's rebuild is asked for, or the write waits for the
    schedule (docs/api.md §12)."""
    from core.storage import StoreError

    host = Asked()
    service = Service(_settings(tmp_path), rebuilds=host)
    api = Api(service)
    key = {**api.key(), "idempotency-key": "lost-1"}
    real = service.store.put_if_absent

    def lands_then_fails(k, body):
        etag = real(k, body)
        if "/ledger/" in k:
            raise StoreError("injected: the answer was lost")
        return etag
    monkeypatch.setattr(service.store, "put_if_absent", lands_then_fails)
    body = {"subject_id": "user_rama", "kind": "tool_result", "content": "Smoke passed.",
            "source": {"type": "tool", "ref": "r"}}
    lost = api.post("/v1/observations", body, key)
    assert lost.status_code == 503 and host.asked == ["acme"]
    monkeypatch.undo()
    again = api.post("/v1/observations", body, key)
    assert again.status_code == 201 and again.json()["meta"]["idempotent_replay"] is True
    assert host.asked == ["acme", "acme"]


def test_a_burst_of_writes_asks_the_supervisor_once_per_message_in_flight(tmp_path):
    """While one request is on its way, the writes behind it are folded into
    the next: a burst costs a few messages, not one per write."""
    import threading

    arrived, release = threading.Event(), threading.Event()
    received = []

    class Slow:
        def request(self, org_id):
            received.append(org_id)
            arrived.set()
            release.wait(30)

    client = RebuildClient(Slow())
    client.request("acme")
    assert arrived.wait(30)
    for _ in range(100):
        client.request("acme")
    client.request("globex")
    release.set()
    assert _wait(lambda: len(received) == 3, 30)
    assert sorted(received[1:]) == ["acme", "globex"]


def test_writes_while_their_rebuild_is_pending_send_no_message_until_it_begins():
    """The answer to a request is the count of rebuilds begun at which the
    organization's rebuild was pending; while that count stands, that
    rebuild has not listed the ledger, and a write needs no message."""
    import types

    begun, written = types.SimpleNamespace(value=5), types.SimpleNamespace(value=0)
    received = []

    class Supervisor:
        def request(self, org_id):
            received.append(org_id)
            return begun.value

    client = RebuildClient(Supervisor(), begun, written)
    client.request("acme")
    assert _wait(lambda: client._covered.get("acme") == 5, 30)
    for _ in range(100):
        client.request("acme")
    assert received == ["acme"] and written.value == 101  # every write counted, one message
    client.request("globex")  # another organization: its own rebuild
    assert _wait(lambda: received == ["acme", "globex"], 30)
    begun.value = 6  # a rebuild began listing: the next write asks again
    client.request("acme")
    assert _wait(lambda: received == ["acme", "globex", "acme"], 30)


def test_every_write_of_a_burst_is_in_the_generation_served_once_the_writes_pause(supervised):
    api, supervisor, bell = supervised
    key = api.key()
    for i in range(40):
        api.observe(key, claim={**STATEMENT, "statement": f"Staging host {i} runs Postgres 16"})
    # the generation served holds all 40 acknowledged claims (a skipped
    # request that lost a write would leave it short, and nothing rebuilds
    # it later: no write follows)
    assert _wait(lambda: api.get("/readyz", key).json()["data"]["claim_count"] == 40, 60)
    assert supervisor.begun.value >= 1 and bell.value >= 1


def test_a_server_killed_while_it_holds_the_count_does_not_stall_the_rebuilds(tmp_path):
    """The count of rebuilds begun is read under an flock: while a server
    holds it the supervisor waits, and when that server is killed outright
    the kernel drops it, so the next rebuild begins."""
    import subprocess
    import sys
    import threading

    from core.serving import BEGUN_LOCK

    supervisor = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    shared = supervise(supervisor)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\n"
         "time.sleep(600)", os.path.join(supervisor.settings.cache_dir, BEGUN_LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        moved = threading.Event()
        threading.Thread(target=lambda: (shared.begun.increment(), moved.set()), daemon=True).start()
        assert not moved.wait(0.5)  # the server's read is in progress: the count does not move under it
        holder.kill()
        holder.wait(30)
        assert moved.wait(30) and shared.begun.value == 1
    finally:
        holder.kill()
        holder.wait(30)


class _Clock:
    """core.service's clock in a test: sleeping advances it, and each sleep
    may count writes (``writes_per_sleep``)."""

    def __init__(self, service, writes_per_sleep):
        self.now, self.slept = 1000.0, []
        self.service, self.writes_per_sleep = service, writes_per_sleep

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds
        self.service.written.value += self.writes_per_sleep


@pytest.mark.parametrize("writes_per_sleep, waits", [
    (0, "one quiet interval"),  # the writes paused: the pending rebuild runs at once
    (25, "the whole spacing"),  # writes keep coming: LOAD_SPACING times the last rebuild's duration
])
def test_a_scheduled_rebuild_is_spaced_only_while_writes_keep_coming(tmp_path, monkeypatch, writes_per_sleep, waits):
    import core.service

    service = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    clock = _Clock(service, writes_per_sleep)
    monkeypatch.setattr(core.service, "time", clock)
    service._last_rebuild["acme"] = (clock.now, 0.4)  # one ended just now, after 0.4 s
    service._space_under_load("acme")
    expected = core.service.QUIET_SECONDS if waits == "one quiet interval" else core.service.LOAD_SPACING * 0.4
    assert sum(clock.slept) == pytest.approx(expected)


def test_a_first_scheduled_rebuild_is_not_spaced(tmp_path, monkeypatch):
    import core.service

    service = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    clock = _Clock(service, 25)
    monkeypatch.setattr(core.service, "time", clock)
    service._space_under_load("acme")
    assert clock.slept == []


def test_a_scheduled_rebuild_another_process_beat_twice_is_scheduled_again(tmp_path, monkeypatch, caplog):
    """The other process's generation may have been listed before the write:
    the write still needs its own rebuild, and nothing else would ask."""
    from core.errors import Conflict

    service = Service(_settings(tmp_path), auto_rebuild=True)
    api = Api(service)
    key = api.key()
    build_here, lost = service._build_here, []

    def beaten_once(*args, **kw):
        if not lost:
            lost.append(True)
            raise Conflict("another rebuild of this organization published first; retry")
        return build_here(*args, **kw)

    monkeypatch.setattr(service, "_build_here", beaten_once)
    claim_id = api.observe(key, claim=STATEMENT)["claim_id"]  # its scheduled rebuild loses
    assert _wait(lambda: _compiled_ids(api, key) == [claim_id], 30)  # no other write asked again
    assert lost and "another process published first; rebuilding again" in caplog.text
    assert "Traceback" not in caplog.text

def test_a_scheduled_rebuild_that_failed_is_tried_again_without_another_write(tmp_path, monkeypatch, caplog):
    """The store failed during the rebuild a write asked for: the write was
    acknowledged, and on a local host no schedule would catch it up."""
    import core.service
    from core.storage import StoreError

    monkeypatch.setattr(core.service, "RETRY_FIRST_SECONDS", 0.05)
    service = Service(_settings(tmp_path), auto_rebuild=True)
    api = Api(service)
    key = api.key()
    build_here, failed = service._build_here, []

    def store_down_twice(*args, **kw):
        if len(failed) < 2:
            failed.append(True)
            raise StoreError("S3 PutObject failed: SlowDown (HTTP 503)")
        return build_here(*args, **kw)

    monkeypatch.setattr(service, "_build_here", store_down_twice)
    claim_id = api.observe(key, claim=STATEMENT)["claim_id"]
    assert _wait(lambda: _compiled_ids(api, key) == [claim_id], 30)
    assert len(failed) == 2 and "trying again in 0.05 s" in caplog.text and "trying again in 0.1 s" in caplog.text

@pytest.mark.parametrize("failed, seconds", [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (5000, 60.0)])
def test_a_failed_rebuild_is_tried_again_after_a_backoff_capped_at_a_minute(failed, seconds):
    from core.service import retry_delay

    assert retry_delay(failed) == seconds  # 5000 failures in a row (three days) never overflow


def test_organizations_that_could_not_be_listed_at_start_are_rebuilt_once_they_can_be(tmp_path, monkeypatch):
    import core.service
    from core.storage import StoreError

    monkeypatch.setattr(core.service, "RETRY_FIRST_SECONDS", 0.05)
    writer = Api(Service(_settings(tmp_path)))
    key = writer.key()
    claim_id = writer.observe(key, claim=STATEMENT)["claim_id"]  # acknowledged, never rebuilt
    service = Service(_settings(tmp_path), auto_rebuild=True)
    listing, failed = service.ledger.organizations, []

    def store_down_once():
        if not failed:
            failed.append(True)
            raise StoreError("S3 ListObjectsV2 failed: SlowDown (HTTP 503)")
        return listing()

    monkeypatch.setattr(service.ledger, "organizations", store_down_once)
    service.rebuild_all_later()
    assert _wait(lambda: _compiled_ids(Api(service), key) == [claim_id], 30) and failed

def test_catch_up_schedules_only_the_organizations_whose_ledger_is_ahead_of_their_generation(tmp_path):
    supervisor = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    writer = Api(Service(_settings(tmp_path)))  # another process: it asks this supervisor for nothing
    acme, globex = writer.key(), writer.key(org="globex")
    for key in (acme, globex):
        writer.observe(key, claim=STATEMENT)
        writer.rebuild(key)
    writer.observe(acme, claim={**STATEMENT, "statement": "The staging cluster runs Redis 7"})
    assert supervisor.catch_up() == ["acme"]
    assert supervisor.catch_up() == []  # pending already: not asked twice
    assert supervisor.finish_scheduled_rebuilds() == []
    assert supervisor.catch_up() == []
    fresh = Api(Service(_settings(tmp_path)))  # what is published now
    assert len(_compiled_ids(fresh, acme, "staging cluster")) == 2


def test_one_organization_that_cannot_be_checked_holds_up_no_others_catch_up(tmp_path):
    supervisor = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    writer = Api(Service(_settings(tmp_path)))
    broken, later = writer.key(org="aaa"), writer.key(org="zzz")
    for key in (broken, later):
        writer.observe(key, claim=STATEMENT)
        writer.rebuild(key)
    writer.observe(later, claim={**STATEMENT, "statement": "The staging cluster runs Redis 7"})
    (tmp_path / "titen" / "orgs" / "aaa" / "snapshots" / "current.json").write_text("{not json")
    assert supervisor.catch_up() == ["zzz"]


@pytest.mark.parametrize("took, wait", [(0.01, 15), (0.75, 15), (2.0, 40), (15, 300), (3600, 300)])
def test_a_catch_up_pass_is_spaced_by_twenty_times_its_duration_but_at_most_five_minutes(took, wait):
    # a pass slowed by a failing store's retries put the next off for hours
    from core.serving import CATCH_UP_SECONDS, next_catch_up_wait

    assert next_catch_up_wait(CATCH_UP_SECONDS, took) == wait


def test_the_supervisor_catches_up_a_write_whose_own_rebuild_never_ran(tmp_path):
    """A ``titen mcp`` killed right after a write, or ``titen import``
    without ``--rebuild``: nothing asks for the rebuild, the safety net
    does (core.serving.catch_up)."""
    import threading

    from core.serving import catch_up

    supervisor = Service(_settings(tmp_path), auto_rebuild=True, serves=False)
    writer = Api(Service(_settings(tmp_path)))
    key = writer.key()
    writer.rebuild(key)
    claim_id = writer.observe(key, claim=STATEMENT)["claim_id"]  # acknowledged, its rebuild never asked
    stop = threading.Event()
    threading.Thread(target=catch_up, args=(supervisor, 0.05), kwargs={"stop": stop}, daemon=True).start()
    try:
        assert _wait(lambda: _compiled_ids(writer, key) == [claim_id], 30)
    finally:
        stop.set()


def test_a_process_ending_runs_the_rebuild_it_scheduled_and_did_not_begin(tmp_path):
    service = Service(_settings(tmp_path), auto_rebuild=True)
    api = Api(service)
    key = api.key()
    api.rebuild(key)
    claim_id = api.observe(key, claim=STATEMENT)["claim_id"]  # its rebuild waits on a timer
    assert service.finish_scheduled_rebuilds() == []
    reader = Api(Service(_settings(tmp_path)))  # a fresh process: what is published
    assert _compiled_ids(reader, key) == [claim_id]


# -- the processes of `titen serve` -----------------------------------------------------------


def _children(pid: int) -> set[int]:
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
        except FileNotFoundError:  # a thread that ended since the listing (a rebuild's, say)
            pass
    return found


def _servers(supervisor: int) -> set[int]:
    """The server processes (spawned children that are not multiprocessing's resource tracker)."""
    found = set()
    for pid in _children(supervisor):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    found.add(pid)
        except FileNotFoundError:
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _wait(condition, seconds=60.0) -> bool:
    """Whether ``condition`` held at some moment within ``seconds`` (it is
    not asked again after holding: /proc's children lists are read while
    processes start and end)."""
    deadline = time.monotonic() + seconds
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def test_titen_serve_runs_the_server_processes_it_is_asked_for(tmp_path):
    with Served(tmp_path / "titen", extra_args=["--workers", "3"]) as served:
        assert _wait(lambda: len(_servers(served.pid)) == 3)


def test_a_killed_server_process_is_replaced_and_its_cache_directory_removed(tmp_path):
    data = tmp_path / "titen"
    with Served(data, extra_args=["--workers", "2"]) as served:
        assert _wait(lambda: len(_servers(served.pid)) == 2)
        assert _wait(lambda: len([n for n in os.listdir(data / "cache")
                                  if n.startswith(SERVE_DIR_PREFIX) and (data / "cache" / n).is_dir()]) == 2)
        victim = min(_servers(served.pid))
        os.kill(victim, signal.SIGKILL)
        assert _wait(lambda: len(_servers(served.pid)) == 2 and victim not in _servers(served.pid), 120), \
            served.log()[-3000:]
        assert _wait(lambda: not (data / "cache" / f"{SERVE_DIR_PREFIX}{victim}").exists())
        assert not (data / "cache" / f"{SERVE_DIR_PREFIX}{victim}.lock").exists()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_titen_serve_leaves_no_server_cache_directory(tmp_path, stop):
    # the supervisor's SIGTERM to its servers, after Ctrl-C, ended them
    # before their own exit could remove their directories
    data = tmp_path / "titen"

    def serve_dirs():
        return [n for n in os.listdir(data / "cache") if n.startswith(SERVE_DIR_PREFIX)]
    with Served(data, extra_args=["--workers", "2"]) as served:
        assert _wait(lambda: len([n for n in serve_dirs() if (data / "cache" / n).is_dir()]) == 2)
        served.process.send_signal(stop)  # the supervisor alone
        assert served.process.wait(60) is not None
    assert serve_dirs() == []


def test_the_server_processes_end_when_the_supervisor_is_killed(tmp_path):
    with Served(tmp_path / "titen", extra_args=["--workers", "2"]) as served:
        assert _wait(lambda: len(_servers(served.pid)) == 2)
        servers = _servers(served.pid)
        served.process.kill()
        served.process.wait()
        assert _wait(lambda: not any(_alive(pid) for pid in servers), 30)


@contextlib.contextmanager
def _following(reader, *, poll: bool):
    """A server's follower thread (core.serving.follow) for the block's length."""
    import threading

    from core.serving import follow

    stop = threading.Event()
    threading.Thread(target=follow, args=(reader, 0.05), kwargs={"poll": poll, "stop": stop}, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def test_an_idle_server_drops_the_older_generation_when_the_bell_rings(supervised):
    """No request reaches the server after the rebuild: its cache must still
    lose the older generation (after an erasure it holds the erased text)."""
    api, supervisor, bell = supervised
    key = api.key()
    api.observe(key, claim=STATEMENT)
    api.rebuild(key)
    reader = api.service.reader
    old = reader.current("acme").path
    with _following(reader, poll=False):
        api.observe(key, claim={**STATEMENT, "statement": "The staging cluster runs Redis 7"})
        assert _wait(lambda: bell.value >= 2, 30)  # the supervisor's timer published
        assert _wait(lambda: not os.path.exists(old), 30)


def test_an_idle_server_drops_a_generation_another_process_published_without_a_bell(tmp_path):
    """``titen mcp`` or ``titen rebuild`` on the same store publishes with no
    bell this server hears: on a local store it follows the pointer too."""
    bell = multiprocessing.Value("Q", 0)  # its supervisor's; nobody here rings it
    server = Api(Service(_settings(tmp_path), reader_dir=str(tmp_path / "server"), bell=bell))
    key = server.key()
    server.observe(key, claim=STATEMENT)
    server.rebuild(key)
    reader = server.service.reader
    old = reader.current("acme").path
    with _following(reader, poll=True):
        other = Api(Service(_settings(tmp_path)))  # another process on the store
        other.observe(key, claim={**STATEMENT, "statement": "The staging cluster runs Redis 7"})
        published = other.rebuild(key)["generation"]
        assert _wait(lambda: not os.path.exists(old), 30)
        assert reader.current("acme").generation == published and bell.value == 0


def test_an_erasure_published_with_a_bell_still_waits_for_the_readers_that_cannot_hear_it(tmp_path):
    """``titen serve``'s supervisor rings its own servers' bell; ``titen mcp``
    beside it on the store reads the pointer every TTL. No compile begun
    after the erasure reads complete may answer from the older generation."""
    import threading

    settings = _settings(tmp_path, TITEN_SNAPSHOT_TTL="1")  # a window a loop of compiles cannot miss
    publisher = Api(Service(settings))
    publisher.service.on_publish = lambda: None  # a bell that reaches none of the readers below
    beside = Api(Service(settings, reader_dir=str(tmp_path / "beside")))
    key = publisher.key(scopes="context:compile,memory:write,memory:erase,admin")
    publisher.observe(key, subject_id="user_gone", claim=STATEMENT)
    publisher.rebuild(key)
    task = {"subject_id": "user_gone", "task": "which Postgres does staging run", "max_tokens": 1200}
    assert beside.post("/v1/context/compile", task, key).json()["data"]["items"]
    answers, done = [], threading.Event()

    def compile_in_a_loop():
        while not done.is_set():
            begun = time.monotonic()
            answers.append((begun, bool(beside.post("/v1/context/compile", task, key).json()["data"]["items"])))

    looping = threading.Thread(target=compile_in_a_loop)
    looping.start()
    try:
        asked = publisher.client.delete("/v1/subjects/user_gone", headers={"authorization": key["authorization"]})
        publisher.rebuild(key)
        erasure = publisher.get(f"/v1/erasures/{asked.json()['data']['erasure_id']}", key).json()["data"]
        complete = time.monotonic()
        assert erasure["status"] == "complete"
        assert _wait(lambda: sum(begun > complete for begun, _ in answers) >= 5, 30)
    finally:
        done.set()
        looping.join()
    after = [found for begun, found in answers if begun > complete]
    assert after and not any(after)

def test_a_connection_made_once_listening_is_printed_is_answered_not_refused(tmp_path):
    # the workers listen only once started, about a second after the message:
    # a client that went by it (a script, the README's curl) was refused
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    titen = str(Path(sys.executable).with_name("titen"))
    proc = subprocess.Popen([titen, "serve", "--data-dir", str(tmp_path / "titen"), "--port", str(port)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env={**os.environ, "TITEN_CACHE_DIR": str(tmp_path / "cache")})
    try:
        for line in proc.stderr:
            if line.startswith(b"titen listening"):
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as answer:
            assert answer.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
