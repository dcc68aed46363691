"""Bad input gets the documented error envelope and changes nothing."""

import json
import re

import pytest

from conftest import ALL_SCOPES

ALL_SCOPES_WITH_ERASE = ALL_SCOPES + ",memory:erase"

OBS = {"subject_id": "user_rama", "kind": "tool_result", "content": "ok",
       "source": {"type": "tool", "ref": "r"}, "visibility": "organization"}


def obs(**changes):
    body = json.loads(json.dumps(OBS))
    for k, v in changes.items():
        if v is ...:
            body.pop(k, None)
        else:
            body[k] = v
    return body


def compile_body(**changes):
    body = {"subject_id": "user_rama", "task": "deploy", "max_tokens": 1200}
    for k, v in changes.items():
        if v is ...:
            body.pop(k)
        else:
            body[k] = v
    return body


def claim(**changes):
    c = {"statement": "s", "kind": "procedural", "confidence": 0.9}
    c.update(changes)
    return {k: v for k, v in c.items() if v is not ...}


ROUTE_CASES = [
    ("/v1/observations", obs(subject_id=...), "subject_id is required"),
    ("/v1/observations", obs(content=5), "content must be a string"),
    ("/v1/observations", obs(content=""), "content must not be empty"),
    ("/v1/observations", obs(kind="gossip"), "kind must be one of"),
    ("/v1/observations", obs(trust="policy_approved"), "policy_approved is never accepted"),
    # the choices a write may make, not policy_approved, which it never may
    ("/v1/observations", obs(trust="high"), "trust must be one of unverified, asserted, verified; got 'high'"),
    ("/v1/observations", obs(visibility="public"), "visibility must be one of"),
    ("/v1/observations", obs(visibility="team"), "workspace_id is required"),
    ("/v1/observations", obs(source={"type": "tool"}), "source.ref is required"),
    ("/v1/observations", obs(occurred_at="yesterday"), "occurred_at must be an ISO-8601"),
    ("/v1/observations", obs(occurred_at="2026-07-30T12:00:00"), "occurred_at must be an ISO-8601"),
    ("/v1/observations", obs(claim=claim(confidence=1.5)), "claim.confidence must be between"),
    ("/v1/observations", obs(claim=claim(confidence=True)), "claim.confidence must be a number"),
    # an integer past a float's range (309 digits) is compared exactly, not converted
    ("/v1/observations", obs(claim=claim(confidence=10 ** 400)), "claim.confidence must be between"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(confidence=-(10 ** 400), sources=[
        {"observation_id": "obs_" + "1" * 32, "relation": "supports"}])]}, "claims[0].confidence must be between"),
    ("/v1/observations", obs(claim=claim(kind="opinion")), "claim.kind must be one of"),
    ("/v1/observations", obs(claim=claim(statement=...)), "claim.statement is required"),
    ("/v1/observations", obs(claim=claim(valid_from="2026-01-02T00:00:00Z", valid_to="2026-01-01T00:00:00Z")),
     "valid_to must be later"),
    ("/v1/observations", obs(subject_id="has space"), "not a valid identifier"),
    ("/v1/observations", obs(extra=1), "unknown field 'extra'"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": []}, "between 1 and 50"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim()] * 51}, "between 1 and 50"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(sources=[])]}, "between 1 and 20"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(sources=[
        {"observation_id": "obs_" + "1" * 32, "relation": "contradicts"}])]}, "at least one 'supports'"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(sources=[
        {"observation_id": "obs_" + "1" * 32, "relation": "supports"},
        {"observation_id": "obs_" + "1" * 32, "relation": "contradicts"}])]},
     "claims[0].sources[1]: obs_" + "1" * 32 + " is already cited as 'supports'; an observation is cited with one relation"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(sources=[
        {"observation_id": "obs_" + "1" * 32, "relation": "refutes"}])]}, "relation must be one of"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": [claim(sources=[
        {"observation_id": "nope", "relation": "supports"}])]}, "not an observation id"),
    ("/v1/consolidations", {"subject_id": "user_rama", "claims": "x"}, "claims must be an array"),
    ("/v1/context/compile", compile_body(task=...), "task is required"),
    ("/v1/context/compile", compile_body(task="x" * 4001), "at most 4000"),
    ("/v1/context/compile", compile_body(max_tokens=127), "between 128 and 32000"),
    ("/v1/context/compile", compile_body(max_tokens=32001), "between 128 and 32000"),
    ("/v1/context/compile", compile_body(max_tokens="1200"), "max_tokens must be an integer"),
    ("/v1/context/compile", compile_body(max_tokens=1200.5), "max_tokens must be an integer"),
    ("/v1/context/compile", compile_body(include_checkpoints="yes"), "include_checkpoints must be true or false"),
    ("/v1/context/compile", compile_body(at="not a time"), "at must be an ISO-8601"),
    ("/v1/context/compile", compile_body(at="2026-07-30T12:00:00." + "1" * 44 + "Z"),
     "at is 65 characters; an instant has at most 64"),
    ("/v1/context/compile", compile_body(subject_id=None), "subject_id is required"),
]


@pytest.mark.parametrize("path,body,message", ROUTE_CASES, ids=[f"{c[0]}:{c[2]}" for c in ROUTE_CASES])
def test_route_rejects_bad_fields_and_writes_nothing(api, path, body, message):
    key = api.key()
    before = api.ledger_keys()
    r = api.post(path, body, key)
    assert r.status_code == 400, r.text
    payload = r.json()
    assert payload["error"]["code"] == "VALIDATION_ERROR"
    assert message in payload["error"]["message"]
    assert payload["meta"]["request_id"].startswith("req_")
    assert api.ledger_keys() == before


def _claim_and_context(api, key):
    c = api.observe(key, claim={"statement": "deploy rule", "kind": "procedural", "confidence": 0.9})["claim_id"]
    api.rebuild(key)
    ctx = api.compile(key, "deploy").json()["data"]["context_id"]
    return c, ctx


BODY_ROUTES = ["/v1/observations", "/v1/consolidations", "/v1/context/compile", "CLAIM/supersede",
               "CLAIM/revoke", "CLAIM/expire", "CTX/feedback"]

RAW_CASES = [
    (b"x" * (1024 * 1024 + 1), 413, "PAYLOAD_TOO_LARGE"),
    (b"[" * 65 + b"]" * 65, 400, "VALIDATION_ERROR"),
    (b'{"a":' * 70 + b"1" + b"}" * 70, 400, "VALIDATION_ERROR"),
    (b'{"subject_id": "\xff\xfe"}', 400, "VALIDATION_ERROR"),
    (b'{"subject_id": "\\ud800"}', 400, "VALIDATION_ERROR"),
    (b'{"content": "bell \\u0007"}', 400, "VALIDATION_ERROR"),
    (b'{"content": "esc \\u001b[31m"}', 400, "VALIDATION_ERROR"),
    ('{"content": "bidi \u202e"}'.encode(), 400, "VALIDATION_ERROR"),
    (b'{"content": "cr \\r"}', 400, "VALIDATION_ERROR"),
    (b'{"x": NaN}', 400, "VALIDATION_ERROR"),
    (b"[1, 2]", 400, "VALIDATION_ERROR"),
    (b"{not json", 400, "VALIDATION_ERROR"),
    (b"", 400, "VALIDATION_ERROR"),
]


@pytest.mark.parametrize("route", BODY_ROUTES)
@pytest.mark.parametrize("raw,status,code", RAW_CASES, ids=[f"case{i}" for i in range(len(RAW_CASES))])
def test_body_rules_hold_on_every_route(api, route, raw, status, code):
    key = api.key()
    claim_id, ctx = _claim_and_context(api, key)
    path = route.replace("CLAIM", f"/v1/claims/{claim_id}").replace("CTX", f"/v1/context/{ctx}")
    before = api.ledger_keys()
    r = api.post(path, raw, key)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
    assert "Traceback" not in r.text
    assert api.ledger_keys() == before


def test_tab_and_line_feed_are_allowed_in_text(api):
    key = api.key()
    r = api.post("/v1/observations", obs(content="line one\n\tline two"), key)
    assert r.status_code == 201


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer nope"}, {"authorization": "Basic abc"},
                                     {"authorization": "Bearer titen_sk_" + "A" * 43}])
def test_missing_or_invalid_keys_are_unauthenticated(api, headers):
    r = api.client.post("/v1/observations", content=json.dumps(OBS), headers=headers)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"


def test_a_401_names_the_bearer_scheme(api):
    r = api.client.post("/v1/observations", content=json.dumps(OBS))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_two_authorization_headers_are_refused_not_the_first_taken(api):
    key = api.key()
    r = api.client.post("/v1/observations", content=json.dumps(OBS),
                        headers=[("authorization", key["authorization"]), ("authorization", "Bearer other"),
                                 ("content-type", "application/json")])
    assert r.status_code == 401 and r.json()["error"] == {
        "code": "UNAUTHENTICATED", "message": "Authorization header sent 2 times; send it once"}
    assert api.ledger_keys() == []


def test_two_idempotency_keys_are_refused_not_the_first_taken(api):
    key = api.key()
    r = api.client.post("/v1/observations", content=json.dumps(OBS),
                        headers=[("authorization", key["authorization"]), ("idempotency-key", "a"),
                                 ("idempotency-key", "b"), ("content-type", "application/json")])
    assert r.status_code == 400 and r.json()["error"] == {
        "code": "VALIDATION_ERROR", "message": "Idempotency-Key header sent 2 times; send it once"}
    assert api.ledger_keys() == []


def test_a_key_without_the_scope_is_forbidden_and_writes_nothing(api):
    reader = api.key(scopes="context:compile")
    r = api.post("/v1/observations", OBS, reader)
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    assert api.ledger_keys() == []


def test_verified_trust_needs_the_verify_scope(api):
    writer = api.key(scopes="memory:write")
    r = api.post("/v1/observations", obs(trust="verified"), writer)
    assert r.status_code == 403
    assert api.ledger_keys() == []


def test_unknown_route_and_wrong_method_use_the_envelope(api):
    r = api.client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    r = api.client.get("/v1/observations")
    assert r.status_code == 405 and r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert r.json()["meta"]["request_id"].startswith("req_")


def test_an_internal_failure_is_a_500_without_a_stack_trace(api, monkeypatch):
    key = api.key()

    def boom(*a, **k):
        raise RuntimeError("SELECT secret FROM claims -- internal detail")

    monkeypatch.setattr(api.service.compiler, "compile", boom)
    r = api.compile(key, "deploy")
    assert r.status_code == 500 and r.json()["error"]["code"] == "INTERNAL"
    assert "SELECT" not in r.text and "Traceback" not in r.text


def test_a_revoked_key_gets_401_within_five_seconds(api, monkeypatch):
    import core.keys
    key = api.key()
    assert api.get("/readyz", key).status_code == 200
    api.service.keys.revoke(key["_key_id"])
    clock = [core.keys.time.monotonic()]
    monkeypatch.setattr(core.keys.time, "monotonic", lambda: clock[0])
    clock[0] += 5.0
    r = api.post("/v1/observations", OBS, key)
    assert r.status_code == 401
    assert api.service.keys.cache_seconds <= 5


def test_a_new_key_works_at_once(api):
    key = api.key(org="fresh")
    assert api.post("/v1/observations", OBS, key).status_code == 201


def test_a_405_names_the_methods_the_route_has(api):
    r = api.client.get("/v1/observations")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.parametrize("method, path", [("GET", "/v1/context/compile"), ("HEAD", "/v1/context/compile"),
                                          ("DELETE", "/v1/context/compile"), ("DELETE", "/v1/observations/batch")])
def test_a_fixed_path_is_not_taken_for_an_id_by_another_method(api, method, path):
    """``compile`` is not a context id, nor ``batch`` an observation id: the
    wrong method on those paths is 405 naming theirs, with or without a key."""
    for headers in ({}, api._headers(api.key(scopes=ALL_SCOPES_WITH_ERASE))):
        r = api.client.request(method, path, headers=headers)
        assert r.status_code == 405 and r.headers["allow"] == "POST", (method, path, r.status_code)


@pytest.mark.parametrize("method, path", [("POST", "/v1/context/compile/"), ("GET", "/healthz/"),
                                          ("GET", "/v1/claims/claim_x/evidence/")])
def test_a_path_with_a_slash_too_many_is_an_unknown_route_in_the_envelope(api, method, path):
    r = api.client.request(method, path, follow_redirects=False)
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    assert r.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("method, path, status", [
    ("POST", "/v1/context/compile%0A", 405),  # the path of a stored pack named "compile\n": GET only
    ("GET", "/healthz%0A", 404), ("POST", "/mcp%0A", 404), ("GET", "/openapi.json%0A", 404)])
def test_a_path_with_a_line_feed_after_a_route_is_not_that_route(api, method, path, status):
    # Python's $ matches before a final line feed: the compile ran
    key = api.key(scopes=ALL_SCOPES_WITH_ERASE)
    r = api.client.request(method, path, headers=api._headers(key), json={"subject_id": "user_rama", "task": "t",
                                                                         "max_tokens": 500})
    assert r.status_code == status and "data" not in r.json(), r.text
    assert api.ledger_keys() == []  # no context run recorded


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/claims/{}/evidence"), ("GET", "/v1/context/{}"), ("POST", "/v1/context/{}/feedback"),
    ("DELETE", "/v1/observations/{}"), ("GET", "/v1/erasures/{}"), ("POST", "/v1/claims/{}/revoke"),
    ("GET", "/v1/{}"),
])
@pytest.mark.parametrize("control", ["%E2%80%AE", "%00", "%1B", "%0A", "%C2%85"])
def test_a_control_character_in_a_path_comes_back_escaped_never_raw(api, method, path, control):
    key = api.key(scopes=ALL_SCOPES_WITH_ERASE)
    body = {"outcome": "used"} if path.endswith("feedback") else {"expected_version": 1}
    r = api.client.request(method, path.format(f"claim_{control}x"), headers=api._headers(key),
                           json=body if method == "POST" else None)
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    message = r.json()["error"]["message"]
    assert message.isprintable() and "\\u" in message


def test_an_erased_subject_id_with_a_trailing_line_feed_is_not_an_identifier(api):
    key = api.key(scopes=ALL_SCOPES_WITH_ERASE)
    r = api.client.delete("/v1/subjects/user_rama%0A", headers=api._headers(key))
    assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "not an identifier" in r.json()["error"]["message"]
    assert api.ledger_keys() == [] and list(api.service.store.list_keys("orgs/acme/erasures/")) == []


def test_an_erased_subject_id_quotes_a_control_character_as_an_escape(api):
    # docs/api.md §1: a path's unprintable characters come back as \uXXXX escapes
    key = api.key(scopes=ALL_SCOPES_WITH_ERASE)
    r = api.client.delete("/v1/subjects/a%00b", headers=api._headers(key))
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "subject_id 'a\\u0000b' is not an identifier (letters, digits, '_.:@-')"


@pytest.mark.parametrize("raw", [b'{"subject_id": "user_rama", "task": "\\ud800", "task": "deploy", "max_tokens": 1200}',
                                 b'{"subject_id": "user_rama", "task": "deploy", "max_tokens": 1200, "max_tokens": 128}'])
def test_a_key_twice_in_one_object_is_refused_not_the_last_taken(api, raw):
    # a proxy reading the first value would see another request than the service
    r = api.post("/v1/context/compile", raw, api.key())
    assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR"
    key = "task" if b"ud800" in raw else "max_tokens"
    assert r.json()["error"]["message"] == f"request body has the key '{key}' twice in one object; send each key once"


def test_a_whole_number_written_with_a_fraction_is_an_integer(api):
    # JSON Schema (and so the OpenAPI document) counts 1200.0 as an integer
    key = api.key()
    r = api.post("/v1/context/compile", compile_body(max_tokens=1200.0), key)
    assert r.status_code == 200 and r.json()["data"]["budget"]["max_tokens"] == 1200
    claim_id = api.observe(key, claim={"statement": "s", "kind": "procedural", "confidence": 0.9})["claim_id"]
    r = api.post(f"/v1/claims/{claim_id}/expire", {"expected_version": 1.0}, key)
    assert r.status_code == 200 and r.json()["data"]["version"] == 2


@pytest.mark.parametrize("literal", [b"127.99999999999999999", b"1200.0000000000000001", b"12.000000000000000001e2",
                                     b"1e-400"])
def test_a_fraction_a_float_would_round_away_is_still_not_an_integer(api, literal):
    # a 64-bit float reads each of these as a whole number; the caller sent a fraction
    key = api.key()
    before = api.ledger_keys()
    raw = b'{"subject_id": "user_rama", "task": "deploy", "max_tokens": ' + literal + b"}"
    r = api.post("/v1/context/compile", raw, key)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "max_tokens must be an integer"
    assert api.ledger_keys() == before


@pytest.mark.parametrize("literal, why", [(b"0e99999999999999999999", "whose exponent is out of range"),
                                          (b"1e-99999999999999999999", "whose exponent is out of range"),
                                          (b"1e400", "beyond the range of a 64-bit float"),
                                          (b"-2e308", "beyond the range of a 64-bit float")])
def test_a_number_no_float_can_hold_is_a_400_saying_so(api, literal, why):
    key = api.key()
    raw = b'{"subject_id": "user_rama", "task": "deploy", "max_tokens": ' + literal + b"}"
    r = api.post("/v1/context/compile", raw, key)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"request body holds the number {literal.decode()!r}, {why}"


LONG = "y" * 3000


@pytest.mark.parametrize("path, body", [
    ("/v1/context/compile", compile_body(**{LONG: 1})),                          # unknown field
    ("/v1/observations", obs(source={"type": "tool", "ref": "r", LONG: {LONG: "\u0001"}})),  # path of keys
    ("/v1/observations", obs(kind=LONG)),                                        # enumerated value
    ("/v1/observations", obs(subject_id="-" + "y" * 120)),                       # identifier
    ("/v1/context/compile", compile_body(max_tokens=int("1" + "0" * 400))),      # integer out of range
    ("/v1/observations", obs(visibility="team", workspace_id="w" * 128)),         # workspace not held
], ids=["unknown-field", "key-path", "enum", "identifier", "integer", "workspace"])
def test_a_long_value_is_quoted_back_cut_to_64_characters(api, path, body):
    r = api.post(path, body, api.key())
    assert r.status_code in (400, 403), r.text
    message = r.json()["error"]["message"]
    longest = max(len(run) for run in re.findall(r"[y0w]+", message))
    assert longest <= 64 and "…" in message, message
