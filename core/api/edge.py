"""The HTTP edge of ``titen serve``: which server, with which settings, and
the envelope on errors the server answers before the app sees a request.

Chosen by measurement (docs/architecture.md, "The edge"): uvicorn with the
``httptools`` (llhttp) parser, not h11. llhttp refuses ``Content-Length``
together with ``Transfer-Encoding`` (a request-smuggling shape that h11
accepts) and a malformed ``Content-Length``, and answers ``/healthz``
about 0.1 ms faster per request on loopback. Its protocol-error answer is
replaced here by the JSON envelope (docs/api.md §3: every response from
the service carries it where the server allows). The app keeps its own
checks too (``core.api.envelope.read_body``), for any server and for Lambda.

On Lambda none of this runs: API Gateway owns the connection and Mangum
hands the app a complete request.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from core.ids import new_id

# The request line and headers together, and how many headers: past either
# the request is a 400 and the connection closes. uvicorn's httptools
# protocol has no limit of its own (a 32 MB header was read whole and
# served). 16 KiB is above what API Gateway's HTTP API lets through (10 KiB
# of request line and header values), so what works on Lambda works here.
HEAD_LIMIT_BYTES = 16 * 1024
HEADER_COUNT_LIMIT = 100
# What the server holds of a head not yet parsed before it refuses: bytes
# received while the head is unfinished are counted a read at a time, so a
# read that also carried the previous request's body can overcount by one
# read (asyncio reads at most 256 KiB): this bound leaves room for that.
UNFINISHED_HEAD_BYTES = 1024 * 1024


class _HeadTooLarge(Exception):
    """Raised inside a parser callback; httptools turns it into a parser error."""


# uvicorn settings for ``titen serve``
SERVER_SETTINGS = {
    "timeout_keep_alive": 5,       # an idle keep-alive connection is closed after 5 s
    "timeout_graceful_shutdown": 10,
    "server_header": False,        # no "server: uvicorn"
}


def protocol_error_body(message: str) -> tuple[bytes, str]:
    request_id = new_id("req")
    body = json.dumps({"error": {"code": "VALIDATION_ERROR", "message": message},
                       "meta": {"request_id": request_id}}, separators=(",", ":"))
    return body.encode(), request_id


class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose 400 on an unparsable request (bad
    ``Content-Length``, ``Content-Length`` with ``Transfer-Encoding``, a
    malformed header) is the JSON error envelope, and the connection closes."""

    _in_head = True        # from the connection's first byte until a head is complete
    _head_bytes = 0        # request line and headers of the current request
    _unfinished_bytes = 0  # bytes received while the current head is unfinished
    _refusal: str | None = None

    def data_received(self, data: bytes) -> None:
        if self._in_head and self._unfinished_bytes > UNFINISHED_HEAD_BYTES:
            self._refuse_head()
            return
        super().data_received(data)
        if self._in_head:
            self._unfinished_bytes += len(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._unfinished_bytes = True, 0, 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(self.headers) >= HEADER_COUNT_LIMIT:
            self._refusal = f"has more than {HEADER_COUNT_LIMIT} headers"
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > HEAD_LIMIT_BYTES:
            self._refusal = f"is over {HEAD_LIMIT_BYTES} bytes"
            raise _HeadTooLarge

    def _refuse_head(self) -> None:
        self._refusal = f"is over {HEAD_LIMIT_BYTES} bytes"
        self.send_400_response("request head too large")

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:
            message = (f"request head (request line and headers) {self._refusal}; "
                       "the connection is closed")
        else:
            message = ("malformed HTTP request (for example a bad Content-Length, or Content-Length "
                       "together with Transfer-Encoding); the connection is closed")
        body, request_id = protocol_error_body(message)
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend([b"content-type: application/json\r\n",
                     b"content-length: " + str(len(body)).encode() + b"\r\n",
                     b"x-request-id: " + request_id.encode() + b"\r\n",
                     b"cache-control: no-store\r\n",
                     b"connection: close\r\n\r\n", body])
        self.transport.write(b"".join(head))
        self.transport.close()
