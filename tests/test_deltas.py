"""Generations published as deltas (core/snapshot/delta.py, chain.py, publish.py).

What must hold: the file a reader reaches by applying deltas is exactly the
file the build made (same sha256), holds the canonical content a build from
scratch reaches (same content hash) and compiles the same packs; a missing
or damaged delta, or a chain the reader is not on, ends in the whole file
and a correct pack, never an error answer; a build killed before its
pointer swap leaves the previous generation serving; deltas are collected
with their generations and never outlive an erasure. Real SQLite, real
stores (the local directory store, and S3 under moto).
"""

from __future__ import annotations

import os
import random
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import Api
from core.checksum import file_sha256
from core.config import Settings
from core.layout import snapshots_prefix
from core.service import Service
from core.snapshot import content_hash
from core.snapshot.build import SnapshotBuilder
from core.snapshot.delta_policy import DeltaPolicy
from core.snapshot.pointer import read_pointer, stored_keys
from core.snapshot.reader import open_readonly

ORG = "acme"
TASKS = ["deploy smoke test", "rollback plan for the canary", "release migration notes"]
WORDS = ["deploy", "smoke", "canary", "rollback", "release", "migration", "notes", "friday", "approval",
         "pipeline", "latency", "cache", "schema", "index", "retry", "budget"]


@pytest.fixture(autouse=True)
def deltas_always(monkeypatch):
    """Every generation after the first is a delta (the default policy keeps
    files under 8 MiB whole: these test corpora are small)."""
    monkeypatch.setenv("TITEN_DELTA_MIN_BYTES", "0")
    monkeypatch.setenv("TITEN_DELTA_MAX", "1000")
    monkeypatch.setenv("TITEN_DELTA_MAX_RATIO", "1000")


def make_api(root: str, store=None, ttl: str = "0") -> Api:
    settings = Settings.from_env(data_dir=os.path.join(root, "titen"),
                                 env={"TITEN_SNAPSHOT_TTL": ttl, "TITEN_CACHE_DIR": os.path.join(root, "cache")},
                                 **({"store_url": store.url} if store is not None else {}))
    return Api(Service(settings, store=store) if store is not None else Service(settings))


def answers(api: Api, key) -> list:
    out = []
    for task in TASKS:
        r = api.compile(key, task)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        out.append([(i["claim_id"], i["score"], i["score_components"]) for i in data["items"]]
                   + [data["conflicts"]])
    return out


def kept_file(api: Api) -> str:
    return os.path.join(api.service.settings.cache_dir, "build", f"kept-{ORG}.sqlite")


def served(api: Api):
    return api.service.reader.current(ORG)


def statement(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."


class World:
    """One organization's service, its claims, and the writes of the property test."""

    def __init__(self, api: Api, rng: random.Random):
        self.api, self.rng = api, rng
        self.key = api.key(ORG)
        self.live: list[tuple[str, int]] = []  # (claim_id, version)

    def observe(self, subject="user_rama"):
        text = statement(self.rng)
        data = self.api.observe(self.key, subject_id=subject, content=text,
                                claim={"statement": text, "kind": "semantic_fact", "confidence": 0.8})
        if subject == "user_rama":
            self.live.append((data["claim_id"], 1))

    def transition(self, kind: str):
        if not self.live:
            return self.observe()
        claim_id, version = self.live.pop(self.rng.randrange(len(self.live)))
        body = {"expected_version": version}
        if kind == "supersede":
            body["statement"] = statement(self.rng)
        r = self.api.post(f"/v1/claims/{claim_id}/{kind}", body, self.key)
        assert r.status_code in (200, 201), r.text
        if kind == "supersede":
            self.live.append((r.json()["data"]["claim_id"], 1))

    def feedback(self):
        pack = self.api.compile(self.key, "deploy smoke canary").json()["data"]
        for item in pack["items"][:2]:
            r = self.api.post(f"/v1/context/{pack['context_id']}/feedback",
                              {"outcome": "useful", "claim_id": item["claim_id"]}, self.key)
            assert r.status_code == 201, r.text

    def erase_subject(self):
        self.observe(subject="subj_gone")
        asked = self.api.client.delete("/v1/subjects/subj_gone",
                                       headers={"authorization": self.key["authorization"]})
        assert asked.status_code == 202, asked.text

    def step(self, op: str):
        if op == "observe":
            for _ in range(self.rng.randint(1, 4)):
                self.observe()
        elif op == "feedback":
            self.feedback()
        elif op == "erase":
            self.erase_subject()
        else:
            self.transition(op)


OPS = st.lists(st.sampled_from(["observe", "observe", "supersede", "revoke", "expire", "feedback", "erase"]),
               min_size=2, max_size=7)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_the_file_a_reader_reaches_by_deltas_is_the_built_file_and_a_from_scratch_builds_content(ops, seed):
    with tempfile.TemporaryDirectory() as root:
        api = make_api(root)
        world = World(api, random.Random(seed))
        for _ in range(5):
            world.observe()
        api.rebuild(world.key)
        assert served(api).generation == 1  # the reader holds the first, whole, generation
        roads = []
        for op in ops:
            world.step(op)
            result = api.rebuild(world.key)
            snapshot = served(api)
            status = api.service.reader.status(ORG)
            if result["published"]:
                roads.append(status["last_load"]["road"])
                # byte for byte the file the build published (and kept)
                assert file_sha256(snapshot.path) == file_sha256(kept_file(api))
            assert status["last_delta_fallback"] is None
        pointer, _ = read_pointer(api.service.store, ORG)
        erased = "erase" in ops
        if not erased:
            assert roads and set(roads) == {"deltas"} and pointer.get("deltas")
        served_hash = content_hash.digest(content_hash.scan(served(api).db))
        assert served_hash == pointer["content_hash"]
        before = answers(api, world.key)
        scratch = SnapshotBuilder(api.service.store, ORG, work_dir=os.path.join(root, "scratch")).rebuild(
            from_scratch=True, force=True)
        assert scratch.content_hash == served_hash  # the canonical content of a build from the ledger
        api.service.reader.refresh(ORG, force=True)
        assert served(api).generation == scratch.generation
        assert answers(api, world.key) == before  # the same packs


# -- faults ----------------------------------------------------------------------------

@pytest.fixture
def chain(store, tmp_path):
    """A reader holding generation 1 (whole); generations 2 and 3 published
    as deltas while it did not look (it looks when told to)."""
    api = make_api(str(tmp_path), store, ttl="3600")
    world = World(api, random.Random(7))
    for _ in range(6):
        world.observe()
    api.rebuild(world.key)
    assert served(api).generation == 1
    builder = SnapshotBuilder(store, ORG, work_dir=str(tmp_path / "builder"))
    for _ in range(2):
        world.observe()
        assert builder.rebuild().published
    pointer, _ = read_pointer(store, ORG)
    assert [d["generation"] for d in pointer["deltas"]] == [2, 3]
    expected_sha = file_sha256(str(tmp_path / "builder" / f"kept-{ORG}.sqlite"))
    return api, world, pointer, expected_sha


def _damage(store, key: str, how: str) -> None:
    if how == "missing":
        store.purge(key)
        return
    raw = bytearray(store.get(key).body)
    raw[len(raw) // 2] ^= 0xFF
    if store.url.startswith("s3://"):
        store.client.put_object(Bucket=store.bucket, Key=store._full(key), Body=bytes(raw))
    else:
        with open(store._path(key), "r+b") as f:
            f.write(bytes(raw))


def test_the_reader_follows_the_chain_from_the_generation_it_holds(chain):
    api, world, pointer, expected_sha = chain
    snapshot = api.service.reader.refresh(ORG, force=True)
    status = api.service.reader.status(ORG)
    assert snapshot.generation == 3 and status["last_load"]["road"] == "deltas"
    assert status["last_load"]["deltas"] == 2
    assert status["last_load"]["downloaded_bytes"] == sum(d["bytes"] for d in pointer["deltas"])
    assert file_sha256(snapshot.path) == expected_sha
    assert snapshot.claim_count == 8 and content_hash.digest(content_hash.scan(snapshot.db)) == pointer["content_hash"]


def test_a_spare_copy_of_the_served_file_takes_the_deltas_without_a_copy_on_the_way(store, tmp_path):
    from core.snapshot.reader import SHADOW, SnapshotReader
    api = make_api(str(tmp_path), store, ttl="3600")
    world = World(api, random.Random(11))
    world.observe()
    api.rebuild(world.key)
    reader = SnapshotReader(store, str(tmp_path / "spare-cache"), ttl_seconds=3600, shadow_min_bytes=0)
    first = reader.refresh(ORG, force=True)
    for _ in range(1000):  # the spare is copied in the background
        if os.path.exists(first.path + SHADOW):
            break
        time.sleep(0.01)
    assert file_sha256(first.path + SHADOW) == file_sha256(first.path)
    builder = SnapshotBuilder(store, ORG, work_dir=str(tmp_path / "builder"))
    world.observe()
    assert builder.rebuild().published
    second = reader.refresh(ORG, force=True)
    loaded = reader.status(ORG)["last_load"]
    assert second.generation == 2 and loaded["road"] == "deltas" and loaded["from"] == "spare copy"
    assert file_sha256(second.path) == file_sha256(str(tmp_path / "builder" / f"kept-{ORG}.sqlite"))
    assert not os.path.exists(first.path) and not os.path.exists(first.path + SHADOW)


@pytest.mark.parametrize("how", ["missing", "corrupt"])
def test_a_missing_or_corrupt_delta_ends_in_a_whole_file_and_a_correct_pack(chain, how):
    api, world, pointer, _ = chain
    held = answers(api, world.key)
    _damage(api.service.store, pointer["deltas"][0]["key"], how)
    api.service.reader.refresh(ORG, force=True)
    # neither road can make generation 3: generation 1 keeps serving, and /readyz says why
    assert served(api).generation == 1
    ready = api.get("/readyz", world.key).json()["data"]
    assert ready["status"] == "ready" and "generation 3" in ready["last_refresh_error"]
    assert "the deltas from generation 1 failed" in ready["last_delta_fallback"]
    assert ("missing" if how == "missing" else "refused") in ready["last_delta_fallback"]
    assert answers(api, world.key) == held  # never an error answer
    # the next rebuild repairs: a whole file, from the ledger, served
    result = api.rebuild(world.key)
    assert result["published"] and any("refused the published generation" in n for n in result["notes"])
    repaired, _ = read_pointer(api.service.store, ORG)
    assert not repaired.get("deltas") and served(api).generation == repaired["generation"]
    assert api.service.reader.status(ORG)["last_load"]["road"] == "whole"
    assert file_sha256(served(api).path) == repaired["sha256"]
    got = answers(api, world.key)
    scratch = SnapshotBuilder(api.service.store, ORG, work_dir=str(api.service.settings.cache_dir) + "-s").rebuild(
        from_scratch=True, force=True)
    assert scratch.content_hash == repaired["content_hash"] and repaired["claim_count"] == 8
    api.service.reader.refresh(ORG, force=True)
    assert served(api).generation == scratch.generation and answers(api, world.key) == got


def test_a_reader_off_the_chain_fetches_the_whole_file_and_serves_the_right_pack(chain, tmp_path, monkeypatch):
    api, world, _, _ = chain
    store = api.service.store
    monkeypatch.setenv("TITEN_DELTA_MAX", "2")  # the chain is full: generation 4 is whole, 5 a delta on it
    builder = SnapshotBuilder(store, ORG, work_dir=str(tmp_path / "builder"))
    for _ in range(2):
        world.observe()
        assert builder.rebuild().published
    pointer, _ = read_pointer(store, ORG)
    assert pointer["full"]["generation"] == 4 and [d["generation"] for d in pointer["deltas"]] == [5]
    api.service.reader.refresh(ORG, force=True)
    status = api.service.reader.status(ORG)
    assert served(api).generation == 5 and status["last_load"]["road"] == "whole"
    assert "not on its chain" in status["last_delta_fallback"]
    assert status["last_load"]["downloaded_bytes"] == pointer["full"]["bytes"] + pointer["deltas"][0]["bytes"]
    assert file_sha256(served(api).path) == file_sha256(str(tmp_path / "builder" / f"kept-{ORG}.sqlite"))
    got = answers(api, world.key)
    scratch = SnapshotBuilder(store, ORG, work_dir=str(tmp_path / "scratch")).rebuild(from_scratch=True, force=True)
    api.service.reader.refresh(ORG, force=True)
    assert served(api).generation == scratch.generation and answers(api, world.key) == got


class Killed(BaseException):
    """The build's process dies here."""


def test_a_build_killed_between_its_delta_and_the_pointer_swap_leaves_the_previous_generation(chain, tmp_path,
                                                                                             monkeypatch):
    api, world, pointer, _ = chain
    store = api.service.store
    api.service.reader.refresh(ORG, force=True)
    before = answers(api, world.key)
    world.observe()

    dead = []
    delete = type(store).delete
    # a dead process cleans nothing up
    monkeypatch.setattr(type(store), "delete", lambda self, key: None if dead else delete(self, key))

    def die():
        dead.append(True)
        raise Killed()

    builder = SnapshotBuilder(store, ORG, work_dir=str(tmp_path / "killed"), before_publish=die)
    with pytest.raises(Killed):
        builder.rebuild()
    dead.clear()
    orphans = [k for k in store.list_keys(snapshots_prefix(ORG)) if k.endswith(".delta")
               and k not in stored_keys(pointer)]
    assert len(orphans) == 1  # uploaded, never named by a pointer
    assert read_pointer(store, ORG)[0]["generation"] == 3
    api.service.reader.refresh(ORG, force=True)
    assert served(api).generation == 3 and answers(api, world.key) == before
    # the next build publishes generation 4, and the orphan goes with the sweep of old generations
    result = api.rebuild(world.key)
    assert result["published"] and result["generation"] == 4
    assert orphans[0] not in set(store.list_keys(snapshots_prefix(ORG)))
    assert api.service.reader.status(ORG)["last_load"]["road"] == "deltas"


def test_deltas_are_collected_with_their_generations(tmp_path, monkeypatch):
    monkeypatch.setenv("TITEN_DELTA_MAX", "3")
    api = make_api(str(tmp_path))
    world = World(api, random.Random(3))
    for _ in range(12):
        world.observe()
        api.rebuild(world.key)
    store = api.service.store
    pointer, _ = read_pointer(store, ORG)
    named = set().union(*(stored_keys(h) for h in pointer["history"]))
    assert set(store.list_keys(snapshots_prefix(ORG))) - {f"{snapshots_prefix(ORG)}current.json"} == named
    assert any(k.endswith(".delta") for k in named) and any(k.endswith(".sqlite") for k in named)


def test_rollback_to_a_delta_generation_serves_its_file(tmp_path):
    from core.snapshot.rollback import rollback
    api = make_api(str(tmp_path))
    world = World(api, random.Random(5))
    for _ in range(3):
        world.observe()
        api.rebuild(world.key)
    pointer, _ = read_pointer(api.service.store, ORG)
    assert pointer["generation"] == 3 and pointer.get("deltas")
    world.observe()
    api.rebuild(world.key)
    out = rollback(api.service.store, ORG, 3)
    assert out == {"org_id": ORG, "generation": 5, "serving": 3}
    api.service.reader.refresh(ORG, force=True)
    snapshot = served(api)
    assert snapshot.generation == 5 and snapshot.claim_count == 3
    rolled, _ = read_pointer(api.service.store, ORG)
    assert rolled["digest"] == pointer["digest"] and rolled["deltas"] == pointer["deltas"]
    # the next build goes on from the rolled-back file: the fourth claim comes back from the ledger
    result = api.rebuild(world.key)
    assert result["published"] and result["claim_count"] == 4


def test_an_erasure_leaves_no_delta_and_no_copy_of_the_erased_text(store, tmp_path):
    api = make_api(str(tmp_path), store)
    key = api.key(ORG)
    api.observe(key, content="Seed.", claim={"statement": "deploy smoke", "kind": "semantic_fact",
                                             "confidence": 0.8})
    api.rebuild(key)
    mark = "zanzibarquokka"
    for i in range(3):
        api.observe(key, subject_id="subj_gone", content=f"{mark} {i}",
                    claim={"statement": f"{mark} number {i}", "kind": "semantic_fact", "confidence": 0.8})
        api.rebuild(key)
    keys = list(store.list_keys(snapshots_prefix(ORG)))
    assert any(k.endswith(".delta") and mark.encode() in store.get(k).body for k in keys)  # the test has teeth
    asked = api.client.delete("/v1/subjects/subj_gone", headers={"authorization": key["authorization"]})
    assert asked.status_code == 202
    api.rebuild(key)
    pointer, _ = read_pointer(store, ORG)
    assert not pointer.get("deltas") and len(pointer["history"]) == 1
    keys = [k for k in store.list_keys(snapshots_prefix(ORG)) if not k.endswith("current.json")]
    assert keys == [pointer["snapshot_key"]]
    assert all(mark.encode() not in store.get(k).body for k in keys)
    db = open_readonly(served(api).path)
    assert db.execute("SELECT count(*) FROM claims WHERE subject_id = 'subj_gone'").fetchone()[0] == 0
    db.close()


def test_the_policy_publishes_whole_files_when_deltas_stop_paying():
    policy = DeltaPolicy(min_file_bytes=1000, max_deltas=2, max_ratio=0.5)
    chain = {"deltas": [{"bytes": 100}]}
    assert policy.whole_file_because(chain, 100, 999)  # a small file
    assert policy.whole_file_because({"deltas": [{"bytes": 1}, {"bytes": 1}]}, 1, 10_000)  # K deltas already
    assert policy.whole_file_because(chain, 500, 1000)  # 600 > 50% of 1000
    assert policy.whole_file_because(chain, 300, 1000) is None
