"""Instants: parse ISO-8601 from callers, store one canonical UTC form.

The canonical form ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` has a fixed width, so the
snapshot compares validity windows as plain strings inside SQL. That only
holds inside a fixed range of years, so every accepted instant must lie in
``EARLIEST`` .. ``LATEST`` in UTC *after* its offset is applied
(docs/api.md §5): ``0001-01-01T00:00:00+14:00`` is a year-0 instant and is
refused as out of range, never an ``OverflowError``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)
RANGE_TEXT = "1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"


class InstantOutOfRange(ValueError):
    """A well-formed instant outside ``EARLIEST`` .. ``LATEST`` in UTC."""


class NoSuchInstant(ValueError):
    """Text of the right shape naming a date or time the calendar lacks
    (``2026-02-30``, ``24:00``, ``23:59:60``): the caller wrote the form
    right, so the error says what does not exist rather than the form."""


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def canonical(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# The shape accepted, before the calendar and the range are checked: the
# extended ISO-8601 date and time of RFC 3339 (seconds and fraction optional),
# with Z or an offset of hours 00-23 and minutes 00-59. datetime.fromisoformat
# alone also took a trailing space, "12:00:00.Z", basic and week-date forms,
# and an offset of 99 minutes (+00:99 read as +01:39).
SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?"
                   r"([Zz]|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)")
# What the OpenAPI document says: the same shape with its fields' ranges and
# the years 1970-9999 (the calendar, and an offset that moves an instant out
# of range, are checked beyond it), and 1969-12-31 with a negative offset,
# which can still fall in 1970 in UTC: the schema may allow what the
# service refuses, never refuse what it accepts (docs/api.md §14).
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]+)?)?"
_OFFSET = r"([01][0-9]|2[0-3])(:?[0-5][0-9])?"
SCHEMA_PATTERN = (r"^((19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]" + _TIME
                  + r"([Zz]|[+-]" + _OFFSET + r")|1969-12-31[Tt ]" + _TIME + "-" + _OFFSET + r")$")


def parse_instant(value: str) -> datetime:
    """An aware UTC datetime from ISO-8601 text of ``SHAPE``; another shape
    or naive input is rejected (``ValueError``), a date or time that does
    not exist is ``NoSuchInstant``, an instant outside the range is
    ``InstantOutOfRange``. A fraction is kept to the microsecond, the
    canonical precision: digits past the sixth are dropped, not rounded, so
    no instant moves into the next second (or day, or year)."""
    if SHAPE.fullmatch(value) is None:
        raise ValueError("not YYYY-MM-DDTHH:MM[:SS[.fff]] with Z or an offset")
    text = value
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:  # "day is out of range for month", "hour must be in 0..23", …
        raise NoSuchInstant(str(exc)) from None
    if dt.tzinfo is None:
        raise ValueError("instant needs a time zone offset or Z")
    try:
        utc = dt.astimezone(timezone.utc)
    except OverflowError:  # the offset moves it before year 1 or past year 9999
        raise InstantOutOfRange(f"outside {RANGE_TEXT}") from None
    if not EARLIEST <= utc <= LATEST:
        raise InstantOutOfRange(f"outside {RANGE_TEXT}")
    return utc


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
