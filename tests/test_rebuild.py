"""Snapshot build and publication: skew, idempotence, replay, crashes, races."""

import json
import threading

import pytest

from core.errors import NotFound, Unavailable

from core.ids import uuid7_hex
from core.instants import canonical, from_ms
from core.ledger import encode
from core.layout import entry_key
from core.snapshot.publish import RebuildConflict
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer
from core.storage.local import LocalStore


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


@pytest.mark.parametrize("body", [
    b"{broken", b"\xff\xfe", b"[1, 2]", b"{}",
    b'{"type": "bogus", "org_id": "acme"}',                                 # a type no build applies
    b'{"type": "observation", "org_id": "acme"}',                           # without its observation
    b'{"type": "observation", "org_id": "acme", "observation": "a text"}',  # a field of the wrong shape
    b'{"type": "transition", "org_id": "acme", "claim_id": null}'])
def test_a_damaged_ledger_entry_stops_the_build_naming_the_object(store, tmp_path, body):
    from core.ledger import DamagedEntry
    _write(store, "acme", "fact one")
    _builder(store, tmp_path).rebuild()
    _write(store, "acme", "fact two")
    damaged = _write(store, "acme", "fact three")
    key = entry_key("acme", damaged[len("claim_"):][:28] + "0000")
    store.delete(key)
    store.put_if_absent(key, body)
    with pytest.raises(DamagedEntry, match=f"ledger entry {key} is damaged"):
        _builder(store, tmp_path).rebuild()
    assert read_pointer(store, "acme")[0]["generation"] == 1  # the published generation stands


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


def test_a_kept_copy_changed_in_place_is_not_built_upon(store, tmp_path):
    """The kept copy is verified against its page digests before a build
    takes it: a file changed in place at the same size (the record beside
    it still matching the pointer) is fetched again from the store."""
    import apsw
    import os
    _write(store, "acme", "Canary deploys wait for smoke.")
    _builder(store, tmp_path).rebuild()
    kept = tmp_path / "work" / "kept-acme.sqlite"
    raw = kept.read_bytes()
    assert b"Canary deploys" in raw
    kept.write_bytes(raw.replace(b"Canary deploys", b"EVIL!! deploys"))
    assert os.path.getsize(kept) == len(raw)
    _write(store, "acme", "A second fact.")
    notes = []
    _builder(store, tmp_path, progress=notes.append).rebuild()
    assert not any("kept locally" in n for n in notes)
    pointer, _ = read_pointer(store, "acme")
    path = str(tmp_path / "check.sqlite")
    store.download_file(pointer["snapshot_key"], path)
    db = apsw.Connection(path)
    statements = sorted(r[0] for r in db.execute("SELECT statement FROM claims"))
    db.close()
    assert statements == ["A second fact.", "Canary deploys wait for smoke."]


def test_a_snapshot_of_another_schema_version_is_replayed_not_extended(store, tmp_path, monkeypatch):
    import core.snapshot.build
    ids = {_write(store, "acme", f"fact {i}") for i in range(4)}
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.snapshot.build, "SCHEMA_VERSION", 99)
    monkeypatch.setattr(core.snapshot.build, "DDL", core.snapshot.build.DDL)
    result = _builder(store, tmp_path).rebuild(force=True)
    assert result.entries_applied == 4 and result.generation == 2
    assert _claim_ids(store, tmp_path) == ids


def test_a_snapshot_indexed_with_other_word_rules_is_replayed_not_extended(store, tmp_path, monkeypatch):
    """Another stemmer (or other bigram rules) made the words its claims_fts
    holds: edited incrementally, postings would be taken out under other
    words than they were put in under."""
    import core.snapshot.build
    ids = {_write(store, "acme", f"fact {i}") for i in range(4)}
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.snapshot.build, "WORDS_ID", "words-0 another stemmer")
    builder = _builder(store, tmp_path)
    result = builder.rebuild(force=True)
    assert result.entries_applied == 4 and result.generation == 2
    assert any("indexed words with other rules" in note for note in result.notes)
    assert _claim_ids(store, tmp_path) == ids


def test_an_incremental_build_adds_an_index_its_base_was_built_without(store, tmp_path, monkeypatch):
    """LATER_INDEXES: a generation built before an index was added is
    extended, not replayed, and gains the index."""
    import apsw
    import core.snapshot.build
    from core.snapshot.schema import DDL, LATER_INDEXES
    ids = {_write(store, "acme", f"fact {i}") for i in range(4)}
    monkeypatch.setattr(core.snapshot.build, "DDL", DDL.replace(LATER_INDEXES, ""))
    monkeypatch.setattr(core.snapshot.build, "LATER_INDEXES", "")
    _builder(store, tmp_path).rebuild()
    monkeypatch.undo()

    def indexes():
        pointer, _ = read_pointer(store, "acme")
        path = str(tmp_path / f"check-{pointer['generation']}.sqlite")
        store.download_file(pointer["snapshot_key"], path)
        db = apsw.Connection(path)
        names = {name for name, in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        db.close()
        return names

    assert "claims_valid" not in indexes()
    ids.add(_write(store, "acme", "new"))
    result = _builder(store, tmp_path).rebuild()
    assert result.entries_applied == 1 and not result.notes  # extended, not replayed
    assert "claims_valid" in indexes()
    assert _claim_ids(store, tmp_path) == ids


def test_a_build_with_nothing_new_leaves_a_generation_without_a_later_index_as_it_is(store, tmp_path, monkeypatch):
    """The index is added by the first build that publishes: one that finds
    nothing new changes nothing, so its kept copy serves the next build and
    nothing is downloaded again."""
    import core.snapshot.build
    from core.snapshot.schema import DDL, LATER_INDEXES
    for i in range(4):
        _write(store, "acme", f"fact {i}")
    monkeypatch.setattr(core.snapshot.build, "DDL", DDL.replace(LATER_INDEXES, ""))
    monkeypatch.setattr(core.snapshot.build, "LATER_INDEXES", "")
    _builder(store, tmp_path).rebuild()
    monkeypatch.undo()
    fetched = []
    real = core.snapshot.build.fetch_whole
    monkeypatch.setattr(core.snapshot.build, "fetch_whole", lambda *a, **k: (fetched.append(1), real(*a, **k))[1])
    results = [_builder(store, tmp_path).rebuild() for _ in range(3)]
    assert [r.published for r in results] == [False, False, False]
    assert fetched == []


def test_a_reader_refuses_a_generation_of_another_schema_version(store, tmp_path, monkeypatch):
    import core.snapshot.reader
    from core.snapshot.reader import SnapshotReader
    _write(store, "acme", "fact")
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.snapshot.reader, "SCHEMA_VERSION", 99)
    reader = SnapshotReader(store, str(tmp_path / "cache"), ttl_seconds=0)
    with pytest.raises(Unavailable, match="schema version"):  # never an empty answer
        reader.current("acme")
    assert "schema version" in reader.status("acme")["last_refresh_error"]


# -- incremental builds: the kept file, the content sums, the candidate index ----

def _published_copy(service, tmp_path, name):
    pointer, _ = read_pointer(service.store, "acme")
    path = str(tmp_path / name)
    service.store.download_file(pointer["snapshot_key"], path)
    return pointer, path


def _lifecycle_steps(api, key):
    """Each step writes entries of another kind; a rebuild follows each."""
    claims = []

    def observe(text):
        claims.append(api.observe(key, content=text, claim={"statement": text, "kind": "semantic_fact",
                                                            "confidence": 0.8})["claim_id"])

    yield lambda: [observe(f"deploy step {i} needs smoke test {i % 3}") for i in range(12)]
    yield lambda: [observe(f"rollback plan {i} for the deploy") for i in range(4)]

    def disputes():
        a, b = api.observe(key), api.observe(key, content="Smoke failed twice.")
        api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
            {"statement": "Smoke deploy passes", "kind": "semantic_fact", "confidence": 0.9, "sources": [
                {"observation_id": a["observation_id"], "relation": "supports"},
                {"observation_id": b["observation_id"], "relation": "contradicts"}]}]}, key)
    yield disputes

    def transitions():
        assert api.post(f"/v1/claims/{claims[0]}/supersede", {"expected_version": 1,
                                                              "statement": "deploy needs two smokes"},
                        key).status_code == 201
        assert api.post(f"/v1/claims/{claims[1]}/revoke", {"expected_version": 1}, key).status_code == 200
        assert api.post(f"/v1/claims/{claims[2]}/expire", {"expected_version": 1}, key).status_code == 200
    yield transitions

    def feedback():
        pack = api.compile(key, "deploy smoke test").json()["data"]
        for item in pack["items"][:2]:
            r = api.post(f"/v1/context/{pack['context_id']}/feedback",
                         {"outcome": "useful", "claim_id": item["claim_id"]}, key)
            assert r.status_code == 201, r.text
    yield feedback


def test_incremental_builds_keep_the_content_hash_and_the_candidate_index_exact(api, tmp_path, monkeypatch):
    import apsw

    from core import lexical
    from core.snapshot import content_hash
    scan = content_hash.scan
    scans = []
    monkeypatch.setattr(content_hash, "scan", lambda db: (scans.append(1), scan(db))[1])
    key = api.key()
    for i, step in enumerate(_lifecycle_steps(api, key)):
        step()
        builder = api.service.builder("acme")
        result = builder.rebuild().as_dict()
        # only the first build (from empty) reads every row and writes the index whole;
        # feedback moves no claim in or out of the index, so its build leaves the postings be
        assert builder.lexical_stats["mode"] == ("whole" if i == 0 else "unchanged" if i == 4 else "incremental")
        assert len(scans) == 1
        pointer, path = _published_copy(api.service, tmp_path, f"g{i}.sqlite")
        db = apsw.Connection(path)
        stored = content_hash.decode(db.execute("SELECT value FROM meta WHERE key = ?",
                                                (content_hash.META_KEY,)).fetchone()[0])
        assert stored == scan(db)  # the sums kept row by row are the sums of the rows
        assert content_hash.digest(stored) == pointer["content_hash"] == result["content_hash"]
        incremental = _lex_content(db)
        with db:
            lexical.build_lexical_index(db)
        assert incremental == _lex_content(db)
        db.close()
    scratch = api.service.builder("acme").rebuild(from_scratch=True)
    assert scratch.content_hash == result["content_hash"]


def _lex_content(db) -> tuple:
    """The candidate index's statistics, lists (blocks joined) and df."""
    lists: dict = {}
    for subject_id, reader, term, rowids, tfdl in db.execute(
            "SELECT subject_id, reader, term, rowids, tfdl FROM lex_postings"
            " ORDER BY subject_id, reader, term, first_rowid"):
        rows, inputs = lists.setdefault((subject_id, reader, term), (bytearray(), bytearray()))
        rows += rowids
        inputs += tfdl
    return (db.execute("SELECT * FROM lex_stats").fetchall(),
            sorted((k, bytes(r), bytes(t)) for k, (r, t) in lists.items()),
            db.execute("SELECT * FROM lex_terms ORDER BY term").fetchall())


def test_an_incremental_build_starts_from_the_kept_file_without_downloading(store, tmp_path, monkeypatch):
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    downloads = []
    real = type(store).download_file
    monkeypatch.setattr(type(store), "download_file", lambda self, k, p: (downloads.append(k), real(self, k, p)))
    _write(store, "acme", "two")
    result = _builder(store, tmp_path).rebuild()
    assert result.entries_applied == 1 and downloads == []
    assert len(_claim_ids(store, tmp_path)) == 2


def test_a_build_with_nothing_new_keeps_the_file_for_the_next_one(store, tmp_path, monkeypatch):
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    assert not _builder(store, tmp_path).rebuild().published
    downloads = []
    real = type(store).download_file
    monkeypatch.setattr(type(store), "download_file", lambda self, k, p: (downloads.append(k), real(self, k, p)))
    _write(store, "acme", "two")
    assert _builder(store, tmp_path).rebuild().entries_applied == 1 and downloads == []
    assert len(_claim_ids(store, tmp_path)) == 2


def test_a_kept_file_of_another_generation_is_not_used(store, tmp_path, monkeypatch):
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    _write(store, "acme", "two")
    _builder(store, tmp_path / "elsewhere").rebuild()  # generation 2, kept in another work directory
    downloads = []
    real = type(store).download_file
    monkeypatch.setattr(type(store), "download_file", lambda self, k, p: (downloads.append(k), real(self, k, p)))
    _write(store, "acme", "three")
    result = _builder(store, tmp_path).rebuild()  # its kept file is generation 1
    assert result.generation == 3 and result.entries_applied == 1 and len(downloads) == 1
    assert len(_claim_ids(store, tmp_path)) == 3


def test_a_kept_file_from_before_a_restart_is_not_trusted(store, tmp_path, monkeypatch):
    import core.snapshot.keep
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    monkeypatch.setattr(core.snapshot.keep, "_boot_id", lambda: "another boot")  # written unsynced: may be torn
    downloads = []
    real = type(store).download_file
    monkeypatch.setattr(type(store), "download_file", lambda self, k, p: (downloads.append(k), real(self, k, p)))
    _write(store, "acme", "two")
    assert _builder(store, tmp_path).rebuild().entries_applied == 1 and len(downloads) == 1
    assert len(_claim_ids(store, tmp_path)) == 2


def test_a_published_file_beyond_the_keep_budget_is_not_kept(store, tmp_path):
    _write(store, "acme", "one")
    _builder(store, tmp_path, keep_bytes=0).rebuild()
    assert not [n for n in (tmp_path / "work").iterdir() if n.name.startswith("kept-")]


# -- rollback ------------------------------------------------------------------------

def test_rollback_serves_a_kept_generation_again_as_a_new_generation(store, tmp_path):
    from core.snapshot.rollback import rollback
    _write(store, "acme", "one")
    first = _builder(store, tmp_path).rebuild()
    _write(store, "acme", "two")
    _builder(store, tmp_path).rebuild()
    answer = rollback(store, "acme", 1)
    pointer, _ = read_pointer(store, "acme")
    assert answer == {"org_id": "acme", "generation": 3, "serving": 1}
    assert (pointer["snapshot_key"], pointer["content_hash"], pointer["bytes"], pointer["rolled_back_to"]) == (
        first.snapshot_key, first.content_hash, first.snapshot_bytes, 1)
    assert len(_claim_ids(store, tmp_path)) == 1


def test_the_build_after_a_rollback_applies_the_entries_after_its_watermark_again(store, tmp_path):
    from core.snapshot.rollback import rollback
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    ids = {_write(store, "acme", "two"), _write(store, "acme", "three")}
    _builder(store, tmp_path).rebuild()
    rollback(store, "acme", 1)
    result = _builder(store, tmp_path).rebuild()  # its kept file is generation 2: not what the pointer names
    assert result.generation == 4 and result.entries_applied == 2
    assert ids < _claim_ids(store, tmp_path)


def test_rollback_to_a_generation_no_longer_kept_changes_nothing(store, tmp_path):
    from core.snapshot.rollback import rollback
    _write(store, "acme", "one")
    _builder(store, tmp_path).rebuild()
    before = read_pointer(store, "acme")
    with pytest.raises(NotFound, match="generation 7 is not kept; kept generations: 1"):
        rollback(store, "acme", 7)
    assert read_pointer(store, "acme") == before
