"""Writes you can retry (docs/api.md §12): the Idempotency-Key on every write route."""

import json
import os
import threading
from datetime import timedelta

import pytest

from core.layout import idempotency_prefix
from core.instants import canonical, now_utc
from core.storage import StoreError
from core.writes.idempotency import request_hash

OBSERVATION = {"subject_id": "user_rama", "kind": "tool_result", "content": "Production smoke returned 200.",
               "source": {"type": "tool", "ref": "deploy_456#smoke"}, "visibility": "organization",
               "claim": {"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                         "confidence": 0.9}}


def keyed(key, idempotency_key):
    return {**key, "Idempotency-Key": idempotency_key}


def records(api, org="acme"):
    return list(api.service.store.list_keys(idempotency_prefix(org)))


# -- each write route, prepared so that one body is valid and another differs --

def _claim(api, key):
    return api.observe(key, claim={"statement": "Deploy on Fridays is allowed.", "kind": "procedural",
                                   "confidence": 0.8})["claim_id"]


def _observation_route(api, key):
    return "/v1/observations", OBSERVATION, {**OBSERVATION, "content": "Production smoke returned 500."}


def _batch_route(api, key):
    return ("/v1/observations/batch", {"items": [OBSERVATION, {**OBSERVATION, "content": "Second."}]},
            {"items": [OBSERVATION]})


def _consolidation_route(api, key):
    obs = api.observe(key)["observation_id"]
    body = {"subject_id": "user_rama", "claims": [{"statement": "Smoke gates the release.", "kind": "procedural",
                                                    "confidence": 0.9,
                                                    "sources": [{"observation_id": obs, "relation": "supports"}]}]}
    other = json.loads(json.dumps(body))
    other["claims"][0]["confidence"] = 0.5
    return "/v1/consolidations", body, other


def _transition_route(action):
    def prepare(api, key):
        claim_id = _claim(api, key)
        body = {"expected_version": 1, "reason": "checked"}
        if action == "supersede":
            body["statement"] = "Deploy on Fridays needs a second approver."
        return f"/v1/claims/{claim_id}/{action}", body, {**body, "reason": "another reason"}
    return prepare


def _feedback_route(api, key):
    claim_id = _claim(api, key)
    api.rebuild(key)
    pack = api.compile(key, "deploy on fridays").json()["data"]
    assert [i["claim_id"] for i in pack["items"]] == [claim_id]
    body = {"outcome": "useful", "claim_id": claim_id}
    return f"/v1/context/{pack['context_id']}/feedback", body, {**body, "outcome": "harmful"}


ROUTES = {
    "observation": _observation_route,
    "batch": _batch_route,
    "consolidation": _consolidation_route,
    "supersede": _transition_route("supersede"),
    "revoke": _transition_route("revoke"),
    "expire": _transition_route("expire"),
    "feedback": _feedback_route,
}


@pytest.fixture(params=sorted(ROUTES))
def route(request, api):
    key = api.key()
    path, body, other = ROUTES[request.param](api, key)
    return key, path, body, other


def test_a_retried_write_replays_the_first_answer_and_stores_nothing(api, route):
    key, path, body, _ = route
    before = len(api.ledger_keys())
    first = api.post(path, body, keyed(key, "retry-1"))
    assert first.status_code in (200, 201), first.text
    second = api.post(path, body, keyed(key, "retry-1"))
    assert second.status_code == first.status_code
    assert second.json()["data"] == first.json()["data"]
    assert first.json()["meta"]["idempotent_replay"] is False
    assert second.json()["meta"]["idempotent_replay"] is True
    assert len(api.ledger_keys()) == before + 1


def test_eight_concurrent_duplicates_store_exactly_once(api, route):
    key, path, body, _ = route
    before = len(api.ledger_keys())
    answers = [None] * 8
    start = threading.Barrier(8)

    def send(i):
        start.wait()
        answers[i] = api.post(path, body, keyed(key, "burst"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {a.status_code for a in answers} == {answers[0].status_code} and answers[0].status_code < 300, \
        [a.text for a in answers]
    assert all(a.json()["data"] == answers[0].json()["data"] for a in answers)
    assert sorted(a.json()["meta"]["idempotent_replay"] for a in answers) == [False] + [True] * 7
    assert len(api.ledger_keys()) == before + 1


def test_another_body_under_a_used_key_is_a_conflict_and_stores_nothing(api, route):
    key, path, body, other = route
    assert api.post(path, body, keyed(key, "k")).status_code < 300
    before = api.ledger_keys()
    r = api.post(path, other, keyed(key, "k"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "CONFLICT", r.text
    assert "Idempotency-Key" in r.json()["error"]["message"]
    assert api.ledger_keys() == before


def test_the_same_observation_without_a_key_is_stored_twice(api):
    key = api.key()
    first = api.post("/v1/observations", OBSERVATION, key).json()
    second = api.post("/v1/observations", OBSERVATION, key).json()
    assert first["data"]["observation_id"] != second["data"]["observation_id"]
    assert "idempotent_replay" not in first["meta"]
    assert len(api.ledger_keys()) == 2


def test_json_formatting_is_not_a_different_body(api):
    key = api.key()
    first = api.post("/v1/observations", json.dumps(OBSERVATION), keyed(key, "k")).json()
    spaced = json.dumps(dict(reversed(list(OBSERVATION.items()))), indent=2)
    again = api.post("/v1/observations", spaced, keyed(key, "k"))
    assert again.status_code == 201 and again.json()["data"] == first["data"]


@pytest.mark.parametrize("nulls", [{"project_id": None}, {"occurred_at": None, "workspace_id": None},
                                   {"claim": {**OBSERVATION["claim"], "valid_to": None}}])
def test_a_null_field_is_the_same_request_as_the_field_absent(api, nulls):
    # api.md §4: null means absent, so a client whose serializer adds nulls on its retry replays
    key = api.key()
    first = api.post("/v1/observations", OBSERVATION, keyed(key, "k")).json()
    stored = api.ledger_keys()
    again = api.post("/v1/observations", {**OBSERVATION, **nulls}, keyed(key, "k"))
    assert again.status_code == 201, again.text
    assert again.json()["data"] == first["data"] and again.json()["meta"]["idempotent_replay"] is True
    assert api.ledger_keys() == stored


@pytest.mark.parametrize("first, retry", [(1, 1.0), (1.0, 1), (1, 1e0)], ids=["1 then 1.0", "1.0 then 1", "1 then 1e0"])
def test_an_integer_written_as_a_float_is_the_same_request(api, first, retry):
    # api.md §4: 1.0 and 1e0 are the integer 1, so a serializer that writes numbers as floats replays
    key = api.key()
    claim = _claim(api, key)
    answer = api.post(f"/v1/claims/{claim}/revoke", json.dumps({"expected_version": first}), keyed(key, "k"))
    assert answer.status_code == 200, answer.text
    stored = api.ledger_keys()
    again = api.post(f"/v1/claims/{claim}/revoke", json.dumps({"expected_version": retry}), keyed(key, "k"))
    assert again.status_code == 200, again.text
    assert again.json()["data"] == answer.json()["data"] and again.json()["meta"]["idempotent_replay"] is True
    assert api.ledger_keys() == stored


def test_a_fraction_a_float_rounds_away_is_not_the_whole_number_it_rounds_to(api):
    # api.md §4: 1.00000000000000000001 is no integer, though a float reads it as 1
    key = api.key()
    claim = _claim(api, key)
    answer = api.post(f"/v1/claims/{claim}/revoke", json.dumps({"expected_version": 1}), keyed(key, "k"))
    assert answer.status_code == 200, answer.text
    stored = api.ledger_keys()
    again = api.post(f"/v1/claims/{claim}/revoke", '{"expected_version": 1.00000000000000000001}', keyed(key, "k"))
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "CONFLICT"
    assert api.ledger_keys() == stored


def test_a_confidence_a_float_rounds_to_one_is_the_same_request_as_one(api):
    # api.md §4: a number field takes 0.99999999999999999999 as the float it rounds to, 1.0
    key = api.key()
    one = {**OBSERVATION, "claim": {**OBSERVATION["claim"], "confidence": 1}}
    first = api.post("/v1/observations", json.dumps(one), keyed(key, "k")).json()
    stored = api.ledger_keys()
    rounds_to_one = json.dumps(one).replace('"confidence": 1', '"confidence": 0.99999999999999999999')
    again = api.post("/v1/observations", rounds_to_one, keyed(key, "k"))
    assert again.status_code == 201, again.text
    assert again.json()["data"] == first["data"] and again.json()["meta"]["idempotent_replay"] is True
    assert api.ledger_keys() == stored


def test_a_confidence_of_one_written_either_way_is_the_same_request(api):
    key = api.key()
    one = {**OBSERVATION, "claim": {**OBSERVATION["claim"], "confidence": 1}}
    first = api.post("/v1/observations", json.dumps(one), keyed(key, "k")).json()
    again = api.post("/v1/observations", json.dumps(one).replace('"confidence": 1', '"confidence": 1.0'),
                     keyed(key, "k"))
    assert again.status_code == 201, again.text
    assert again.json()["data"] == first["data"] and again.json()["meta"]["idempotent_replay"] is True


def test_a_record_hashed_before_integral_floats_were_read_as_integers_still_replays(api):
    # a retry that spans the release replays instead of answering 409 (core/writes/idempotency.py)
    key = api.key()
    one = {**OBSERVATION, "claim": {**OBSERVATION["claim"], "confidence": 1.0}}
    first = api.post("/v1/observations", json.dumps(one), keyed(key, "k")).json()
    store = api.service.store
    [rkey] = records(api)
    obj = store.get(rkey)
    record = json.loads(obj.body)
    record["request_hash"] = request_hash({}, one, integral_floats=False)
    assert record["request_hash"] != request_hash({}, one)
    store.compare_and_swap(rkey, json.dumps(record).encode(), obj.etag)
    again = api.post("/v1/observations", json.dumps(one), keyed(key, "k"))
    assert again.status_code == 201, again.text
    assert again.json()["data"] == first["data"] and again.json()["meta"]["idempotent_replay"] is True


def test_a_key_is_per_route(api):
    key = api.key()
    obs = api.post("/v1/observations", OBSERVATION, keyed(key, "k")).json()["data"]
    batch = api.post("/v1/observations/batch", {"items": [OBSERVATION]}, keyed(key, "k"))
    assert batch.status_code == 201
    assert batch.json()["meta"]["idempotent_replay"] is False
    assert batch.json()["data"]["results"][0]["data"]["observation_id"] != obs["observation_id"]


def test_one_key_on_another_claim_of_the_same_route_is_a_conflict(api):
    key = api.key()
    a, b = _claim(api, key), _claim(api, key)
    assert api.post(f"/v1/claims/{a}/revoke", {"expected_version": 1}, keyed(key, "k")).status_code == 200
    r = api.post(f"/v1/claims/{b}/revoke", {"expected_version": 1}, keyed(key, "k"))
    assert r.status_code == 409


@pytest.mark.parametrize("who", ["another principal", "another organization"])
def test_another_callers_key_never_replays_someone_elses_answer(api, who):
    alice = api.key()
    other = api.key(principal="bob") if who == "another principal" else api.key(org="globex")
    first = api.post("/v1/observations", OBSERVATION, keyed(alice, "shared")).json()["data"]
    theirs = api.post("/v1/observations", OBSERVATION, keyed(other, "shared"))
    assert theirs.status_code == 201 and theirs.json()["meta"]["idempotent_replay"] is False
    assert theirs.json()["data"]["observation_id"] != first["observation_id"]
    # and a different body under the same key is theirs to send, not a conflict
    assert api.post("/v1/observations", {**OBSERVATION, "content": "x"}, keyed(other, "other")).status_code == 201


def test_a_key_without_the_routes_scope_is_forbidden_before_any_replay(api):
    alice = api.key()
    api.post("/v1/observations", OBSERVATION, keyed(alice, "k"))
    reader = api.key(principal="alice", scopes="context:compile")
    r = api.post("/v1/observations", OBSERVATION, keyed(reader, "k"))
    assert r.status_code == 403 and "data" not in r.json()


@pytest.mark.parametrize("value", ["", " ", "has space", "x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_validation_error_and_stores_nothing(api, value):
    key = api.key()
    r = api.client.post("/v1/observations", content=json.dumps(OBSERVATION).encode(),
                        headers={"authorization": key["authorization"], "content-type": "application/json",
                                 "Idempotency-Key": value.encode("utf-8")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR", r.text
    assert "Idempotency-Key" in r.json()["error"]["message"]
    assert api.ledger_keys() == [] and records(api) == []


@pytest.mark.parametrize("value", ["a", "x" * 255, "!~:{}"])
def test_keys_of_one_to_255_visible_characters_are_accepted(api, value):
    assert api.post("/v1/observations", OBSERVATION, keyed(api.key(), value)).status_code == 201


def test_an_erasure_route_ignores_the_header_so_a_repeat_is_a_second_erasure(api):
    # docs/api.md §12: only the POST write routes read the key; an erasure is not replayed
    key = api.key(scopes="memory:write,memory:erase")
    headers = {"authorization": key["authorization"], "Idempotency-Key": "has space"}
    first = api.client.delete("/v1/subjects/user_gone", headers=headers)
    second = api.client.delete("/v1/subjects/user_gone", headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["data"]["erasure_id"] != second.json()["data"]["erasure_id"]
    assert "idempotent_replay" not in second.json()["meta"] and records(api) == []

def test_an_invalid_body_does_not_use_up_the_key(api):
    key = api.key()
    bad = api.post("/v1/observations", {**OBSERVATION, "kind": "nonsense"}, keyed(key, "k"))
    assert bad.status_code == 400
    assert records(api) == [] and api.ledger_keys() == []
    assert api.post("/v1/observations", OBSERVATION, keyed(key, "k")).status_code == 201


def test_a_record_older_than_24_hours_no_longer_replays(api):
    key = api.key()
    first = api.post("/v1/observations", OBSERVATION, keyed(key, "k")).json()["data"]
    _age_records(api, hours=25)
    again = api.post("/v1/observations", OBSERVATION, keyed(key, "k"))
    assert again.status_code == 201 and again.json()["meta"]["idempotent_replay"] is False
    assert again.json()["data"]["observation_id"] != first["observation_id"]
    assert api.post("/v1/observations", OBSERVATION, keyed(key, "k")).json()["meta"]["idempotent_replay"] is True


def test_the_rebuild_deletes_expired_records_and_keeps_live_ones(api):
    key = api.key()
    api.post("/v1/observations", OBSERVATION, keyed(key, "old"))
    _age_records(api, hours=25)
    api.post("/v1/observations", OBSERVATION, keyed(key, "new"))
    assert len(records(api)) == 2
    api.rebuild(key)
    assert len(records(api)) == 1
    assert api.post("/v1/observations", OBSERVATION, keyed(key, "new")).json()["meta"]["idempotent_replay"] is True


def _age_records(api, hours):
    store = api.service.store
    for rkey in records(api):
        obj = store.get(rkey)
        record = json.loads(obj.body)
        record["created_at"] = canonical(now_utc() - timedelta(hours=hours))
        store.compare_and_swap(rkey, json.dumps(record).encode(), obj.etag)
        then = (now_utc() - timedelta(hours=hours)).timestamp()
        os.utime(os.path.join(store.root, *rkey.split("/")), (then, then))


# -- a crash between the record and the ledger entry ---------------------------

class _FailOnce:
    """Make the next ledger put of the store fail, after the idempotency
    record was written: the write dies between the two."""

    def __init__(self, store, monkeypatch, fragment="/ledger/"):
        self.failed = 0
        real = store.put_if_absent

        def put_if_absent(key, body):
            if fragment in key and not self.failed:
                self.failed += 1
                raise StoreError("injected: the process died before the ledger entry")
            return real(key, body)

        monkeypatch.setattr(store, "put_if_absent", put_if_absent)


@pytest.mark.parametrize("name", ["observation", "batch", "consolidation", "revoke", "supersede", "feedback"])
def test_a_write_killed_between_its_record_and_its_entry_completes_on_retry(api, monkeypatch, name):
    key = api.key()
    path, body, _ = ROUTES[name](api, key)
    before = len(api.ledger_keys())
    fault = _FailOnce(api.service.store, monkeypatch)
    dead = api.post(path, body, keyed(key, "k"))
    assert fault.failed == 1 and dead.status_code == 503, dead.text
    assert len(records(api)) == 1  # the key is claimed ...
    if name not in ("revoke", "supersede"):  # (a transition's head already holds its pending entry)
        assert len(api.ledger_keys()) == before  # ... and nothing half-written is stored
    retry = api.post(path, body, keyed(key, "k"))
    assert retry.status_code in (200, 201), retry.text
    # nothing had been answered before; a transition's first attempt had already moved the
    # claim's head, which any later writer of the claim completes, so its retry reads as a replay
    assert retry.json()["meta"]["idempotent_replay"] is (name in ("revoke", "supersede"))
    assert len(api.ledger_keys()) == before + 1
    again = api.post(path, body, keyed(key, "k"))
    assert again.json()["data"] == retry.json()["data"] and again.json()["meta"]["idempotent_replay"] is True
    assert len(api.ledger_keys()) == before + 1


def test_a_retry_after_a_crash_is_served_once_by_compile(api, monkeypatch):
    key = api.key()
    _FailOnce(api.service.store, monkeypatch)
    assert api.post("/v1/observations", OBSERVATION, keyed(key, "k")).status_code == 503
    api.rebuild(key)
    assert api.compile(key, "deploy smoke release").json()["data"]["items"] == []
    stored = api.post("/v1/observations", OBSERVATION, keyed(key, "k")).json()["data"]
    api.rebuild(key)
    items = api.compile(key, "deploy smoke release").json()["data"]["items"]
    assert [i["claim_id"] for i in items] == [stored["claim_id"]]


def test_a_duplicate_that_finishes_while_the_first_attempt_runs_unclaimed_is_replayed_not_a_conflict(service):
    """The interleaving the 8-thread burst hits only sometimes: attempt B
    reads no record, duplicate A claims the key and finishes, then B's own
    write fails because A already moved the claim. B answers A's answer."""
    from core.errors import Conflict
    from core.writes.idempotency import Idempotency
    from core.ledger import Ledger
    from core.layout import entry_key
    from core.keys import Principal

    principal = Principal(org_id="acme", principal_id="alice", key_id="key_x", scopes=frozenset({"memory:write"}),
                          workspaces=())
    idem = Idempotency(service.store)
    ledger = Ledger(service.store)

    def first(attempt):  # A: claims, stores its entry with its answer
        attempt.claim(entry_key("acme", attempt.entry_hex))
        ledger.append("acme", "transition", attempt.answer(200, {"claim_id": "claim_a", "status": "revoked"}),
                      actor="alice", entry_hex=attempt.entry_hex)
        return 200, {"claim_id": "claim_a", "status": "revoked"}

    def second(attempt):  # B: A runs to the end meanwhile, then B finds the claim revoked
        assert idem.run(principal, "revoke", "k1", {"claim_id": "claim_a"}, {"expected_version": 1}, first).replay \
            is False
        raise Conflict("claim claim_a is revoked; only active or disputed claims can change")

    outcome = idem.run(principal, "revoke", "k1", {"claim_id": "claim_a"}, {"expected_version": 1}, second)
    assert (outcome.status, outcome.data, outcome.replay) == (200, {"claim_id": "claim_a", "status": "revoked"}, True)


def test_a_failure_with_no_duplicate_in_flight_is_answered_as_it_is(service):
    from core.errors import Conflict
    from core.writes.idempotency import Idempotency
    from core.keys import Principal

    principal = Principal(org_id="acme", principal_id="alice", key_id="key_x", scopes=frozenset({"memory:write"}),
                          workspaces=())

    def fails(attempt):
        raise Conflict("claim claim_a is revoked; only active or disputed claims can change")

    with pytest.raises(Conflict, match="is revoked"):
        Idempotency(service.store).run(principal, "revoke", "k2", {"claim_id": "claim_a"}, {}, fails)
