"""Nothing leaks across scope: on every route, a caller from another
organization, and one without the record's visibility, sees exactly what an
unknown id shows."""

import pytest

UNKNOWN_CLAIM = "claim_" + "0" * 32
UNKNOWN_OBS = "obs_" + "0" * 32
UNKNOWN_CTX = "ctx_" + "0" * 32


def same_as_unknown(seen, unknown, seen_id, unknown_id):
    assert seen.status_code == unknown.status_code == 404, (seen.text, unknown.text)
    a, b = seen.json()["error"], unknown.json()["error"]
    assert a["code"] == b["code"] == "NOT_FOUND"
    assert a["message"].replace(seen_id, "ID") == b["message"].replace(unknown_id, "ID")


@pytest.fixture
def world(api):
    """One claim per visibility, written by alice of acme, and the outsiders."""
    alice = api.key(principal="alice", workspaces=["ws_a"])
    records = {}
    for visibility in ("private", "team", "organization"):
        extra = {"workspace_id": "ws_a"} if visibility == "team" else {}
        data = api.observe(alice, visibility=visibility, content=f"{visibility} deploy note",
                           claim={"statement": f"{visibility} deploy rule", "kind": "procedural",
                                  "confidence": 0.9}, **extra)
        records[visibility] = data
    api.rebuild(alice)
    return {"alice": alice, "records": records,
            "foreign": api.key(org="globex", principal="alice", workspaces=["ws_a"]),
            "bob": api.key(principal="bob"),  # same org, not in ws_a, not alice
            "alice_outside_ws_a": api.key(principal="alice"),  # alice's own key, without ws_a
            }


# (caller, visibility) pairs that must not see the record: each its own test id,
# so one failing outsider does not hide the rest
OUTSIDERS = [("foreign", "private"), ("foreign", "team"), ("foreign", "organization"),
             ("bob", "private"), ("bob", "team"), ("alice_outside_ws_a", "team")]
outsiders = pytest.mark.parametrize("caller_name, vis", OUTSIDERS, ids=[f"{c}-{v}" for c, v in OUTSIDERS])
# a pack holds what its compiling key could read: a key of the same principal
# without that key's workspaces may not read it back
other_callers = pytest.mark.parametrize("caller_name", ["foreign", "bob", "alice_outside_ws_a"])


@outsiders
def test_evidence_route(api, world, caller_name, vis):
    caller = world[caller_name]
    claim = world["records"][vis]["claim_id"]
    same_as_unknown(api.get(f"/v1/claims/{claim}/evidence", caller),
                    api.get(f"/v1/claims/{UNKNOWN_CLAIM}/evidence", caller), claim, UNKNOWN_CLAIM)


@outsiders
@pytest.mark.parametrize("action", ["supersede", "revoke", "expire"])
def test_transition_routes(api, world, action, caller_name, vis):
    body = {"expected_version": 1, "statement": "changed"} if action == "supersede" else {"expected_version": 1}
    caller = world[caller_name]
    claim = world["records"][vis]["claim_id"]
    before = api.ledger_keys()
    same_as_unknown(api.post(f"/v1/claims/{claim}/{action}", body, caller),
                    api.post(f"/v1/claims/{UNKNOWN_CLAIM}/{action}", body, caller), claim, UNKNOWN_CLAIM)
    assert api.ledger_keys() == before


@outsiders
def test_consolidation_citing_evidence(api, world, caller_name, vis):
    caller = world[caller_name]
    obs = world["records"][vis]["observation_id"]

    def cite(obs_id):
        return api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
            {"statement": "s", "kind": "semantic_fact", "confidence": 0.5,
             "sources": [{"observation_id": obs_id, "relation": "supports"}]}]}, caller)
    same_as_unknown(cite(obs), cite(UNKNOWN_OBS), obs, UNKNOWN_OBS)


@pytest.fixture
def stored_context(api, world):
    """A pack alice compiled: its id."""
    return api.compile(world["alice"], "deploy rule").json()["data"]["context_id"]


@other_callers
def test_stored_context_route(api, world, stored_context, caller_name):
    caller, ctx = world[caller_name], stored_context
    same_as_unknown(api.get(f"/v1/context/{ctx}", caller), api.get(f"/v1/context/{UNKNOWN_CTX}", caller),
                    ctx, UNKNOWN_CTX)


@other_callers
def test_feedback_route(api, world, stored_context, caller_name):
    caller, ctx = world[caller_name], stored_context
    same_as_unknown(api.post(f"/v1/context/{ctx}/feedback", {"outcome": "useful"}, caller),
                    api.post(f"/v1/context/{UNKNOWN_CTX}/feedback", {"outcome": "useful"}, caller),
                    ctx, UNKNOWN_CTX)


# who compiles, and the visibilities of alice's claims they may read
READERS = {"alice": {"private", "team", "organization"}, "bob": {"organization"}, "foreign": set()}


@pytest.mark.parametrize("reader", list(READERS))
def test_compile_never_sees_or_counts_what_the_caller_may_not_read(api, world, reader):
    caller, visible = world[reader], READERS[reader]
    r = api.compile(caller, "deploy rule")
    assert r.status_code == 200
    claims = {i["claim_id"] for i in r.json()["data"]["items"]}
    assert claims == {world["records"][v]["claim_id"] for v in visible}
    assert r.json()["meta"]["candidates"] == len(visible)


@pytest.mark.parametrize("reader", list(READERS))
def test_readyz_counts_only_the_claims_the_key_may_read(api, world, reader):
    ready = api.get("/readyz", world[reader]).json()["data"]
    assert ready["claim_count"] == len(READERS[reader])


@pytest.mark.parametrize("reader", ["alice", "bob"])
def test_admin_rebuild_counts_only_the_claims_the_key_may_read(api, world, reader):
    # bob holds admin too: running the organization's rebuild does not widen
    # what he reads, so alice's private and team claims stay out of his count
    assert api.rebuild(world[reader])["claim_count"] == len(READERS[reader])


def test_readyz_without_a_key_counts_no_one_s_claims(api, world):
    api.get("/readyz", world["alice"])  # acme loaded in this process
    ready = api.get("/readyz").json()["data"]
    assert ready["organizations"] == 1
    assert ready["claim_count"] is None


def test_team_visibility_follows_the_key_workspaces(api, world):
    teammate = api.key(principal="carol", workspaces=["ws_a"])
    claims = {i["claim_id"] for i in api.compile(teammate, "deploy rule").json()["data"]["items"]}
    assert claims == {world["records"]["team"]["claim_id"], world["records"]["organization"]["claim_id"]}


def test_another_subject_or_project_is_out_of_scope(api):
    key = api.key()
    api.observe(key, subject_id="user_other", claim={"statement": "deploy rule other", "kind": "procedural",
                                                      "confidence": 0.9})
    in_project = api.observe(key, project_id="proj_a", claim={"statement": "deploy rule project",
                                                               "kind": "procedural", "confidence": 0.9})
    no_project = api.observe(key, claim={"statement": "deploy rule general", "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    everything = api.compile(key, "deploy rule").json()
    assert {i["claim_id"] for i in everything["data"]["items"]} == {in_project["claim_id"], no_project["claim_id"]}
    narrowed = api.compile(key, "deploy rule", project_id="proj_a").json()
    assert [i["claim_id"] for i in narrowed["data"]["items"]] == [in_project["claim_id"]]
    assert narrowed["meta"]["candidates"] == 1
    assert api.compile(key, "deploy rule", project_id="proj_b").json()["meta"]["candidates"] == 0


def test_another_organization_never_shifts_a_score(api, tmp_path):
    from core.config import Settings
    from core.service import Service
    from conftest import Api

    def scores(with_noise):
        root = tmp_path / ("noisy" if with_noise else "quiet")
        local = Api(Service(Settings.from_env(data_dir=str(root), env={"TITEN_SNAPSHOT_TTL": "0"})))
        key = local.key()
        for text in ("deploy smoke rule", "deploy canary rule", "unrelated words entirely"):
            local.observe(key, claim={"statement": text, "kind": "procedural", "confidence": 0.9})
        if with_noise:
            other = local.key(org="globex")
            for i in range(30):
                local.observe(other, claim={"statement": f"deploy deploy smoke {i}", "kind": "procedural",
                                            "confidence": 0.9})
            local.rebuild(other)
        local.rebuild(key)
        items = local.compile(key, "deploy smoke", at="2030-01-01T00:00:00Z").json()["data"]["items"]
        return [(i["claim"], i["score"], i["score_components"]) for i in items]

    assert scores(False) == scores(True)


def test_hidden_claims_never_reach_normalization(api):
    """A strong private match of bob must not lower alice's relevance."""
    alice, bob = api.key(principal="alice"), api.key(principal="bob")
    api.observe(alice, visibility="organization",
                claim={"statement": "deploy canary", "kind": "procedural", "confidence": 0.9})
    api.observe(bob, visibility="private",
                claim={"statement": "deploy deploy deploy canary canary", "kind": "procedural", "confidence": 0.9})
    api.rebuild(alice)
    (item,) = api.compile(alice, "deploy canary").json()["data"]["items"]
    assert item["score_components"]["relevance"] == 1


def test_contradiction_by_evidence_the_reader_cannot_see_neither_marks_nor_scores(api):
    alice = api.key(principal="alice")
    bob = api.key(principal="bob")
    public = api.observe(alice, visibility="organization")
    secret = api.observe(alice, visibility="private", content="Smoke failed in my private run.")
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "deploy smoke passes", "kind": "semantic_fact", "confidence": 0.9, "sources": [
            {"observation_id": public["observation_id"], "relation": "supports"},
            {"observation_id": secret["observation_id"], "relation": "contradicts"}]}]}, alice)
    claim = r.json()["data"]["claim_ids"][0]
    api.rebuild(alice)
    seen_by_alice = api.compile(alice, "deploy smoke").json()["data"]
    seen_by_bob = api.compile(bob, "deploy smoke").json()["data"]
    assert seen_by_alice["items"][0]["status"] == "disputed" and len(seen_by_alice["conflicts"]) == 1
    assert seen_by_bob["items"][0]["status"] == "active" and seen_by_bob["conflicts"] == []
    assert seen_by_bob["items"][0]["score_components"]["conflict"] == 0
    assert seen_by_bob["items"][0]["evidence_ids"] == [public["observation_id"]]
    evidence = api.get(f"/v1/claims/{claim}/evidence", bob).json()["data"]
    assert evidence["claim"]["status"] == "active"
    assert [e["observation_id"] for e in evidence["evidence"]] == [public["observation_id"]]


def test_a_claim_on_team_evidence_from_two_workspaces_cannot_be_team_visible(api):
    key = api.key(workspaces=["ws_a", "ws_b"])
    a = api.observe(key, visibility="team", workspace_id="ws_a")
    b = api.observe(key, visibility="team", workspace_id="ws_b")
    sources = [{"observation_id": a["observation_id"], "relation": "supports"},
               {"observation_id": b["observation_id"], "relation": "supports"}]
    before = api.ledger_keys()
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "s", "kind": "semantic_fact", "confidence": 0.9, "visibility": "team",
         "workspace_id": "ws_a", "sources": sources}]}, key)
    assert r.status_code == 400 and "spans workspaces" in r.json()["error"]["message"]
    assert api.ledger_keys() == before
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "s", "kind": "semantic_fact", "confidence": 0.9, "sources": sources}]}, key)
    api.rebuild(key)
    claim = api.get(f"/v1/claims/{r.json()['data']['claim_ids'][0]}/evidence", key).json()["data"]["claim"]
    assert claim["visibility"] == "private"
