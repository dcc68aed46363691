"""Every route through the Lambda handler: its request line and its metrics (docs/operations.md).

The API function is invoked with the payload-2.0 event files of
infra/events/ (ids a write returned substituted for their
``REPLACE_WITH_…`` placeholders) under moto, configured for metrics as
template.yaml configures it. Everything the invocations print — request
lines on stderr, EMF documents and rebuild lines on stdout — is parsed:
each route has its line under its template, the metrics follow the EMF
specification (tests/emf_spec.py) with the expected names and dimensions,
and nothing a caller wrote (a task, a claim's or an observation's text, a
reason) nor the key appears anywhere.
"""

import base64
import json
from pathlib import Path

import pytest
from cfnlint.decode import decode

from emf_spec import assert_emf, metric_values
from test_lambda_handlers import LambdaContext, event, lam, scheduled  # noqa: F401  (lam: the fixture)

ROOT = Path(__file__).resolve().parent.parent
STACK = "titen-test"
UNMATCHED_PATH = "/v1/claims/claim_0190aaaa/evidence/extra"


def template_metrics_env() -> dict:
    """The metrics variables the template gives both functions, resolved for stack ``STACK``."""
    parsed, errors = decode(str(ROOT / "template.yaml"))
    assert not errors, errors
    env = parsed["Globals"]["Function"]["Environment"]["Variables"]
    resolved = {}
    for name in ("TITEN_METRICS", "TITEN_METRICS_NAMESPACE", "TITEN_METRICS_ORGS"):
        value = env[name]
        if isinstance(value, dict) and "Fn::Sub" in value:
            value = value["Fn::Sub"].replace("${AWS::StackName}", STACK)
        elif isinstance(value, dict) and "Ref" in value:
            value = parsed["Parameters"][value["Ref"]]["Default"]
        resolved[name] = value
    return resolved


@pytest.fixture
def as_deployed(monkeypatch):
    for name, value in template_metrics_env().items():
        monkeypatch.setenv(name, value)


def routed(name: str, key: str, **ids) -> dict:
    """An event file with the key and the ids (``claim_id=…``) in place of its placeholders."""
    evt = event(name, key)

    def fill(text: str) -> str:
        for field, value in ids.items():
            text = text.replace(f"REPLACE_WITH_{field.upper()}", value)
        return text

    evt["rawPath"] = evt["requestContext"]["http"]["path"] = fill(evt["rawPath"])
    if evt.get("body") and evt.get("isBase64Encoded"):
        raw = fill(base64.b64decode(evt["body"]).decode()).encode()
        evt["body"] = base64.b64encode(raw).decode()
        evt["headers"]["content-length"] = str(len(raw))
    assert "REPLACE_WITH" not in json.dumps(evt), f"{name}: a placeholder was left"
    return evt


def invoke(lam, evt) -> dict:
    response = lam.api.handler(evt, LambdaContext())
    return {"status": response["statusCode"], "body": json.loads(response["body"]) if response["body"] else None,
            "request_id": response["headers"]["x-request-id"]}


def written_text(name: str) -> list[str]:
    """Every string a caller wrote in an event file's body (texts, statements, tasks, reasons)."""
    evt = json.loads((ROOT / "infra" / "events" / name).read_text())
    if not evt.get("body"):
        return []
    found = []

    def walk(value, field=None):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, field)
        elif isinstance(value, str) and field in ("content", "statement", "task", "reason") and len(value) > 8:
            found.append(value)

    walk(json.loads(base64.b64decode(evt["body"])))
    return found


def every_route(lam, capsys) -> dict:
    """Call every route with its event file; what each answered and all that was printed."""
    key = lam.key
    answers = {}
    capsys.readouterr()
    answers["healthz"] = invoke(lam, routed("healthz.json", key))
    answers["readyz"] = invoke(lam, routed("readyz.json", key))
    answers["openapi"] = invoke(lam, routed("openapi-get.json", key))
    answers["observation"] = obs = invoke(lam, routed("observation.json", key))
    answers["batch"] = batch = invoke(lam, routed("observation-batch.json", key))
    answers["consolidation"] = cons = invoke(lam, routed("consolidation.json", key,
                                                        observation_id=obs["body"]["data"]["observation_id"]))
    scheduled(lam)  # the rebuild function publishes the writes
    answers["admin_rebuild"] = invoke(lam, routed("admin-rebuild.json", key))
    answers["compile"] = compiled = invoke(lam, routed("compile.json", key))
    context_id = compiled["body"]["data"]["context_id"]
    claim_1 = obs["body"]["data"]["claim_id"]
    claim_2 = next(r["data"]["claim_id"] for r in batch["body"]["data"]["results"] if r.get("data", {}).get("claim_id"))
    claim_3 = cons["body"]["data"]["claim_ids"][0]
    answers["context"] = invoke(lam, routed("context-get.json", key, context_id=context_id))
    answers["feedback"] = invoke(lam, routed("context-feedback.json", key, context_id=context_id, claim_id=claim_1))
    answers["evidence"] = invoke(lam, routed("claim-evidence.json", key, claim_id=claim_1))
    answers["supersede"] = invoke(lam, routed("claim-supersede.json", key, claim_id=claim_1))
    answers["revoke"] = invoke(lam, routed("claim-revoke.json", key, claim_id=claim_2))
    answers["expire"] = invoke(lam, routed("claim-expire.json", key, claim_id=claim_3))
    for name in ("mcp-initialize.json", "mcp-tools-list.json", "mcp-compile.json", "mcp-get.json"):
        answers[name] = invoke(lam, routed(name, key))
    batch_obs = next(r["data"]["observation_id"] for r in batch["body"]["data"]["results"] if "data" in r)
    answers["erase_observation"] = invoke(lam, routed("erase-observation.json", key, observation_id=batch_obs))
    answers["erase_subject"] = erased = invoke(lam, routed("erase-subject.json", key))
    answers["erasure"] = invoke(lam, routed("erasure-status.json", key, erasure_id=erased["body"]["data"]["erasure_id"]))
    unmatched = routed("healthz.json", key)
    unmatched["rawPath"] = unmatched["requestContext"]["http"]["path"] = UNMATCHED_PATH
    answers["unmatched"] = invoke(lam, unmatched)
    out, err = capsys.readouterr()
    ids = {context_id, claim_1, claim_2, claim_3, obs["body"]["data"]["observation_id"], batch_obs,
           erased["body"]["data"]["erasure_id"]}
    return {"answers": answers, "out": out, "err": err, "ids": ids}


@pytest.fixture
def served(as_deployed, lam, capsys):
    return lam, every_route(lam, capsys)


def request_lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.startswith('{"event":"request"')]


def emf_documents(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.startswith('{"_aws"')]


def test_every_event_was_answered_as_the_route_documents(served):
    _, run = served
    statuses = {name: a["status"] for name, a in run["answers"].items()}
    assert statuses == {"healthz": 200, "readyz": 200, "openapi": 200, "observation": 201, "batch": 201,
                        "consolidation": 201, "admin_rebuild": 200, "compile": 200, "context": 200, "feedback": 201,
                        "evidence": 200, "supersede": 201, "revoke": 200, "expire": 200,
                        "mcp-initialize.json": 200, "mcp-tools-list.json": 200, "mcp-compile.json": 200,
                        "mcp-get.json": 405, "erase_observation": 202, "erase_subject": 202, "erasure": 200,
                        "unmatched": 404}


def test_every_route_of_the_app_has_its_line_under_its_template(served):
    lam, run = served
    lines = request_lines(run["err"])
    templates = {route.path for route in lam.api.app.routes}
    assert {line["route"] for line in lines} == templates | {None}
    assert len(lines) == len(run["answers"])  # one line per invocation
    assert [line["request_id"] for line in lines] == [a["request_id"] for a in run["answers"].values()]
    assert {line["lambda_request_id"] for line in lines} == {LambdaContext.aws_request_id}


def test_no_line_holds_an_id_from_a_path_or_the_unmatched_path(served):
    _, run = served
    lines = json.dumps(request_lines(run["err"]))
    assert not [i for i in run["ids"] if i in lines]
    assert UNMATCHED_PATH not in lines and "claim_0190aaaa" not in lines


def test_nothing_a_caller_wrote_nor_the_key_is_printed(served):
    lam, run = served
    printed = run["out"] + run["err"]
    secrets = [lam.key, lam.key.removeprefix("titen_sk_")]
    for name in sorted(p.name for p in (ROOT / "infra" / "events").glob("*.json")):
        secrets += written_text(name)
    assert len(secrets) > 10  # the event files' texts, statements, task and reason were collected
    assert [s for s in secrets if s in printed] == []


def test_every_metrics_document_follows_the_emf_specification(served):
    _, run = served
    docs = emf_documents(run["out"])
    assert docs
    for doc in docs:
        assert_emf(doc)
    assert {d["Namespace"] for doc in docs for d in doc["_aws"]["CloudWatchMetrics"]} == {f"titen/{STACK}"}


def test_each_route_counts_its_requests_and_latency(served):
    lam, run = served
    found = metric_values(emf_documents(run["out"]))
    lines = request_lines(run["err"])
    for template in {route.path for route in lam.api.app.routes} | {"unmatched"}:
        dims = frozenset({("Service", "api"), ("Route", template)})
        expected = [line["latency_ms"] for line in lines if (line["route"] or "unmatched") == template]
        assert found[("Latency", dims)] == expected, template
        assert found[("Requests", dims)] == [1] * len(expected), template


def test_compiles_write_their_metrics_over_http_and_mcp(served):
    _, run = served
    found = metric_values(emf_documents(run["out"]))
    api = frozenset({("Service", "api")})
    compiles = [line for line in request_lines(run["err"]) if "candidates" in line]
    assert [line["route"] for line in compiles] == ["/v1/context/compile", "/mcp"]
    assert found[("CompileLatency", api)] == [line["latency_ms"] for line in compiles]
    assert found[("Candidates", api)] == [line["candidates"] for line in compiles]
    assert found[("PackItems", api)] == [line["items"] for line in compiles] and compiles[0]["items"] >= 1
    assert found[("BudgetUse", api)] == [round(100 * x["used_tokens"] / x["max_tokens"], 2) for x in compiles]
    assert found[("VectorUsed", api)] == found[("VectorErrors", api)] == [0, 0]  # vector: disabled
    assert len(found[("GenerationAge", api)]) == 2


def test_errors_are_counted_by_code(served):
    _, run = served
    found = metric_values(emf_documents(run["out"]))
    errors = {dict(dims)["Code"]: sum(values) for (name, dims), values in found.items() if name == "Errors"}
    assert errors == {"METHOD_NOT_ALLOWED": 1, "NOT_FOUND": 1}


def test_the_rebuild_writes_its_metrics_beside_its_line(served):
    _, run = served
    found = metric_values(emf_documents(run["out"]))
    rebuild = frozenset({("Service", "rebuild")})
    lines = [json.loads(x) for x in run["out"].splitlines() if x.startswith("{")]
    published = [line for line in lines if line.get("event") == "rebuild" and line["published"]]
    assert published and found[("FreshnessLag", rebuild)] == [x["freshness_lag_seconds"] for x in published]
    assert found[("EntriesApplied", rebuild)] == [x["entries_applied"] for x in published]


def test_no_organization_dimension_unless_one_is_named(served):
    _, run = served
    docs = emf_documents(run["out"])
    assert not any("Organization" in doc for doc in docs)
    assert not any("Organization" in dims for doc in docs for d in doc["_aws"]["CloudWatchMetrics"]
                   for dims in d["Dimensions"])


@pytest.fixture
def demo_named(as_deployed, monkeypatch):
    monkeypatch.setenv("TITEN_METRICS_ORGS", "demo")  # the MetricsOrganizations parameter


def test_a_named_organization_gets_its_own_dimension(demo_named, lam, capsys):
    capsys.readouterr()
    invoke(lam, routed("observation.json", lam.key))
    (doc,) = emf_documents(capsys.readouterr().out)
    assert doc["Organization"] == "demo"
    assert ["Service", "Route", "Organization"] in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
