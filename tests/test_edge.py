"""The edge of ``titen serve`` (docs/api.md §4, "The edge"), probed over raw
sockets against the real server: protocol errors in the JSON envelope, no
Content-Length with Transfer-Encoding, a body read timeout answered 408, a
client gone mid-body logged as one line, ids echoed cut to a fixed length."""

import json
import socket
import time

import pytest

from bench.common import Served
from core.api.edge import HEAD_LIMIT_BYTES, HEADER_COUNT_LIMIT
from core.config import Settings
from core.keys import KeyRing
from core.storage import open_store

OBS = json.dumps({"subject_id": "user_rama", "kind": "tool_result", "content": "ok",
                  "source": {"type": "tool", "ref": "r"}, "visibility": "organization"}).encode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("edge") / "titen")
    store = open_store(Settings.from_env(data_dir=data_dir).store_url)
    key = KeyRing(store).create("acme", "alice", ["memory:write", "context:compile", "admin"], [])["api_key"]
    with Served(data_dir, env={"TITEN_BODY_TIMEOUT": "1"}) as s:
        s.key, s.store = key, store
        yield s


def exchange(served, raw: bytes, *, wait: float = 10.0, close_after_send: bool = False) -> bytes:
    """Send raw bytes, read until the server closes (or ``wait`` passes)."""
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.settimeout(wait)
    sock.sendall(raw)
    if close_after_send:
        sock.close()
        return b""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except socket.timeout:
        out += b"<still open>"
    sock.close()
    return out


def parse(response: bytes) -> tuple[int, dict, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def ledger(served):
    return list(served.store.list_keys("orgs/acme/ledger/"))


def post(served, extra_headers: bytes, body: bytes = OBS, path=b"/v1/observations") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + served.key.encode() + b"\r\n" + extra_headers + b"\r\n" + body)


@pytest.mark.parametrize("raw", [
    b"POST /v1/observations HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /v1/observations HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"GET /healthz HTTP/1.1\r\nHost: t\r\nBad Header Line\r\n\r\n",
    b"GARBAGE\r\n\r\n",
], ids=["bad-content-length", "two-content-lengths", "malformed-header", "not-http"])
def test_a_protocol_error_is_answered_in_the_envelope(served, raw):
    status, headers, body = parse(exchange(served, raw))
    assert status == 400
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert body["error"]["code"] == "VALIDATION_ERROR"
    assert body["meta"]["request_id"].startswith("req_")


def test_content_length_with_transfer_encoding_is_refused_and_writes_nothing(served):
    before = ledger(served)
    chunked = b"%x\r\n" % len(OBS) + OBS + b"\r\n0\r\n\r\n"
    raw = post(served, b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(OBS), chunked)
    status, _, body = parse(exchange(served, raw))
    assert status == 400 and body["error"]["code"] == "VALIDATION_ERROR"
    assert ledger(served) == before


def test_a_well_formed_request_still_writes(served):
    before = ledger(served)
    status, _, body = parse(exchange(served, post(served, b"Content-Length: %d\r\nConnection: close\r\n" % len(OBS))))
    assert status == 201, body
    assert len(ledger(served)) == len(before) + 1


@pytest.mark.parametrize("extra", [
    b"X-Big: " + b"a" * (HEAD_LIMIT_BYTES + 1) + b"\r\n",                      # one header over the limit
    b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(200)),          # many headers, their sum over it
    b"".join(b"X-H%d: v\r\n" % i for i in range(HEADER_COUNT_LIMIT + 1)),     # more headers than the count
], ids=["one-huge-header", "headers-summing-over", "too-many-headers"])
def test_a_request_head_over_the_limit_is_a_400_that_writes_nothing(served, extra):
    before = ledger(served)
    raw = post(served, extra + b"Content-Length: %d\r\n" % len(OBS))
    status, headers, body = parse(exchange(served, raw))
    assert status == 400 and headers["connection"] == "close"
    assert body["error"]["code"] == "VALIDATION_ERROR"
    assert "request head" in body["error"]["message"]
    assert ledger(served) == before


def test_a_head_that_never_ends_is_refused_before_it_is_held_in_memory(served):
    # 8 MiB of one header, sent without its end (a server with no limit read
    # it whole and waited for more)
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.settimeout(10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
    sent = 0
    try:
        while sent < 8 << 20:
            sock.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed while the client was still sending
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (ConnectionResetError, socket.timeout):
        pass  # a reset can overtake the 400 when the client's bytes were unread
    sock.close()
    # either the 400 came back, or the server closed before it had the 8 MiB
    assert answer.startswith(b"HTTP/1.1 400") or sent < 8 << 20, answer[:200]


def test_a_head_just_within_the_limit_is_served(served):
    extra = b"X-Big: " + b"a" * (HEAD_LIMIT_BYTES - 2048) + b"\r\n"
    status, _, body = parse(exchange(served, post(served, extra + b"Content-Length: %d\r\nConnection: close\r\n"
                                                   % len(OBS))))
    assert status == 201, body


def test_a_body_that_never_arrives_is_a_408_in_the_envelope_and_the_connection_closes(served):
    before = ledger(served)
    t0 = time.monotonic()
    response = exchange(served, post(served, b"Content-Length: 500\r\n", OBS[:10]), wait=8)
    elapsed = time.monotonic() - t0
    assert not response.endswith(b"<still open>")
    status, headers, body = parse(response)
    assert (status, body["error"]["code"]) == (408, "REQUEST_TIMEOUT")
    assert "within 1 s" in body["error"]["message"] and headers["connection"] == "close"
    assert elapsed < 6  # TITEN_BODY_TIMEOUT=1 here; 10 s by default
    assert ledger(served) == before


def test_a_client_gone_mid_body_is_logged_as_one_line_without_a_traceback(served):
    exchange(served, post(served, b"Content-Length: 500\r\n", OBS[:10]), close_after_send=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "client disconnected" not in served.log():
        time.sleep(0.05)
    log = served.log()
    assert len([line for line in log.splitlines() if "client disconnected" in line]) == 1
    assert "Traceback" not in log and "unhandled error" not in log


@pytest.mark.parametrize("path", ["/v1/claims/claim_{id}/evidence", "/v1/context/ctx_{id}", "/v1/nothing/{id}"])
def test_a_long_id_is_echoed_cut_to_a_fixed_length(served, path):
    raw = (b"GET " + path.format(id="a" * 5000).encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
           b"Authorization: Bearer " + served.key.encode() + b"\r\n\r\n")
    status, _, body = parse(exchange(served, raw))
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"
    assert len(body["error"]["message"]) < 120
    assert "a" * 65 not in body["error"]["message"] and "…" in body["error"]["message"]


def test_a_100000_character_id_is_never_echoed(served):
    """llhttp refuses a request line this long: the protocol-error envelope, no echo."""
    raw = (b"GET /v1/claims/claim_" + b"a" * 100_000 + b"/evidence HTTP/1.1\r\nHost: t\r\n"
           b"Authorization: Bearer " + served.key.encode() + b"\r\n\r\n")
    response = exchange(served, raw)
    status, headers, body = parse(response)
    assert status in (400, 404) and headers["content-type"] == "application/json"
    assert len(response) < 1000


def test_the_app_itself_refuses_content_length_with_transfer_encoding(tmp_path):
    """Behind any server (h11 accepts the pair; on Lambda API Gateway sits in front)."""
    import anyio

    from core.api.app import create_app
    from core.service import Service

    service = Service(Settings.from_env(data_dir=str(tmp_path / "titen")))
    key = service.keys.create("acme", "alice", ["memory:write"], [])["api_key"]
    app = create_app(service)
    sent = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/observations", "raw_path": b"/v1/observations", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-length", b"%d" % len(OBS)),
                         (b"transfer-encoding", b"chunked"), (b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": OBS, "more_body": False}

    async def send(message):
        sent.append(message)

    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["message"].startswith("Content-Length together with")
    assert list(service.store.list_keys("orgs/acme/ledger/")) == []


def _asgi_post(tmp_path, content_length: bytes):
    """One POST straight into the app (as API Gateway or any server hands it
    on): (status, error envelope, ledger keys)."""
    import anyio

    from core.api.app import create_app
    from core.service import Service

    service = Service(Settings.from_env(data_dir=str(tmp_path / "titen")))
    key = service.keys.create("acme", "alice", ["memory:write"], [])["api_key"]
    sent = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/observations", "raw_path": b"/v1/observations", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-length", content_length),
                         (b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": OBS, "more_body": False}

    async def send(message):
        sent.append(message)

    anyio.run(create_app(service), scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"]), list(service.store.list_keys("orgs/acme/ledger/"))


@pytest.mark.parametrize("zeros", [0, 6000])
def test_a_content_length_of_thousands_of_digits_is_a_413_quoting_at_most_64(tmp_path, zeros):
    status, body, ledger = _asgi_post(tmp_path, b"0" * zeros + b"9" * 5000)
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert len(body["error"]["message"]) < 160 and "…" in body["error"]["message"]
    assert ledger == []


def test_a_content_length_in_non_ascii_digits_is_a_400(tmp_path):
    status, body, ledger = _asgi_post(tmp_path, "²".encode("latin-1"))
    assert status == 400 and body["error"]["message"] == "Content-Length must be a decimal number of bytes"
    assert ledger == []
