"""POST /v1/observations/batch: up to 100 observations in one ledger entry,
each invalid item reported by its index and stored nowhere (docs/api.md §8)."""

import json

import pytest


def item(i, **fields):
    body = {"subject_id": "user_rama", "kind": "tool_result", "content": f"Smoke run {i} returned 200.",
            "source": {"type": "tool", "ref": f"deploy#{i}"}, "visibility": "organization",
            "claim": {"statement": f"release gate number {i} passed", "kind": "episodic_event",
                      "confidence": 0.9}}
    body.update(fields)
    return body


def test_a_hundred_items_with_three_invalid_store_97_in_one_entry(api):
    key = api.key()
    items = [item(i) for i in range(100)]
    items[4] = item(4, kind="nonsense")
    items[50]["claim"]["confidence"] = 7
    items[99] = {"subject_id": "user_rama"}
    r = api.post("/v1/observations/batch", {"items": items}, key)
    assert r.status_code == 201, r.text
    results = r.json()["data"]["results"]
    assert [x["index"] for x in results] == list(range(100))
    errors = {x["index"]: x["error"] for x in results if "error" in x}
    assert sorted(errors) == [4, 50, 99]
    assert all(e["code"] == "VALIDATION_ERROR" for e in errors.values())
    assert errors[4]["message"].startswith("items[4].kind must be one of")
    assert "items[50].claim.confidence" in errors[50]["message"]
    assert errors[99]["message"] == "items[99].kind is required"
    stored = [x["data"] for x in results if "data" in x]
    assert len(stored) == 97 and len({s["observation_id"] for s in stored}) == 97
    assert all(s["claim_id"] and s["visibility"] == "organization" for s in stored)
    assert len(api.ledger_keys()) == 1
    assert api.rebuild(key)["claim_count"] == 97
    evidence = api.get(f"/v1/claims/{results[51]['data']['claim_id']}/evidence", key).json()["data"]
    assert evidence["claim"]["claim"] == "release gate number 51 passed"
    assert [e["observation_id"] for e in evidence["evidence"]] == [results[51]["data"]["observation_id"]]


def test_an_item_answer_is_what_the_single_route_answers(api):
    key = api.key()
    single = api.post("/v1/observations", item(1), key).json()["data"]
    batch = api.post("/v1/observations/batch", {"items": [item(1)]}, key).json()["data"]["results"][0]["data"]
    assert set(batch) == set(single)
    assert {k: batch[k] for k in ("subject_id", "project_id", "trust", "visibility")} == \
        {k: single[k] for k in ("subject_id", "project_id", "trust", "visibility")}


def test_when_no_item_is_valid_the_answer_is_still_a_result_per_item_and_nothing_is_stored(api):
    key = api.key(scopes="memory:write")
    body = {"items": [item(0, kind="x"), {"content": "no"}, item(2, trust="verified")]}
    headers = {**api._headers(key), "idempotency-key": "all-bad-1"}
    r = api.client.post("/v1/observations/batch", json=body, headers=headers)
    assert r.status_code == 201
    results = r.json()["data"]["results"]
    assert [sorted(x) for x in results] == [["error", "index"]] * 3
    assert [x["error"]["code"] for x in results] == ["VALIDATION_ERROR", "VALIDATION_ERROR", "FORBIDDEN"]
    assert results[0]["error"]["message"].startswith("items[0].kind must be one of")
    assert results[2]["error"]["message"] == "items[2].trust: verified needs the memory:verify scope"
    assert api.ledger_keys() == []
    # nothing was written, so nothing is kept to replay: the retry finds the same errors
    again = api.client.post("/v1/observations/batch", json=body, headers=headers)
    assert again.status_code == 201 and again.json()["data"] == r.json()["data"]
    assert list(api.service.store.list_keys("orgs/acme/idempotency/")) == []


@pytest.mark.parametrize("body,expected", [
    ({"items": []}, "items must hold between 1 and 100 entries; got 0"),
    ({"items": [item(i) for i in range(101)]}, "items must hold between 1 and 100 entries; got 101"),
    ({"items": item(0)}, "items must be an array"),
    ({}, "items is required"),
    ({"items": [item(0)], "org_id": "globex"}, "body: unknown field 'org_id'"),
])
def test_a_malformed_batch_is_a_validation_error_and_stores_nothing(api, body, expected):
    r = api.post("/v1/observations/batch", body, api.key())
    assert r.status_code == 400 and r.json()["error"]["message"] == expected
    assert api.ledger_keys() == []


def test_an_item_that_is_not_an_object_is_reported_by_its_index(api):
    r = api.post("/v1/observations/batch", {"items": [item(0), "text", 7]}, api.key())
    results = r.json()["data"]["results"]
    assert [x["error"]["message"] for x in results[1:]] == ["items[1] must be a JSON object",
                                                           "items[2] must be a JSON object"]


def test_an_item_with_a_confidence_past_a_floats_range_is_reported_alone(api):
    key = api.key()
    bad = item(1)
    bad["claim"]["confidence"] = 10 ** 400
    results = api.post("/v1/observations/batch", {"items": [item(0), bad]}, key).json()["data"]["results"]
    assert "data" in results[0]
    assert results[1]["error"]["code"] == "VALIDATION_ERROR"
    assert results[1]["error"]["message"].startswith("items[1].claim.confidence must be between 0")
    assert api.rebuild(key)["claim_count"] == 1

def test_the_whole_batch_is_still_limited_to_one_mebibyte(api):
    items = [item(i, content="x" * 30_000) for i in range(40)]
    assert len(json.dumps({"items": items})) > 1 << 20
    r = api.post("/v1/observations/batch", {"items": items}, api.key())
    assert r.status_code == 413 and api.ledger_keys() == []


def test_an_item_asking_for_what_the_key_may_not_do_is_forbidden_alone(api):
    writer = api.key(principal="ci-bot", scopes="memory:write", workspaces=("ws_ci",))
    r = api.post("/v1/observations/batch", {"items": [
        item(0, trust="verified"), item(1, visibility="team", workspace_id="ws_deploy"),
        item(2, visibility="team", workspace_id="ws_ci"), item(3, trust="policy_approved")]}, writer)
    assert r.status_code == 201
    results = r.json()["data"]["results"]
    assert [x.get("error", {}).get("code") for x in results] == ["FORBIDDEN", "FORBIDDEN", None, "VALIDATION_ERROR"]
    assert "items[1]: this key is not a member of workspace ws_deploy" == results[1]["error"]["message"]


def test_the_route_needs_the_memory_write_scope(api):
    r = api.post("/v1/observations/batch", {"items": [item(0)]}, api.key(scopes="context:compile"))
    assert r.status_code == 403 and api.ledger_keys() == []


def test_a_batch_observation_can_be_cited_at_once_and_reads_as_unknown_to_another_organization(api):
    key = api.key()
    obs = api.post("/v1/observations/batch", {"items": [item(0), item(1)]}, key).json()
    cited = obs["data"]["results"][1]["data"]["observation_id"]
    body = {"subject_id": "user_rama", "claims": [{"statement": "Smoke gates releases.", "kind": "procedural",
                                                    "confidence": 0.9,
                                                    "sources": [{"observation_id": cited, "relation": "supports"}]}]}
    assert api.post("/v1/consolidations", body, key).status_code == 201
    foreign = api.post("/v1/consolidations", body, api.key(org="globex"))
    unknown_id = "obs_" + "0" * 32
    unknown = api.post("/v1/consolidations", json.loads(json.dumps(body).replace(cited, unknown_id)),
                       api.key(org="globex"))
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json()["error"]["message"] == unknown.json()["error"]["message"].replace(unknown_id, cited)


def test_private_batch_items_stay_private_to_their_writer(api):
    alice, bob = api.key(), api.key(principal="bob")
    api.post("/v1/observations/batch", {"items": [item(0, visibility="private")]}, alice)
    api.rebuild(alice)
    task = "release gate number 0 passed"
    assert [i["claim"] for i in api.compile(alice, task).json()["data"]["items"]] == [task]
    assert api.compile(bob, task).json()["data"]["items"] == []


def test_a_consolidation_citing_many_observations_of_one_batch_reads_that_entry_once(api, monkeypatch):
    from core.ledger import Ledger
    key = api.key()
    stored = api.post("/v1/observations/batch", {"items": [item(i) for i in range(60)]}, key).json()["data"]
    ids = [x["data"]["observation_id"] for x in stored["results"]]
    reads = []
    real_read = Ledger.read

    def counting_read(self, org_id, entry_hex, *args, **kwargs):
        reads.append(entry_hex)
        return real_read(self, org_id, entry_hex, *args, **kwargs)

    monkeypatch.setattr(Ledger, "read", counting_read)
    claims = [{"statement": f"gate {i} holds", "kind": "procedural", "confidence": 0.8,
               "sources": [{"observation_id": o, "relation": "supports"} for o in ids[i:i + 10]]}
              for i in range(0, 50, 5)]
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": claims}, key)
    assert r.status_code == 201, r.text
    assert len(reads) == 1 == len(set(reads))
