"""What an agent host does over MCP, driven by the official SDK client.

The same sequence runs against every transport (tests/test_mcp.py against
``titen serve`` and stdio, tests/test_lambda_handlers.py through the Lambda
handler): initialize, list the tools, remember a claim, rebuild, compile it
back, give feedback, and see a missing scope and a foreign id come back as
tool errors, the foreign id exactly like an unknown one.
"""

from __future__ import annotations

import json

from core.domain import INSTRUCTIONS
from core.api.mcp import TOOLS

TOOL_NAMES = {"titen_remember", "titen_consolidate", "titen_compile", "titen_feedback", "titen_evidence",
              "titen_forget"}
UNKNOWN_CLAIM = "claim_" + "0" * 32
STATEMENT = "Deploy smoke checks must pass before a release is promoted."


def remember_args(subject_id="user_rama"):
    return {"subject_id": subject_id, "content": "Rama said the deploy smoke checks gate every release.",
            "visibility": "organization",
            "claim": {"statement": STATEMENT, "kind": "procedural", "confidence": 0.9}}


def compile_args(subject_id="user_rama"):
    return {"subject_id": subject_id, "task": "can we promote the release? did the smoke checks pass?",
            "max_tokens": 1200}


def masked(result, claim_id: str) -> dict:
    """A tool error with the id it names replaced, to compare two answers."""
    return json.loads(json.dumps(result.structured_content).replace(claim_id, "<id>"))


async def agent_sequence(connect, rebuild, *, key: str, compile_only_key: str, foreign_claim_id: str,
                         expect_version: str = "2025-11-25") -> dict:
    """``connect(key)``: an async context manager yielding an entered ``mcp.Client``;
    ``rebuild()``: an awaitable that makes the writes compile-visible."""
    async with connect(key) as client:
        assert client.protocol_version == expect_version
        assert client.server_info.name == "titen-lambda"
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOL_NAMES
        for tool in tools:
            assert tool.input_schema == TOOLS[tool.name].arguments.schema()
            assert tool.input_schema["type"] == "object" and tool.input_schema["additionalProperties"] is False

        remembered = await client.call_tool("titen_remember", remember_args())
        assert remembered.is_error is False, remembered.content
        claim_id = remembered.structured_content["claim_id"]
        assert json.loads(remembered.content[0].text) == remembered.structured_content

        await rebuild()
        pack = await client.call_tool("titen_compile", compile_args())
        assert pack.is_error is False, pack.content
        first_line, rest = pack.content[0].text.split("\n", 1)
        assert first_line == INSTRUCTIONS
        assert json.loads(rest) == pack.structured_content
        items = pack.structured_content["items"]
        assert [i["claim"] for i in items if i["claim_id"] == claim_id] == [STATEMENT]

        feedback = await client.call_tool("titen_feedback", {"context_id": pack.structured_content["context_id"],
                                                             "outcome": "useful", "claim_id": claim_id})
        assert feedback.is_error is False, feedback.content
        assert feedback.structured_content["feedback_id"].startswith("fb_")
        assert feedback.structured_content["claim_id"] == claim_id

        foreign = await client.call_tool("titen_evidence", {"claim_id": foreign_claim_id})
        unknown = await client.call_tool("titen_evidence", {"claim_id": UNKNOWN_CLAIM})
        assert foreign.is_error is True and unknown.is_error is True
        assert masked(foreign, foreign_claim_id) == masked(unknown, UNKNOWN_CLAIM) == {
            "error": {"code": "NOT_FOUND", "message": "claim <id> not found"}}
        assert foreign.content[0].text.replace(foreign_claim_id, "<id>") == \
            unknown.content[0].text.replace(UNKNOWN_CLAIM, "<id>")

    async with connect(compile_only_key) as client:
        denied = await client.call_tool("titen_remember", remember_args())
        assert denied.is_error is True
        assert denied.structured_content == {"error": {"code": "FORBIDDEN",
                                                       "message": "this key lacks the memory:write scope"}}
    return {"claim_id": claim_id, "context_id": pack.structured_content["context_id"]}
