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

    def send_400_response(self, msg: str) -> None:
        body, request_id = protocol_error_body(
            "malformed HTTP request (for example a bad Content-Length, or Content-Length together "
            "with Transfer-Encoding); the connection is closed")
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
