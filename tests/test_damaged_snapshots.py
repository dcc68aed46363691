"""A damaged snapshot is detected, reported and repaired, never served
(docs/architecture.md, "Damaged snapshots"). Each case reproduces one finding
of the fail-safe probe through HTTP: it now answers 503 UNAVAILABLE in the
envelope (or the right answer), /readyz says why, and the rebuild recovers."""

import os

import pytest

from conftest import ALL_SCOPES, Api
from core.config import Settings
from core.snapshot.pointer import read_pointer
from core.service import Service

CLAIM = {"statement": "Deploy smoke must pass before release.", "kind": "procedural", "confidence": 0.9}
TASK = "must the deploy smoke pass before release"


def make_service(tmp_path, ttl="0"):
    settings = Settings.from_env(data_dir=str(tmp_path / "titen"), env={"TITEN_SNAPSHOT_TTL": ttl})
    return Service(settings)


@pytest.fixture
def published(tmp_path):
    """A served generation 1 holding one claim, and an admin key."""
    api = Api(make_service(tmp_path))
    key = api.key("acme", "alice", ALL_SCOPES)
    claim_id = api.observe(key, claim=CLAIM)["claim_id"]
    api.service.rebuild("acme")  # loaded, no page of its claims read yet (the route would count them)
    return api, key, claim_id


def served_file(api):
    return api.service.reader.current("acme").path


def stored_object(api):
    pointer, _ = read_pointer(api.service.store, "acme")
    return pointer, os.path.join(api.service.store.root, pointer["snapshot_key"])


def overwrite_pages(path):
    """Same size, every page after the first replaced by garbage."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(bytes([0xA5]) * (size - 4096))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def assert_unavailable(r):
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "UNAVAILABLE"
    assert r.json()["meta"]["request_id"].startswith("req_")
    assert "Traceback" not in r.text and "apsw" not in r.text


# -- a damaged cached copy, same process ---------------------------------------------

def test_a_cached_copy_damaged_in_place_answers_503_and_is_evicted(published):
    api, key, _ = published
    overwrite_pages(served_file(api))
    before = api.ledger_keys()
    assert_unavailable(api.compile(key, TASK))
    assert api.ledger_keys() == before  # no context run recorded for the failed compile
    ready = api.get("/readyz", key)
    assert "generation 1 evicted" in ready.json()["data"]["last_eviction"]
    assert "CorruptError" in ready.json()["data"]["last_eviction"] or \
        "NotADBError" in ready.json()["data"]["last_eviction"]


def test_after_the_eviction_the_verified_generation_serves_again(published):
    api, key, _ = published
    overwrite_pages(served_file(api))
    assert_unavailable(api.compile(key, TASK))
    r = api.compile(key, TASK)  # fetched and verified afresh from the store
    assert r.status_code == 200 and len(r.json()["data"]["items"]) == 1
    ready = api.get("/readyz", key)
    assert ready.status_code == 200 and ready.json()["data"]["status"] == "ready"
    assert ready.json()["data"]["generation"] == 1


def test_evidence_on_a_damaged_cached_copy_answers_503(published):
    api, key, claim_id = published
    overwrite_pages(served_file(api))
    assert_unavailable(api.get(f"/v1/claims/{claim_id}/evidence", key))
    assert api.get(f"/v1/claims/{claim_id}/evidence", key).status_code == 200


def test_readyz_with_a_key_on_a_damaged_cached_copy_answers_503_not_ready_and_evicts_it(published):
    # the key's claim count reads the copy: the damage is met there, as on any route
    api, key, _ = published
    overwrite_pages(served_file(api))
    r = api.get("/readyz", key)
    assert r.status_code == 503, r.text
    data = r.json()["data"]
    assert data["status"] == "not_ready" and data["claim_count"] is None
    assert "damaged and was evicted" in data["reason"]
    assert "generation 1 evicted" in data["last_eviction"]
    assert "Traceback" not in r.text
    again = api.get("/readyz", key)  # fetched and verified afresh from the store
    assert again.status_code == 200 and again.json()["data"]["claim_count"] == 1


def test_a_truncated_cached_copy_is_evicted_before_it_is_read(published):
    api, key, _ = published
    truncate(served_file(api))
    r = api.compile(key, TASK)  # the TTL check sees the size differ from the pointer's
    assert r.status_code == 200 and len(r.json()["data"]["items"]) == 1
    data = api.get("/readyz", key).json()["data"]
    assert data["status"] == "ready" and "generation 1 evicted" in data["last_eviction"]


def test_the_admin_rebuild_rehashes_the_cached_copy_and_recovers(tmp_path):
    api = Api(make_service(tmp_path, ttl="3600"))  # no TTL check would see it
    key = api.key("acme", "alice", ALL_SCOPES)
    api.observe(key, claim=CLAIM)
    api.rebuild(key)
    path = served_file(api)
    data = bytearray(open(path, "rb").read())
    data[len(data) - 10] ^= 0xFF  # same size: only the sha256 shows it
    open(path, "wb").write(bytes(data))
    rebuilt = api.rebuild(key)
    assert rebuilt["published"] is False  # nothing new in the ledger ...
    ready = api.get("/readyz", key).json()["data"]
    assert ready["status"] == "ready" and "generation 1 evicted" in ready["last_eviction"]  # ... but re-verified
    assert api.service.reader.current("acme").path != path
    assert len(api.compile(key, TASK).json()["data"]["items"]) == 1


# -- a damaged stored snapshot, after a restart ---------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_stored_snapshot_after_a_restart_is_503_never_an_empty_pack(published, tmp_path, damage):
    api, key, claim_id = published
    pointer, obj = stored_object(api)
    truncate(obj) if damage == "truncate" else os.unlink(obj)
    restarted = Api(make_service(tmp_path))
    ready = restarted.get("/readyz", key)
    assert ready.status_code == 503
    data = ready.json()["data"]
    assert data["status"] == "not_ready" and data["generation"] == 0
    assert data["claim_count"] is None  # not 0: that reads as an organization with nothing in it
    assert "generation 1 refused" in data["reason"]
    assert ("sha256" if damage == "truncate" else "missing from the store") in data["reason"]
    assert "still serving" not in data["last_refresh_error"]
    before = restarted.ledger_keys()
    assert_unavailable(restarted.compile(key, TASK))
    assert_unavailable(restarted.get(f"/v1/claims/{claim_id}/evidence", key))
    assert restarted.ledger_keys() == before


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_the_rebuild_repairs_a_damaged_stored_snapshot_from_the_ledger(published, tmp_path, damage):
    api, key, _ = published
    _, obj = stored_object(api)
    truncate(obj) if damage == "truncate" else os.unlink(obj)
    restarted = Api(make_service(tmp_path))
    assert restarted.get("/readyz", key).status_code == 503
    rebuilt = restarted.rebuild(key)
    assert rebuilt["published"] is True and rebuilt["generation"] == 2
    assert any("built from the ledger" in note for note in rebuilt["notes"])
    ready = restarted.get("/readyz", key)
    assert ready.status_code == 200 and ready.json()["data"]["generation"] == 2
    assert ready.json()["data"]["last_refresh_error"] is None
    assert len(restarted.compile(key, TASK).json()["data"]["items"]) == 1


def test_a_restarted_server_builds_from_the_ledger_when_the_stored_copy_is_damaged(published, tmp_path):
    """The restarted server's own start-up rebuild (as ``titen serve`` runs it) may begin
    from this machine's intact kept copy; once serving shows the stored one damaged it
    replays the ledger instead of answering 'unchanged'."""
    api, key, _ = published
    _, obj = stored_object(api)
    truncate(obj)
    service = make_service(tmp_path)
    result = service.rebuild("acme")
    assert result.published and result.generation == 2
    assert any("built from the ledger" in note for note in result.notes)
    assert service.reader.current("acme").generation == 2


def test_no_published_generation_is_still_an_empty_pack(tmp_path):
    api = Api(make_service(tmp_path))
    key = api.key("fresh", "alice", ALL_SCOPES)
    r = api.compile(key, TASK)
    assert r.status_code == 200 and r.json()["data"]["items"] == []
    assert api.get("/readyz", key).json()["data"]["status"] == "ready"


# -- the builder -----------------------------------------------------------------------

@pytest.mark.parametrize("damage,why", [("truncate", "fails its sha256"), ("delete", "is missing from the store")])
def test_the_builder_replays_the_ledger_over_a_damaged_previous_generation_and_says_so(
        published, tmp_path, damage, why):
    api, key, _ = published
    _, obj = stored_object(api)
    truncate(obj) if damage == "truncate" else os.unlink(obj)
    api.observe(key, content="Canary stayed green.")
    from core.snapshot.build import SnapshotBuilder
    result = SnapshotBuilder(api.service.store, "acme", work_dir=str(tmp_path / "elsewhere")).rebuild()
    assert result.published and result.generation == 2
    assert result.notes == (f"previous generation 1 {why}: built from the ledger",)
    assert result.claim_count == 1
