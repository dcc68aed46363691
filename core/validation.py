"""Edge validation: the rules every request body obeys before anything runs.

docs/api.md §4: bodies over 1 MiB, JSON nested deeper than 64, ill-formed Unicode
and terminal or bidirectional control characters in text are rejected with a
clear message (tab and line feed are allowed). The ``Fields`` reader then
checks one object's fields by name, type and range, and rejects unknown
fields, so a typo in a request is an error rather than a silent default.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from decimal import Decimal
from typing import Any, Iterable

from core.bodies import IDENTIFIER, Record
from core.characters import FORBIDDEN_CLASS
from core.errors import PayloadTooLarge, ValidationError, echo, printable
from core.instants import RANGE_TEXT, InstantOutOfRange, NoSuchInstant, parse_instant

MAX_BODY_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_INSTANT = 64  # characters: the longest instant read (fractions beyond microseconds are cut)

_FORBIDDEN = re.compile(f"[{FORBIDDEN_CLASS}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _describe(ch: str) -> str:
    return f"U+{ord(ch):04X}"


def well_formed(value: str) -> bool:
    """Whether ``value`` can be written in UTF-8 (no unpaired surrogate)."""
    return not _SURROGATE.search(value)


def check_text(value: str, path: str) -> None:
    if _SURROGATE.search(value):
        raise ValidationError(f"{path}: ill-formed Unicode (unpaired surrogate)")
    m = _FORBIDDEN.search(value)
    if m:
        raise ValidationError(
            f"{path}: control character {_describe(m.group())} is not allowed (only tab and line feed are)")


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object, or a ``TitenError`` saying why not."""
    value, text = _parse(raw)
    if not isinstance(value, dict):
        raise ValidationError("request body must be a JSON object")
    # Every character of every string and key is in the text as written
    # unless an escape made it: a text without a backslash, a surrogate or
    # a forbidden character holds none in any value, and the walk that
    # names the offending field is needed only otherwise.
    if "\\" in text or _SURROGATE.search(text) or _FORBIDDEN.search(text):
        check_strings(value, "body")
    return value


def parse_json_value(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Any JSON value under the body rules of size, encoding and depth (the
    text rules are ``check_strings``, applied by the caller to what it reads).
    ``max_depth`` is wider for a message that wraps a body (MCP's tool
    arguments sit two levels in), which then checks the body with ``check_depth``."""
    return _parse(raw, max_depth)[0]


def check_depth(value: Any) -> None:
    """The depth rule on a parsed body (a body read inside a wider message)."""
    level = [(value, 1)]
    while level:
        v, depth = level.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValidationError(f"request body nests deeper than {MAX_DEPTH} levels")
            level.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict) else v)
                         if isinstance(item, (dict, list)))


def check_size(raw: bytes) -> None:
    """The body-size rule alone (the MCP relay applies it before sending)."""
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES} (1 MiB)")


def _parse(raw: bytes, max_depth: int = MAX_DEPTH) -> tuple[Any, str]:
    check_size(raw)
    if not raw.strip():
        raise ValidationError("request body is empty; a JSON object is required")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"request body is not well-formed UTF-8 (byte {exc.start})") from None
    _check_depth(text, max_depth)
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                           parse_float=_parse_float, object_pairs_hook=_object)
    except ValidationError:
        raise
    except (ValueError, RecursionError) as exc:
        # some of Python's messages end in "at", before the position they name
        msg = exc.msg.removesuffix(" at") if isinstance(exc, json.JSONDecodeError) else "invalid JSON"
        pos = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ValidationError(f"request body is not valid JSON: {msg}{pos}") from None
    return value, text


# Python refuses to read an integer of more digits than this (a guard
# against quadratic conversion); JSON itself allows any, so say why
MAX_INT_DIGITS = 4300


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValidationError(f"request body holds an integer of {len(digits.lstrip('-'))} digits; "
                              f"an integer in a body may have at most {MAX_INT_DIGITS}")
    return int(digits)


class RoundedToWhole(float):
    """A JSON number with a fraction that a 64-bit float rounds away
    (``127.99999999999999999`` reads as 128.0): a number where a number is
    asked, never an integer, since the caller did not send a whole number."""


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # a finite JSON number past a float's range (1e400): no field takes one
        raise ValidationError(f"request body holds the number {echo(literal)!r}, beyond the range of a "
                              "64-bit float")
    # Only a float that came out whole can have lost a fraction, and not one
    # of at most 16 characters without an exponent: that has at most 15
    # significant digits, which a float keeps. Decimal reads the rest exactly.
    if not value.is_integer() or (len(literal) <= 16 and "e" not in literal and "E" not in literal):
        return value
    try:
        exact = Decimal(literal)
        whole = exact == exact.to_integral_value()
    except ArithmeticError:  # an exponent past Decimal's reach (0e99999999999999999999)
        raise ValidationError(f"request body holds the number {echo(literal)!r}, whose exponent is out of "
                              "range") from None
    return value if whole else RoundedToWhole(value)


def _object(pairs: list[tuple[str, Any]]) -> dict:
    # A key twice in one object is refused rather than the last value taken:
    # a proxy or a signature check that reads the first would see another
    # request than the service, and a text rule broken in the value dropped
    # would pass unseen.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValidationError(f"request body has the key '{printable(echo(key))}' twice in one object; "
                                      "send each key once")
            seen.add(key)
    return obj


def _reject_constant(name: str):
    raise ValidationError(f"request body is not valid JSON: {name} is not a JSON number")


# a JSON string, escapes included (the unrolled form: no backtracking); a
# string that never closes runs to the end of the text, in one pass (a
# required closing quote made every later quote retry to the end: quadratic)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def _check_depth(text: str, max_depth: int) -> None:
    # Count brackets outside strings before parsing, so a deeply nested body
    # is refused without recursing through it. Fewer brackets than the
    # limit, strings included, cannot nest deeper: no scan. Otherwise the
    # strings are cut out first (in C); one that never closes takes the rest
    # of the text with it, so nothing after it counts, as for the parser.
    if text.count("[") + text.count("{") <= max_depth:
        return
    outside = _STRING.sub("", text)
    depth = 0
    for c in _BRACKETS.findall(outside):
        if c in "[{":
            depth += 1
            if depth > max_depth:
                raise ValidationError(f"request body nests deeper than {max_depth} levels")
        else:
            depth -= 1


def check_strings(value: Any, path: str) -> None:
    """``check_text`` on every string and key inside ``value``."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            check_text(v, p)
        elif isinstance(v, dict):
            for k, item in v.items():
                check_text(k, p)
                stack.append((item, f"{p}.{echo(k)}"))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))


class Fields:
    """Typed, named access to one JSON object's fields, with clear errors.

    Given a ``core.bodies.Record``, ``take(name)`` reads a field through its
    declared spec (the one the OpenAPI document and MCP schemas show)."""

    def __init__(self, obj: Any, path: str, allowed: "Iterable[str] | Record"):
        self.record = allowed if isinstance(allowed, Record) else None
        if self.record is not None:
            allowed = self.record.fields
        if not isinstance(obj, dict):
            raise ValidationError(f"{path} must be a JSON object")
        unknown = sorted(set(obj) - set(allowed))
        if unknown:
            raise ValidationError(f"{path}: unknown field {echo(unknown[0])!r}")
        self.obj = obj
        self.path = path

    def take(self, name: str, *, required: bool | None = None):
        """The field read by its spec; required as the record says unless overridden."""
        spec = self.record.fields[name]
        return spec.read(self, name, name in self.record.required if required is None else required)

    def _name(self, name: str) -> str:
        return name if self.path == "body" else f"{self.path}.{name}"

    def _get(self, name: str, required: bool):
        if name not in self.obj or self.obj[name] is None:
            if required:
                raise ValidationError(f"{self._name(name)} is required")
            return None
        return self.obj[name]

    def string(self, name: str, *, required: bool = True, max_len: int = 256,
               pattern: re.Pattern | None = None, choices: Iterable[str] | None = None,
               default: str | None = None, refused: Iterable[str] = ()) -> str | None:
        v = self._get(name, required)
        if v is None:
            return default
        if not isinstance(v, str):
            raise ValidationError(f"{self._name(name)} must be a string")
        if choices is not None:
            choices = tuple(choices)
            if v not in choices:
                offered = [c for c in choices if c not in refused]
                raise ValidationError(f"{self._name(name)} must be one of {', '.join(offered)}; got {echo(v)!r}")
            return v
        if not v.strip():
            raise ValidationError(f"{self._name(name)} must not be empty")
        if len(v) > max_len:
            raise ValidationError(f"{self._name(name)} is {len(v)} characters; at most {max_len} are allowed")
        if pattern is not None and not pattern.fullmatch(v):
            raise ValidationError(f"{self._name(name)} is not a valid identifier: {echo(v)!r}")
        return v

    def identifier(self, name: str, *, required: bool = True) -> str | None:
        return self.string(name, required=required, max_len=128, pattern=IDENTIFIER)

    def integer(self, name: str, *, required: bool = True, lo: int, hi: int,
                default: int | None = None) -> int | None:
        v = self._get(name, required)
        if v is None:
            return default
        # JSON has one number type and JSON Schema calls 2.0 an integer, so
        # a client that sends one (as a float-only JSON encoder does) is right
        if isinstance(v, float) and v.is_integer() and not isinstance(v, RoundedToWhole):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValidationError(f"{self._name(name)} must be an integer")
        if not lo <= v <= hi:
            raise ValidationError(f"{self._name(name)} must be between {lo} and {hi}; got {echo(str(v))}")
        return v

    def number(self, name: str, *, required: bool = True, lo: float, hi: float,
               default: float | None = None) -> float | None:
        v = self._get(name, required)
        if v is None:
            return default
        # math.isfinite(int) converts to float, and an integer of 309 digits
        # overflows that: only a float can be infinite, and ints compare exactly
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise ValidationError(f"{self._name(name)} must be a number")
        if not lo <= v <= hi:
            raise ValidationError(f"{self._name(name)} must be between {lo} and {hi}; got {echo(str(v))}")
        return float(v)

    def boolean(self, name: str, *, default: bool = False) -> bool:
        v = self._get(name, False)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ValidationError(f"{self._name(name)} must be true or false")
        return v

    def instant(self, name: str, *, required: bool = False) -> datetime | None:
        v = self._get(name, required)
        if v is None:
            return None
        if not isinstance(v, str):
            raise ValidationError(f"{self._name(name)} must be an ISO-8601 instant string")
        if len(v) > MAX_INSTANT:
            raise ValidationError(f"{self._name(name)} is {len(v)} characters; an instant has at most {MAX_INSTANT}")
        try:
            return parse_instant(v)
        except InstantOutOfRange:
            raise ValidationError(
                f"{self._name(name)} must be an instant from {RANGE_TEXT} (UTC, after its offset); "
                f"got {echo(v)!r}") from None
        except NoSuchInstant as exc:
            raise ValidationError(
                f"{self._name(name)} names a date or time that does not exist ({exc}); got {echo(v)!r}") from None
        except ValueError:
            raise ValidationError(
                f"{self._name(name)} must be an ISO-8601 instant YYYY-MM-DDTHH:MM[:SS[.ffffff]] with Z or "
                f"an offset, e.g. 2026-07-30T12:00:00Z; got {echo(v)!r}") from None

    def object(self, name: str, allowed: "Iterable[str] | Record", *, required: bool = False) -> "Fields | None":
        v = self._get(name, required)
        if v is None:
            return None
        return Fields(v, self._name(name), allowed)

    def array(self, name: str, *, required: bool = True, min_len: int = 0, max_len: int) -> list | None:
        v = self._get(name, required)
        if v is None:
            return None
        if not isinstance(v, list):
            raise ValidationError(f"{self._name(name)} must be an array")
        if not min_len <= len(v) <= max_len:
            raise ValidationError(
                f"{self._name(name)} must hold between {min_len} and {max_len} entries; got {len(v)}")
        return v

    def raw(self, name: str):
        return self.obj.get(name)
