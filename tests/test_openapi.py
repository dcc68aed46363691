"""GET /openapi.json: one document for every route, held to the server by schemathesis.

The document's request bodies are the validator's own specs (core/bodies.py),
so the tests here check the generation (every route present, the bodies
are the specs) and then run schemathesis against a real ``titen serve``:
every operation, at least 1,000 generated cases, and no 5xx, no answer the
document does not describe, no request the document forbids accepted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from core.bodies import COMPILE, FREE_TEXT, OBSERVATION, PY_WHITESPACE
from core.errors import ValidationError
from core.validation import check_text
from core.config import Settings
from core.api.openapi import document
from core.service import Service
from test_mcp import _free_port, _wait_for

ROUTES = {("get", "/healthz"), ("get", "/readyz"), ("post", "/v1/observations"), ("post", "/v1/observations/batch"),
          ("post", "/v1/consolidations"),
          ("post", "/v1/claims/{claim_id}/supersede"), ("post", "/v1/claims/{claim_id}/revoke"),
          ("post", "/v1/claims/{claim_id}/expire"), ("get", "/v1/claims/{claim_id}/evidence"),
          ("post", "/v1/context/compile"), ("get", "/v1/context/{context_id}"),
          ("post", "/v1/context/{context_id}/feedback"), ("post", "/v1/admin/rebuild"), ("post", "/mcp"),
          ("get", "/openapi.json"), ("delete", "/v1/subjects/{subject_id}"),
          ("delete", "/v1/observations/{observation_id}"), ("get", "/v1/erasures/{erasure_id}")}
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "negative_data_rejection,ignored_auth")
MAX_EXAMPLES = 30
MIN_CASES = 1000


def test_openapi_json_needs_no_key_and_is_the_document(api):
    r = api.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == json.loads(json.dumps(document()))
    assert r.json()["openapi"] == "3.1.0"


def test_every_route_of_the_app_is_in_the_document(api):
    served = {(m.lower(), route.path) for route in api.client.app.routes for m in route.methods if m != "HEAD"}
    documented = {(m, p) for p, ops in document()["paths"].items() for m in ops}
    assert served == documented == ROUTES


def test_the_erased_subject_in_the_path_is_the_identifier_a_body_names():
    # the route refuses what is not an identifier, so the document says so (api.md §14)
    delete = document()["paths"]["/v1/subjects/{subject_id}"]["delete"]
    (param,) = delete["parameters"]
    body_subject = {k: v for k, v in OBSERVATION.fields["subject_id"].schema(False).items() if k != "description"}
    assert {k: v for k, v in param["schema"].items() if k != "description"} == body_subject


def test_request_bodies_are_the_validators_specs():
    schemas = document()["components"]["schemas"]
    assert schemas["Observation"] == OBSERVATION.schema()
    assert schemas["Compile"]["properties"]["max_tokens"] == {"type": "integer", "minimum": 128, "maximum": 32000,
                                                              "description": COMPILE.fields["max_tokens"].description}
    assert schemas["Compile"]["additionalProperties"] is False


def test_a_trust_no_write_accepts_is_not_in_the_write_schemas(api):
    from core.api.openapi import document
    schemas = document()["components"]["schemas"]
    observation_trust = schemas["Observation"]["properties"]["trust"]["enum"]
    assert "policy_approved" not in observation_trust and "verified" in observation_trust
    body = {"subject_id": "user_rama", "kind": "tool_result", "content": "ok", "source": {"type": "tool", "ref": "r"},
            "trust": "policy_approved"}
    r = api.post("/v1/observations", body, api.key())
    assert r.status_code == 400 and "policy_approved is never accepted" in r.json()["error"]["message"]


def test_every_documented_example_is_valid_against_its_schema():
    doc = document()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            if not content:
                continue
            schema = {**content["schema"], "components": doc["components"]}
            for name, example in content["examples"].items():
                jsonschema.Draft202012Validator(schema).validate(example["value"])
    error = doc["components"]["schemas"]["Error"]
    for example in error["examples"]:
        jsonschema.Draft202012Validator(error).validate(example)


def _objects(node):
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            yield node["properties"]
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def test_a_validity_window_built_from_the_property_examples_is_one_the_service_accepts():
    # schemathesis combined valid_from's and valid_to's examples, equal instants, into a 400
    from core.instants import parse_instant
    windows = [(p["valid_from"], p["valid_to"]) for p in _objects(document())
               if "examples" in p.get("valid_from", {}) and "examples" in p.get("valid_to", {})]
    assert windows
    for start, end in windows:
        assert parse_instant(end["examples"][0]) > parse_instant(start["examples"][0])


def test_free_text_is_blank_exactly_where_str_strip_says():
    assert set(PY_WHITESPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}
    assert all(re.search(FREE_TEXT, ch * 3) is None for ch in PY_WHITESPACE)
    assert re.search(FREE_TEXT, " \ufeff ") is not None  # str.strip keeps U+FEFF: not blank


def _service_accepts_text(value):
    try:
        check_text(value, "body.x")
    except ValidationError:
        return False
    return True


def test_free_text_refuses_exactly_the_characters_the_body_rules_refuse():
    """The document's pattern and the validator read one table (core/characters.py)."""
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue  # ill-formed Unicode: refused by the body rules, not statable in a pattern
        text = f"a{chr(c)}b"
        assert (re.search(FREE_TEXT, text) is not None) is _service_accepts_text(text), hex(c)


def _valid(schema_name, value):
    doc = document()
    schema = {**doc["components"]["schemas"][schema_name], "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema).is_valid(value)


TEAM = {"subject_id": "user_rama", "kind": "tool_result", "content": "Smoke passed.",
        "source": {"type": "tool", "ref": "smoke#1"}, "visibility": "team"}


@pytest.mark.parametrize("body,documented", [(TEAM, False), ({**TEAM, "workspace_id": None}, False),
                                             ({**TEAM, "workspace_id": "ws_deploy"}, True),
                                             ({**TEAM, "visibility": "organization"}, True)])
def test_team_visibility_without_a_workspace_is_refused_by_the_document_and_the_service(api, body, documented):
    assert _valid("Observation", body) is documented
    r = api.post("/v1/observations", body, api.key(workspaces=["ws_deploy"]))
    assert (r.status_code == 201) is documented, r.text


@pytest.mark.parametrize("relations,documented", [(["contradicts"], False), (["qualifies", "contradicts"], False),
                                                  (["contradicts", "supports"], True)])
def test_a_consolidated_claim_needs_a_supporting_source_in_the_document_as_in_the_service(api, relations,
                                                                                          documented):
    key = api.key()
    evidence = [api.observe(key, content=f"Smoke run {i} passed.")["observation_id"] for i in range(len(relations))]
    body = {"subject_id": "user_rama", "claims": [{
        "statement": "Smoke passes.", "kind": "procedural", "confidence": 0.9,
        "sources": [{"observation_id": o, "relation": r} for o, r in zip(evidence, relations)]}]}
    assert _valid("Consolidation", body) is documented
    r = api.post("/v1/consolidations", body, key)
    assert (r.status_code == 201) is documented, r.text


@pytest.mark.parametrize("item,documented", [({"content": "a\x03b"}, False), ([[[["deep\x85"]]]], False),
                                             ({"k\u202e": 1}, False), ({"content": "tab\tand\nline"}, True),
                                             ([[[[1, None, "fine"]]]], True), ("not an observation", True)])
def test_a_batch_item_is_any_value_whose_texts_obey_the_body_rules(api, item, documented):
    """An item that is not an observation is reported by its index (201), but
    a refused character anywhere refuses the whole batch (400)."""
    body = {"items": [item]}
    assert _valid("ObservationBatch", body) is documented
    r = api.post("/v1/observations/batch", body, api.key())
    assert r.status_code == (201 if documented else 400), r.text


@pytest.mark.parametrize("value,ok", [("user_rama", True), ("user_rama\n", False), ("-x", False)])
def test_an_identifier_matches_whole_as_the_document_says(api, value, ok):
    key = api.key()
    r = api.compile(key, "deploy", subject_id=value)
    assert (r.status_code == 200) is ok, r.text


@pytest.mark.parametrize("value", ["obs_" + "0" * 32, "obs_" + "a" * 32, "obs_0", "OBS_" + "0" * 32,
                                   "obs_" + "A" * 32, "obs_" + "0" * 32 + "x", " obs_" + "0" * 32,
                                   "claim_" + "0" * 32, "0"])
def test_an_observation_ids_format_is_in_the_schema_as_the_validator_reads_it(api, value):
    schema = document()["components"]["schemas"]["Consolidation"]["properties"]["claims"]["items"]
    source = schema["properties"]["sources"]["items"]["properties"]["observation_id"]
    key = api.key()
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "x", "kind": "procedural", "confidence": 0.5,
         "sources": [{"observation_id": value, "relation": "supports"}]}]}, key)
    refused_as_malformed = r.status_code == 400 and "is not an observation id" in r.text
    assert (re.search(source["pattern"], value) is None) is refused_as_malformed, r.text


# -- schemathesis against titen serve --------------------------------------------------

def _seed(data_dir: Path) -> dict:
    """Keys and real ids, so the generated cases reach past the 404s."""
    service = Service(Settings.from_env(data_dir=str(data_dir)))
    created = service.keys.create("acme", "alice", ["context:compile", "context:feedback", "memory:write",
                                                    "memory:verify", "admin"], ["ws_deploy"])
    principal = service.keys.authenticate("Bearer " + created["api_key"])
    claims = []
    for i in range(4):
        written = service.writes.record_observation(principal, {
            "subject_id": "user_rama", "kind": "tool_result", "content": f"Smoke run {i} returned 200.",
            "source": {"type": "tool", "ref": f"smoke#{i}"}, "visibility": "organization",
            "claim": {"statement": f"Deploy smoke check {i} must pass.", "kind": "procedural", "confidence": 0.9}})
        claims.append(written["claim_id"])
    service.rebuild("acme")
    context_id = service.compiler.compile(principal, {"subject_id": "user_rama", "task": "deploy smoke",
                                                      "max_tokens": 1200}).data["context_id"]
    return {"key": created["api_key"], "claims": claims, "context_id": context_id}


def test_schemathesis_finds_no_5xx_no_undocumented_answer_and_no_forbidden_request_accepted(tmp_path):
    data_dir = tmp_path / "titen"
    seeded = _seed(data_dir)
    claims = seeded["claims"]
    config = tmp_path / "schemathesis.toml"
    operations = [("POST /v1/claims/{claim_id}/supersede", "claim_id", claims[0]),
                  ("POST /v1/claims/{claim_id}/revoke", "claim_id", claims[1]),
                  ("POST /v1/claims/{claim_id}/expire", "claim_id", claims[2]),
                  ("GET /v1/claims/{claim_id}/evidence", "claim_id", claims[3]),
                  ("GET /v1/context/{context_id}", "context_id", seeded["context_id"]),
                  ("POST /v1/context/{context_id}/feedback", "context_id", seeded["context_id"])]
    config.write_text("".join(f'[[operations]]\ninclude-name = "{name}"\nparameters = {{ {p} = "{v}" }}\n\n'
                              for name, p, v in operations))
    port = _free_port()
    env = {**os.environ, "TITEN_CACHE_DIR": str(tmp_path / "cache")}
    bin_dir = Path(sys.executable).parent
    # stderr to a file: a pipe nobody reads fills with request lines and stalls the server
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        server = subprocess.Popen([str(bin_dir / "titen"), "serve", "--data-dir", str(data_dir), "--port",
                                   str(port)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, server, log)
        # the document as served, run from a file so GET /openapi.json is one of the operations
        schema = tmp_path / "openapi.json"
        schema.write_bytes(urllib.request.urlopen(url + "/openapi.json", timeout=10).read())
        run = subprocess.run([str(bin_dir / "st"), "--no-color", "--config-file", str(config), "run",
                              str(schema), "--url", url,
                              "-H", f"Authorization: Bearer {seeded['key']}", "--checks", CHECKS,
                              "-n", str(MAX_EXAMPLES), "--seed", "20261203", "--workers", "1",
                              "--phases", "examples,coverage,fuzzing"],
                             capture_output=True, text=True, timeout=540, cwd=tmp_path)
    finally:
        server.terminate()
        server.wait(timeout=10)
    summary = run.stdout[run.stdout.rfind("SUMMARY"):] if "SUMMARY" in run.stdout else run.stdout[-4000:]
    print(summary)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
    tested = re.search(r"Tested: (\d+)", summary)
    assert tested and int(tested.group(1)) == len(ROUTES), summary
    generated = re.search(r"(\d+) generated", summary)
    assert generated and int(generated.group(1)) >= MIN_CASES, summary


def test_the_error_envelope_lists_every_code_of_the_error_hierarchy():
    from core.errors import TitenError
    codes = document()["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert set(codes) == {cls.code for cls in TitenError.__subclasses__()} | {"INTERNAL"}


def _closed(node):
    """The schema with every object that names its properties closed to
    others: an answer field the document leaves out then fails validation."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def test_every_field_of_every_answer_is_in_the_document(api):
    """schemathesis allows fields the document does not name; this holds each
    route's real answers (a scenario touching every field) to the document
    with every object closed, so a field the routes add is documented too."""
    doc = _closed(document())
    key = api.key()
    obs = api.observe(key, claim={"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                                  "confidence": 0.95})
    other = api.observe(key, content="Smoke was skipped on Friday.")
    answers = [("post", "/v1/observations/batch", api.post("/v1/observations/batch", {"items": [
        {"subject_id": "user_rama", "kind": "decision", "content": "c", "source": {"type": "t", "ref": "r"}},
        {"subject_id": "user_rama"}]}, {**key, "idempotency-key": "k1"}))]
    consolidated = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "Smoke gates releases.", "kind": "procedural", "confidence": 0.9, "visibility": "organization",
         "sources": [{"observation_id": obs["observation_id"], "relation": "supports"},
                     {"observation_id": other["observation_id"], "relation": "contradicts"}]}]}, key)
    answers.append(("post", "/v1/consolidations", consolidated))
    disputed = consolidated.json()["data"]["claim_ids"][0]
    answers.append(("post", "/v1/admin/rebuild", api.post("/v1/admin/rebuild", b"", key)))
    answers.append(("get", "/v1/claims/{claim_id}/evidence", api.get(f"/v1/claims/{disputed}/evidence", key)))
    compiled = api.compile(key, "deploy smoke release", include_checkpoints=True)
    answers.append(("post", "/v1/context/compile", compiled))
    context_id = compiled.json()["data"]["context_id"]
    answers.append(("get", "/v1/context/{context_id}", api.get(f"/v1/context/{context_id}", key)))
    answers.append(("post", "/v1/context/{context_id}/feedback",
                    api.post(f"/v1/context/{context_id}/feedback", {"outcome": "useful", "claim_id": disputed}, key)))
    answers.append(("post", "/v1/claims/{claim_id}/supersede",
                    api.post(f"/v1/claims/{obs['claim_id']}/supersede",
                             {"expected_version": 1, "statement": "Two green smokes gate a release."}, key)))
    answers.append(("post", "/v1/claims/{claim_id}/revoke",
                    api.post(f"/v1/claims/{disputed}/revoke", {"expected_version": 1, "reason": "wrong"}, key)))
    erased = api.client.delete(f"/v1/observations/{other['observation_id']}", headers=api._headers(key))
    answers.append(("delete", "/v1/observations/{observation_id}", erased))
    answers.append(("delete", "/v1/subjects/{subject_id}",
                    api.client.delete("/v1/subjects/user_gone", headers=api._headers(key))))
    api.rebuild(key)
    answers.append(("get", "/v1/erasures/{erasure_id}",
                    api.get(f"/v1/erasures/{erased.json()['data']['erasure_id']}", key)))
    answers.append(("get", "/readyz", api.get("/readyz", key)))
    answers.append(("get", "/healthz", api.get("/healthz")))
    answers.append(("post", "/v1/context/compile", api.compile(key, "x" * 5000)))  # an error envelope
    assert [r.status_code for _, _, r in answers] == [201, 201, 200, 200, 200, 200, 201, 201, 200, 202, 202, 200,
                                                      200, 200, 400]
    for method, path, r in answers:
        schema = doc["paths"][path][method]["responses"][str(r.status_code)]["content"]["application/json"]["schema"]
        jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(r.json())


def test_a_readyz_503_from_a_store_failure_is_in_the_document(api):
    # the document promised only the not-ready report under 503; a store
    # failing while the key is read answers the error envelope
    key = api.key()
    (record,) = [p for p in (Path(api.service.store.root) / "keys").glob("*.json")
                 if key["_key_id"] not in p.name]
    record.unlink()
    record.mkdir()  # reading the key's record now fails as a store error, not as "no key"
    r = api.get("/readyz", key)
    assert r.status_code == 503 and r.json()["error"]["code"] == "UNAVAILABLE", r.text
    schema = document()["paths"]["/readyz"]["get"]["responses"]["503"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": document()["components"]}).validate(r.json())
