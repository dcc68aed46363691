"""Instants: parse ISO-8601 from callers, store one canonical UTC form.

The canonical form ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` has a fixed width, so the
snapshot compares validity windows as plain strings inside SQL.
"""

from __future__ import annotations

from datetime import datetime, timezone


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def canonical(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_instant(value: str) -> datetime:
    """An aware datetime from ISO-8601 text; naive input is rejected."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        raise ValueError("instant needs a time zone offset or Z")
    return dt.astimezone(timezone.utc)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
