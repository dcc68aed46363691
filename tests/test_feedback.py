"""Feedback closes the loop: checked against the stored pack at once."""

import json

import pytest


@pytest.fixture
def pack(api):
    key = api.key()
    claim = api.observe(key, claim={"statement": "Deploy smoke must pass.", "kind": "procedural",
                                    "confidence": 0.9})["claim_id"]
    api.rebuild(key)
    data = api.compile(key, "deploy smoke").json()["data"]
    assert [i["claim_id"] for i in data["items"]] == [claim]
    return {"key": key, "claim": claim, "context": data["context_id"]}


def test_feedback_is_accepted_at_once_and_echoed(api, pack):
    r = api.post(f"/v1/context/{pack['context']}/feedback", {"outcome": "useful", "claim_id": pack["claim"]},
                 pack["key"])
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert data["feedback_id"].startswith("fb_")
    assert (data["context_id"], data["claim_id"], data["outcome"]) == (pack["context"], pack["claim"], "useful")
    assert data["recorded_at"].endswith("Z")


def test_feedback_without_a_claim_is_recorded_for_the_pack(api, pack):
    r = api.post(f"/v1/context/{pack['context']}/feedback", {"outcome": "irrelevant"}, pack["key"])
    assert r.status_code == 201 and r.json()["data"]["claim_id"] is None


def test_feedback_from_a_second_principal_is_not_found(api, pack):
    bob = api.key(principal="bob")
    r = api.post(f"/v1/context/{pack['context']}/feedback", {"outcome": "useful"}, bob)
    assert r.status_code == 404


def test_feedback_to_an_unknown_context_is_not_found(api, pack):
    r = api.post(f"/v1/context/ctx_{'0' * 32}/feedback", {"outcome": "useful"}, pack["key"])
    assert r.status_code == 404


def test_feedback_naming_a_claim_not_in_the_pack_is_not_found_and_writes_nothing(api, pack):
    other = api.observe(pack["key"], claim={"statement": "unrelated", "kind": "procedural",
                                            "confidence": 0.9})["claim_id"]
    before = api.ledger_keys()
    r = api.post(f"/v1/context/{pack['context']}/feedback", {"outcome": "useful", "claim_id": other}, pack["key"])
    assert r.status_code == 404
    assert api.ledger_keys() == before


def _utility(api, key):
    (item,) = api.compile(key, "deploy smoke").json()["data"]["items"]
    return item["score_components"]["utility"]


def test_three_useful_signals_on_three_packs_move_utility_to_one(api, pack):
    key, claim = pack["key"], pack["claim"]
    contexts = [pack["context"]] + [api.compile(key, "deploy smoke").json()["data"]["context_id"] for _ in range(2)]
    for i, ctx in enumerate(contexts):
        assert api.post(f"/v1/context/{ctx}/feedback", {"outcome": "useful", "claim_id": claim}, key).status_code == 201
        api.rebuild(key)
        assert _utility(api, key) == (1 if i == 2 else 0.5)


def test_repeating_feedback_on_one_pack_cannot_inflate_utility(api, pack):
    key, claim = pack["key"], pack["claim"]
    for _ in range(4):
        assert api.post(f"/v1/context/{pack['context']}/feedback",
                        {"outcome": "useful", "claim_id": claim}, key).status_code == 201
    api.rebuild(key)
    assert _utility(api, key) == 0.5


def test_the_latest_outcome_for_a_pack_and_claim_wins(api, pack):
    key, claim = pack["key"], pack["claim"]
    contexts = [pack["context"]] + [api.compile(key, "deploy smoke").json()["data"]["context_id"] for _ in range(2)]
    for ctx in contexts:
        api.post(f"/v1/context/{ctx}/feedback", {"outcome": "useful", "claim_id": claim}, key)
    api.post(f"/v1/context/{contexts[0]}/feedback", {"outcome": "harmful", "claim_id": claim}, key)
    api.rebuild(key)
    assert _utility(api, key) == pytest.approx(((2 - 1) / 3 + 1) / 2, abs=1e-6)


def test_feedback_on_the_whole_pack_is_kept_but_causes_no_new_generation(api, pack):
    before = api.ledger_keys()
    r = api.post(f"/v1/context/{pack['context']}/feedback", {"outcome": "useful"}, pack["key"])
    assert r.status_code == 201
    (new_key,) = set(api.ledger_keys()) - set(before)
    assert json.loads(api.service.store.get(new_key).body)["feedback_id"] == r.json()["data"]["feedback_id"]
    assert api.rebuild(pack["key"])["published"] is False
