"""core/observe/request_line.py: one structured line per HTTP request (docs/operations.md, "Reading the logs").

Driven through the ASGI app as ``titen serve`` runs it (Starlette's test
client over a real local store); the same app runs under Mangum on Lambda,
where tests/test_lambda_observability.py checks every route through the
handler. Lines are read from stderr, metrics (EMF) from stdout.
"""

import json

import pytest

from core.config import Settings
from core.observe.request_line import Facts, as_text, request_line
from core.service import Service
from core.storage import StoreError
from core.storage.local import LocalStore
from conftest import Api
from emf_spec import assert_emf, metric_values

STATEMENT = "Deploy smoke must pass before release."


def lines(capsys) -> list[dict]:
    err = capsys.readouterr().err
    return [json.loads(line) for line in err.splitlines() if line.startswith('{"event":"request"')]


def metrics_docs(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


@pytest.fixture
def measured(tmp_path):
    """An API whose metrics are on (as the template sets them)."""
    settings = Settings.from_env(data_dir=str(tmp_path / "titen"), env={
        "TITEN_SNAPSHOT_TTL": "0", "TITEN_METRICS": "emf", "TITEN_METRICS_NAMESPACE": "titen/test"})
    return Api(Service(settings))


def published(api):
    key = api.key()
    written = api.observe(key, claim={"statement": STATEMENT, "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    return key, written


def test_every_request_gets_exactly_one_line(api, capsys):
    key = api.key()
    api.get("/healthz")
    api.get("/readyz", key)
    api.observe(key)
    assert [(x["method"], x["route"], x["status"]) for x in lines(capsys)] == [
        ("GET", "/healthz", 200), ("GET", "/readyz", 200), ("POST", "/v1/observations", 201)]


def test_the_line_names_the_route_template_never_the_path_with_its_ids(api, capsys):
    key, written = published(api)
    capsys.readouterr()
    api.get(f"/v1/claims/{written['claim_id']}/evidence", key)
    (line,) = lines(capsys)
    assert line["route"] == "/v1/claims/{claim_id}/evidence"
    assert written["claim_id"] not in json.dumps(line)


def test_the_line_carries_the_request_id_the_client_received_and_the_organization(api, capsys):
    key = api.key("acme")
    api.observe(key)
    response = api.get("/readyz", key)
    (_, line) = lines(capsys)
    assert line["request_id"] == response.headers["x-request-id"] == response.json()["meta"]["request_id"]
    assert line["org_id"] == "acme"


def test_a_response_without_a_request_id_gets_one_and_logs_it(api, capsys):
    response = api.get("/openapi.json")
    (line,) = lines(capsys)
    assert response.status_code == 200 and response.headers["x-request-id"].startswith("req_")
    assert line["request_id"] == response.headers["x-request-id"]


def test_a_path_no_route_matches_logs_no_route_and_not_the_path(api, capsys):
    api.get("/v1/secret-looking/path")
    (line,) = lines(capsys)
    assert (line["route"], line["status"], line["code"]) == (None, 404, "NOT_FOUND")
    assert "secret-looking" not in json.dumps(line)


def test_a_method_the_route_does_not_allow_logs_the_route_and_405(api, capsys):
    api.get("/v1/observations")
    (line,) = lines(capsys)
    assert (line["method"], line["route"], line["status"], line["code"]) == (
        "GET", "/v1/observations", 405, "METHOD_NOT_ALLOWED")


@pytest.mark.parametrize("request_, status, code", [
    (lambda api, key: api.post("/v1/observations", {}, {"authorization": "Bearer nope"}), 401, "UNAUTHENTICATED"),
    (lambda api, key: api.post("/v1/admin/rebuild", b"", api.key("acme", "bob", "context:compile")), 403, "FORBIDDEN"),
    (lambda api, key: api.post("/v1/observations", {"subject_id": "user_rama"}, key), 400, "VALIDATION_ERROR"),
    (lambda api, key: api.get("/v1/context/ctx_" + "0" * 32, key), 404, "NOT_FOUND"),
])
def test_an_error_line_carries_the_code_of_the_envelope(api, capsys, request_, status, code):
    key = api.key("acme")
    capsys.readouterr()
    response = request_(api, key)
    line = lines(capsys)[-1]
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert (line["status"], line["code"]) == (status, code)


def test_a_compile_line_carries_compiles_counts_and_states(api, capsys):
    key, _ = published(api)
    capsys.readouterr()
    body = api.compile(key, "must the deploy smoke pass before release", max_tokens=900).json()
    (line,) = lines(capsys)
    assert line["route"] == "/v1/context/compile"
    assert (line["candidates"], line["items"], line["used_tokens"], line["max_tokens"], line["vector"],
            line["generation"]) == (body["meta"]["candidates"], len(body["data"]["items"]),
                                    body["data"]["budget"]["used_tokens"], 900, "disabled", 1)
    assert line["items"] == 1 and 0 <= line["generation_age_seconds"] < 60


def test_a_compile_with_a_key_seen_before_names_its_organization(api, capsys):
    key, _ = published(api)  # the key is in the key ring's cache from here on
    capsys.readouterr()
    api.compile(key, "must the deploy smoke pass before release")
    (line,) = lines(capsys)
    assert line["org_id"] == "acme"


def test_an_mcp_line_names_the_method_and_the_tool_and_counts_its_compile(api, capsys):
    key, _ = published(api)
    capsys.readouterr()
    api.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "titen_compile", "arguments": {"subject_id": "user_rama", "task": "deploy smoke", "max_tokens": 900}}},
        key)
    (line,) = lines(capsys)
    assert (line["route"], line["rpc_method"], line["tool"], line["items"]) == ("/mcp", "tools/call", "titen_compile", 1)


def test_an_mcp_tool_error_is_logged_with_its_code(api, capsys):
    key = api.key("acme", "bob", "context:compile")
    capsys.readouterr()
    api.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "titen_remember", "arguments": {"subject_id": "user_rama", "content": "x"}}}, key)
    (line,) = lines(capsys)
    assert (line["status"], line["tool"], line["code"]) == (200, "titen_remember", "FORBIDDEN")


def test_a_tool_or_method_this_server_does_not_know_is_not_written_down(api, capsys):
    key = api.key()
    capsys.readouterr()
    api.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "leak: a task text"}}, key)
    api.post("/mcp", {"jsonrpc": "2.0", "id": 2, "method": "leak: another text"}, key)
    unknown_tool, unknown_method = lines(capsys)
    assert "leak" not in json.dumps([unknown_tool, unknown_method])
    assert ("tool" not in unknown_tool, unknown_tool["code"]) == (True, "INVALID_PARAMS")
    assert (unknown_method["rpc_method"], unknown_method["code"]) == ("other", "METHOD_NOT_FOUND")


class PointerOutage(LocalStore):
    """A real local store whose pointer reads fail while ``down``."""

    down = False

    def get_if_changed(self, key, etag):
        if self.down:
            raise StoreError("S3 GetObject failed: SlowDown")
        return super().get_if_changed(key, etag)


def test_a_refresh_failure_is_counted_on_the_request_that_met_it(tmp_path, capsys):
    store = PointerOutage(str(tmp_path / "store"))
    api = Api(Service(Settings.from_env(data_dir=str(tmp_path / "unused"), env={"TITEN_SNAPSHOT_TTL": "0"}),
                      store=store))
    key, _ = published(api)
    store.down = True
    capsys.readouterr()
    assert api.compile(key, "deploy smoke").status_code == 200  # the loaded generation keeps serving
    (line,) = lines(capsys)
    assert line["refresh_failures"] == 1


def test_a_crash_past_every_handler_still_gets_a_line(api, capsys, monkeypatch):
    import core.api.openapi

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(core.api.openapi, "document_json", broken)
    assert api.get("/openapi.json").status_code == 500
    (line,) = lines(capsys)
    assert (line["route"], line["status"], line["code"]) == ("/openapi.json", 500, "INTERNAL")


def test_the_text_format_gives_a_person_the_same_facts():
    facts = Facts(org_id="acme", compiled={"candidates": 12, "items": 3, "used_tokens": 480, "max_tokens": 1200,
                                           "vector": "used", "generation": 7, "generation_age_seconds": 3.2})
    line = request_line(request_id="req_" + "a" * 32, method="POST", route="/v1/context/compile", status=200,
                        latency_ms=41.66, facts=facts)
    assert as_text(line) == ("req_" + "a" * 32 + " POST /v1/context/compile 200 41.7ms org=acme candidates=12 "
                             "items=3 tokens=480/1200 vector=used generation=7")


@pytest.mark.parametrize("field, value, written", [
    ("method", "BREW", "OTHER"),
    ("code", "a claim's text", "OTHER"),
    ("vector", "the task itself", "other"),
])
def test_a_value_of_the_wrong_shape_is_replaced_not_written(field, value, written):
    facts = Facts(code=value if field == "code" else None,
                  compiled={"candidates": 1, "items": 1, "used_tokens": 1, "max_tokens": 2, "generation": 1,
                            "vector": value if field == "vector" else "used", "generation_age_seconds": 0.0})
    line = request_line(request_id=None, method=value if field == "method" else "GET", route=None, status=400,
                        latency_ms=1.0, facts=facts)
    assert line[field] == written and value not in json.dumps(line)


# -- the request's metrics ------------------------------------------------------------

def test_a_compile_writes_its_metrics_from_the_same_facts_as_its_line(measured, capsys):
    key, _ = published(measured)
    capsys.readouterr()
    measured.compile(key, "must the deploy smoke pass before release", max_tokens=900)
    out, err = capsys.readouterr()
    (line,) = [json.loads(x) for x in err.splitlines() if x.startswith('{"event"')]
    (doc,) = metrics_docs(out)
    assert_emf(doc)
    api, route = ("Service", "api"), ("Route", "/v1/context/compile")
    assert metric_values([doc]) == {
        ("Requests", frozenset({api, route})): [1],
        ("Latency", frozenset({api, route})): [line["latency_ms"]],
        ("CompileLatency", frozenset({api})): [line["latency_ms"]],
        ("Candidates", frozenset({api})): [line["candidates"]],
        ("PackItems", frozenset({api})): [line["items"]],
        ("BudgetUse", frozenset({api})): [round(100 * line["used_tokens"] / 900, 2)],
        ("VectorUsed", frozenset({api})): [0],
        ("VectorErrors", frozenset({api})): [0],
        ("GenerationAge", frozenset({api})): [line["generation_age_seconds"]],
    }
    assert {d["Namespace"] for d in doc["_aws"]["CloudWatchMetrics"]} == {"titen/test"}


def test_an_error_is_counted_by_its_code(measured, capsys):
    key = measured.key()
    capsys.readouterr()
    measured.get("/v1/context/ctx_" + "0" * 32, key)
    (doc,) = metrics_docs(capsys.readouterr().out)
    found = metric_values([doc])
    assert found[("Errors", frozenset({("Service", "api"), ("Code", "NOT_FOUND")}))] == [1]
    assert found[("Requests", frozenset({("Service", "api"), ("Route", "/v1/context/{context_id}")}))] == [1]


def test_without_metrics_configured_nothing_is_written_to_stdout(api, capsys):
    api.get("/healthz")
    assert capsys.readouterr().out == ""
