"""The response envelope and the request body, as every route sends and reads them.

Success is ``{"data": …, "meta": {"request_id", …}}``, failure is
``{"error": {"code", "message"}, "meta": {"request_id"}}`` (docs/api.md §3),
always JSON, never cached. A body is read within the edge rules: at most
1 MiB, never ``Content-Length`` with ``Transfer-Encoding``, all of it
within the body timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.responses import Response

from core.budget.items import dumps
from core.errors import PayloadTooLarge, RequestTimeout, TitenError, Unauthenticated, ValidationError, echo
from core.observe.request_line import note_error
from core.validation import MAX_BODY_BYTES, parse_json_body


def envelope(status: int, payload: dict, request_id: str) -> Response:
    return json_response(status, dumps(payload), request_id)


def json_response(status: int, body: str, request_id: str) -> Response:
    return Response(body, status_code=status, media_type="application/json",
                    headers={"x-request-id": request_id, "cache-control": "no-store"})


@dataclass(frozen=True)
class Serialized:
    """A route's ``data`` already serialized with ``dumps``: compile sends
    the very text it estimated against the budget, not a second encoding."""
    json: str


def success_body(data, meta: dict) -> str:
    """``dumps({"data": data, "meta": meta})``, byte for byte."""
    if isinstance(data, Serialized):
        return '{"data":' + data.json + ',"meta":' + dumps(meta) + "}"
    return dumps({"data": data, "meta": meta})


def error_response(exc: TitenError, request_id: str) -> Response:
    note_error(exc.code)  # the request line's code, counted in the Errors metric
    response = envelope(exc.status, {"error": {"code": exc.code, "message": exc.message},
                                     "meta": {"request_id": request_id}}, request_id)
    if exc.status == 401:  # RFC 9110 §15.5.2: a 401 names the scheme it wants
        response.headers["www-authenticate"] = "Bearer"
    return response


def one_header(request: Request, name: str) -> str | None:
    """A header that must come at most once: two ``Authorization`` headers are
    401 (which key is meant?), any other twice 400 — never the first taken
    silently."""
    values = request.headers.getlist(name)
    if len(values) > 1:
        error = Unauthenticated if name.lower() == "authorization" else ValidationError
        raise error(f"{name} header sent {len(values)} times; send it once")
    return values[0] if values else None


async def read_body(request: Request, timeout: float = 10.0) -> dict:
    """The JSON body, within the edge rules of ``read_raw``."""
    return parse_json_body(await read_raw(request, timeout))


async def read_raw(request: Request, timeout: float = 10.0) -> bytes:
    """The body's bytes, within the edge rules (docs/api.md §4): at most 1 MiB,
    never ``Content-Length`` with ``Transfer-Encoding``, and all of it within
    ``timeout`` seconds (``TITEN_BODY_TIMEOUT``, else 408)."""
    length = request.headers.get("content-length")
    if length is not None and "transfer-encoding" in request.headers:
        raise ValidationError("Content-Length together with Transfer-Encoding is refused")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise ValidationError("Content-Length must be a decimal number of bytes")
    # compared as text first: int() of a string of more than 4,300 digits raises
    digits = (length or "").lstrip("0")
    if len(digits) > len(str(MAX_BODY_BYTES)) or (digits and int(digits) > MAX_BODY_BYTES):
        raise PayloadTooLarge(f"request body is {echo(digits)} bytes; the limit is {MAX_BODY_BYTES} (1 MiB)")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise PayloadTooLarge(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes (1 MiB)")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None
    return b"".join(chunks)
