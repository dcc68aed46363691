"""``titen mcp``: the MCP tools over stdio, for local agent hosts (docs/api.md, MCP; README).

Newline-delimited JSON-RPC on stdin and stdout (stdout carries only
messages; anything else goes to stderr). Two ways to answer:

- **embedded**: the same ``McpServer`` as ``POST /mcp``, over a local
  ``Service`` (``--data-dir``/``--store``) that rebuilds in-process shortly
  after a write, like ``titen serve``; every message is authorized with the
  one key given by ``--api-key`` or ``TITEN_API_KEY``;
- **bridged** (``--url``): each message is POSTed to ``<url>/mcp`` with that
  key as its Bearer token and the answer written back, so a host can reach
  a served titen (Lambda or ``titen serve``) through a local command.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import IO, Callable

from core.errors import PayloadTooLarge, TitenError, ValidationError
from core.ids import new_id
from core.api.mcp import MESSAGE_DEPTH, PARSE_ERROR, SERVER_ERROR, McpServer, RpcError, message_id, rpc_error
from core.budget.items import dumps
from core.validation import check_size, parse_json_value

Answer = Callable[[bytes], "dict | None"]


def run(answer: Answer, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """Answer every line of ``stdin`` on ``stdout`` until end of input."""
    for line in stdin:
        if not line.strip():
            continue
        reply = answer(line)
        if reply is not None:
            stdout.write(dumps(reply).encode() + b"\n")
            stdout.flush()
    return 0


def embedded(service, api_key: str) -> Answer:
    server = McpServer(service)
    authorization = "Bearer " + api_key

    def answer(line: bytes) -> dict | None:
        message = None
        try:
            try:
                message = parse_json_value(line, MESSAGE_DEPTH)
            except ValidationError as exc:
                raise RpcError(PARSE_ERROR, exc.message) from None
            return server.handle(message, lambda: service.keys.authenticate(authorization), new_id("req"))
        except RpcError as exc:
            error = rpc_error(message_id(message), exc.code, exc.message)
        except TitenError as exc:
            if message is None and isinstance(exc, PayloadTooLarge):
                # refused before it was parsed: parsed now for its id alone, so
                # the client can match the answer (a null id left it waiting)
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):  # deeper than the parser goes: no id to read
                    pass
            error = rpc_error(message_id(message), SERVER_ERROR, exc.message, {"code": exc.code})
        except Exception as exc:  # the store, or a bug: say so on stderr, answer an error
            print(f"titen mcp: {type(exc).__name__}: {exc}", file=sys.stderr)
            error = rpc_error(message_id(message), SERVER_ERROR, "internal error", {"code": "INTERNAL"})
        return error if _expects_answer(message) else None
    return answer


def refusing(error: TitenError) -> Answer:
    """Every message that expects an answer gets ``error`` under its id: a
    key this store does not know, or a store that is not there. The host
    then shows why (its initialize fails with the message) instead of a
    server that closed before answering."""

    def answer(line: bytes) -> dict | None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if not _expects_answer(message):
            return None
        return rpc_error(message_id(message), SERVER_ERROR, error.message, {"code": error.code})
    return answer


def bridged(url: str, api_key: str | None, timeout: float = 60.0) -> Answer:
    endpoint = url.rstrip("/") if url.rstrip("/").endswith("/mcp") else url.rstrip("/") + "/mcp"
    negotiated: dict[str, str] = {}

    def answer(line: bytes) -> dict | None:
        try:
            message = json.loads(line)
        except ValueError:
            return rpc_error(None, PARSE_ERROR, "not valid JSON")
        except RecursionError:  # the server refuses it unread as well, under a null id
            return rpc_error(None, PARSE_ERROR, f"request body nests deeper than {MESSAGE_DEPTH} levels")
        raw = line.strip()
        try:
            # refused here, as the server would: a server answers 413 while
            # the body is still arriving and may close before it is all sent
            # (the relay then saw a broken connection, not the 413)
            check_size(raw)
        except PayloadTooLarge as exc:
            return rpc_error(message_id(message), SERVER_ERROR, exc.message, {"code": exc.code})
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if api_key:
            headers["authorization"] = "Bearer " + api_key
        if "version" in negotiated:
            headers["mcp-protocol-version"] = negotiated["version"]
        request = urllib.request.Request(endpoint, data=raw, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        except OSError as exc:
            return _failed(message, f"cannot reach {endpoint}: {exc}")
        if not body:
            return None  # 202: a notification
        try:
            reply = json.loads(body)
        except ValueError:
            return _failed(message, f"{endpoint} answered something other than JSON")
        if isinstance(reply, dict) and reply.get("id") is None and "error" in reply:
            # a 401 or 413 is answered before the server reads the body, so
            # under a null id; the message's own lets the client match it
            reply["id"] = message_id(message)
        if isinstance(message, dict) and message.get("method") == "initialize":
            version = (reply.get("result") or {}).get("protocolVersion")
            if isinstance(version, str):
                negotiated["version"] = version
        return reply if _expects_answer(message) else None
    return answer


def _failed(message, reason: str) -> dict | None:
    """The relay could not deliver ``message``: an error answer, unless it
    is a notification (JSON-RPC 2.0 §4.1: never answered), which is then
    lost and said so on stderr."""
    if _expects_answer(message):
        return rpc_error(message_id(message), SERVER_ERROR, reason, {"code": "UNAVAILABLE"})
    print(f"titen mcp: a message that takes no answer was not delivered: {reason}", file=sys.stderr)
    return None


def _expects_answer(message) -> bool:
    """Everything but a notification or a response (JSON-RPC 2.0 §5: a
    response is never answered) gets an answer, errors included."""
    if not isinstance(message, dict):
        return True
    if "id" not in message:
        return False  # a notification
    return not ("method" not in message and ("result" in message or "error" in message))
