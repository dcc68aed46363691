"""Snapshot build and publication: skew, idempotence, replay, crashes, races."""

import json
import threading

import pytest

from core.ids import uuid7_hex
from core.instants import canonical, from_ms
from core.ledger import Ledger, encode, entry_key
from core.rebuild import RebuildConflict, SnapshotBuilder, read_pointer
from core.store_local import LocalStore


def _observation_entry(org, hex_, statement):
    created = canonical(from_ms(int(hex_[:12], 16)))
    obs_id, claim_id = f"obs_{hex_}", f"claim_{hex_[:28]}0001"
    obs = {"observation_id": obs_id, "org_id": org, "subject_id": "s", "project_id": None, "workspace_id": None,
           "visibility": "organization", "owner_id": "alice", "kind": "tool_result", "content": statement,
           "source": {"type": "tool", "ref": "r"}, "trust": "asserted", "occurred_at": None, "created_at": created}
    claim = {"claim_id": claim_id, "org_id": org, "owner_id": "alice", "subject_id": "s", "project_id": None,
             "visibility": "organization", "workspace_id": None, "statement": statement, "kind": "semantic_fact",
             "confidence": 0.9, "trust": "asserted", "observer_id": None, "valid_from": created,
             "valid_to": None, "created_at": created,
             "sources": [{"observation_id": obs_id, "relation": "supports"}]}
    return {"entry_id": hex_, "type": "observation", "org_id": org, "actor": "alice", "recorded_at": created,
            "observation": obs, "claims": [claim]}


def _write(store, org, statement, ms=None):
    hex_ = uuid7_hex(ms)[:28] + "0000"
    store.put_if_absent(entry_key(org, hex_), encode(_observation_entry(org, hex_, statement)))
    return f"claim_{hex_[:28]}0001"


@pytest.fixture
def store(tmp_path):
    return LocalStore(str(tmp_path / "store"))


def _builder(store, tmp_path, **kw):
    return SnapshotBuilder(store, "acme", work_dir=str(tmp_path / "work"), **kw)


def _claim_ids(store, tmp_path):
    import apsw
    pointer, _ = read_pointer(store, "acme")
    path = str(tmp_path / "check.sqlite")
    store.download_file(pointer["snapshot_key"], path)
    db = apsw.Connection(path)
    ids = {r[0] for r in db.execute("SELECT claim_id FROM claims")}
    db.close()
    return ids


def test_every_accepted_write_is_in_the_next_snapshot(store, tmp_path):
    ids = {_write(store, "acme", f"fact {i}") for i in range(25)}
    result = _builder(store, tmp_path).rebuild()
    assert result.published and result.generation == 1 and result.entries_applied == 25
    assert _claim_ids(store, tmp_path) == ids


def test_a_write_from_a_clock_three_minutes_behind_is_still_applied(store, tmp_path):
    import time
    _write(store, "acme", "first")
    _builder(store, tmp_path).rebuild()
    late = _write(store, "acme", "late", ms=int(time.time() * 1000) - 180_000)
    result = _builder(store, tmp_path).rebuild()
    assert result.entries_applied == 1
    assert late in _claim_ids(store, tmp_path)


def test_applying_the_same_ledger_twice_changes_nothing(store, tmp_path):
    _write(store, "acme", "one")
    first = _builder(store, tmp_path).rebuild()
    again = _builder(store, tmp_path).rebuild(force=True)
    assert again.entries_applied == 0
    assert again.content_hash == first.content_hash


def test_nothing_new_publishes_nothing(store, tmp_path):
    _write(store, "acme", "one")
    first = _builder(store, tmp_path).rebuild()
    second = _builder(store, tmp_path).rebuild()
    assert not second.published and second.generation == first.generation


def test_from_scratch_and_incremental_builds_report_the_same_content_hash(store, tmp_path, monkeypatch):
    import time
    for i in range(10):
        _write(store, "acme", f"fact {i}")
    _builder(store, tmp_path).rebuild()
    for i in range(5):
        _write(store, "acme", f"more {i}")
    _write(store, "acme", "lagging", ms=int(time.time() * 1000) - 120_000)
    incremental = _builder(store, tmp_path).rebuild()
    scratch = _builder(store, tmp_path).rebuild(from_scratch=True)
    assert incremental.content_hash == scratch.content_hash
    assert scratch.claim_count == incremental.claim_count == 16


def _killed_rebuild(root, work):
    import os
    import signal
    store = LocalStore(root)
    SnapshotBuilder(store, "acme", work_dir=work,
                    before_publish=lambda: os.kill(os.getpid(), signal.SIGKILL)).rebuild()


def test_a_rebuild_killed_midway_leaves_the_previous_generation_serving(store, tmp_path):
    import multiprocessing
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    before, _ = read_pointer(store, "acme")
    _write(store, "acme", "two")
    child = multiprocessing.get_context("fork").Process(target=_killed_rebuild,
                                                        args=(store.root, str(tmp_path / "work")))
    child.start()
    child.join()
    assert child.exitcode == -9  # killed after uploading, before swapping the pointer
    after, _ = read_pointer(store, "acme")
    assert after == before
    result = _builder(store, tmp_path).rebuild()
    assert result.generation == 2 and result.entries_applied == 1
    kept = [k for k in store.list_keys("orgs/acme/snapshots/") if k.endswith(".sqlite")]
    assert len(kept) == 2  # the killed build's orphaned upload was retired


def test_two_racing_rebuilds_publish_exactly_one_generation_and_lose_no_entry(store, tmp_path):
    ids = {_write(store, "acme", f"fact {i}") for i in range(30)}
    barrier = threading.Barrier(2)
    outcomes = []

    def go():
        b = _builder(store, tmp_path, before_publish=barrier.wait)
        try:
            outcomes.append(b.rebuild().generation)
        except RebuildConflict:
            outcomes.append("lost")

    threads = [threading.Thread(target=go) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(outcomes, key=str) == [1, "lost"]
    pointer, _ = read_pointer(store, "acme")
    assert pointer["generation"] == 1
    assert _claim_ids(store, tmp_path) == ids
    assert len([k for k in store.list_keys("orgs/acme/snapshots/") if k.endswith(".sqlite")]) == 1


def test_only_the_last_generations_are_kept(store, tmp_path):
    for i in range(8):
        _write(store, "acme", f"fact {i}")
        _builder(store, tmp_path).rebuild()
    pointer, _ = read_pointer(store, "acme")
    kept = [k for k in store.list_keys("orgs/acme/snapshots/") if k.endswith(".sqlite")]
    assert pointer["generation"] == 8
    assert sorted(kept) == sorted(h["snapshot_key"] for h in pointer["history"])
    assert len(kept) == 5


def test_a_damaged_previous_snapshot_is_not_built_upon(store, tmp_path):
    ids = {_write(store, "acme", f"fact {i}") for i in range(3)}
    _builder(store, tmp_path).rebuild()
    pointer, etag = read_pointer(store, "acme")
    pointer["sha256"] = "0" * 64
    store.compare_and_swap("orgs/acme/snapshots/current.json", json.dumps(pointer).encode(), etag)
    ids.add(_write(store, "acme", "new"))
    _builder(store, tmp_path).rebuild()
    assert _claim_ids(store, tmp_path) == ids


def test_a_snapshot_of_another_schema_version_is_replayed_not_extended(store, tmp_path, monkeypatch):
    import core.rebuild
    ids = {_write(store, "acme", f"fact {i}") for i in range(4)}
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.rebuild, "SCHEMA_VERSION", 99)
    monkeypatch.setattr(core.rebuild, "DDL", core.rebuild.DDL)
    result = _builder(store, tmp_path).rebuild(force=True)
    assert result.entries_applied == 4 and result.generation == 2
    assert _claim_ids(store, tmp_path) == ids


def test_a_reader_refuses_a_generation_of_another_schema_version(store, tmp_path, monkeypatch):
    import core.snapshot
    from core.snapshot import SnapshotReader
    _write(store, "acme", "fact")
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.snapshot, "SCHEMA_VERSION", 99)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0)
    assert reader.current("acme") is None
    assert "schema version" in reader.status("acme")["last_refresh_error"]
