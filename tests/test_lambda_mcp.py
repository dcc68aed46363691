"""POST /mcp on Lambda: the handler, invoked with infra/events/mcp-*.json.

The SDK client (``mcp.Client`` over ``mcp.client.streamable_http``) runs
the agent sequence through ``handler.api.handler``: an httpx2 transport
turns each of its HTTP requests into an API Gateway HTTP API (payload v2)
event, built from infra/events/mcp-initialize.json, and the handler's
answer back into the HTTP response. The event files are also replayed as
they are. S3 is moto, as in tests/test_lambda_handlers.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from core.domain import INSTRUCTIONS
from core.keys import KeyRing
from core.api.mcp import REMEMBER_DEFAULTS
from mcp_agent import TOOL_NAMES, agent_sequence, remember_args
from test_lambda_handlers import LambdaContext, call, event, lam  # noqa: F401  (lam is a fixture)

MCP_EVENTS = ["mcp-initialize.json", "mcp-tools-list.json", "mcp-compile.json", "mcp-get.json"]


def invoke(handler, evt):
    """One Lambda invocation on a worker thread, which (like Lambda) has its own event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return handler(evt, LambdaContext())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


class LambdaTransport(httpx2.AsyncBaseTransport):
    """HTTP request -> HTTP API payload v2 event -> handler -> HTTP response."""

    def __init__(self, handler):
        self.handler = handler
        self.template = event("mcp-initialize.json")
        self.events = []

    async def handle_async_request(self, request):
        body = await request.aread()
        evt = copy.deepcopy(self.template)
        evt["rawPath"] = evt["requestContext"]["http"]["path"] = request.url.path
        evt["requestContext"]["http"]["method"] = request.method
        evt["headers"] = {k.lower(): v for k, v in request.headers.items()}
        evt["body"] = base64.b64encode(body).decode()
        self.events.append(evt)
        response = await anyio.to_thread.run_sync(invoke, self.handler, evt)
        content = response.get("body") or ""
        content = base64.b64decode(content) if response.get("isBase64Encoded") else content.encode()
        return httpx2.Response(response["statusCode"], headers=response.get("headers") or {}, content=content)


@pytest.mark.parametrize("name", MCP_EVENTS)
def test_mcp_event_files_are_http_api_payload_v2(name):
    evt = event(name)
    assert evt["version"] == "2.0" and evt["routeKey"] == "$default"
    assert evt["rawPath"] == evt["requestContext"]["http"]["path"] == "/mcp"
    assert evt["headers"]["authorization"] == "Bearer REPLACE_WITH_KEY"
    if evt["requestContext"]["http"]["method"] == "POST":
        assert evt["isBase64Encoded"] is True
        assert json.loads(base64.b64decode(evt["body"], validate=True))["jsonrpc"] == "2.0"


def test_sdk_client_runs_the_agent_sequence_through_the_lambda_handler(lam):
    ring = KeyRing(lam.store)
    compile_only = ring.create("demo", "bob", ["context:compile"], [])["api_key"]
    other = lam.api.service.keys.authenticate("Bearer " + ring.create("globex", "mallory", ["memory:write"],
                                                                       [])["api_key"])
    foreign = lam.api.service.writes.record_observation(other, {**remember_args(), **REMEMBER_DEFAULTS})
    lam.api.service.rebuild("globex")
    transport = LambdaTransport(lam.api.handler)

    @contextlib.asynccontextmanager
    async def connect(key):
        async with httpx2.AsyncClient(transport=transport, headers={"authorization": f"Bearer {key}"}) as http:
            async with Client(streamable_http_client("https://id.execute-api.us-east-1.amazonaws.com/mcp",
                                                     http_client=http)) as client:
                yield client

    async def rebuild():
        summary = await anyio.to_thread.run_sync(lam.rebuild.handler, event("rebuild-org.json"), LambdaContext())
        assert summary["results"][0]["status"] == "published", summary

    anyio.run(lambda: agent_sequence(connect, rebuild, key=lam.key, compile_only_key=compile_only,
                                     foreign_claim_id=foreign["claim_id"]))
    methods = [json.loads(base64.b64decode(e["body"])).get("method") for e in transport.events]
    assert "initialize" in methods and "tools/list" in methods and methods.count("tools/call") >= 5


def test_initialize_event_answers_the_negotiated_version_without_a_session(lam):
    status, body, response = call(lam, "mcp-initialize.json")
    assert status == 200, body
    assert body["result"]["protocolVersion"] == "2025-11-25"
    assert body["result"]["serverInfo"]["name"] == "titen-lambda"
    assert "mcp-session-id" not in response["headers"]


def test_tools_list_event_lists_the_five_tools(lam):
    status, body, _ = call(lam, "mcp-tools-list.json")
    assert status == 200, body
    assert {t["name"] for t in body["result"]["tools"]} == TOOL_NAMES


def test_compile_event_after_a_rebuild_returns_the_remembered_claim_after_the_instructions(lam):
    _, written, _ = call(lam, "observation.json")
    lam.rebuild.handler(event("rebuild-org.json"), LambdaContext())
    status, body, _ = call(lam, "mcp-compile.json")
    assert status == 200, body
    result = body["result"]
    assert result["isError"] is False
    assert result["content"][0]["text"].startswith(INSTRUCTIONS + "\n")
    assert [i["claim_id"] for i in result["structuredContent"]["items"]] == [written["data"]["claim_id"]]


def test_get_event_is_405(lam):
    evt = event("mcp-get.json", lam.key)
    response = lam.api.handler(evt, LambdaContext())
    assert response["statusCode"] == 405
    assert json.loads(response["body"])["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_compile_event_with_an_unknown_key_is_401(lam):
    evt = event("mcp-compile.json", "titen_sk_" + "A" * 43)
    response = lam.api.handler(evt, LambdaContext())
    assert response["statusCode"] == 401
    assert json.loads(response["body"])["error"]["data"] == {"code": "UNAUTHENTICATED"}


def test_the_openapi_document_answers_through_mangum_without_a_key(lam):
    evt = event("healthz.json")
    evt["rawPath"] = evt["requestContext"]["http"]["path"] = "/openapi.json"
    response = lam.api.handler(evt, LambdaContext())
    assert response["statusCode"] == 200
    body = response["body"]
    doc = json.loads(base64.b64decode(body) if response["isBase64Encoded"] else body)
    assert doc["openapi"] == "3.1.0" and "/mcp" in doc["paths"]
