"""The one error hierarchy of the service, mapped once to the HTTP envelope.

Every failure a caller can see is a ``TitenError`` with a stable ``code`` and
HTTP ``status`` (docs/api.md §3). Anything else that escapes becomes ``INTERNAL``
with a generic message: no stack trace or SQL ever reaches a response.
"""

from __future__ import annotations


class TitenError(Exception):
    code = "INTERNAL"
    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ValidationError(TitenError):
    code, status = "VALIDATION_ERROR", 400


class Unauthenticated(TitenError):
    code, status = "UNAUTHENTICATED", 401


class Forbidden(TitenError):
    code, status = "FORBIDDEN", 403


class NotFound(TitenError):
    code, status = "NOT_FOUND", 404


class MethodNotAllowed(TitenError):
    code, status = "METHOD_NOT_ALLOWED", 405


class Conflict(TitenError):
    code, status = "CONFLICT", 409


class RequestTimeout(TitenError):
    """The request body did not arrive within the body read timeout."""
    code, status = "REQUEST_TIMEOUT", 408


class PayloadTooLarge(TitenError):
    code, status = "PAYLOAD_TOO_LARGE", 413


class Unavailable(TitenError):
    code, status = "UNAVAILABLE", 503


class Internal(TitenError):
    code, status = "INTERNAL", 500


ECHO_LIMIT = 64  # longer than any id the service mints (prefix + 32 hex)


def echo(value: str) -> str:
    """A caller's value as an error message may quote it: at most
    ``ECHO_LIMIT`` characters, cut with an ellipsis."""
    return value if len(value) <= ECHO_LIMIT else value[:ECHO_LIMIT] + "…"


def printable(value: str) -> str:
    """A value from a URL path as a message may show it: every character
    ``str.isprintable`` refuses (controls, bidi overrides, line breaks) as a
    ``\\u`` escape of four hex digits (``\\U`` and eight beyond U+FFFF). A
    body's text with such characters is refused before anything quotes it;
    a path is quoted back in ``NOT_FOUND``, so it is escaped instead: a
    message never carries what a body may not."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in value)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a local disk is full: an OSError (ENOSPC, EDQUOT)
    or SQLite's FullError. A rebuild's work files and a server's cache live
    on the machine's disk, not in the store, so the message says which."""
    import errno

    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    import apsw  # (only once a failure is being described)
    return isinstance(exc, apsw.FullError)
