"""POST /mcp: the stateless MCP subset and its five tools (docs/api.md, MCP).

The agent sequence (tests/mcp_agent.py) runs with the official SDK client
(``mcp.Client`` over ``mcp.client.streamable_http``) against the app in
process and against a real ``titen serve``; the protocol rules are checked
on the wire with plain JSON-RPC posts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from core.bodies import COMPILE, CONSOLIDATION, FEEDBACK, OBSERVATION
from core.config import Settings
from core.domain import INSTRUCTIONS
from core.keys import KeyRing
from core.api.mcp import PROTOCOL_VERSIONS, REMEMBER_DEFAULTS, TOOLS
from core.storage import open_store
from mcp_agent import UNKNOWN_CLAIM, agent_sequence, compile_args, remember_args

ROOT = Path(__file__).resolve().parent.parent
HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


def rpc(api, key, method, params=None, *, id=1, headers=None):
    message = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return api.client.post("/mcp", content=json.dumps(message),
                           headers={**HEADERS, **api._headers(key), "content-type": "application/json",
                                    **(headers or {})})


def call_tool(api, key, name, arguments):
    r = rpc(api, key, "tools/call", {"name": name, "arguments": arguments})
    assert r.status_code == 200, r.text
    return r.json()["result"]


def foreign_claim(api) -> str:
    other = api.key(org="globex", principal="mallory")
    r = api.post("/v1/observations", {**remember_args(), **REMEMBER_DEFAULTS}, other)
    assert r.status_code == 201, r.text
    api.rebuild(other)
    return r.json()["data"]["claim_id"]


# -- the SDK client, in process and against titen serve ------------------------------

def test_sdk_client_runs_the_agent_sequence_in_process(api):
    key = api.key()["authorization"]
    compile_only = api.key(principal="bob", scopes="context:compile")["authorization"]
    foreign = foreign_claim(api)
    app = api.client.app

    @contextlib.asynccontextmanager
    async def connect(auth):
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      headers={"authorization": auth}) as http:
            async with Client(streamable_http_client("http://titen.test/mcp", http_client=http)) as client:
                yield client

    async def rebuild():
        api.service.rebuild("acme")

    anyio.run(lambda: agent_sequence(connect, rebuild, key=key, compile_only_key=compile_only,
                                     foreign_claim_id=foreign))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the server answers /healthz (or fails with what it printed to ``log``)."""
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1)
            return
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(log.read_text()) from None
            time.sleep(0.05)
    raise AssertionError(f"{url} did not start")


@pytest.fixture
def served(tmp_path):
    """A real ``titen serve`` on a free port over an embedded store."""
    yield from serve(tmp_path)


def serve(tmp_path: Path):
    """(url, keys) of a ``titen serve`` over ``tmp_path/titen``, stopped after the yield."""
    data_dir = tmp_path / "titen"
    store = open_store(Settings.from_env(data_dir=str(data_dir)).store_url)
    ring = KeyRing(store)
    keys = {"all": ring.create("acme", "alice", ["context:compile", "context:feedback", "memory:write", "admin"],
                               [])["api_key"],
            "compile": ring.create("acme", "bob", ["context:compile"], [])["api_key"],
            "erase": ring.create("acme", "erin", ["memory:erase"], [])["api_key"],
            "other": ring.create("globex", "mallory", ["memory:write", "admin"], [])["api_key"]}
    port = _free_port()
    env = {**os.environ, "TITEN_CACHE_DIR": str(tmp_path / "cache")}
    # stderr to a file: a pipe nobody reads fills with request lines and stalls the server
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("titen")), "serve", "--data-dir",
                                 str(data_dir), "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, proc, log)
        yield url, keys
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post(url, path, key, body=None):
    request = urllib.request.Request(url + path, data=json.dumps(body or {}).encode() if body is not None else b"",
                                     method="POST", headers={"authorization": f"Bearer {key}",
                                                             "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_sdk_client_runs_the_agent_sequence_against_titen_serve(served):
    url, keys = served
    foreign = _post(url, "/v1/observations", keys["other"], {**remember_args(), **REMEMBER_DEFAULTS})["data"]["claim_id"]
    _post(url, "/v1/admin/rebuild", keys["other"])

    @contextlib.asynccontextmanager
    async def connect(key):
        async with httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"}) as http:
            async with Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
                yield client

    async def rebuild():
        await anyio.to_thread.run_sync(_post, url, "/v1/admin/rebuild", keys["all"])

    anyio.run(lambda: agent_sequence(connect, rebuild, key=keys["all"], compile_only_key=keys["compile"],
                                     foreign_claim_id=foreign))


# -- the protocol on the wire ------------------------------------------------------------

@pytest.mark.parametrize("requested,answered", [
    ("2025-11-25", "2025-11-25"), ("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"),
    ("2024-11-05", "2024-11-05"), ("2031-01-01", PROTOCOL_VERSIONS[0]), (None, PROTOCOL_VERSIONS[0])])
def test_initialize_answers_the_clients_version_when_supported_else_the_newest(api, requested, answered):
    key = api.key()
    params = {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    if requested:
        params["protocolVersion"] = requested
    r = rpc(api, key, "initialize", params, headers={"mcp-protocol-version": ""})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    result = r.json()["result"]
    assert result["protocolVersion"] == answered
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert "mcp-session-id" not in r.headers  # stateless: no session is ever minted


def test_get_on_mcp_is_405_no_sse_stream(api):
    r = api.client.get("/mcp", headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 405 and r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_a_notification_is_accepted_with_202_and_no_body(api):
    r = api.client.post("/mcp", content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                        headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 202 and r.content == b""
    assert r.headers["cache-control"] == "no-store" and r.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize("params", [[1, 2], "str", 3])
def test_a_notification_whose_params_are_not_an_object_is_400_invalid_params(api, params):
    # as for a request (api.md §13); the OpenAPI document says params is an object or null
    r = api.client.post("/mcp", content=json.dumps({"jsonrpc": "2.0", "method": "notifications/x", "params": params}),
                        headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 400
    assert r.json()["id"] is None and r.json()["error"]["code"] == -32602


def test_ping_answers_an_empty_result(api):
    r = rpc(api, api.key(), "ping", id="p-1")
    assert r.json() == {"jsonrpc": "2.0", "id": "p-1", "result": {}}


@pytest.mark.parametrize("headers,code", [({}, "UNAUTHENTICATED"), ({"authorization": "Bearer nope"},
                                                                    "UNAUTHENTICATED")])
def test_mcp_without_a_valid_key_is_401_with_a_jsonrpc_error(api, headers, code):
    r = api.client.post("/mcp", content=json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
                        headers={**HEADERS, **headers})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    body = r.json()
    # the key is checked before the body is read, so the id is not known (JSON-RPC's null)
    assert body["id"] is None and body["error"]["data"] == {"code": code}


@pytest.mark.parametrize("raw", [b"{not json", b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]',
                                 json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping",
                                             "params": {"x": "a" * (1 << 20)}}).encode()])
def test_the_key_is_checked_before_the_body_as_on_every_route(api, raw):
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, "authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["data"] == {"code": "UNAUTHENTICATED"}


@pytest.mark.parametrize("raw,status,code", [
    (b"{not json", 400, -32700),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', 400, -32600),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list"}', 200, -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "titen_nope"}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}', 400, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": "abc"}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}', 200, -32602),
])
def test_protocol_failures_are_jsonrpc_errors(api, raw, status, code):
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert api.ledger_keys() == []


def test_a_tool_call_without_a_name_says_the_name_is_required(api):
    r = api.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}},
                        headers={**HEADERS, **api._headers(api.key())})
    assert r.json()["error"]["message"] == "params.name is required: the name of a tool tools/list names"


@pytest.mark.parametrize("message", [
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
])
def test_an_unsupported_protocol_version_header_is_400(api, message):
    r = api.client.post("/mcp", json=message, headers={**HEADERS, **api._headers(api.key()),
                                                       "mcp-protocol-version": "1999-01-01"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600
    assert "2025-11-25" in r.json()["error"]["message"]


def test_a_body_over_one_mib_is_413(api):
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "a" * (1 << 20)}})
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 413 and r.json()["error"]["data"] == {"code": "PAYLOAD_TOO_LARGE"}


# -- the tools ----------------------------------------------------------------------------

def test_tools_list_schemas_are_the_routes_field_specs(api):
    tools = {t["name"]: t for t in rpc(api, api.key(), "tools/list").json()["result"]["tools"]}
    remember = tools["titen_remember"]["inputSchema"]
    route = OBSERVATION.schema()["properties"]
    assert {k: v for k, v in remember["properties"].items() if k not in REMEMBER_DEFAULTS} == \
        {k: v for k, v in route.items() if k not in REMEMBER_DEFAULTS}
    assert remember["properties"]["kind"]["default"] == "user_statement"
    assert remember["properties"]["source"]["properties"] == route["source"]["properties"]
    assert set(remember["required"]) == set(OBSERVATION.required) - set(REMEMBER_DEFAULTS)
    assert tools["titen_consolidate"]["inputSchema"] == CONSOLIDATION.schema()
    compile_schema = tools["titen_compile"]["inputSchema"]
    assert set(compile_schema["properties"]) == {"subject_id", "task", "max_tokens", "project_id", "at"}
    assert compile_schema["properties"]["max_tokens"] == COMPILE.schema()["properties"]["max_tokens"]
    feedback = tools["titen_feedback"]["inputSchema"]
    assert set(feedback["properties"]) == {"context_id", *FEEDBACK.fields}
    assert feedback["required"] == ["context_id", "outcome"]
    assert tools["titen_evidence"]["inputSchema"]["required"] == ["claim_id"]
    assert tools["titen_evidence"]["annotations"]["readOnlyHint"] is True


def test_remember_defaults_kind_and_source_and_stores_one_entry(api, service):
    key = api.key()
    result = call_tool(api, key, "titen_remember", {"subject_id": "user_rama", "content": "Rama likes tea."})
    assert result["isError"] is False
    assert len(api.ledger_keys()) == 1
    observation = service.ledger.read("acme", result["structuredContent"]["observation_id"][4:])["observation"]
    assert observation["kind"] == "user_statement"
    assert observation["source"] == {"type": "mcp", "ref": "titen_remember"}


@pytest.mark.parametrize("tool,arguments,path,body", [
    ("titen_remember", {"subject_id": "user_rama", "content": "x", "trust": "policy_approved"},
     "/v1/observations", {"subject_id": "user_rama", "content": "x", "trust": "policy_approved",
                          **REMEMBER_DEFAULTS}),
    ("titen_remember", {"subject_id": "bad id!", "content": "x"}, "/v1/observations",
     {"subject_id": "bad id!", "content": "x", **REMEMBER_DEFAULTS}),
    ("titen_remember", {"subject_id": "user_rama", "content": "a\x1bb"}, "/v1/observations",
     {"subject_id": "user_rama", "content": "a\x1bb", **REMEMBER_DEFAULTS}),
    ("titen_consolidate", {"subject_id": "user_rama", "claims": []}, "/v1/consolidations",
     {"subject_id": "user_rama", "claims": []}),
    ("titen_compile", {**compile_args(), "max_tokens": 5}, "/v1/context/compile", {**compile_args(), "max_tokens": 5}),
    ("titen_compile", {**compile_args(), "at": "yesterday"}, "/v1/context/compile", {**compile_args(), "at": "yesterday"}),
    ("titen_compile", {**compile_args(), "bogus": 1}, "/v1/context/compile", {**compile_args(), "bogus": 1}),
    ("titen_compile", {**compile_args(), "task": "a\rb"}, "/v1/context/compile", {**compile_args(), "task": "a\rb"}),
    ("titen_remember", {"subject_id": "user_rama", "content": 7}, "/v1/observations",
     {"subject_id": "user_rama", "content": 7, **REMEMBER_DEFAULTS}),
])
def test_a_tools_validation_error_is_the_routes_and_stores_nothing(api, tool, arguments, path, body):
    key = api.key()
    result = call_tool(api, key, tool, arguments)
    route = api.post(path, body, key).json()["error"]
    assert result["isError"] is True
    assert route["code"] == "VALIDATION_ERROR"
    assert result["structuredContent"]["error"] == route  # the route's code and message, word for word
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    assert api.ledger_keys() == []


@pytest.mark.parametrize("tool,arguments", [
    ("titen_compile", {**compile_args(), "include_checkpoints": True}),
    ("titen_evidence", {"claim_id": UNKNOWN_CLAIM, "extra": 1}),
    ("titen_feedback", {"outcome": "useful"}),
])
def test_arguments_the_tool_does_not_declare_or_requires_are_validation_errors(api, tool, arguments):
    result = call_tool(api, api.key(), tool, arguments)
    assert result["isError"] is True and result["structuredContent"]["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.parametrize("tool,scope,arguments", [
    ("titen_remember", "memory:write", remember_args()),
    ("titen_consolidate", "memory:write", {"subject_id": "user_rama", "claims": [
        {"statement": "s", "kind": "procedural", "confidence": 0.5,
         "sources": [{"observation_id": "obs_" + "0" * 32, "relation": "supports"}]}]}),
    ("titen_compile", "context:compile", compile_args()),
    ("titen_feedback", "context:feedback", {"context_id": "ctx_" + "0" * 32, "outcome": "useful"}),
    ("titen_evidence", "context:compile", {"claim_id": UNKNOWN_CLAIM}),
    ("titen_forget", "memory:erase", {"subject_id": "user_rama"}),
])
def test_each_tool_needs_the_scope_of_its_route(api, tool, scope, arguments):
    others = ",".join(s for s in ("context:compile", "context:feedback", "memory:write") if s != scope)
    result = call_tool(api, api.key(principal="carol", scopes=others), tool, arguments)
    assert result["isError"] is True
    assert result["structuredContent"] == {"error": {"code": "FORBIDDEN", "message": f"this key lacks the {scope} scope"}}
    assert api.ledger_keys() == []


def test_compile_text_starts_with_the_instructions_and_carries_the_routes_data(api):
    key = api.key()
    api.observe(key, claim={"statement": "Deploy smoke must pass.", "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    result = call_tool(api, key, "titen_compile", compile_args())
    route = api.compile(key, compile_args()["task"]).json()["data"]
    text = result["content"][0]["text"]
    assert text.startswith(INSTRUCTIONS + "\n")
    data = result["structuredContent"]
    assert json.loads(text[len(INSTRUCTIONS) + 1:]) == data
    strip = lambda d: {k: v for k, v in d.items() if k != "context_id"}  # noqa: E731
    assert strip(data) == strip(route)


def test_feedback_on_another_principals_pack_reads_like_an_unknown_pack(api):
    alice, bob = api.key(), api.key(principal="bob", scopes="context:compile,context:feedback")
    context_id = api.compile(alice, "deploy").json()["data"]["context_id"]
    unknown = "ctx_" + "0" * 32
    theirs = call_tool(api, bob, "titen_feedback", {"context_id": context_id, "outcome": "useful"})
    missing = call_tool(api, bob, "titen_feedback", {"context_id": unknown, "outcome": "useful"})
    assert theirs["isError"] is missing["isError"] is True
    assert (json.dumps(theirs).replace(context_id, "<id>") == json.dumps(missing).replace(unknown, "<id>"))


def test_evidence_of_a_private_claim_of_another_principal_reads_like_an_unknown_claim(api):
    alice, bob = api.key(), api.key(principal="bob", scopes="context:compile")
    data = api.observe(alice, visibility="private",
                       claim={"statement": "Alice's secret.", "kind": "preference", "confidence": 0.9})
    api.rebuild(alice)
    assert call_tool(api, alice, "titen_evidence", {"claim_id": data["claim_id"]})["isError"] is False
    theirs = call_tool(api, bob, "titen_evidence", {"claim_id": data["claim_id"]})
    missing = call_tool(api, bob, "titen_evidence", {"claim_id": UNKNOWN_CLAIM})
    assert json.dumps(theirs).replace(data["claim_id"], "<id>") == json.dumps(missing).replace(UNKNOWN_CLAIM, "<id>")


def test_every_tool_in_the_table_has_a_spec_for_its_arguments():
    assert set(TOOLS) == {"titen_remember", "titen_consolidate", "titen_compile", "titen_feedback",
                          "titen_evidence", "titen_forget"}


def test_consolidating_another_organizations_observation_reads_like_an_unknown_one(api):
    mallory = api.key(org="globex", principal="mallory")
    theirs = api.post("/v1/observations", {**remember_args(), **REMEMBER_DEFAULTS}, mallory).json()["data"]
    unknown = "obs_" + "0" * 32
    alice = api.key()

    def consolidate(observation_id):
        return call_tool(api, alice, "titen_consolidate", {"subject_id": "user_rama", "claims": [
            {"statement": "s", "kind": "procedural", "confidence": 0.5,
             "sources": [{"observation_id": observation_id, "relation": "supports"}]}]})

    foreign, missing = consolidate(theirs["observation_id"]), consolidate(unknown)
    assert foreign["structuredContent"]["error"]["code"] == "NOT_FOUND"
    assert json.dumps(foreign).replace(theirs["observation_id"], "<id>") == json.dumps(missing).replace(unknown, "<id>")
    assert api.ledger_keys("acme") == []


def test_a_2026_discover_probe_is_refused_so_the_client_falls_back_to_initialize(api):
    r = rpc(api, api.key(), "server/discover", {}, headers={"mcp-protocol-version": "2026-07-28"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600
    assert all(v in r.json()["error"]["message"] for v in PROTOCOL_VERSIONS)


def test_concurrent_tool_calls_against_titen_serve_all_answer(served):
    """Tools read the snapshot under the organization's serving lock, like
    the routes: eight threads of compile and evidence calls all succeed."""
    import concurrent.futures

    url, keys = served
    written = _post(url, "/v1/observations", keys["all"], {**remember_args(), **REMEMBER_DEFAULTS})["data"]
    _post(url, "/v1/admin/rebuild", keys["all"])

    def tool(name, arguments):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": name, "arguments": arguments}}).encode()
        request = urllib.request.Request(url + "/mcp", data=body, method="POST", headers={
            "authorization": f"Bearer {keys['all']}", "content-type": "application/json", **HEADERS})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["result"]

    calls = [("titen_compile", compile_args()), ("titen_evidence", {"claim_id": written["claim_id"]})] * 20
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: tool(*c), calls))
    assert [r["isError"] for r in results] == [False] * len(calls)


def test_forget_is_the_subject_erasure_route_and_is_marked_destructive(api):
    key = api.key(scopes="memory:write,memory:erase,context:compile,admin")
    api.observe(key, content="Remember the harbour at dawn.",
                claim={"statement": "Harbour visits happen at dawn.", "kind": "episodic_event", "confidence": 0.9})
    api.rebuild(key)
    listing = {t["name"]: t for t in rpc(api, key, "tools/list").json()["result"]["tools"]}
    assert listing["titen_forget"]["annotations"]["destructiveHint"] is True
    result = call_tool(api, key, "titen_forget", {"subject_id": "user_rama"})
    assert result["isError"] is False
    asked = result["structuredContent"]
    assert asked["subject_id"] == "user_rama" and asked["status"] == "pending"
    api.rebuild(key)
    done = api.get(f"/v1/erasures/{asked['erasure_id']}", key).json()["data"]
    assert done["status"] == "complete" and done["counts"]["claims"] == 1
    assert api.compile(key, "harbour dawn").json()["data"]["items"] == []


@pytest.mark.parametrize("tool,arguments,method,path", [
    ("titen_evidence", {"claim_id": "claim_" + "a" * 70}, "GET", "/v1/claims/claim_" + "a" * 70 + "/evidence"),
    ("titen_evidence", {"claim_id": "   "}, "GET", "/v1/claims/%20%20%20/evidence"),
    ("titen_feedback", {"context_id": "ctx_" + "b" * 90, "outcome": "used"}, "POST",
     "/v1/context/ctx_" + "b" * 90 + "/feedback"),
    ("titen_forget", {"subject_id": "bad id!"}, "DELETE", "/v1/subjects/bad%20id%21"),
])
def test_an_id_argument_gets_exactly_the_answer_its_route_gives_that_path(api, tool, arguments, method, path):
    # (a control character is the exception: in arguments it is body text, refused by the body rule)
    key = api.key(scopes="context:compile,context:feedback,memory:write,memory:erase")
    result = call_tool(api, key, tool, arguments)
    route = api.client.request(method, path, headers=api._headers(key),
                               json={"outcome": "used"} if method == "POST" else None).json()["error"]
    assert result["isError"] is True and result["structuredContent"]["error"] == route
    assert api.ledger_keys() == []


@pytest.mark.parametrize("raw_id", [r'"a\ud800"', r'"\udfff"', r'"\udc00\ud800"'])
def test_an_id_that_is_not_well_formed_unicode_is_an_invalid_request_under_a_null_id(api, raw_id):
    # the id was echoed as it came, and writing the answer failed: a 500 in the REST envelope
    raw = b'{"jsonrpc": "2.0", "id": ' + raw_id.encode() + b', "method": "ping"}'
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["id"] is None and body["error"]["code"] == -32600
    assert body["error"]["message"] == "the JSON-RPC id must be a string or an integer, in well-formed Unicode"


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [62, 63, 64, 65, 66, 128])
def test_tool_arguments_nest_as_deep_as_the_routes_body_and_no_deeper(api, depth):
    # the arguments object is the route's body (level 1); the JSON-RPC message
    # around it does not count against the limit of 64
    key = api.key()
    body = {**remember_args(), "bogus": _nested(depth - 1)}
    result = call_tool(api, key, "titen_remember", body)
    route = api.post("/v1/observations", {**body, **REMEMBER_DEFAULTS}, key).json()["error"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == route
    assert api.ledger_keys() == []


def test_a_message_nesting_deeper_than_twice_the_body_limit_is_refused_unread_as_a_parse_error(api):
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "titen_remember", "arguments": {"x": _nested(200)}}})
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700
    assert r.json()["error"]["message"] == "request body nests deeper than 130 levels"
    assert api.ledger_keys() == []


def test_a_body_rule_is_checked_before_the_tools_scope_as_on_its_route(api):
    # docs/api.md §3: the body rules (3) come before the scope (5)
    key = api.key(principal="carol", scopes="context:compile")
    arguments = {"subject_id": "user_rama", "content": "x\u0007"}
    result = call_tool(api, key, "titen_remember", arguments)
    route = api.post("/v1/observations", {**arguments, **REMEMBER_DEFAULTS}, key).json()["error"]
    assert route["code"] == "VALIDATION_ERROR"
    assert result["structuredContent"]["error"] == route


def test_a_key_twice_in_a_message_is_a_parse_error_and_runs_nothing(api):
    raw = (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "titen_remember", '
           b'"arguments": {"subject_id": "user_rama", "content": "\\u0007", "content": "ok"}}}')
    r = api.client.post("/mcp", content=raw, headers={**HEADERS, **api._headers(api.key())})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700
    assert r.json()["error"]["message"] == "request body has the key 'content' twice in one object; send each key once"
    assert api.ledger_keys() == []
