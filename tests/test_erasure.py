"""Forget on request (docs/api.md §16): erase a subject or one observation,
from every copy — the snapshot (free pages and FTS segments included), kept
generations, the ledger and every stored version of it, the rebuild's kept
file, the reader's cache, the embedding cache and the vector rows — on the
local store and on a versioned S3 bucket (moto)."""

import hashlib
import json
from collections import Counter
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import threading
import time

import boto3
import pytest

from core.config import Settings
from core.errors import NotFound, Unavailable
from core.ids import entry_hex
from core.layout import entry_key
from core.service import Service
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer
from core.snapshot import workfiles
from core.snapshot.rollback import rollback
from core.snapshot.workfiles import WorkFile
from core.vectors.feature_hash import HashEmbedder
from core.writes.importer import import_file
from conftest import ALL_SCOPES, Api

AT = "2027-06-01T00:00:00Z"  # after every record the tests write: all are valid then
# S's distinctive text: lower case letters only, so FTS5 keeps each word as written
S_MARKS = ["quokkazanzibar", "velvetpangolin", "marmalademonsoon", "periwinklefjord", "tangerinetundra"]


@pytest.fixture
def world(store, tmp_path):
    """A service over ``store`` (local directory or versioned S3) with the
    vector path on, and S's distinctive text in every kind of record."""
    settings = Settings.from_env(store_url=store.url, env={"TITEN_SNAPSHOT_TTL": "0",
                                                           "TITEN_CACHE_DIR": str(tmp_path / "cache")})
    service = Service(settings, store=store, embedder=HashEmbedder(64))
    api = Api(service)
    key = api.key(scopes=ALL_SCOPES + ",memory:erase")
    s_obs = [api.observe(key, subject_id="subj_s", content=f"Observed: {S_MARKS[0]} near the dock.",
                         claim={"statement": f"The {S_MARKS[1]} deploy note holds.", "kind": "procedural",
                                "confidence": 0.9})]
    s_obs.append(api.observe(key, subject_id="subj_s", content=f"A second note on {S_MARKS[2]}."))
    cons = api.post("/v1/consolidations", {"subject_id": "subj_s", "claims": [
        {"statement": f"Consolidated: {S_MARKS[2]} deploy rule.", "kind": "semantic_fact", "confidence": 0.8,
         "sources": [{"observation_id": s_obs[1]["observation_id"], "relation": "supports"}]}]}, key)
    assert cons.status_code == 201, cons.text
    # one import batch shared by S and T
    lines = tmp_path / "shared.ndjson"
    with open(lines, "w") as f:
        for subject, text in (("subj_s", f"Imported {S_MARKS[3]} deploy fact."), ("subj_t", "Imported deploy fact."),
                              ("subj_s", f"Imported {S_MARKS[3]} again."), ("subj_t", "Second deploy fact.")):
            f.write(json.dumps({"subject_id": subject, "kind": "imported_source", "content": text,
                                "visibility": "organization", "source": {"type": "file", "ref": "shared"},
                                "claim": {"statement": text, "kind": "semantic_fact", "confidence": 0.7}}) + "\n")
    principal = service.keys.authenticate(key["authorization"])
    import_file(store, principal, str(lines), batch_size=10)
    for i in range(3):
        api.observe(key, subject_id="subj_t", content=f"T evidence {i}.",
                    claim={"statement": f"Deploy checklist item {i} for t.", "kind": "procedural",
                           "confidence": 0.9})
    api.rebuild(key)
    # compiled packs of S, and feedback on one of them (on a claim, and on the whole pack)
    pack = api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s", at=AT).json()["data"]
    assert pack["items"]
    assert api.post(f"/v1/context/{pack['context_id']}/feedback",
                    {"outcome": "useful", "claim_id": pack["items"][0]["claim_id"],
                     "reason_code": S_MARKS[4]}, key).status_code == 201
    assert api.post(f"/v1/context/{pack['context_id']}/feedback", {"outcome": "used"}, key).status_code == 201
    api.rebuild(key)
    return {"api": api, "key": key, "service": service, "store": store, "tmp": tmp_path, "pack": pack,
            "s_obs": s_obs}


def t_digest(api, key) -> str:
    """T's pack for a fixed task and instant, less what every compile draws anew.

    BM25's statistics are the organization's (docs/api.md §9.3), so any
    write or erasure may move the *relative* relevance of other subjects'
    claims; the task matches only T's claims of one shape (one term, same
    length), whose relevance is 1 whatever those statistics are."""
    data = api.compile(key, "checklist", subject_id="subj_t", at=AT).json()["data"]
    assert data["items"]
    return hashlib.sha256(json.dumps({k: v for k, v in data.items() if k != "context_id"},
                                     sort_keys=True).encode()).hexdigest()


def stored_bytes(store, roots) -> list[tuple[str, bytes]]:
    """Every file under ``roots``, and every object version in the bucket when ``store`` is S3."""
    out = []
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    out.append((path, f.read()))
    if store.url.startswith("s3://"):
        s3 = boto3.client("s3", region_name="us-east-1")
        for page in s3.get_paginator("list_object_versions").paginate(Bucket="titen-test"):
            for version in page.get("Versions", []):
                body = s3.get_object(Bucket="titen-test", Key=version["Key"], VersionId=version["VersionId"])
                out.append((f"s3://{version['Key']}@{version['VersionId']}", body["Body"].read()))
    return out


def roots(world) -> list[str]:
    store = world["store"]
    local = [store.root] if not store.url.startswith("s3://") else []
    return local + [str(world["tmp"] / "cache")]


def found(world, marks) -> list[tuple[str, str]]:
    hits = []
    for where, body in stored_bytes(world["store"], roots(world)):
        lowered = body.lower()
        hits += [(where, m) for m in marks if m.encode() in lowered]
    return hits


def erase(world, path) -> dict:
    api, key = world["api"], world["key"]
    asked = api.client.delete(path, headers={"authorization": key["authorization"]})
    assert asked.status_code == 202, asked.text
    return asked.json()["data"]


def status(world, erasure_id):
    api, key = world["api"], world["key"]
    return api.get(f"/v1/erasures/{erasure_id}", key)


# -- a subject -------------------------------------------------------------------

# a rebuild killed outright (SIGKILL, out of memory, a Lambda timeout) while
# its work file held the organization's snapshot: no finally removed it
KILLED_BUILD = """
import os, shutil, signal, sys
from core.snapshot.workfiles import WorkFile
held = WorkFile(sys.argv[1], "build-acme-")
shutil.copyfile(sys.argv[2], held.path)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_erasure_completes_without_the_copy_a_killed_rebuild_left(world):
    api, key = world["api"], world["key"]
    work_dir = world["tmp"] / "cache" / "build"
    kept = work_dir / "kept-acme.sqlite"
    assert S_MARKS[1].encode() in kept.read_bytes(), "the test needs S's text in the copied snapshot"
    done = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(work_dir), str(kept)], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == -9, done.stderr
    assert [name for name in os.listdir(work_dir) if name.startswith("build-acme-")]
    asked = erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, S_MARKS) == []
    assert not [name for name in os.listdir(work_dir) if name.startswith("build-")]


def _running_build_with(world):
    """A build of the organization still running in this machine's work
    directory (an operator's ``titen rebuild``, say) whose work file holds
    S's text: it began before the erasure was asked."""
    work_dir = world["tmp"] / "cache" / "build"
    held = WorkFile(str(work_dir), "build-acme-")
    shutil.copyfile(work_dir / "kept-acme.sqlite", held.path)
    assert S_MARKS[1].encode() in open(held.path, "rb").read()
    return held


def test_an_erasure_is_not_complete_while_a_running_build_holds_its_text(world, monkeypatch):
    api, key = world["api"], world["key"]
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    running = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    r = api.post("/v1/admin/rebuild", b"", key)
    assert r.status_code == 503 and "still holds a work file" in r.json()["error"]["message"]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "pending"
    running.release()  # it ends (it could not publish: the erasure's generation did first)
    api.rebuild(key)  # nothing new in the ledger: this build finishes the erasure
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, S_MARKS) == []


class _Clock:
    """The build's clock, moved only by its sleeps: what the build waits for is
    what it asks to sleep, whatever this machine's speed."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def _complete_at(world, monkeypatch, clock):
    import core.erasure.work
    marked = []
    real = core.erasure.work.ErasureWork.complete

    def complete(self, erased):
        marked.append((clock.now, read_pointer(world["store"], "acme")[0]["generation"]))
        return real(self, erased)
    monkeypatch.setattr(core.erasure.work.ErasureWork, "complete", complete)
    return marked


def test_an_erasure_is_marked_complete_only_once_every_reader_has_had_its_ttl_to_see_the_generation(
        world, monkeypatch):
    """Readers that no bell reaches (Lambda instances; servers beside an
    operator's ``titen rebuild``) check the pointer at most every TTL: the
    build waits that long after its publish before it says complete, so no
    reader answers from the erased generation after ``complete``."""
    import core.snapshot.build
    clock = _Clock()
    monkeypatch.setattr(core.snapshot.build, "time", clock)
    builder = world["service"].builder("acme")
    builder.readers_ttl = 3.0
    marked = _complete_at(world, monkeypatch, clock)
    erase(world, "/v1/subjects/subj_s")
    result = builder.rebuild()
    assert clock.slept == [3.0]
    assert marked == [(1003.0, result.generation)]  # after the wait, the erasure's generation published


def test_an_erasure_in_titen_serve_rings_the_bell_and_still_waits_the_ttl_before_complete(world, monkeypatch):
    """``titen serve``'s supervisor rings its bell at the publish, and each
    of its servers checks the pointer at its next request once it has rung;
    but the bell reaches only them, and a ``titen mcp`` process beside them
    on the store learns of the publish at its next pointer check: the wait
    of every other build holds here too."""
    import core.snapshot.build
    clock = _Clock()
    monkeypatch.setattr(core.snapshot.build, "time", clock)
    asked = erase(world, "/v1/subjects/subj_s")
    rung = []
    builder = world["service"].builder("acme")
    builder.readers_ttl = 5.0
    builder.after_publish = lambda: rung.append(status(world, asked["erasure_id"]).json()["data"]["status"])
    builder.rebuild()
    assert rung == ["pending"] and clock.slept == [5.0]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"


HOLD_LOCK = str(Path(__file__).resolve().parent / "hold_lock.py")  # a process holding a lock


def test_an_erasure_removes_the_snapshot_caches_that_servers_gone_left_behind(world):
    """A ``titen serve`` server killed (or stopped by SIGTERM) leaves its cache
    directory with a generation from before the erasure; the erasure removes
    it before it is complete. A server is gone when the lock on its directory
    is free — not when its pid is, which means nothing in another PID
    namespace (a server in another container sharing the data directory)."""
    import subprocess
    cache = world["tmp"] / "cache"
    dead = [subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(3)]
    for pid in dead:
        (cache / f"serve-{pid}").mkdir(parents=True)
        shutil.copyfile(cache / "build" / "kept-acme.sqlite", cache / f"serve-{pid}" / "acme-000000000002-x.sqlite")
    (cache / f"serve-{dead[0]}.lock").touch()  # its server ended: nobody holds the lock
    # dead[1]'s lock is held: a live server whose pid is another namespace's
    holder = subprocess.Popen([sys.executable, HOLD_LOCK, str(cache / f"serve-{dead[1]}.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # dead[2]: no lock file (a release before the locks): its pid decides
        erase(world, "/v1/subjects/subj_s")
        world["api"].rebuild(world["key"])
        assert not (cache / f"serve-{dead[0]}").exists() and not (cache / f"serve-{dead[0]}.lock").exists()
        assert (cache / f"serve-{dead[1]}").exists()
        assert not (cache / f"serve-{dead[2]}").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_servers_cache_that_cannot_be_removed_leaves_the_erasure_pending(world, monkeypatch):
    import subprocess
    cache = world["tmp"] / "cache"
    pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                         check=True).stdout.strip()
    (cache / f"serve-{pid}").mkdir(parents=True)
    shutil.copyfile(cache / "build" / "kept-acme.sqlite", cache / f"serve-{pid}" / "acme-000000000002-x.sqlite")
    monkeypatch.setattr(workfiles.shutil, "rmtree", lambda path, ignore_errors=False: None)  # e.g. read-only
    asked = erase(world, "/v1/subjects/subj_s")
    r = world["api"].post("/v1/admin/rebuild", b"", world["key"])
    assert r.status_code == 503 and "could not be removed" in r.json()["error"]["message"]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "pending"
    monkeypatch.undo()
    world["api"].rebuild(world["key"])
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert not (cache / f"serve-{pid}").exists()


def test_titen_serve_rings_its_bell_when_it_finishes_an_erasure_another_process_published(world, monkeypatch):
    """An operator's build published the erasure's generation and stopped
    before marking it complete; the supervisor that finishes it rings its
    servers' bell first (no bell rang for that publish)."""
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    running = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    assert world["api"].post("/v1/admin/rebuild", b"", world["key"]).status_code == 503  # published, pending
    running.release()
    rung = []
    builder = world["service"].builder("acme")
    builder.after_publish = lambda: rung.append(status(world, asked["erasure_id"]).json()["data"]["status"])
    builder.rebuild()
    assert rung == ["pending"]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"


def test_finishing_an_erasure_published_by_a_machine_whose_clock_runs_ahead_waits_one_ttl_at_most(
        world, monkeypatch):
    import json as _json

    import core.snapshot.build
    from core.layout import pointer_key
    from core.snapshot.pointer import encode_pointer
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    running = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    assert world["api"].post("/v1/admin/rebuild", b"", world["key"]).status_code == 503
    running.release()
    store = world["store"]
    obj = store.get(pointer_key("acme"))
    store.compare_and_swap(pointer_key("acme"), encode_pointer({**_json.loads(obj.body),
                                                                "published_at": "2099-01-01T00:00:00Z"}), obj.etag)
    clock = _Clock()
    monkeypatch.setattr(core.snapshot.build, "time", clock)
    builder = world["service"].builder("acme")
    builder.readers_ttl = 2.0
    builder.rebuild()
    assert clock.slept == [2.0]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"


def test_an_erasure_left_pending_by_a_recovering_build_that_publishes_is_finished_by_a_later_one(
        world, monkeypatch):
    """A build that cannot finish an unfinished erasure (a running build
    still holds its text) publishes its own writes all the same; the new
    pointer still names the erasure, so the first build after the running
    one ends completes it (the pointer used to forget it, leaving it
    pending for good, its status object naming the subject)."""
    api, key, store = world["api"], world["key"], world["store"]
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    running = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    assert api.post("/v1/admin/rebuild", b"", key).status_code == 503
    api.observe(key, subject_id="subj_t", content="A later T note.")
    api.rebuild(key)  # cannot finish the erasure: publishes the write
    pointer = read_pointer(store, "acme")[0]
    assert asked["erasure_id"] in pointer["erasures"]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "pending"
    running.release()
    api.observe(key, subject_id="subj_t", content="Another T note.")
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, S_MARKS + ["subj_s"]) == []


def test_an_erasure_finished_by_recovery_is_not_carried_out_again_by_the_same_build(world, monkeypatch):
    """The build that finishes an erasure left pending and then meets a late
    entry it names erases that entry as a standing rule: it does not carry the
    erasure out a second time (no second outcome, no generation deleted)."""
    api, key, store = world["api"], world["key"], world["store"]
    s_entry = next(store.get(k).body for k in store.list_keys("orgs/acme/ledger/")
                   if not k.endswith(".run.json") and S_MARKS[0].encode() in store.get(k).body)
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    running = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    assert api.post("/v1/admin/rebuild", b"", key).status_code == 503
    running.release()
    erased_in = read_pointer(store, "acme")[0]["generation"]
    store.put_if_absent(entry_key("acme", entry_hex()), s_entry)  # a late entry holding S's records
    world["service"].builder("acme").rebuild()  # finishes the erasure, then erases the late entry's records
    pointer = read_pointer(store, "acme")[0]
    assert [h["generation"] for h in pointer["history"]] == [pointer["generation"], erased_in]
    assert pointer["erased_through"] == erased_in and not pointer.get("erasures")
    outcomes = [json.loads(store.get(k).body) for k in store.list_keys("orgs/acme/ledger/")
                if k.endswith(".run.json")]
    assert [o["erasure_id"] for o in outcomes if o.get("type") == "erasure_complete"] == [asked["erasure_id"]]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    # (the late ledger object itself is for `titen erasures reapply`: test_ledger_objects_restored_…)
    assert api.compile(key, S_MARKS[1], subject_id="subj_s", at=AT).json()["data"]["items"] == []


def test_an_erasure_waits_for_a_running_build_to_end_before_it_is_complete(world):
    api, key = world["api"], world["key"]
    running = _running_build_with(world)
    ended = threading.Timer(0.5, running.release)
    asked = erase(world, "/v1/subjects/subj_s")
    ended.start()
    api.rebuild(key)
    assert not ended.is_alive()  # the rebuild returned after the running build ended
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, S_MARKS) == []


def test_another_organizations_running_build_does_not_hold_an_erasure_up(world, monkeypatch):
    api, key = world["api"], world["key"]
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.3)
    work_dir = world["tmp"] / "cache" / "build"
    others = [WorkFile(str(work_dir), prefix) for prefix in ("build-acme-eu-", "seed-acme-eu-")]
    for other in others:
        with open(other.path, "wb") as f:
            f.write(b"acme-eu's snapshot")
    asked = erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)  # at once: acme-eu's builds hold none of acme's text
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert all(os.path.exists(other.path) for other in others)  # live: never swept
    for other in others:
        other.release()


def test_a_replay_that_completes_no_erasure_does_not_wait_for_running_builds(world, monkeypatch):
    """A replay from empty enforces every erasure already complete again;
    with none pending it has nothing to mark complete, so it never waits (two
    such replays used to wait for each other until the timeout)."""
    api, key = world["api"], world["key"]
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 0.5)
    asked = erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    running = WorkFile(str(world["tmp"] / "cache" / "build"), "build-acme-")  # any build still running
    said = []
    built = world["service"].builder("acme", said.append).rebuild(from_scratch=True)
    assert built.published
    assert not [line for line in said if "waiting for a running build" in line]
    running.release()


def test_two_builds_carrying_an_erasure_out_never_wait_for_each_other(world, monkeypatch):
    """B publishes the erasure and waits for an older running build; A starts
    after B published, replays from empty and reaches its own wait while B
    still holds its file. A waits for B (B started before A published); B
    must not wait for A, whose file holds nothing erased, or they would wait
    for each other until the timeout."""
    monkeypatch.setattr(workfiles, "ERASURE_WAIT_SECONDS", 30)
    service = world["service"]
    older = _running_build_with(world)
    asked = erase(world, "/v1/subjects/subj_s")
    said = {"a": [], "b": []}
    results = {}

    def build(name, **kw):
        try:
            results[name] = service.builder("acme", said[name].append).rebuild(**kw)
        except Exception as exc:  # the test reports it below
            results[name] = exc

    def waiting(name):
        return any("waiting for a running build" in line for line in said[name])

    b = threading.Thread(target=build, args=("b",))
    b.start()
    deadline = time.monotonic() + 20
    while not waiting("b") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert waiting("b")
    a = threading.Thread(target=build, args=("a",), kwargs={"from_scratch": True})
    a.start()
    while not waiting("a") and a.is_alive() and time.monotonic() < deadline + 20:
        time.sleep(0.02)
    older.release()  # the older build ends: B completes, then A
    b.join(40)
    a.join(40)
    assert not isinstance(results["b"], Exception), results["b"]
    assert not isinstance(results["a"], Exception), results["a"]
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    service.reader.refresh("acme", force=True)  # the server's cache moves on to the new generation
    assert found(world, S_MARKS) == []


def test_erasing_a_subject_leaves_no_copy_of_its_text_anywhere(world):
    api, key = world["api"], world["key"]
    assert found(world, S_MARKS), "the test needs S's text stored first"
    before_t = t_digest(api, key)
    asked = erase(world, "/v1/subjects/subj_s")
    assert asked["subject_id"] == "subj_s" and asked["status"] == "pending"
    assert asked["erasure_id"].startswith("era_")
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "pending"
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete" and done["completed_at"]
    assert done["counts"]["observations"] == 4 and done["counts"]["claims"] == 4
    assert done["counts"]["context_runs"] >= 1 and done["counts"]["feedback"] == 2
    assert done["counts"]["embeddings"] >= 1
    assert found(world, S_MARKS + ["subj_s"]) == []
    assert t_digest(api, key) == before_t


def test_an_erased_subject_compiles_to_nothing_and_its_pack_and_records_are_gone(world):
    api, key, pack = world["api"], world["key"], world["pack"]
    erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    assert api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s").json()["data"]["items"] == []
    assert api.get(f"/v1/context/{pack['context_id']}", key).status_code == 404
    assert api.get(f"/v1/claims/{pack['items'][0]['claim_id']}/evidence", key).status_code == 404


def test_after_an_erasure_a_build_from_scratch_agrees_with_the_incremental_one(world):
    api, key, store = world["api"], world["key"], world["store"]
    erase(world, "/v1/subjects/subj_s")
    incremental = api.rebuild(key)
    replayed = SnapshotBuilder(store, "acme", work_dir=str(world["tmp"] / "replay")).rebuild(from_scratch=True)
    assert replayed.content_hash == incremental["content_hash"]


def test_a_build_from_scratch_that_carries_an_erasure_out_brings_no_erased_vector_back(world):
    from core.vectors.embedder import text_sha256
    api, key, service = world["api"], world["key"], world["service"]
    erase(world, "/v1/subjects/subj_s")
    # the previous generation still holds S's vectors; the replay must not seed them
    service.rebuild("acme", from_scratch=True)
    snapshot = service.reader.current("acme")
    cached = {h for h, in snapshot.db.execute("SELECT text_sha256 FROM embed_cache")}
    said = {text_sha256(s) for s, in snapshot.db.execute("SELECT DISTINCT statement FROM claims")}
    assert cached and cached <= said
    assert snapshot.db.execute("SELECT count(*) FROM claims WHERE subject_id = 'subj_s'").fetchone()[0] == 0


def test_the_erasure_record_in_the_ledger_is_content_free(world):
    api, key, store = world["api"], world["key"], world["store"]
    asked = erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    records = [json.loads(store.get(k).body) for k in store.list_keys("orgs/acme/ledger/")]
    stubs = [r for r in records if r["type"] == "erased"]
    assert stubs and all(set(r) <= {"entry_id", "type", "org_id", "erasure_id", "erased_records", "erased_counted",
                                    "erased_kind", "requester_own"} for r in stubs)
    # a pack's or feedback's stub says only which of the two it was, and whether the requester's own
    assert {r.get("erased_kind") for r in stubs} == {None, "context_run", "feedback"}
    assert {r.get("requester_own") for r in stubs} <= {None, True}
    # what a stub (or a rewritten entry) records of the erased records is a hash of each id, nothing else
    taken = [r["erased_records"] for r in records if "erased_records" in r]
    assert taken
    for by_erasure in taken:
        assert set(by_erasure) == {asked["erasure_id"]}
        assert all(re.fullmatch("[0-9a-f]{64}", h) for h in by_erasure[asked["erasure_id"]])
    # which of them were observations and claims, and readable by the requester: the same hashes again
    counted = [r["erased_counted"] for r in records if "erased_counted" in r]
    assert counted
    for by_erasure in counted:
        assert set(by_erasure) == {asked["erasure_id"]}
        assert set(by_erasure[asked["erasure_id"]]) <= {"readable_observations", "other_observations",
                                                        "readable_claims", "other_claims"}
        assert all(re.fullmatch("[0-9a-f]{16}", h) for hashes in by_erasure[asked["erasure_id"]].values()
                   for h in hashes)
    erasure = [r for r in records if r.get("erasure_id") == asked["erasure_id"] and r["type"] != "erased"]
    assert {r["type"] for r in erasure} == {"erasure", "erasure_complete"}
    for record in erasure:
        assert "subj_s" not in json.dumps(record)
    (complete,) = [r for r in erasure if r["type"] == "erasure_complete"]
    assert complete["counts"]["claims"] == 4
    assert erasure[0]["target_sha256"] == hashlib.sha256(b"acme\nsubject\nsubj_s").hexdigest()


def test_a_rollback_to_a_generation_from_before_the_erasure_is_refused(world):
    api, key, store = world["api"], world["key"], world["store"]
    before = read_pointer(store, "acme")[0]["generation"]
    erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    pointer = read_pointer(store, "acme")[0]
    assert [h["generation"] for h in pointer["history"]] == [pointer["generation"]]
    with pytest.raises(NotFound, match="erasure"):
        rollback(store, "acme", before)


def test_a_replay_from_empty_after_a_completed_erasure_keeps_the_generations_built_since(world):
    """Generations published after an erasure completed hold nothing it
    erased: a replay from empty, which applies the erasure's entry again,
    keeps them for rollback and leaves ``erased_through`` where it was (it
    used to publish itself as the only generation)."""
    api, key, store = world["api"], world["key"], world["store"]
    asked = erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    erased_through = read_pointer(store, "acme")[0]["erased_through"]
    for i in range(2):
        api.observe(key, subject_id="subj_t", content=f"Later T evidence {i}.")
        api.rebuild(key)
    since = [h["generation"] for h in read_pointer(store, "acme")[0]["history"]]
    assert len(since) == 3
    world["service"].rebuild("acme", from_scratch=True)
    pointer = read_pointer(store, "acme")[0]
    assert [h["generation"] for h in pointer["history"]] == [pointer["generation"], *since]
    assert pointer["erased_through"] == erased_through and not pointer.get("erasures")
    served = rollback(store, "acme", since[1])
    assert served["serving"] == since[1]
    assert read_pointer(store, "acme")[0]["rolled_back_to"] == since[1]


def test_records_about_the_subject_written_after_the_erasure_are_kept(world):
    api, key = world["api"], world["key"]
    erase(world, "/v1/subjects/subj_s")
    later = api.observe(key, subject_id="subj_s", content="Written after the erasure.",
                        claim={"statement": "A new start for s.", "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(key)
    data = api.compile(key, "new start", subject_id="subj_s").json()["data"]
    assert [i["claim_id"] for i in data["items"]] == [later["claim_id"]]


def test_erasing_a_subject_with_no_records_completes_with_zero_counts(world):
    api, key = world["api"], world["key"]
    asked = erase(world, "/v1/subjects/nobody_here")
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert done["counts"] == {"observations": 0, "claims": 0, "context_runs": 0, "feedback": 0, "embeddings": 0}


def test_an_erasure_that_finds_no_record_keeps_the_older_generations_to_roll_back_to(world):
    """Only an erasure leaves a record out of a snapshot, and it purges every
    older generation: one that finds nothing has nothing to purge, so it does
    not take the rollback points with it."""
    api, key, store = world["api"], world["key"], world["store"]
    before = [h["generation"] for h in read_pointer(store, "acme")[0]["history"]]
    assert len(before) >= 2
    erase(world, "/v1/subjects/nobody_here")
    api.rebuild(key)
    pointer = read_pointer(store, "acme")[0]
    assert [h["generation"] for h in pointer["history"]] == [pointer["generation"], *before]
    assert rollback(store, "acme", before[-1])["serving"] == before[-1]
    assert read_pointer(store, "acme")[0]["rolled_back_to"] == before[-1]


def test_many_erasures_carried_out_by_one_build_read_each_ledger_entry_and_the_listing_once(world, monkeypatch):
    # 300 erasures of unknown subjects held a rebuild for two minutes: each
    # re-listed the ledger and re-read every entry since the watermark,
    # the other erasures' own entries among them
    api, key, store = world["api"], world["key"], world["store"]
    asked = [erase(world, f"/v1/subjects/ghost_{i}") for i in range(12)]
    gets, listings = Counter(), Counter()
    real_get, real_list = store.get, store.list_keys

    def get(k, *args, **kwargs):
        gets[k] += 1
        return real_get(k, *args, **kwargs)

    def list_keys(prefix, *args, **kwargs):
        listings[prefix] += 1
        return real_list(prefix, *args, **kwargs)

    monkeypatch.setattr(store, "get", get)
    monkeypatch.setattr(store, "list_keys", list_keys)
    api.rebuild(key)
    assert all(status(world, a["erasure_id"]).json()["data"]["status"] == "complete" for a in asked)
    erasure_entries = [k for k in gets if "/ledger/" in k and k.rsplit("/", 1)[1].split(".")[0] in
                       {a["erasure_id"][len("era_"):] for a in asked}]
    assert len(erasure_entries) == 12
    # read by the build that applies it, and once by the purge
    assert max(gets[k] for k in erasure_entries) <= 2, {k: gets[k] for k in erasure_entries}
    assert listings["orgs/acme/ledger/"] <= 3, listings


def _ledger_text(store) -> bytes:
    return b"\n".join(store.get(k).body for k in store.list_keys("orgs/acme/ledger/"))


def test_a_purge_never_writes_an_entry_read_for_an_earlier_erasure_over_another_purges_rewrite(world):
    # two builds of one organization may run at once (a direct invoke beside
    # a queued rebuild; `titen erasures reapply` beside a build): one purge
    # must not write back what another already took from an entry
    from core.erasure import records
    from core.erasure.purge import LedgerPurge
    from core.erasure.work import target_of
    store = world["store"]
    for path in ("/v1/subjects/ghost", "/v1/subjects/subj_t", "/v1/subjects/subj_s"):
        erase(world, path)
    pending = sorted(records.pending(store, "acme"), key=lambda r: r["erasure_id"])
    assert len(pending) == 3
    assert S_MARKS[3].encode() in _ledger_text(store)
    slow = LedgerPurge(store, "acme", 0, lambda m: None)
    ghost, t, _ = [target_of(r) for r in pending]
    slow.carry_out(ghost, None)  # reads the import batch S and T share, takes nothing from it
    fast = LedgerPurge(store, "acme", 0, lambda m: None)
    for target in [target_of(r) for r in pending]:  # the other build carries all three out
        fast.carry_out(target, None)
    assert S_MARKS[3].encode() not in _ledger_text(store)
    slow.carry_out(t, None)  # its build listed its erasures before S's was asked
    assert S_MARKS[3].encode() not in _ledger_text(store)


# -- one observation ----------------------------------------------------------------

def test_erasing_an_observation_keeps_a_claim_it_does_not_alone_support(world):
    api, key = world["api"], world["key"]
    secret = "zebracrumpet"
    kept = api.observe(key, subject_id="subj_u", content="The runbook says canaries first.", trust="verified")
    gone = api.observe(key, subject_id="subj_u", content=f"A {secret} remark, to be forgotten.",
                       trust="verified")
    written = api.post("/v1/consolidations", {"subject_id": "subj_u", "claims": [
        {"statement": "Canaries go first.", "kind": "procedural", "confidence": 0.9, "trust": "verified",
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "supports"}]}]}, key)
    claim_id = written.json()["data"]["claim_ids"][0]
    api.rebuild(key)
    assert found(world, [secret])
    asked = erase(world, f"/v1/observations/{gone['observation_id']}")
    assert asked == {"erasure_id": asked["erasure_id"], "observation_id": gone["observation_id"],
                     "status": "pending"}
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    evidence = api.get(f"/v1/claims/{claim_id}/evidence", key).json()["data"]
    assert [e["observation_id"] for e in evidence["evidence"]] == [kept["observation_id"]]
    assert evidence["claim"]["trust"] == "verified"
    assert found(world, [secret]) == []


def test_erasing_an_observation_erases_the_claims_it_alone_supports_and_caps_the_others(world):
    api, key = world["api"], world["key"]
    strong = api.observe(key, subject_id="subj_v", content="Verified source.", trust="verified",
                         claim={"statement": "Only this one says so.", "kind": "semantic_fact", "confidence": 0.9})
    weak = api.observe(key, subject_id="subj_v", content="Hearsay.", trust="unverified")
    both = api.post("/v1/consolidations", {"subject_id": "subj_v", "claims": [
        {"statement": "Both say so.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": strong["observation_id"], "relation": "supports"},
                     {"observation_id": weak["observation_id"], "relation": "supports"}]}]}, key)
    both_id = both.json()["data"]["claim_ids"][0]
    api.rebuild(key)
    erase(world, f"/v1/observations/{strong['observation_id']}")
    api.rebuild(key)
    assert api.get(f"/v1/claims/{strong['claim_id']}/evidence", key).status_code == 404
    survivor = api.get(f"/v1/claims/{both_id}/evidence", key).json()["data"]["claim"]
    assert survivor["trust"] == "unverified"  # its strongest remaining support


def from_scratch_agrees(world, incremental: dict) -> bool:
    replayed = SnapshotBuilder(world["store"], "acme", work_dir=str(world["tmp"] / "replay")).rebuild(
        from_scratch=True)
    return replayed.content_hash == incremental["content_hash"]


def test_an_erased_observation_id_is_left_in_no_claim_that_cited_it(world):
    api, key = world["api"], world["key"]
    kept = api.observe(key, subject_id="subj_w", content="Kept evidence.", trust="asserted")
    gone = api.observe(key, subject_id="subj_w", content="Evidence to forget.", trust="verified")
    both = api.post("/v1/consolidations", {"subject_id": "subj_w", "claims": [
        {"statement": "Supported twice.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "supports"}]},
        {"statement": "Supported once, disputed by the erased one.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "contradicts"}]}]}, key)
    twice, disputed = both.json()["data"]["claim_ids"]
    api.rebuild(key)
    erase(world, f"/v1/observations/{gone['observation_id']}")
    incremental = api.rebuild(key)
    assert found(world, [gone["observation_id"]]) == []
    for claim_id in (twice, disputed):
        evidence = api.get(f"/v1/claims/{claim_id}/evidence", key).json()["data"]
        assert [e["observation_id"] for e in evidence["evidence"]] == [kept["observation_id"]]
        assert evidence["claim"]["trust"] == "asserted" and evidence["claim"]["status"] == "active"
    assert from_scratch_agrees(world, incremental)


def test_a_stored_pack_citing_an_erased_observation_goes_with_the_citation(world):
    api, key = world["api"], world["key"]
    kept = api.observe(key, subject_id="subj_w", content="Kept evidence.")
    gone = api.observe(key, subject_id="subj_w", content="Evidence to forget.")
    api.post("/v1/consolidations", {"subject_id": "subj_w", "claims": [
        {"statement": "The gannet rota is supported twice.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "supports"}]}]}, key)
    api.rebuild(key)
    pack = api.compile(key, "gannet rota", subject_id="subj_w", at=AT).json()["data"]
    assert gone["observation_id"] in pack["items"][0]["evidence_ids"]
    erase(world, f"/v1/observations/{gone['observation_id']}")
    api.rebuild(key)
    assert api.get(f"/v1/context/{pack['context_id']}", key).status_code == 404
    assert found(world, [gone["observation_id"]]) == []
    again = api.compile(key, "gannet rota", subject_id="subj_w", at=AT).json()["data"]
    assert again["items"][0]["evidence_ids"] == [kept["observation_id"]]

FEEDBACK_REASON = "ibexfeedbackreason"


def a_pack_of_a_claim_supported_twice(world) -> tuple[str, str, dict]:
    """A pack whose one claim two observations support, one of them about to
    be erased: (the claim id, that observation's id, the pack)."""
    api, key = world["api"], world["key"]
    kept = api.observe(key, subject_id="subj_w", content="Kept evidence.")
    gone = api.observe(key, subject_id="subj_w", content="Evidence to forget.")
    claim_id = api.post("/v1/consolidations", {"subject_id": "subj_w", "claims": [
        {"statement": "The gannet rota is supported twice.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "supports"}]}]},
        key).json()["data"]["claim_ids"][0]
    api.rebuild(key)
    pack = api.compile(key, "gannet rota", subject_id="subj_w", at=AT).json()["data"]
    assert [i["claim_id"] for i in pack["items"]] == [claim_id]
    return claim_id, gone["observation_id"], pack


def feedback_on_a_kept_claim(world) -> tuple[str, str]:
    """A pack citing an observation about to be erased, whose one claim has
    other support and stays, and feedback with a reason on that claim in
    that pack: (the claim id, the observation id)."""
    api, key = world["api"], world["key"]
    claim_id, gone, pack = a_pack_of_a_claim_supported_twice(world)
    sent = api.post(f"/v1/context/{pack['context_id']}/feedback",
                    {"outcome": "harmful", "claim_id": claim_id, "reason_code": FEEDBACK_REASON}, key)
    assert sent.status_code == 201, sent.text
    api.rebuild(key)
    assert feedback_on(world, claim_id) == (1, 1) and found(world, [FEEDBACK_REASON])
    return claim_id, gone


def feedback_on(world, claim_id: str) -> tuple[int, int]:
    """(feedback rows on the claim, the feedback count its utility reads) in the served generation."""
    db = world["service"].reader.current("acme").db
    return (db.execute("SELECT count(*) FROM feedback WHERE claim_id = ?", (claim_id,)).fetchone()[0],
            db.execute("SELECT feedback_total FROM claims WHERE claim_id = ?", (claim_id,)).fetchone()[0])


def test_feedback_on_a_kept_claim_of_a_stored_pack_that_goes_goes_with_the_pack(world):
    """The pack cites the erased observation, so it goes; the claim it packed
    keeps other support and stays. Feedback on that claim in that pack goes
    with the pack (docs/api.md §16): from the ledger, and from the claim's
    utility."""
    api, key = world["api"], world["key"]
    claim_id, gone = feedback_on_a_kept_claim(world)
    asked = erase(world, f"/v1/observations/{gone}")
    incremental = api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert done["counts"]["context_runs"] == 1 and done["counts"]["feedback"] == 1
    assert api.get(f"/v1/claims/{claim_id}/evidence", key).status_code == 200
    assert feedback_on(world, claim_id) == (0, 0)
    assert found(world, [FEEDBACK_REASON]) == []
    assert from_scratch_agrees(world, incremental)


def test_a_claim_citing_only_evidence_whose_erasure_is_pending_goes_with_it(world):
    api, key = world["api"], world["key"]
    gone = api.observe(key, subject_id="subj_x", content="Evidence to forget.")
    api.rebuild(key)
    erase(world, f"/v1/observations/{gone['observation_id']}")
    late = api.post("/v1/consolidations", {"subject_id": "subj_x", "claims": [
        {"statement": "Written while the erasure was pending.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": gone["observation_id"], "relation": "supports"}]}]}, key)
    assert late.status_code == 201, late.text
    incremental = api.rebuild(key)
    assert api.get(f"/v1/claims/{late.json()['data']['claim_ids'][0]}/evidence", key).status_code == 404
    assert api.compile(key, "pending erasure", subject_id="subj_x").json()["data"]["items"] == []
    assert found(world, [gone["observation_id"], "written while the erasure"]) == []
    assert from_scratch_agrees(world, incremental)


def test_a_claim_about_the_subject_written_after_its_erasure_keeps_only_its_later_evidence(world):
    api, key = world["api"], world["key"]
    old = world["s_obs"][1]["observation_id"]
    erase(world, "/v1/subjects/subj_s")
    new = api.observe(key, subject_id="subj_s", content="Written after the erasure.")
    late = api.post("/v1/consolidations", {"subject_id": "subj_s", "claims": [
        {"statement": "A later claim on old and new evidence.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": old, "relation": "supports"},
                     {"observation_id": new["observation_id"], "relation": "supports"}]}]}, key)
    assert late.status_code == 201, late.text
    incremental = api.rebuild(key)
    evidence = api.get(f"/v1/claims/{late.json()['data']['claim_ids'][0]}/evidence", key).json()["data"]
    assert [e["observation_id"] for e in evidence["evidence"]] == [new["observation_id"]]
    assert found(world, [old]) == []
    assert from_scratch_agrees(world, incremental)


# -- a rebuild that fails part-way through an erasure --------------------------------

def fail_once(monkeypatch, store, method: str, when) -> list:
    """The store's ``method`` raises StoreError on its first call whose key
    ``when`` accepts (the S3 call refused); every other call is real."""
    from core.storage import StoreError
    real, failed = getattr(store, method), []

    def call(key, *args, **kwargs):
        if not failed and when(key):
            failed.append(key)
            raise StoreError(f"injected: {method} {key}")
        return real(key, *args, **kwargs)
    monkeypatch.setattr(store, method, call)
    return failed


def test_feedback_on_a_kept_claim_goes_when_an_earlier_attempt_stubbed_its_pack_and_failed(world, monkeypatch):
    """The retry finds the pack already a stub, named only by a hash: the
    feedback on it still goes, from the ledger and the snapshot."""
    api, key = world["api"], world["key"]
    claim_id, gone = feedback_on_a_kept_claim(world)
    asked = erase(world, f"/v1/observations/{gone}")
    failed = fail_once(monkeypatch, world["store"], "purge_history", lambda k: k.endswith(".run.json"))
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert failed
    api.rebuild(key)
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete" and done["counts"]["context_runs"] == 1
    assert feedback_on(world, claim_id) == (0, 0)
    assert found(world, [FEEDBACK_REASON]) == []


def test_every_feedback_on_a_kept_claim_of_a_pack_that_goes_goes_repeats_included(world, monkeypatch):
    """A snapshot keeps only the last feedback per pack and claim; the ledger
    keeps every one, the earlier ones older than the snapshot's watermark
    (no skew window here to re-read them by chance)."""
    import dataclasses
    api, key, service = world["api"], world["key"], world["service"]
    monkeypatch.setattr(service, "settings", dataclasses.replace(service.settings, skew_seconds=0))
    claim_id, gone, pack = a_pack_of_a_claim_supported_twice(world)
    for reason in ("firstreasonzz", "secondreasonzz"):
        sent = api.post(f"/v1/context/{pack['context_id']}/feedback",
                        {"outcome": "harmful", "claim_id": claim_id, "reason_code": reason}, key)
        assert sent.status_code == 201, sent.text
        api.rebuild(key)
    assert found(world, ["firstreasonzz", "secondreasonzz"])
    erase(world, f"/v1/observations/{gone}")
    incremental = api.rebuild(key)
    assert found(world, ["firstreasonzz", "secondreasonzz"]) == []
    assert feedback_on(world, claim_id) == (0, 0)
    assert from_scratch_agrees(world, incremental)


@pytest.mark.parametrize("skew", [0, None], ids=["no skew window", "the default skew window"])
def test_a_late_feedback_entry_behind_a_moved_stub_is_stubbed_and_counted_once(world, monkeypatch, skew):
    """A write landing late is stored under a fresh key behind a moved stub
    at its own (core/ledger.py): the purge reads it through both keys, and
    the subject's tag finds the stub's key a third time."""
    import dataclasses

    import core.ledger
    api, key, service = world["api"], world["key"], world["service"]
    if skew is not None:
        monkeypatch.setattr(service, "settings", dataclasses.replace(service.settings, skew_seconds=skew))
    claim_id, gone = feedback_on_a_kept_claim(world)
    pack = api.compile(key, "gannet rota", subject_id="subj_w", at=AT).json()["data"]
    monkeypatch.setattr(core.ledger, "LATE_AFTER_SECONDS", -1)  # this feedback lands "late"
    sent = api.post(f"/v1/context/{pack['context_id']}/feedback",
                    {"outcome": "harmful", "claim_id": claim_id, "reason_code": "movedreasonzz"}, key)
    assert sent.status_code == 201, sent.text
    monkeypatch.setattr(core.ledger, "LATE_AFTER_SECONDS", 60)
    api.rebuild(key)
    asked = erase(world, f"/v1/observations/{gone}")
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert found(world, ["movedreasonzz", FEEDBACK_REASON]) == []
    assert (done["counts"]["context_runs"], done["counts"]["feedback"]) == (2, 2), done["counts"]


@pytest.mark.parametrize("target", ["subject", "observation"])
def test_a_pack_compiled_while_the_erasure_was_pending_goes_with_what_it_erased(world, target):
    """A pack compiled after the erasure was asked, before a rebuild carried
    it out, copied the erased text: it goes too (api.md §16)."""
    api, key = world["api"], world["key"]
    obs = world["s_obs"][0]["observation_id"]  # alone supports the S_MARKS[1] claim
    asked = erase(world, "/v1/subjects/subj_s" if target == "subject" else f"/v1/observations/{obs}")
    late = api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s", at=AT).json()["data"]
    assert any(S_MARKS[1] in item["claim"] for item in late["items"])
    api.rebuild(key)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert api.get(f"/v1/context/{late['context_id']}", key).status_code == 404
    assert found(world, [S_MARKS[1]]) == []


def test_a_pack_compiled_from_the_older_generation_while_the_erasure_ran_goes_before_it_is_complete(
        world, monkeypatch):
    """Compiled after the purge listed the ledger, before the erasure's
    generation was published: the erasure is complete only once it is gone."""
    from core.erasure.work import ErasureWork
    api, key = world["api"], world["key"]
    asked = erase(world, "/v1/subjects/subj_s")
    during = []
    real_purge = ErasureWork.purge

    def purge_then_compile(self, db):
        real_purge(self, db)
        during.append(api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s", at=AT).json()["data"])

    monkeypatch.setattr(ErasureWork, "purge", purge_then_compile)
    api.rebuild(key)
    assert during and any(S_MARKS[1] in item["claim"] for item in during[0]["items"])
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert api.get(f"/v1/context/{during[0]['context_id']}", key).status_code == 404
    assert found(world, S_MARKS + ["subj_s"]) == []


def _compile_during_the_purge(world, monkeypatch, during: list) -> None:
    """A compile from the older generation right after the purge listed the ledger."""
    from core.erasure.work import ErasureWork
    api, key = world["api"], world["key"]
    real_purge = ErasureWork.purge

    def purge_then_compile(self, db):
        real_purge(self, db)
        during.append(api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s", at=AT).json()["data"])
    monkeypatch.setattr(ErasureWork, "purge", purge_then_compile)


@pytest.mark.parametrize("where", ["the readers' wait", "the late sweep"])
def test_a_pack_compiled_during_an_erasure_whose_build_failed_after_publishing_goes_before_it_is_complete(
        world, monkeypatch, where):
    """The build that finishes the erasure (``recover``) purges the ledger
    again, so the pack the failed build's late sweep never reached goes too."""
    from core.erasure.purge import LedgerPurge
    api, key = world["api"], world["key"]
    asked = erase(world, "/v1/subjects/subj_s")
    during = []
    _compile_during_the_purge(world, monkeypatch, during)
    if where == "the readers' wait":
        real = SnapshotBuilder._before_complete
        calls = []

        def dies_once(self, *args, **kwargs):  # a Lambda timeout during the readers' TTL wait, say
            calls.append(1)
            if len(calls) == 1:
                raise Unavailable("killed during the readers' wait")
            return real(self, *args, **kwargs)
        monkeypatch.setattr(SnapshotBuilder, "_before_complete", dies_once)
    else:
        real_sweep = LedgerPurge.sweep_late
        armed = [True]

        def sweep(self, carried):
            if armed.pop() if armed else False:
                fail_once(monkeypatch, world["store"], "compare_and_swap", lambda k: k.endswith(".run.json"))
            return real_sweep(self, carried)
        monkeypatch.setattr(LedgerPurge, "sweep_late", sweep)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert during and any(S_MARKS[1] in item["claim"] for item in during[0]["items"])
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert api.get(f"/v1/context/{during[0]['context_id']}", key).status_code == 404
    assert found(world, S_MARKS + ["subj_s"]) == []
    assert (done["counts"]["observations"], done["counts"]["claims"], done["counts"]["feedback"]) == (4, 4, 2)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_feedback_on_a_kept_claim_goes_with_its_pack_when_the_erasure_is_retried(world, monkeypatch):
    api, key = world["api"], world["key"]
    claim_id, gone = feedback_on_a_kept_claim(world)
    asked = erase(world, f"/v1/observations/{gone}")
    # the older versions of the first entry stubbed or rewritten: the build
    # fails before it publishes, the feedback's stub already written
    failed = fail_once(monkeypatch, world["store"], "purge_history", lambda k: "/ledger/" in k)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert failed
    api.rebuild(key)
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert done["counts"]["context_runs"] == 1 and done["counts"]["feedback"] == 1  # counted once
    assert feedback_on(world, claim_id) == (0, 0)
    assert found(world, [FEEDBACK_REASON]) == []


@pytest.mark.parametrize("store", ["s3"], indirect=True)
@pytest.mark.parametrize("method,where", [
    ("purge_history", "/ledger/"),      # the older versions of a rewritten or stubbed entry
    ("purge_prefix", "/snapshots/"),    # every version of the older generations, after the swap
    ("purge_history", "/erasures/"),    # the pending status object, which named the subject
])
def test_an_erasure_interrupted_after_a_step_leaves_no_copy_once_complete(world, monkeypatch, method, where):
    api, key = world["api"], world["key"]
    asked = erase(world, "/v1/subjects/subj_s")
    failed = fail_once(monkeypatch, world["store"], method, lambda k: where in k)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert failed
    if where != "/erasures/":  # still pending: the schedule's next pass rebuilds (on Lambda)
        from core.rebuild.backlog import backlog
        assert backlog(world["store"], "acme").due
    api.rebuild(key)  # the step is taken again before the erasure reads complete
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert found(world, S_MARKS + ["subj_s"]) == []
    # told what an uninterrupted erasure tells (test_erasing_a_subject_leaves_no_copy_of_its_text_anywhere)
    assert (done["counts"]["observations"], done["counts"]["claims"], done["counts"]["feedback"]) == (4, 4, 2)
    assert done["counts"]["context_runs"] >= 1


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_retry_that_reads_the_whole_ledger_still_knows_the_claims_an_interrupted_attempt_stubbed(
        world, monkeypatch):
    """The first attempt stubs the observation's entry, whose claim is then
    named nowhere else in the ledger, and fails before the pack holding that
    claim is stubbed; the retry starts from empty (``--from-scratch``), so no
    previous generation says which claims went: the stub must."""
    api, key, service = world["api"], world["key"], world["service"]
    obs = world["s_obs"][0]["observation_id"]  # alone supports the S_MARKS[1] claim, which the pack holds
    asked = erase(world, f"/v1/observations/{obs}")
    failed = fail_once(monkeypatch, world["store"], "purge_history", lambda k: "/ledger/" in k)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert failed
    monkeypatch.undo()
    service.rebuild("acme", from_scratch=True)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, [S_MARKS[0], S_MARKS[1]]) == []
    assert api.get(f"/v1/context/{world['pack']['context_id']}", key).status_code == 404


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_finishing_an_erasure_spares_a_racing_build_of_a_later_generation(world, monkeypatch):
    """The erasure's generation N is published but the purge after the swap
    failed; while a later build finishes it, another build (from N, so
    holding nothing erased) has uploaded N + 1 and is about to swap it in:
    its upload stays, every file up to N but the pointer's goes."""
    from core.erasure.work import ErasureWork
    from core.layout import snapshot_key
    api, key, store = world["api"], world["key"], world["store"]
    asked = erase(world, "/v1/subjects/subj_s")
    fail_once(monkeypatch, store, "purge_prefix", lambda k: "/snapshots/" in k)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    monkeypatch.undo()
    pointer = read_pointer(store, "acme")[0]
    racing = snapshot_key("acme", pointer["generation"] + 1, "racing")
    store.put_if_absent(racing, b"a build from the erasure's generation")
    older = [k for k in store.list_keys("orgs/acme/snapshots/") if k != racing and not k.endswith("current.json")
             and k != pointer["snapshot_key"]]
    assert older, "the test needs an older generation left behind"
    ErasureWork(store, "acme", 0).recover(pointer)
    assert status(world, asked["erasure_id"]).json()["data"]["status"] == "complete"
    assert store.get(racing).body == b"a build from the erasure's generation"
    assert set(store.list_keys("orgs/acme/snapshots/")) == {racing, pointer["snapshot_key"],
                                                             "orgs/acme/snapshots/current.json"}

@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_pointer_swap_whose_answer_was_lost_keeps_the_file_it_published(world, monkeypatch):
    api, key, store = world["api"], world["key"], world["store"]
    api.observe(key, subject_id="subj_t", content="One more.", claim={"statement": "One more checklist.",
                                                                     "kind": "procedural", "confidence": 0.9})
    real = store.compare_and_swap

    def landed_then_lost(k, body, etag):
        answer = real(k, body, etag)
        if k.endswith("current.json"):
            from core.storage import StoreError
            raise StoreError("injected: the answer was lost")
        return answer
    monkeypatch.setattr(store, "compare_and_swap", landed_then_lost)
    rebuilt = api.rebuild(key)
    monkeypatch.setattr(store, "compare_and_swap", real)
    pointer = read_pointer(store, "acme")[0]
    assert pointer["generation"] == rebuilt["generation"]
    assert store.get(pointer["snapshot_key"]).body  # the file it names is there
    fresh = Service(Settings.from_env(store_url=store.url, env={"TITEN_SNAPSHOT_TTL": "0",
                                      "TITEN_CACHE_DIR": str(world["tmp"] / "fresh")}), store=store)
    assert Api(fresh).compile(key, "checklist", subject_id="subj_t").status_code == 200


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_an_instance_that_cannot_load_the_generation_after_an_erasure_stops_serving_the_one_before(
        world, monkeypatch):
    """Another API instance holds the generation from before the erasure; the
    store then refuses it the new file: it answers 503, never the erased records."""
    api, key, store = world["api"], world["key"], world["store"]
    other = Api(Service(Settings.from_env(store_url=store.url, env={
        "TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(world["tmp"] / "other")}), store=store))
    task = f"{S_MARKS[1]} deploy"
    assert other.compile(key, task, subject_id="subj_s").json()["data"]["items"]
    erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    from core.storage import StoreError

    def refused(*args, **kwargs):
        raise StoreError("injected: the new generation cannot be read")
    monkeypatch.setattr(store, "download_file", refused)
    answer = other.compile(key, task, subject_id="subj_s")
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "UNAVAILABLE"
    ready = other.get("/readyz", key).json()["data"]
    assert ready["status"] == "not_ready" and "no longer served: an erasure" in ready["reason"]


def test_an_erasure_whose_request_stopped_short_is_carried_out_by_a_later_rebuild(world, monkeypatch):
    """The status object was stored but the ledger entry was not (the request
    answered 503): no new entry names the erasure, yet it must not stay pending."""
    import types

    import core.erasure.work
    import core.ledger
    from core.erasure import records
    from core.snapshot import housekeeping
    from core.storage import StoreError
    api, key, service = world["api"], world["key"], world["service"]

    def refused(*args, **kwargs):
        raise StoreError("injected: the erasure entry did not land")
    monkeypatch.setattr(service.erasures.ledger, "append", refused)
    asked = api.client.delete("/v1/subjects/subj_s", headers={"authorization": key["authorization"]})
    assert asked.status_code == 503
    monkeypatch.undo()
    (stranded,) = records.pending(world["store"], "acme")
    api.rebuild(key)  # a minute has not passed: the request may still be finishing
    assert status(world, stranded["erasure_id"]).json()["data"]["status"] == "pending"
    later = time.time() + 120
    clock = types.SimpleNamespace(time=lambda: later)
    # both clocks: the sweep's, and the ledger's, which then stores the entry
    # late (under a fresh key, behind a moved stub at its own)
    monkeypatch.setattr(core.erasure.work, "time", clock)
    monkeypatch.setattr(core.ledger, "time", clock)
    housekeeping._last_run.clear()  # the sweep's cadence (every 10 minutes) has come round
    api.rebuild(key)  # this very build carries it out
    assert status(world, stranded["erasure_id"]).json()["data"]["status"] == "complete"
    assert found(world, S_MARKS + ["subj_s"]) == []


# -- scope ----------------------------------------------------------------------------

def test_a_key_without_memory_erase_is_forbidden_on_every_erasure_route(world):
    api = world["api"]
    writer = api.key(principal="bob", scopes="context:compile,memory:write")
    obs = world["s_obs"][0]["observation_id"]
    for method, path in (("DELETE", "/v1/subjects/subj_s"), ("DELETE", f"/v1/observations/{obs}"),
                         ("GET", "/v1/erasures/era_" + "0" * 32)):
        answer = api.client.request(method, path, headers={"authorization": writer["authorization"]})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "FORBIDDEN", (method, path)
    assert list(world["store"].list_keys("orgs/acme/erasures/")) == []


def test_a_foreign_or_unreadable_observation_reads_like_an_unknown_one(world):
    api = world["api"]
    foreign = api.key(org="globex", principal="eve", scopes="memory:erase,memory:write")
    private = api.observe(world["key"], subject_id="subj_w", content="Private to alice.", visibility="private")
    bob = api.key(principal="bob", scopes="memory:erase")
    unknown = "obs_" + "0" * 32
    for caller, obs in ((foreign, world["s_obs"][0]["observation_id"]), (bob, private["observation_id"])):
        seen = api.client.delete(f"/v1/observations/{obs}", headers={"authorization": caller["authorization"]})
        none = api.client.delete(f"/v1/observations/{unknown}", headers={"authorization": caller["authorization"]})
        assert seen.status_code == none.status_code == 404
        assert seen.json()["error"]["message"].replace(obs, "ID") == none.json()["error"]["message"].replace(
            unknown, "ID")
    assert list(world["store"].list_keys("orgs/globex/erasures/")) == []


def assert_reads_as_unknown(api, caller, erasure_id):
    """``caller`` gets exactly what an unknown erasure id gets."""
    unknown = "era_" + "0" * 32
    seen = api.get(f"/v1/erasures/{erasure_id}", caller)
    none = api.get(f"/v1/erasures/{unknown}", caller)
    assert seen.status_code == none.status_code == 404
    assert seen.json()["error"]["message"].replace(erasure_id, "ID") == \
        none.json()["error"]["message"].replace(unknown, "ID")


@pytest.mark.parametrize("org, principal", [("globex", "eve"), ("acme", "bob")],
                         ids=["another organization", "another principal"])
def test_an_erasure_reads_to_anyone_but_its_requester_exactly_as_an_unknown_one(world, org, principal):
    api = world["api"]
    asked = erase(world, "/v1/subjects/subj_s")
    assert_reads_as_unknown(api, api.key(org=org, principal=principal, scopes="memory:erase"), asked["erasure_id"])


def test_a_key_of_the_requester_with_fewer_workspaces_reads_an_erasure_as_an_unknown_one(world):
    api = world["api"]
    bob_ops = api.key(principal="bob", scopes="memory:erase", workspaces=("ws_ops",))
    bob_plain = api.key(principal="bob", scopes="memory:erase")
    asked = api.client.delete("/v1/subjects/subj_s", headers={"authorization": bob_ops["authorization"]})
    erasure_id = asked.json()["data"]["erasure_id"]
    assert api.get(f"/v1/erasures/{erasure_id}", bob_ops).status_code == 200
    assert_reads_as_unknown(api, bob_plain, erasure_id)


def notes_of_three_visibilities(world) -> dict:
    """About ``subj_p``: alice's private note, carol's note to the ws_ops team
    and an organization-wide one, each with a claim; carol's key."""
    api, alice = world["api"], world["key"]
    carol = api.key(principal="carol", scopes=ALL_SCOPES, workspaces=("ws_ops",))
    api.observe(alice, subject_id="subj_p", content="Alice's private note.", visibility="private",
                claim={"statement": "Alice keeps this to herself.", "kind": "preference", "confidence": 0.8})
    api.observe(carol, subject_id="subj_p", content="Ops team note.", visibility="team", workspace_id="ws_ops",
                claim={"statement": "The ops team knows this.", "kind": "procedural", "confidence": 0.8})
    api.observe(alice, subject_id="subj_p", content="Everyone may read this.",
                claim={"statement": "Everyone knows this.", "kind": "semantic_fact", "confidence": 0.8})
    return carol


def test_a_subject_erasure_takes_records_its_requester_cannot_read_but_counts_only_what_it_could(world):
    api, store = world["api"], world["store"]
    alice = world["key"]
    ws = notes_of_three_visibilities(world)
    api.rebuild(alice)
    bob = api.key(principal="bob", scopes="memory:erase,context:compile")
    asked = api.client.delete("/v1/subjects/subj_p", headers={"authorization": bob["authorization"]})
    assert asked.status_code == 202
    api.rebuild(alice)
    done = api.get(f"/v1/erasures/{asked.json()['data']['erasure_id']}", bob).json()["data"]
    # bob could read only the organization-wide observation and claim
    assert done["status"] == "complete"
    assert (done["counts"]["observations"], done["counts"]["claims"]) == (1, 1)
    # every record went, whoever could read it
    for key in (alice, ws):
        assert api.compile(key, "note knows this", subject_id="subj_p").json()["data"]["items"] == []
    outcomes = [json.loads(store.get(k).body) for k in store.list_keys("orgs/acme/ledger/")]
    told = [o for o in outcomes if o.get("type") == "erasure_complete"
            and o["erasure_id"] == asked.json()["data"]["erasure_id"]]
    assert (told[0]["counts"]["observations"], told[0]["counts"]["claims"]) == (3, 3)
    assert told[0]["told_counts"] == done["counts"]


@pytest.mark.parametrize("readable_first", [True, False], ids=["readable claim first", "readable claim last"])
def test_a_statement_two_erased_claims_share_counts_its_embedding_for_a_requester_who_could_read_either(
        world, readable_first):
    api = world["api"]
    alice, bob = world["key"], api.key(principal="bob", scopes="memory:erase,memory:write")
    writes = [(bob, "organization"), (alice, "private")]
    for writer, visibility in (writes if readable_first else writes[::-1]):
        api.observe(writer, subject_id="subj_q", content="Shared wording.", visibility=visibility,
                    claim={"statement": "The heron gate opens at nine.", "kind": "semantic_fact",
                           "confidence": 0.8})
    api.rebuild(alice)
    asked = api.client.delete("/v1/subjects/subj_q", headers={"authorization": bob["authorization"]})
    api.rebuild(alice)
    done = api.get(f"/v1/erasures/{asked.json()['data']['erasure_id']}", bob).json()["data"]
    assert done["status"] == "complete"
    assert (done["counts"]["claims"], done["counts"]["embeddings"]) == (1, 1)

def test_a_retried_write_whose_records_were_erased_is_a_conflict_not_a_second_copy(world):
    api, key = world["api"], world["key"]
    body = {"subject_id": "subj_x", "kind": "tool_result", "content": "once", "source": {"type": "tool", "ref": "r"},
            "visibility": "organization"}
    first = api.post("/v1/observations", body, {**key, "idempotency-key": "k-1"})
    assert first.status_code == 201
    api.rebuild(key)
    erase(world, "/v1/subjects/subj_x")
    api.rebuild(key)
    again = api.post("/v1/observations", body, {**key, "idempotency-key": "k-1"})
    assert again.status_code == 409 and "erased" in again.json()["error"]["message"]


@pytest.mark.parametrize("batch", [False, True], ids=["one write", "a batch about two subjects"])
def test_an_erasure_leaves_no_hash_of_a_keyed_request_it_erased_and_a_retry_is_still_a_conflict(world, batch):
    """The record of an Idempotency-Key holds a sha256 of the request for 24
    hours: a guessed subject and content could be confirmed against it. The
    erasure drops it (every version); the retry's 409 needs only the entry."""
    from core.writes.idempotency import request_hash
    api, key = world["api"], world["key"]
    item = {"subject_id": "subj_x", "kind": "tool_result", "content": "A guessable sentence.",
            "source": {"type": "tool", "ref": "r"}, "visibility": "organization"}
    route, body = (("/v1/observations/batch", {"items": [item, {**item, "subject_id": "subj_y"}]}) if batch
                   else ("/v1/observations", item))
    first = api.post(route, body, {**key, "idempotency-key": "k-3"})
    assert first.status_code == 201, first.text
    hashes = [request_hash({}, body)]
    api.rebuild(key)
    assert found(world, hashes)  # the record holds it until the erasure
    erase(world, "/v1/subjects/subj_x")
    api.rebuild(key)
    assert found(world, hashes) == []
    again = api.post(route, body, {**key, "idempotency-key": "k-3"})
    assert again.status_code == 409 and "erased" in again.json()["error"]["message"]
    another = {**item, "content": "Another."}
    other = api.post(route, {"items": [another]} if batch else another, {**key, "idempotency-key": "k-3"})
    assert other.status_code == 409


def test_a_keyed_write_that_only_lost_a_citation_to_an_erasure_still_replays_its_answer(world):
    """The consolidation's claim keeps other support: its stored answer still
    names what exists, so its record keeps the request's hash and an
    identical retry replays it rather than a 409 that would invite a copy."""
    api, key = world["api"], world["key"]
    kept = api.observe(key, subject_id="subj_w", content="Kept evidence.")
    gone = api.observe(key, subject_id="subj_w", content="Evidence to forget.")
    body = {"subject_id": "subj_w", "claims": [
        {"statement": "The gannet rota is supported twice.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": kept["observation_id"], "relation": "supports"},
                     {"observation_id": gone["observation_id"], "relation": "supports"}]}]}
    first = api.post("/v1/consolidations", body, {**key, "idempotency-key": "c-1"})
    assert first.status_code == 201, first.text
    api.rebuild(key)
    erase(world, f"/v1/observations/{gone['observation_id']}")
    api.rebuild(key)
    again = api.post("/v1/consolidations", body, {**key, "idempotency-key": "c-1"})
    assert again.status_code == 201, again.text
    assert again.json()["data"] == first.json()["data"] and again.json()["meta"]["idempotent_replay"] is True


def test_a_retried_write_whose_records_were_partly_erased_is_a_conflict_not_a_stale_answer(world):
    """A batch about two subjects, one of them erased: its first answer names
    an observation that no longer exists, so it is not handed back."""
    api, key = world["api"], world["key"]
    item = {"kind": "tool_result", "content": "once", "source": {"type": "tool", "ref": "r"},
            "visibility": "organization"}
    body = {"items": [{**item, "subject_id": "subj_x"}, {**item, "subject_id": "subj_y"}]}
    first = api.post("/v1/observations/batch", body, {**key, "idempotency-key": "k-2"})
    assert first.status_code == 201, first.text
    api.rebuild(key)
    erase(world, "/v1/subjects/subj_x")
    api.rebuild(key)
    stored = api.ledger_keys()
    again = api.post("/v1/observations/batch", body, {**key, "idempotency-key": "k-2"})
    assert again.status_code == 409 and "erased" in again.json()["error"]["message"]
    assert api.ledger_keys() == stored


def test_ledger_objects_restored_from_a_backup_are_erased_again_by_reapply(world):
    from core.erasure.work import reapply
    api, key, store = world["api"], world["key"], world["store"]
    backup = {k: store.get(k).body for k in store.list_keys("orgs/acme/ledger/")}  # before the erasure
    erase(world, "/v1/subjects/subj_s")
    api.rebuild(key)
    assert found(world, S_MARKS) == []
    for k, body in backup.items():  # a restore puts the old objects back over the stubs
        current = store.get(k)
        if current.body != body:
            store.compare_and_swap(k, body, current.etag)
    assert found(world, S_MARKS)
    outcome = reapply(store, "acme")
    assert sum(e["entries_stubbed"] + e["entries_rewritten"] for e in outcome["erasures"].values()) > 0
    assert found(world, S_MARKS + ["subj_s"]) == []
    # and what is served never had them back
    assert api.compile(key, f"{S_MARKS[1]} deploy", subject_id="subj_s").json()["data"]["items"] == []


def rebuild_after_a_failed_attempt(world, monkeypatch, key, where="/ledger/") -> None:
    """A first rebuild that fails at the first version purge of a key
    holding ``where`` (after its ledger purge has begun), then two that run."""
    api = world["api"]
    failed = fail_once(monkeypatch, world["store"], "purge_history", lambda k: where in k)
    assert api.post("/v1/admin/rebuild", b"", key).status_code != 200
    assert failed
    api.rebuild(key)
    api.rebuild(key)


def completion_entry(store, erasure_id: str) -> dict:
    """The erasure's ``erasure_complete`` ledger entry (the totals, for operators)."""
    outcomes = [json.loads(store.get(k).body) for k in store.list_keys("orgs/acme/ledger/")]
    (entry,) = [o for o in outcomes if o.get("type") == "erasure_complete" and o["erasure_id"] == erasure_id]
    return entry


@pytest.mark.parametrize("store", ["s3"], indirect=True)
@pytest.mark.parametrize("target", ["subject", "observation"])
def test_records_no_generation_held_count_when_an_earlier_attempt_stubbed_them(world, monkeypatch, target):
    """Written after the last rebuild and erased before the next: the first
    attempt stubs their entries and fails before publishing, so the retry
    reads only stubs and deletes no row. The records were still erased, and
    the counts say so: what an uninterrupted erasure tells."""
    api, key = world["api"], world["key"]
    u = api.observe(key, subject_id="subj_u", content="Observed: ultramarine lemming.",
                    claim={"statement": "The ultramarine lemming note holds.", "kind": "semantic_fact",
                           "confidence": 0.9})
    path = "/v1/subjects/subj_u" if target == "subject" else f"/v1/observations/{u['observation_id']}"
    asked = erase(world, path)
    rebuild_after_a_failed_attempt(world, monkeypatch, key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert (done["counts"]["observations"], done["counts"]["claims"]) == (1, 1)
    assert found(world, ["ultramarine"]) == []


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_records_no_generation_held_count_only_what_the_requester_could_read_when_an_earlier_attempt_stubbed_them(
        world, monkeypatch):
    """As test_a_subject_erasure_takes_records_its_requester_cannot_read_but_counts_only_what_it_could,
    with the records written after the last rebuild and stubbed by a failed
    first attempt: the stubs say which of them the requester could read."""
    api, store = world["api"], world["store"]
    alice = world["key"]
    notes_of_three_visibilities(world)
    bob = api.key(principal="bob", scopes="memory:erase,context:compile", workspaces=("ws_ops",))
    asked = api.client.delete("/v1/subjects/subj_p", headers={"authorization": bob["authorization"]})
    assert asked.status_code == 202
    erasure_id = asked.json()["data"]["erasure_id"]
    rebuild_after_a_failed_attempt(world, monkeypatch, alice)
    done = api.get(f"/v1/erasures/{erasure_id}", bob).json()["data"]
    assert done["status"] == "complete"
    # bob could read the team's (his workspace) and the organization-wide ones
    assert (done["counts"]["observations"], done["counts"]["claims"]) == (2, 2)
    told = completion_entry(store, erasure_id)
    assert (told["counts"]["observations"], told["counts"]["claims"]) == (3, 3)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
@pytest.mark.parametrize("interrupted", [None, "/ledger/", ".run.json"],
                         ids=["one attempt", "retried after an attempt failed", "retried after an attempt failed "
                                                                                "stubbing the packs"])
def test_a_key_with_fewer_workspaces_is_told_only_of_the_packs_and_feedback_it_could_read(
        world, monkeypatch, interrupted):
    """A pack is read by its principal through a key holding at least the
    workspaces of the key that compiled it (docs/api.md §6), so an erasure
    asked with a narrower key is told neither of a wider key's pack nor of
    the feedback sent on it; both go all the same."""
    api = world["api"]
    wide = api.key(scopes=ALL_SCOPES + ",memory:erase", workspaces=("ws_a", "ws_b"))
    narrow = api.key(scopes=ALL_SCOPES + ",memory:erase", workspaces=("ws_a",))
    api.observe(wide, subject_id="subj_w", content="Observed: saffron heron.",
                claim={"statement": "The saffron heron note holds.", "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(wide)
    wide_pack = api.compile(wide, "saffron heron", subject_id="subj_w", at=AT).json()["data"]
    narrow_pack = api.compile(narrow, "saffron heron", subject_id="subj_w", at=AT).json()["data"]
    assert wide_pack["items"] and narrow_pack["items"]
    assert api.get(f"/v1/context/{wide_pack['context_id']}", narrow).status_code == 404
    for pack, key in ((wide_pack, wide), (narrow_pack, narrow)):
        sent = api.post(f"/v1/context/{pack['context_id']}/feedback",
                        {"outcome": "useful", "claim_id": pack["items"][0]["claim_id"]}, key)
        assert sent.status_code == 201, sent.text
    asked = api.client.delete("/v1/subjects/subj_w", headers={"authorization": narrow["authorization"]})
    assert asked.status_code == 202
    erasure_id = asked.json()["data"]["erasure_id"]
    if interrupted:
        rebuild_after_a_failed_attempt(world, monkeypatch, wide, where=interrupted)
    else:
        api.rebuild(wide)
    done = api.get(f"/v1/erasures/{erasure_id}", narrow).json()["data"]
    assert done["status"] == "complete"
    assert (done["counts"]["context_runs"], done["counts"]["feedback"]) == (1, 1)
    for pack, key in ((wide_pack, wide), (narrow_pack, narrow)):
        assert api.get(f"/v1/context/{pack['context_id']}", key).status_code == 404
    told = completion_entry(world["store"], erasure_id)
    assert (told["counts"]["context_runs"], told["counts"]["feedback"]) == (2, 2)


def test_erasures_pending_together_count_each_record_once_in_the_earliest_asked(world):
    api, key = world["api"], world["key"]
    api.observe(key, subject_id="subj_o", content="Observed: cobalt marmot.",
                claim={"statement": "The cobalt marmot note holds.", "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(key)
    first = erase(world, "/v1/subjects/subj_o")
    second = erase(world, "/v1/subjects/subj_o")
    api.rebuild(key)
    counts = [status(world, e["erasure_id"]).json()["data"]["counts"] for e in (first, second)]
    assert (counts[0]["observations"], counts[0]["claims"]) == (1, 1)
    assert (counts[1]["observations"], counts[1]["claims"]) == (0, 0)


@pytest.mark.parametrize("listed", [True, False], ids=["written before the build listed the ledger",
                                                     "written after the build listed it, before its purge"])
def test_a_claim_citing_only_erased_evidence_counts_whenever_the_build_met_it(world, monkeypatch, listed):
    """A claim written while an observation's erasure is pending, citing
    only that observation, goes with it. Written after the build listed the
    new entries, it is stubbed by the build's purge (which lists the ledger
    again) and never applied by that build: it counts all the same."""
    from core.erasure.work import ErasureWork
    api, key = world["api"], world["key"]
    gone = api.observe(key, subject_id="subj_x", content="Evidence to forget.")
    api.rebuild(key)
    asked = erase(world, f"/v1/observations/{gone['observation_id']}")

    def consolidate():
        late = api.post("/v1/consolidations", {"subject_id": "subj_x", "claims": [
            {"statement": "Written while the erasure was pending.", "kind": "semantic_fact", "confidence": 0.9,
             "sources": [{"observation_id": gone["observation_id"], "relation": "supports"}]}]}, key)
        assert late.status_code == 201, late.text

    if listed:
        consolidate()
    else:
        real = ErasureWork.purge

        def consolidate_then_purge(self, db):
            consolidate()
            return real(self, db)
        monkeypatch.setattr(ErasureWork, "purge", consolidate_then_purge)
    api.rebuild(key)
    done = status(world, asked["erasure_id"]).json()["data"]
    assert done["status"] == "complete"
    assert (done["counts"]["observations"], done["counts"]["claims"]) == (1, 1)


def test_a_record_another_erasure_of_the_build_deleted_is_not_counted_again_from_the_ledger():
    """Erasures pending together may name one record: the purge takes it for
    one, the snapshot may delete it for another (they go in different
    orders); it counts once."""
    from core.snapshot.erase import Erased
    other, this = Erased(), Erased()
    other.counted.add("a" * 16)  # deleted from the snapshot for the other erasure
    deleted = set(other.counted)
    this.count_taken({"a" * 16: ("observations", True), "b" * 16: ("claims", True),
                      "c" * 16: ("claims", False)}, deleted)
    assert (this.observations, this.claims, this.visible_observations, this.visible_claims) == (0, 2, 0, 1)
    assert deleted == {"a" * 16, "b" * 16, "c" * 16}


def test_an_erasure_whose_entry_a_racing_rebuild_stored_first_is_still_answered_202(world, monkeypatch):
    """The request stores the status object, then the ledger entry; a
    rebuild in between finds the pending erasure and stores the entry
    itself. The request must not then answer 503 for an erasure that goes
    on (its retry would read zero counts)."""
    from core.erasure.work import ErasureWork
    from core.ledger import Ledger
    api, key, service = world["api"], world["key"], world["service"]
    real = Ledger.append

    def rebuild_first(self, org_id, entry_type, *args, **kwargs):
        if entry_type == "erasure":
            ErasureWork(world["store"], org_id, 0).pending()  # what a racing build does first
        return real(self, org_id, entry_type, *args, **kwargs)
    monkeypatch.setattr(Ledger, "append", rebuild_first)
    asked = api.client.delete("/v1/subjects/subj_s", headers={"authorization": key["authorization"]})
    assert asked.status_code == 202, asked.text
    monkeypatch.undo()
    api.rebuild(key)
    done = status(world, asked.json()["data"]["erasure_id"]).json()["data"]
    assert done["status"] == "complete" and done["counts"]["observations"] == 4
