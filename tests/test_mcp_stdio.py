"""``titen mcp``: the agent sequence over stdio with the SDK's stdio client.

Embedded: ``titen mcp --data-dir D --api-key K`` answers from the local
store. Bridged: ``titen mcp --url U`` (key from ``TITEN_API_KEY``) relays
to a real ``titen serve``. Both pass tests/mcp_agent.py unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from core.config import Settings
from core.keys import KeyRing
from core.api.mcp import REMEMBER_DEFAULTS
from core.service import Service
from mcp_agent import agent_sequence, remember_args
from test_mcp import _post, served  # noqa: F401  (served is a fixture)

TITEN = str(Path(sys.executable).with_name("titen"))


def _params(args, tmp_path, **env):
    return StdioServerParameters(command=TITEN, args=args,
                                 env={"TITEN_CACHE_DIR": str(tmp_path / f"cache-{len(os.listdir(tmp_path))}"),
                                      "TITEN_SNAPSHOT_TTL": "0", **env})


def test_sdk_stdio_client_runs_the_agent_sequence_on_the_embedded_store(tmp_path):
    data_dir = tmp_path / "titen"
    service = Service(Settings.from_env(data_dir=str(data_dir), env={"TITEN_SNAPSHOT_TTL": "0"}))
    ring = KeyRing(service.store)
    key = ring.create("acme", "alice", ["context:compile", "context:feedback", "memory:write", "admin"], [])
    compile_only = ring.create("acme", "bob", ["context:compile"], [])["api_key"]
    other = service.keys.authenticate("Bearer " + ring.create("globex", "mallory", ["memory:write"], [])["api_key"])
    foreign = service.writes.record_observation(other, {**remember_args(), **REMEMBER_DEFAULTS})["claim_id"]
    service.rebuild("globex")

    @contextlib.asynccontextmanager
    async def connect(api_key):
        async with Client(_params(["mcp", "--data-dir", str(data_dir), "--api-key", api_key], tmp_path)) as client:
            yield client

    async def rebuild():
        await anyio.to_thread.run_sync(service.rebuild, "acme")

    anyio.run(lambda: agent_sequence(connect, rebuild, key=key["api_key"], compile_only_key=compile_only,
                                     foreign_claim_id=foreign))


def test_sdk_stdio_client_runs_the_agent_sequence_bridged_to_titen_serve(served, tmp_path):
    url, keys = served
    foreign = _post(url, "/v1/observations", keys["other"], {**remember_args(), **REMEMBER_DEFAULTS})["data"]
    _post(url, "/v1/admin/rebuild", keys["other"])

    @contextlib.asynccontextmanager
    async def connect(api_key):
        async with Client(_params(["mcp", "--url", url], tmp_path, TITEN_API_KEY=api_key)) as client:
            yield client

    async def rebuild():
        await anyio.to_thread.run_sync(_post, url, "/v1/admin/rebuild", keys["all"])

    anyio.run(lambda: agent_sequence(connect, rebuild, key=keys["all"], compile_only_key=keys["compile"],
                                     foreign_claim_id=foreign["claim_id"]))


def _embedded(tmp_path, key: str, lines: bytes) -> subprocess.CompletedProcess:
    """``titen mcp`` on the embedded store ``tmp_path/d``, fed ``lines`` on stdin."""
    return subprocess.run([TITEN, "mcp", "--data-dir", str(tmp_path / "d"), "--api-key", key], input=lines,
                          capture_output=True, timeout=60, env={**os.environ, "TITEN_CACHE_DIR": str(tmp_path / "c")})


def test_titen_mcp_without_a_key_says_so_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TITEN_API_KEY"}
    proc = subprocess.run([TITEN, "mcp", "--data-dir", str(tmp_path / "d")], input=b"", capture_output=True,
                          env=env, timeout=60)
    assert proc.returncode == 2 and b"--api-key or TITEN_API_KEY" in proc.stderr


def test_an_embedded_server_with_a_key_the_store_does_not_know_answers_every_message_with_why(tmp_path):
    # it exited before answering: a host saw only a server that closed
    Service(Settings.from_env(data_dir=str(tmp_path / "d"))).keys.create("acme", "alice", ["context:compile"], [])
    lines = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}\n' \
            b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n'
    proc = _embedded(tmp_path, "titen_sk_" + "A" * 43, lines)
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(a["id"], a["error"]["data"]["code"]) for a in answers] == [(1, "UNAUTHENTICATED"), (2, "UNAUTHENTICATED")]
    assert proc.returncode == 2 and b"not valid" in proc.stderr
    assert not (tmp_path / "c").exists()  # nothing was made for a process that cannot act


def test_an_embedded_server_on_a_data_directory_that_is_not_there_says_so_and_makes_none(tmp_path):
    proc = _embedded(tmp_path, "titen_sk_" + "A" * 43, b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answer["id"] == 1 and answer["error"]["data"]["code"] == "NOT_FOUND"
    assert "no store at" in answer["error"]["message"] and proc.returncode == 2
    assert not (tmp_path / "d").exists()


def test_stdio_answers_a_bad_line_with_a_parse_error_and_ignores_notifications(tmp_path):
    service = Service(Settings.from_env(data_dir=str(tmp_path / "d")))
    key = service.keys.create("acme", "alice", ["context:compile"], [])["api_key"]
    lines = b'{not json\n{"jsonrpc": "2.0", "method": "notifications/initialized"}\n' \
            b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n'
    proc = _embedded(tmp_path, key, lines)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 9]
    assert answers[0]["error"]["code"] == -32700 and answers[1]["result"] == {}


def test_the_embedded_server_answers_a_message_over_1_mib_under_its_own_id(tmp_path):
    # it answered under a null id, and the SDK's stdio client waited forever
    service = Service(Settings.from_env(data_dir=str(tmp_path / "d")))
    key = service.keys.create("acme", "alice", ["memory:write"], [])["api_key"]
    big = {"name": "titen_remember", "arguments": {"subject_id": "s", "content": "x" * (1 << 20)}}
    lines = (json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": big}).encode() + b"\n"
             + json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": big}).encode() + b"\n"
             + b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n')
    proc = _embedded(tmp_path, key, lines)
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [8, 9]  # the notification is never answered
    assert answers[0]["error"]["data"]["code"] == "PAYLOAD_TOO_LARGE"
    assert not list(service.store.list_keys("orgs/acme/ledger/"))


def test_the_relay_never_answers_a_notification_even_when_the_server_is_unreachable(tmp_path):
    # port 9 (discard) on localhost: nothing listens, the connection is refused
    lines = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n' \
            b'{"jsonrpc": "2.0", "id": 3, "method": "ping"}\n'
    proc = subprocess.run([TITEN, "mcp", "--url", "http://127.0.0.1:9"], input=lines, capture_output=True,
                          timeout=60, env={**os.environ, "TITEN_API_KEY": "titen_sk_" + "x" * 43})
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [3]
    assert answers[0]["error"]["data"]["code"] == "UNAVAILABLE"
    assert b"takes no answer was not delivered" in proc.stderr


def test_the_relay_answers_a_refused_message_under_its_own_id(served):
    """Over HTTP a 401 is answered before the body is read, so its id is
    null; the relay has read the message and knows it (a null id left the
    SDK's stdio client waiting forever). A message over 1 MiB the relay
    refuses itself, under its id, without sending it."""
    url, keys = served
    lines = (b'{"jsonrpc": "2.0", "id": 5, "method": "ping"}\n'
             + json.dumps({"jsonrpc": "2.0", "id": "big", "method": "ping",
                           "params": {"x": "a" * (1 << 20)}}).encode() + b"\n")
    for api_key, codes in (("titen_sk_" + "x" * 43, ["UNAUTHENTICATED", "PAYLOAD_TOO_LARGE"]),
                           (keys["all"], [None, "PAYLOAD_TOO_LARGE"])):
        proc = subprocess.run([TITEN, "mcp", "--url", url], input=lines, capture_output=True, timeout=60,
                              env={**os.environ, "TITEN_API_KEY": api_key})
        answers = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [a["id"] for a in answers] == [5, "big"]
        assert [(a.get("error") or {}).get("data", {}).get("code") for a in answers] == codes


def _deep(levels: int, pad: int = 0) -> bytes:
    """A ping whose params nest ``levels`` deep (deeper than Python's parser
    recurses past about 1000), padded to ``pad`` bytes."""
    inner = b"[" * levels + b"]" * levels
    return b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"p": "' + b"x" * pad + b'", "d": ' \
        + inner + b"}}\n"


def test_the_embedded_server_answers_a_message_over_1_mib_too_deep_to_parse_and_goes_on(tmp_path):
    # re-read for its id, it raised RecursionError and titen mcp died
    service = Service(Settings.from_env(data_dir=str(tmp_path / "d")))
    key = service.keys.create("acme", "alice", ["context:compile"], [])["api_key"]
    proc = _embedded(tmp_path, key, _deep(600_000) + b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n')
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 9]
    assert answers[0]["error"]["data"]["code"] == "PAYLOAD_TOO_LARGE" and answers[1]["result"] == {}


def test_the_relay_answers_a_message_too_deep_to_parse_with_a_parse_error_and_goes_on(served):
    url, keys = served
    proc = subprocess.run([TITEN, "mcp", "--url", url], input=_deep(1500) + b'{"jsonrpc": "2.0", "id": 9, '
                          b'"method": "ping"}\n', capture_output=True, timeout=60,
                          env={**os.environ, "TITEN_API_KEY": keys["compile"]})
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 9]
    assert answers[0]["error"]["code"] == -32700 and answers[1]["result"] == {}


@pytest.mark.parametrize("url", ["served", "http://127.0.0.1:9"])
def test_the_relay_never_answers_a_response(served, url):
    # JSON-RPC 2.0: a response is never answered; with a bad key or no
    # server the relay answered it with an error under its id
    lines = b'{"jsonrpc": "2.0", "id": 5, "result": {}}\n{"jsonrpc": "2.0", "id": 6, "error": ' \
            b'{"code": 1, "message": "m"}}\n{"jsonrpc": "2.0", "id": 7, "method": "ping"}\n'
    proc = subprocess.run([TITEN, "mcp", "--url", served[0] if url == "served" else url], input=lines,
                          capture_output=True, timeout=60, env={**os.environ, "TITEN_API_KEY": "titen_sk_" + "x" * 43})
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [7]


def test_stdio_answers_an_id_in_ill_formed_unicode_under_a_null_id_and_goes_on(tmp_path):
    # the id was echoed as it came: writing the answer raised, and titen mcp exited
    service = Service(Settings.from_env(data_dir=str(tmp_path / "d")))
    key = service.keys.create("acme", "alice", ["context:compile"], [])["api_key"]
    lines = b'{"jsonrpc": "2.0", "id": "a\\ud800", "method": "ping"}\n{"jsonrpc": "2.0", "id": 3, "method": "ping"}\n'
    proc = _embedded(tmp_path, key, lines)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 3]
    assert answers[0]["error"]["code"] == -32600 and answers[1]["result"] == {}


def test_the_relay_answers_an_id_in_ill_formed_unicode_under_a_null_id_and_goes_on(served):
    url, keys = served
    lines = b'{"jsonrpc": "2.0", "id": "a\\ud800", "method": "ping"}\n{"jsonrpc": "2.0", "id": 3, "method": "ping"}\n'
    proc = subprocess.run([TITEN, "mcp", "--url", url], input=lines, capture_output=True, timeout=60,
                          env={**os.environ, "TITEN_API_KEY": keys["compile"]})
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [None, 3]
    assert answers[0]["error"]["code"] == -32600 and answers[1]["result"] == {}


# -- an embedded process beside another that publishes (titen serve, titen rebuild) --

MARKER = "zqxmarker rhubarb telescope"


class _EmbeddedMcp:
    """``titen mcp`` on ``data_dir``'s store, asked one tool call at a time."""

    def __init__(self, data_dir: Path, key: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TITEN_")}
        self.proc = subprocess.Popen([TITEN, "mcp", "--data-dir", str(data_dir), "--api-key", key],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        self.held = data_dir / "cache" / f"serve-{self.proc.pid}"  # its generations, held for its life
        self.asked = 0

    def call(self, name: str, arguments: dict) -> dict:
        self.asked += 1
        message = {"jsonrpc": "2.0", "id": self.asked, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["result"]

    def copies_holding(self, text: str) -> list[str]:
        found = []
        for path in self.held.glob("*.sqlite*"):
            try:
                if text.encode() in path.read_bytes():
                    found.append(path.name)
            except FileNotFoundError:  # swapped out between the listing and the read
                pass
        return found

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _marker_served_over_mcp(api):
    key = api.key(scopes="context:compile,memory:write,memory:erase,admin")
    api.observe(key, subject_id="user_gone", content=MARKER,
                claim={"statement": MARKER, "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(key)
    mcp = _EmbeddedMcp(Path(api.service.settings.store_url[len("file://"):]), key["authorization"][7:])
    result = mcp.call("titen_compile", {"subject_id": "user_gone", "task": "rhubarb telescope", "max_tokens": 1000})
    assert [item["claim"] for item in result["structuredContent"]["items"]] == [MARKER]
    assert mcp.copies_holding(MARKER)  # the generation it serves, in its own directory
    return key, mcp


def _erase_user_gone(api, key) -> None:
    asked = api.client.delete("/v1/subjects/user_gone", headers={"authorization": key["authorization"]})
    api.rebuild(key)  # another process publishes the generation that carries the erasure out
    assert api.get(f"/v1/erasures/{asked.json()['data']['erasure_id']}", key).json()["data"]["status"] == "complete"


def _files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_killed_embedded_process_leaves_no_copy_of_what_the_next_erasure_erases(api):
    key, mcp = _marker_served_over_mcp(api)
    mcp.proc.kill()
    mcp.proc.wait(timeout=30)
    _erase_user_gone(api, key)
    assert not mcp.held.exists()
    assert _files_holding(Path(api.service.settings.store_url[len("file://"):]), MARKER) == []


def test_an_idle_embedded_process_drops_the_generation_an_erasure_came_after(api):
    key, mcp = _marker_served_over_mcp(api)
    try:
        _erase_user_gone(api, key)
        # nothing is asked of it: its own thread reads the pointer and swaps
        deadline = time.monotonic() + 30
        while mcp.copies_holding(MARKER) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mcp.copies_holding(MARKER) == []
        result = mcp.call("titen_compile", {"subject_id": "user_gone", "task": "rhubarb telescope",
                                            "max_tokens": 1000})
        assert result["structuredContent"]["items"] == []
    finally:
        mcp.close()
    assert not mcp.held.exists()  # a process that ends removes its directory


def _pointer(data_dir: Path, org: str = "acme") -> dict:
    return json.loads((data_dir / "orgs" / org / "snapshots" / "current.json").read_text())


def _one_shot_forget(api) -> tuple[str, _EmbeddedMcp]:
    """A subject with the marker, published; then a ``titen mcp`` asked to
    forget it, its answer read and nothing more: a one-shot agent host."""
    key = api.key(scopes="context:compile,memory:write,memory:erase,admin")
    api.observe(key, subject_id="user_gone", content=MARKER,
                claim={"statement": MARKER, "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(key)
    mcp = _EmbeddedMcp(Path(api.service.settings.store_url[len("file://"):]), key["authorization"][7:])
    erasure_id = mcp.call("titen_forget", {"subject_id": "user_gone"})["structuredContent"]["erasure_id"]
    return erasure_id, mcp


@pytest.mark.parametrize("ending", ["end of input", "SIGTERM"])
def test_an_embedded_process_that_ends_right_after_a_forget_carries_it_out_first(api, ending):
    # a host closes stdin (or stops the server) once answered: the rebuild
    # the erasure asked for died with the process, the erasure stayed
    # pending and titen serve kept serving the erased text
    erasure_id, mcp = _one_shot_forget(api)
    if ending == "SIGTERM":
        mcp.proc.send_signal(signal.SIGTERM)
        assert mcp.proc.wait(timeout=60) == 0
    else:
        mcp.close()
    key = api.key(scopes="memory:erase")
    assert api.get(f"/v1/erasures/{erasure_id}", key).json()["data"]["status"] == "complete"
    api.service.reader.check_held()  # this test's own reader follows no pointer (a server's thread does)
    assert _files_holding(Path(api.service.settings.store_url[len("file://"):]), MARKER) == []


def test_an_embedded_process_that_ends_right_after_a_write_publishes_it_first(api):
    data_dir = Path(api.service.settings.store_url[len("file://"):])
    key = api.key(scopes="context:compile,memory:write,admin")
    api.rebuild(key)
    before = _pointer(data_dir)["generation"]
    mcp = _EmbeddedMcp(data_dir, key["authorization"][7:])
    written = mcp.call("titen_remember", remember_args("user_rama"))
    mcp.close()
    pointer = _pointer(data_dir)
    assert pointer["generation"] > before and pointer["claim_count"] == 1
    assert written["structuredContent"]["claim_id"] is not None


SLOW_REBUILDS = """
import sys, time
import core.snapshot.build as build
rebuild = build.SnapshotBuilder.rebuild
def slow(self, *args, **kwargs):
    time.sleep(1.5)
    return rebuild(self, *args, **kwargs)
build.SnapshotBuilder.rebuild = slow
from core.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_while_the_exit_rebuild_runs_does_not_cut_it_short(api):
    # a host closes stdin, then sends SIGTERM after its grace period: that
    # SIGTERM stopped the rebuild it was waiting for, and the process exited 0
    data_dir = Path(api.service.settings.store_url[len("file://"):])
    key = api.key(scopes="context:compile,memory:write,admin")
    api.rebuild(key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TITEN_")}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_REBUILDS, "mcp", "--data-dir", str(data_dir),
                             "--api-key", key["authorization"][7:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "titen_remember", "arguments": remember_args("user_rama")}}
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()
    assert "result" in json.loads(proc.stdout.readline())
    proc.stdin.close()
    time.sleep(0.5)  # the exit rebuild is under way
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert _pointer(data_dir)["claim_count"] == 1


BEATEN_AT_START = """
import sys
import core.service
from core.errors import Conflict
def beaten(self, org_id, **kwargs):
    raise Conflict("another rebuild of this organization published first; retry")
core.service.Service.rebuild = beaten
from core.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_embedded_server_whose_rebuild_at_start_is_beaten_still_serves(tmp_path):
    # it exited 2 before answering initialize (3.5% of starts in a soak beside titen serve)
    service = Service(Settings.from_env(data_dir=str(tmp_path / "d")))
    key = service.keys.create("acme", "alice", ["context:compile", "memory:write"], [])
    principal = service.keys.authenticate("Bearer " + key["api_key"])
    service.write(principal, "POST /v1/observations", {}, {**remember_args("user_rama"), "kind": "tool_result",
                                                          "source": {"type": "tool", "ref": "t#1"}}, None)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TITEN_")},
           "TITEN_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.run([sys.executable, "-c", BEATEN_AT_START, "mcp", "--data-dir", str(tmp_path / "d"),
                           "--api-key", key["api_key"]], input=b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n',
                          capture_output=True, timeout=120, env=env)
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [9]
    assert proc.returncode == 0 and b"at start failed" in proc.stderr and b"Traceback" not in proc.stderr
