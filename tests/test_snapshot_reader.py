"""The serving side of snapshots (core.snapshot.reader.SnapshotReader), on every store
backend (conftest ``store``: a local directory and S3 under moto).

Acceptance: "A snapshot object whose bytes do not match its recorded sha256
is refused and the previous generation keeps serving; /readyz says why."
Also: the pointer is read at most once per TTL (counted, not slept), and the
least recently used organization is evicted with its file deleted.
"""

import os

import pytest

import core.snapshot.reader
from conftest import ALL_SCOPES, Api
from core.config import Settings
from core.keys import Principal
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer
from core.service import Service
from core.snapshot.reader import SnapshotReader
from core.writes import Writes

ORG = "acme"


def observe(store, statement, org=ORG):
    principal = Principal(org, "alice", "key_test", frozenset({"memory:write"}), ())
    body = {"subject_id": "user_rama", "kind": "tool_result", "content": statement,
            "source": {"type": "tool", "ref": "t#1"}, "visibility": "organization",
            "claim": {"statement": statement, "kind": "semantic_fact", "confidence": 0.9}}
    return Writes(store, reader=None).record_observation(principal, body)


def publish(store, tmp_path, org=ORG):
    result = SnapshotBuilder(store, org, work_dir=str(tmp_path / "build")).rebuild()
    assert result.published
    return result


def corrupt_current_generation(store, tmp_path, org=ORG):
    """Flip bytes of the published object, keeping the pointer (and its sha256)."""
    pointer, _ = read_pointer(store, org)
    local = tmp_path / "victim.sqlite"
    store.download_file(pointer["snapshot_key"], str(local))
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0xFF
    store.delete(pointer["snapshot_key"])
    store.put_if_absent(pointer["snapshot_key"], bytes(data))
    return pointer


def cache_files(cache_dir):
    return sorted(os.listdir(cache_dir))


class Clock:
    """Stands in for the ``time`` module inside core.snapshot: monotonic() only."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


class CountingStore:
    """Delegates to a real store, counting pointer reads and snapshot downloads."""

    def __init__(self, inner):
        self.inner = inner
        self.pointer_reads = 0
        self.downloads = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_if_changed(self, key, etag):
        if key.endswith("/snapshots/current.json"):
            self.pointer_reads += 1
        return self.inner.get_if_changed(key, etag)

    def download_file(self, key, path):
        self.downloads += 1
        return self.inner.download_file(key, path)


# -- a generation that fails its sha256 ----------------------------------------------

@pytest.fixture
def refused(store, tmp_path):
    """Generation 1 served; generation 2 published with bytes that do not match."""
    observe(store, "Deploy smoke must pass before release.")
    publish(store, tmp_path)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0)
    assert reader.current(ORG).generation == 1
    observe(store, "Canary must stay green for ten minutes.")
    publish(store, tmp_path)
    corrupt_current_generation(store, tmp_path)
    return reader


def test_a_generation_failing_its_sha256_is_refused_and_the_previous_keeps_serving(refused):
    snapshot = refused.current(ORG)
    assert snapshot.generation == 1
    assert snapshot.db.execute("SELECT count(*) FROM claims").fetchone()[0] == 1
    error = refused.status(ORG)["last_refresh_error"]
    assert "generation 2" in error and "sha256" in error


def test_a_refused_generation_leaves_no_file_in_the_cache(refused, tmp_path):
    refused.current(ORG)
    files = cache_files(tmp_path / "cache")
    assert len(files) == 1 and files[0].startswith(f"{ORG}-000000000001-") and files[0].endswith(".sqlite")


def test_a_later_good_generation_is_served_and_clears_the_error(refused, store, tmp_path):
    refused.current(ORG)
    observe(store, "Rollback needs a second approver.")
    publish(store, tmp_path)  # the builder refuses to build on the damaged file: it replays
    snapshot = refused.current(ORG)
    assert snapshot.generation == 3
    assert snapshot.db.execute("SELECT count(*) FROM claims").fetchone()[0] == 3
    assert refused.status(ORG)["last_refresh_error"] is None


def test_readyz_says_why_the_new_generation_was_refused(store, tmp_path):
    settings = Settings.from_env(data_dir=str(tmp_path / "unused"),
                                 env={"TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(tmp_path / "cache")})
    api = Api(Service(settings, store=store))
    key = api.key(ORG, "alice", ALL_SCOPES)
    api.observe(key, claim={"statement": "Deploy smoke must pass.", "kind": "procedural", "confidence": 0.9})
    publish(store, tmp_path)
    assert api.get("/readyz", key).json()["data"]["generation"] == 1
    api.observe(key, content="Canary stayed green.")
    publish(store, tmp_path)
    corrupt_current_generation(store, tmp_path)
    r = api.get("/readyz", key)
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["status"] == "ready" and data["generation"] == 1
    assert "sha256" in data["last_refresh_error"] and "generation 2" in data["last_refresh_error"]
    assert api.compile(key, "must the deploy smoke pass").json()["meta"]["generation"] == 1


def test_an_admin_rebuild_this_process_cannot_load_counts_no_claims_of_the_generation_it_still_serves(
        store, tmp_path, monkeypatch):
    """api.md §8.9: claim_count is of the generation the rebuild published,
    null when this process cannot serve it (a full cache disk, say)."""
    import errno
    settings = Settings.from_env(data_dir=str(tmp_path / "unused"),
                                 env={"TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(tmp_path / "cache")})
    service = Service(settings, store=store)
    api = Api(service)
    key = api.key(ORG, "alice", ALL_SCOPES + ",admin")
    api.observe(key, claim={"statement": "Deploy smoke must pass.", "kind": "procedural", "confidence": 0.9})
    assert api.rebuild(key)["claim_count"] == 1
    api.observe(key, claim={"statement": "Canary stayed green.", "kind": "procedural", "confidence": 0.9})

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(service.reader, "_load", full_disk)
    answer = api.post("/v1/admin/rebuild", b"", key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["generation"] == 2 and answer.json()["data"]["claim_count"] is None
    ready = api.get("/readyz", key).json()["data"]
    assert ready["generation"] == 1 and "loading the new generation failed: OSError" in ready["last_refresh_error"]


# -- TTL ------------------------------------------------------------------------------

@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(core.snapshot.reader, "time", fake)
    return fake


def serving_generation_1(store, tmp_path, ttl_seconds):
    """(reader, counting store): one claim published, its generation loaded
    through a ``CountingStore`` by a reader with this TTL."""
    observe(store, "Deploy smoke must pass before release.")
    publish(store, tmp_path)
    counting = CountingStore(store)
    reader = SnapshotReader(counting, str(tmp_path / "cache"), ttl_seconds=ttl_seconds)
    assert reader.current(ORG).generation == 1
    return reader, counting


@pytest.fixture
def counted(store, tmp_path, clock):
    reader, counting = serving_generation_1(store, tmp_path, 30)
    assert (counting.pointer_reads, counting.downloads) == (1, 1)
    return reader, counting


def test_the_pointer_is_not_read_again_before_the_ttl_passes(counted, clock):
    reader, counting = counted
    for _ in range(5):
        clock.now += 5.9
        assert reader.current(ORG).generation == 1
    assert counting.pointer_reads == 1


def test_an_unchanged_pointer_is_checked_after_the_ttl_and_downloads_nothing(counted, clock):
    reader, counting = counted
    clock.now += 30
    assert reader.current(ORG).generation == 1
    assert (counting.pointer_reads, counting.downloads) == (2, 1)


def test_a_new_generation_is_served_at_the_first_check_after_the_ttl(counted, clock, store, tmp_path):
    reader, counting = counted
    observe(store, "Canary must stay green for ten minutes.")
    publish(store, tmp_path)
    clock.now += 29
    assert reader.current(ORG).generation == 1
    clock.now += 1
    assert reader.current(ORG).generation == 2
    assert (counting.pointer_reads, counting.downloads) == (2, 2)


def test_the_replaced_generation_file_is_deleted_from_the_cache(counted, clock, store, tmp_path):
    reader, _ = counted
    old_path = reader.current(ORG).path
    observe(store, "Canary must stay green for ten minutes.")
    publish(store, tmp_path)
    clock.now += 30
    new = reader.current(ORG)
    assert new.generation == 2 and os.path.exists(new.path)
    assert not os.path.exists(old_path)
    assert cache_files(tmp_path / "cache") == [os.path.basename(new.path)]


# -- LRU -------------------------------------------------------------------------------

@pytest.fixture
def three_orgs(store, tmp_path):
    for org in ("org-a", "org-b", "org-c"):
        observe(store, f"{org} deploys on Tuesdays.", org=org)
        publish(store, tmp_path, org=org)
    return SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0, max_organizations=2)


def test_the_least_recently_used_organization_is_evicted_and_its_file_deleted(three_orgs):
    reader = three_orgs
    a = reader.current("org-a")
    reader.current("org-b")
    reader.current("org-a")  # a is now more recently used than b
    reader.current("org-c")
    assert reader.loaded() == ["org-a", "org-c"]
    assert os.path.exists(a.path)
    files = cache_files(reader.cache_dir)
    assert len(files) == 2 and not any(f.startswith("org-b-") for f in files)


def test_an_evicted_organization_is_loaded_again_on_its_next_request(three_orgs):
    reader = three_orgs
    for org in ("org-a", "org-b", "org-c"):
        reader.current(org)
    snapshot = reader.current("org-a")
    assert snapshot.generation == 1 and os.path.exists(snapshot.path)
    assert snapshot.db.execute("SELECT count(*) FROM claims").fetchone()[0] == 1
    assert reader.loaded() == ["org-c", "org-a"]


def test_a_refused_generation_is_not_downloaded_again(store, tmp_path, clock):
    observe(store, "Deploy smoke must pass before release.")
    publish(store, tmp_path)
    counting = CountingStore(store)
    reader = SnapshotReader(counting, str(tmp_path / "cache"), ttl_seconds=5)
    reader.current(ORG)
    observe(store, "Canary must stay green for ten minutes.")
    publish(store, tmp_path)
    corrupt_current_generation(store, tmp_path)
    for _ in range(3):
        clock.now += 5
        assert reader.current(ORG).generation == 1
    assert counting.pointer_reads == 4
    assert counting.downloads == 2  # generation 1 once, the refused generation 2 once


def test_a_pointer_read_failure_is_reported_then_cleared_when_the_store_answers(store, tmp_path, clock):
    reader, flaky = serving_generation_1(store, tmp_path, 5)

    def broken(*args, **kwargs):
        raise ConnectionError("store down")

    flaky.get_if_changed = broken
    clock.now += 5
    assert reader.current(ORG).generation == 1
    assert "pointer" in reader.status(ORG)["last_refresh_error"]
    del flaky.get_if_changed
    clock.now += 10  # one failure doubles the wait
    assert reader.current(ORG).generation == 1
    assert reader.status(ORG)["last_refresh_error"] is None


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"])
def test_a_damaged_pointer_keeps_the_verified_generation_serving(store, tmp_path, clock, body):
    reader, _ = serving_generation_1(store, tmp_path, 1)
    pointer = store.get(f"orgs/{ORG}/snapshots/current.json")
    store.compare_and_swap(f"orgs/{ORG}/snapshots/current.json", body, pointer.etag)
    clock.now += 1
    assert reader.current(ORG).generation == 1
    assert reader.status(ORG)["last_refresh_error"].startswith("loading the new generation failed")


def test_while_the_store_keeps_failing_checks_back_off_and_the_generation_keeps_serving(store, tmp_path, clock):
    reader, flaky = serving_generation_1(store, tmp_path, 1)
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(clock.now)
        raise ConnectionError("store down")

    flaky.get_if_changed = broken
    start = clock.now
    for _ in range(100):  # a request every 0.5 s for 50 s
        clock.now += 0.5
        assert reader.current(ORG).generation == 1
    # checks at TTL 1 would be 50; backing off (2, 4, 8, 16 s) asks 5 times
    assert [round(t - start, 1) for t in attempts] == [1.0, 3.0, 7.0, 15.0, 31.0]
    del flaky.get_if_changed
    clock.now += 60
    assert reader.current(ORG).generation == 1 and reader.status(ORG)["last_refresh_error"] is None
    clock.now += 1  # recovered: the TTL again
    reads = flaky.pointer_reads
    assert reader.current(ORG).generation == 1 and flaky.pointer_reads == reads + 1


def test_retired_generations_release_their_connections(tmp_path):
    """A generation's connection is freed once it is replaced (a cached FTS5
    tokenizer kept every one alive: ~30 MiB of page cache per generation)."""
    import gc

    import apsw

    settings = Settings.from_env(data_dir=str(tmp_path / "titen"), env={"TITEN_SNAPSHOT_TTL": "0"})
    api = Api(Service(settings))
    key = api.key(ORG, "alice", ALL_SCOPES)
    for i in range(12):
        api.observe(key, claim={"statement": f"Deploy rule {i} holds.", "kind": "procedural", "confidence": 0.9})
        api.rebuild(key)
        assert api.compile(key, "deploy rule").status_code == 200
    gc.collect()
    cache = settings.cache_dir

    def on_cache(c):
        try:
            return cache in (c.filename or "")
        except apsw.ConnectionClosedError:
            return False

    open_on_cache = [c for c in gc.get_objects() if isinstance(c, apsw.Connection) and on_cache(c)]
    assert len(open_on_cache) <= 2, len(open_on_cache)


def _held_downloads(store, monkeypatch):
    """Downloads from ``store`` wait until ``release`` is set; ``fetching``
    is set when one has started: (fetching, release)."""
    import threading

    fetching, release = threading.Event(), threading.Event()
    download = store.download_file

    def held(key, path):
        fetching.set()
        release.wait(30)
        download(key, path)

    monkeypatch.setattr(store, "download_file", held)
    return fetching, release


def _request(reader, org=ORG):
    """``reader.check(org)`` on a thread of its own, as a concurrent request:
    (the thread, started; the dict its answer lands in under "answer")."""
    import threading
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.setdefault("answer", reader.check(org)))
    thread.start()
    return thread, answer


def test_a_request_during_the_first_load_waits_for_it_rather_than_answering_unavailable(store, tmp_path,
                                                                                       monkeypatch):
    """Two requests reach a cold reader together (a freshly started server
    process): the second must get the generation the first is fetching."""
    import threading

    observe(store, "The staging cluster runs Postgres 16")
    publish(store, tmp_path)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=3600)
    fetching, release = _held_downloads(store, monkeypatch)
    first = {}
    loader = threading.Thread(target=lambda: first.setdefault("snapshot", reader.current(ORG)))
    loader.start()
    assert fetching.wait(30)
    waiter, second = _request(reader)
    waiter.join(0.5)
    assert waiter.is_alive()  # waiting for the load, not answering "no generation verified yet"
    release.set()
    loader.join(30)
    waiter.join(30)
    snapshot, reason = second["answer"]
    assert reason is None and snapshot is first["snapshot"] and snapshot.claim_count == 1


def test_after_the_bell_a_request_waits_for_the_refresh_in_flight_not_the_older_generation(store, tmp_path,
                                                                                         monkeypatch):
    """titen serve: another server process may already answer with the new
    generation, so this one must not answer with the older one meanwhile."""
    import multiprocessing
    import threading

    observe(store, "The staging cluster runs Postgres 16")
    publish(store, tmp_path)
    bell = multiprocessing.get_context("spawn").RawValue("Q", 0)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=3600, bell=bell)
    assert reader.current(ORG).claim_count == 1
    observe(store, "The staging cluster runs Redis 7")
    publish(store, tmp_path)
    bell.value += 1
    fetching, release = _held_downloads(store, monkeypatch)
    loader = threading.Thread(target=reader.current, args=(ORG,))
    loader.start()
    assert fetching.wait(30)
    answer = {}
    request = threading.Thread(target=lambda: answer.setdefault("snapshot", reader.current(ORG)))
    request.start()
    request.join(0.5)
    assert request.is_alive()
    release.set()
    loader.join(30)
    request.join(30)
    assert answer["snapshot"].claim_count == 2


def test_while_a_generation_an_erasure_came_after_loads_requests_wait_rather_than_answer_the_older(
        store, tmp_path, monkeypatch):
    """The erasure's build marks it complete one TTL after its publish; a
    reader that began loading the new generation near the end of that TTL
    must not answer concurrent requests from the erased one meanwhile."""
    import json
    import threading
    import time

    from core.layout import pointer_key
    from core.snapshot.pointer import encode_pointer

    observe(store, "The staging cluster runs Postgres 16")
    publish(store, tmp_path)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0.2)
    assert reader.current(ORG).claim_count == 1
    observe(store, "The staging cluster runs Redis 7")
    publish(store, tmp_path)
    obj = store.get(pointer_key(ORG))
    pointer = json.loads(obj.body)
    store.compare_and_swap(pointer_key(ORG), encode_pointer({**pointer, "erased_through": pointer["generation"]}),
                           obj.etag)  # as an erasure's publish writes it
    time.sleep(0.25)  # the reader's check is due
    fetching, release = _held_downloads(store, monkeypatch)
    loader = threading.Thread(target=reader.check, args=(ORG,))
    loader.start()
    assert fetching.wait(30)
    request, answer = _request(reader)
    request.join(0.5)
    assert request.is_alive()  # not answered from generation 1
    release.set()
    loader.join(30)
    request.join(30)
    snapshot, reason = answer["answer"]
    assert reason is None and snapshot.claim_count == 2


def test_a_slow_pointer_read_holds_other_requests_only_briefly(store, tmp_path, monkeypatch):
    """A throttled store can hold one refresh's pointer read for seconds
    (botocore's retries): other requests wait for it only briefly, then
    answer from the generation held, as when the store cannot be read."""
    import threading
    import time

    observe(store, "The staging cluster runs Postgres 16")
    publish(store, tmp_path)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0.2)
    assert reader.current(ORG).claim_count == 1
    time.sleep(0.25)  # the reader's check is due
    reading, release = threading.Event(), threading.Event()
    get = store.get_if_changed

    def slow(key, etag):
        reading.set()
        release.wait(30)
        return get(key, etag)
    monkeypatch.setattr(store, "get_if_changed", slow)
    refresher = threading.Thread(target=reader.check, args=(ORG,))
    refresher.start()
    assert reading.wait(30)
    request, answer = _request(reader)
    request.join(10)
    try:
        assert not request.is_alive()  # answered while the read is still held
        snapshot, reason = answer["answer"]
        assert reason is None and snapshot.claim_count == 1
    finally:
        release.set()
        refresher.join(30)


def test_with_nothing_served_a_failing_load_backs_off_within_seconds_and_logs_one_traceback(
        store, tmp_path, clock, caplog):
    """A cache disk that is full fails every download: with nothing served,
    checks still back off (each may download a whole generation), at most
    NOTHING_SERVED_MAX_BACKOFF_S apart, and the traceback is logged once for
    the run of the same failure (/readyz says it meanwhile)."""
    import errno
    observe(store, "Deploy smoke must pass before release.")
    publish(store, tmp_path)
    counting = CountingStore(store)
    reader = SnapshotReader(counting, str(tmp_path / "cache"), ttl_seconds=0.1)
    attempts = []

    def full_disk(key, path):
        attempts.append(round(clock.now - start, 2))
        raise OSError(errno.ENOSPC, "No space left on device")
    counting.download_file = full_disk
    start = clock.now
    with caplog.at_level("WARNING", logger="titen"):
        for _ in range(400):  # a request every 0.05 s for 20 s
            assert reader.check(ORG)[0] is None
            clock.now += 0.05
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    longest = core.snapshot.reader.NOTHING_SERVED_MAX_BACKOFF_S
    waits = [min(longest, 0.1 * 2 ** n) for n in range(1, len(gaps) + 1)]  # 0.2, 0.4, … 5, 5
    assert all(w - 0.01 <= g <= w + 0.06 for g, w in zip(gaps, waits)), (gaps, waits)
    assert len(attempts) == 8  # 0, .25, .7, 1.55, 3.2, 6.45, 11.5, 16.5 s: not 400
    assert sum(1 for r in caplog.records if r.exc_info) == 1
    assert "loading the new generation failed: OSError" in reader.check(ORG)[1]
    del counting.download_file  # the disk has room again
    clock.now += core.snapshot.reader.NOTHING_SERVED_MAX_BACKOFF_S
    assert reader.check(ORG)[0].generation == 1
