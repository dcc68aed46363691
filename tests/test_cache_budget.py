"""The API's snapshot cache is bounded by bytes (docs/architecture.md, "The
snapshot cache is bounded by bytes"): least recently used organizations are
evicted so the files held, a download in flight included, never exceed the
budget; a generation larger than the whole budget is a clear 503 and a
/readyz reason, never a crash."""

import os

import pytest

from conftest import ALL_SCOPES, Api
from core.config import Settings, cache_budget
from core.snapshot.pointer import read_pointer
from core.service import Service
from core.storage import open_store

ORGS = ["org-a", "org-b", "org-c", "org-d", "org-e"]


def cache_dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if n.endswith((".sqlite", ".part")) or ".part" in n)


@pytest.fixture
def five_orgs(tmp_path):
    """Five published organizations, each with claims only it has."""
    data = str(tmp_path / "titen")
    writer = Api(Service(Settings.from_env(data_dir=data, env={"TITEN_SNAPSHOT_TTL": "0"})))
    keys = {}
    for n, org in enumerate(ORGS):
        keys[org] = writer.key(org, "alice", ALL_SCOPES)
        for i in range(3 + 4 * n):
            writer.observe(keys[org], content=f"{org} fact {i}",
                           claim={"statement": f"{org} deploys release {i} on tuesday",
                                  "kind": "procedural", "confidence": 0.9})
        writer.rebuild(keys[org])
    store = open_store(Settings.from_env(data_dir=data).store_url)
    sizes = {org: read_pointer(store, org)[0]["bytes"] for org in ORGS}
    return data, keys, sizes


def serving_api(tmp_path, data, budget):
    env = {"TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(tmp_path / "api-cache"),
           "TITEN_CACHE_BYTES": str(budget)}
    return Api(Service(Settings.from_env(data_dir=data, env=env)))


def test_compiles_rotating_across_five_orgs_answer_correctly_within_a_budget_under_three_snapshots(
        five_orgs, tmp_path):
    data, keys, sizes = five_orgs
    budget = 2 * max(sizes.values()) + 4096
    assert budget < 3 * min(sizes.values())
    api = serving_api(tmp_path, data, budget)
    cache = str(tmp_path / "api-cache")
    for round_ in range(4):
        for org in ORGS:
            r = api.compile(keys[org], "when does it deploy the release on tuesday")
            assert r.status_code == 200, r.text
            items = r.json()["data"]["items"]
            assert items and all(item["claim"].startswith(f"{org} deploys") for item in items)
            assert cache_dir_bytes(cache) <= budget
            assert api.service.reader.cached_bytes() <= budget
    assert len([n for n in os.listdir(cache) if n.endswith(".sqlite")]) <= 2


def test_readyz_reports_the_organizations_the_budget_left_loaded(five_orgs, tmp_path):
    data, keys, sizes = five_orgs
    api = serving_api(tmp_path, data, 2 * max(sizes.values()) + 4096)
    for org in ORGS:
        api.compile(keys[org], "deploy")
    assert api.get("/readyz").json()["data"]["organizations"] <= 2


def test_a_snapshot_larger_than_the_whole_budget_is_a_503_with_a_readyz_reason(five_orgs, tmp_path):
    data, keys, sizes = five_orgs
    api = serving_api(tmp_path, data, sizes["org-e"] - 1)
    before = list(api.service.store.list_keys("orgs/org-e/ledger/"))
    r = api.compile(keys["org-e"], "deploy")
    assert r.status_code == 503 and r.json()["error"]["code"] == "UNAVAILABLE"
    assert "cache budget" in r.json()["error"]["message"]
    assert list(api.service.store.list_keys("orgs/org-e/ledger/")) == before
    ready = api.get("/readyz", keys["org-e"])
    assert ready.status_code == 503
    assert "snapshot cache budget" in ready.json()["data"]["reason"]
    assert cache_dir_bytes(str(tmp_path / "api-cache")) == 0
    assert api.compile(keys["org-a"], "deploy").status_code == 200  # a smaller one still serves


@pytest.mark.parametrize("env,budget", [
    ({"TITEN_CACHE_BYTES": "1000"}, 1000),
    ({"TITEN_EPHEMERAL_MB": "2048"}, int(2048 * 1024 * 1024 * 0.75)),
    ({"TITEN_EPHEMERAL_MB": "2048", "TITEN_CACHE_BYTES": "5"}, 5),
    ({}, None),
])
def test_the_budget_comes_from_the_environment(env, budget):
    assert cache_budget(env) == budget
