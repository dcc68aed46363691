"""Writes through HTTP: observations, consolidations, lifecycle transitions."""

import json

import pytest


def test_observation_is_acknowledged_only_once_the_ledger_holds_it(api):
    key = api.key()
    data = api.observe(key)
    assert data["observation_id"].startswith("obs_") and data["claim_id"] is None
    (entry_key,) = api.ledger_keys()
    entry = json.loads(api.service.store.get(entry_key).body)
    assert entry["type"] == "observation"
    assert entry["observation"]["observation_id"] == data["observation_id"]


def test_observation_with_a_direct_claim_takes_the_observation_trust_and_visibility(api):
    key = api.key()
    data = api.observe(key, trust="verified", visibility="organization",
                       claim={"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                              "confidence": 0.95})
    api.rebuild(key)
    r = api.get(f"/v1/claims/{data['claim_id']}/evidence", key)
    assert r.status_code == 200, r.text
    claim = r.json()["data"]["claim"]
    assert claim["trust"] == "verified" and claim["visibility"] == "organization"
    assert claim["version"] == 1 and claim["status"] == "active"
    assert [e["observation_id"] for e in r.json()["data"]["evidence"]] == [data["observation_id"]]


def test_claim_valid_from_defaults_to_its_creation_time(api):
    key = api.key()
    data = api.observe(key, claim={"statement": "x y z", "kind": "semantic_fact", "confidence": 0.5})
    api.rebuild(key)
    claim = api.get(f"/v1/claims/{data['claim_id']}/evidence", key).json()["data"]["claim"]
    assert claim["valid_from"] == claim["created_at"]


def test_consolidation_can_cite_an_observation_written_a_moment_ago(api):
    key = api.key()
    obs = api.observe(key)
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "Smoke passes on prod.", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": obs["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 201, r.text
    assert r.json()["data"]["model_used"] is False
    assert len(r.json()["data"]["claim_ids"]) == 1


def test_consolidation_trust_defaults_to_and_is_capped_by_the_strongest_supporting_evidence(api):
    key = api.key()
    obs = api.observe(key, trust="asserted")
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "capped", "kind": "semantic_fact", "confidence": 0.9, "trust": "verified",
         "sources": [{"observation_id": obs["observation_id"], "relation": "supports"}]},
        {"statement": "defaulted", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": obs["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 201, r.text
    api.rebuild(key)
    trusts = [api.get(f"/v1/claims/{c}/evidence", key).json()["data"]["claim"]["trust"]
              for c in r.json()["data"]["claim_ids"]]
    assert trusts == ["asserted", "asserted"]


def test_consolidation_visibility_defaults_to_the_narrowest_supporting_evidence(api):
    key = api.key(workspaces=["ws_deploy"])
    wide = api.observe(key, visibility="organization")
    team = api.observe(key, visibility="team", workspace_id="ws_deploy")
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "narrow", "kind": "semantic_fact", "confidence": 0.9, "sources": [
            {"observation_id": wide["observation_id"], "relation": "supports"},
            {"observation_id": team["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 201, r.text
    api.rebuild(key)
    claim = api.get(f"/v1/claims/{r.json()['data']['claim_ids'][0]}/evidence", key).json()["data"]["claim"]
    assert claim["visibility"] == "team"


def test_consolidation_wider_than_its_evidence_is_rejected(api):
    key = api.key()
    private = api.observe(key, visibility="private")
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "too wide", "kind": "semantic_fact", "confidence": 0.9, "visibility": "organization",
         "sources": [{"observation_id": private["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR"


def test_contradicted_claim_is_reported_disputed(api):
    key = api.key()
    a, b = api.observe(key), api.observe(key, content="Smoke failed.")
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "Smoke passes", "kind": "semantic_fact", "confidence": 0.9, "sources": [
            {"observation_id": a["observation_id"], "relation": "supports"},
            {"observation_id": b["observation_id"], "relation": "contradicts"}]}]}, key)
    api.rebuild(key)
    data = api.get(f"/v1/claims/{r.json()['data']['claim_ids'][0]}/evidence", key).json()["data"]
    assert data["claim"]["status"] == "disputed"
    assert {(e["observation_id"], e["relation"]) for e in data["evidence"]} == {
        (a["observation_id"], "supports"), (b["observation_id"], "contradicts")}


def test_evidence_from_another_subject_is_rejected(api):
    key = api.key()
    other = api.observe(key, subject_id="user_other")
    before = api.ledger_keys()
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "s", "kind": "semantic_fact", "confidence": 0.9,
         "sources": [{"observation_id": other["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 400
    assert api.ledger_keys() == before


def _claim(api, key, statement="Deploys need a green smoke test."):
    return api.observe(key, claim={"statement": statement, "kind": "procedural", "confidence": 0.9})["claim_id"]


def test_supersede_creates_a_new_claim_and_retires_the_old(api):
    key = api.key()
    old = _claim(api, key)
    r = api.post(f"/v1/claims/{old}/supersede", {"expected_version": 1, "statement": "Deploys need two green smokes."}, key)
    assert r.status_code == 201, r.text
    new = r.json()["data"]["claim_id"]
    assert r.json()["data"]["superseded"] == old and new != old
    api.rebuild(key)
    old_claim = api.get(f"/v1/claims/{old}/evidence", key).json()["data"]["claim"]
    new_claim = api.get(f"/v1/claims/{new}/evidence", key).json()["data"]["claim"]
    assert (old_claim["status"], old_claim["version"], old_claim["superseded_by"]) == ("superseded", 2, new)
    assert (new_claim["status"], new_claim["version"], new_claim["claim"]) == ("active", 1, "Deploys need two green smokes.")


@pytest.mark.parametrize("action,status", [("revoke", "revoked"), ("expire", "expired")])
def test_revoke_and_expire_change_status_and_bump_the_version(api, action, status):
    key = api.key()
    claim = _claim(api, key)
    r = api.post(f"/v1/claims/{claim}/{action}", {"expected_version": 1, "reason": "wrong"}, key)
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"claim_id": claim, "status": status, "version": 2}
    api.rebuild(key)
    assert api.get(f"/v1/claims/{claim}/evidence", key).json()["data"]["claim"]["status"] == status


def test_transition_with_a_stale_version_is_a_conflict_and_writes_nothing(api):
    key = api.key()
    claim = _claim(api, key)
    assert api.post(f"/v1/claims/{claim}/expire", {"expected_version": 1}, key).status_code == 200
    before = api.ledger_keys()
    r = api.post(f"/v1/claims/{claim}/revoke", {"expected_version": 1}, key)
    assert r.status_code == 409 and r.json()["error"]["code"] == "CONFLICT"
    assert api.ledger_keys() == before


def test_transition_on_a_claim_already_in_the_snapshot_uses_its_version(api):
    key = api.key()
    claim = _claim(api, key)
    api.rebuild(key)
    r = api.post(f"/v1/claims/{claim}/supersede", {"expected_version": 2, "statement": "n"}, key)
    assert r.status_code == 409
    assert api.post(f"/v1/claims/{claim}/supersede", {"expected_version": 1, "statement": "n"}, key).status_code == 201


def test_two_concurrent_transitions_of_one_version_exactly_one_wins(api):
    import threading
    key = api.key()
    claim = _claim(api, key)
    barrier, codes = threading.Barrier(2), []

    def go(action):
        barrier.wait()
        codes.append(api.post(f"/v1/claims/{claim}/{action}", {"expected_version": 1}, key).status_code)

    threads = [threading.Thread(target=go, args=(a,)) for a in ("revoke", "expire")]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(codes) == [200, 409]


def test_superseding_a_verified_claim_without_the_verify_scope_caps_trust_at_asserted(api):
    admin = api.key()
    writer = api.key(principal="writer", scopes="memory:write,context:compile")
    claim = api.observe(admin, trust="verified", claim={"statement": "Smoke is green.", "kind": "semantic_fact",
                                                        "confidence": 0.9})["claim_id"]
    r = api.post(f"/v1/claims/{claim}/supersede", {"expected_version": 1, "statement": "Smoke is red."}, writer)
    assert r.status_code == 201
    api.rebuild(admin)
    new = api.get(f"/v1/claims/{r.json()['data']['claim_id']}/evidence", admin).json()["data"]["claim"]
    assert new["trust"] == "asserted"


def test_naming_a_workspace_the_key_is_not_in_is_forbidden(api):
    key = api.key(workspaces=["ws_a"])
    r = api.post("/v1/observations", {"subject_id": "user_rama", "kind": "tool_result", "content": "c",
                                      "source": {"type": "tool", "ref": "r"}, "visibility": "organization",
                                      "workspace_id": "ws_other"}, key)
    assert r.status_code == 403
    assert api.ledger_keys() == []


def test_a_transition_completed_by_another_writer_still_succeeds(api, monkeypatch):
    """A second writer may read the head between our swap and our ledger
    write, and complete the pending entry itself; ours must not then fail."""
    key = api.key()
    claim = _claim(api, key)
    store = api.service.store
    real_put = store.put_if_absent

    def put(k, body):
        etag = real_put(k, body)
        if "/claims/" in k:  # right after the head swap, a reader repairs the entry
            api.service.writes._head(api.service.keys.authenticate(key["authorization"]), claim, k)
        return etag

    monkeypatch.setattr(store, "put_if_absent", put)
    r = api.post(f"/v1/claims/{claim}/revoke", {"expected_version": 1}, key)
    assert r.status_code == 200, r.text
    entries = [json.loads(store.get(k).body) for k in api.ledger_keys()]
    assert [e["action"] for e in entries if e["type"] == "transition"] == ["revoke"]
