"""Which organizations' ledgers hold entries their published generation lacks.

Why it exists: the scheduled run is the safety net behind the rebuild queue
(a failed enqueue, a message that ended in the dead-letter queue). It must
cost what changed, not what exists: deciding by downloading each
organization's snapshot made an idle organization as expensive as a busy one
(docs/operations.md, "Freshness on Lambda").

The rule: read the pointer (``current.json``, one small GET), then list the
ledger strictly after the watermark it records (the newest entry the
generation applied), ``PAGE_SIZE`` keys per request (S3's most). The first
entry that a rebuild would apply — anything but a context run
(``*.run.json``), which no snapshot needs — means a rebuild is due. An
organization with nothing new costs one pointer read and one list call.
No snapshot is ever read here.

Context runs do not move the watermark (only a build that applies an entry
does), so an organization that only compiles would cost one more list call
per ``PAGE_SIZE`` compiles at every pass, without end. So when a pass finds
a whole page of runs, it resumes from ``runs-listed.json`` — the newest run
an earlier pass listed with nothing but runs before it — and moves that
mark forward (a compare-and-swap; one small PUT) to the newest run it
listed that is older than the skew window. A pass then costs the runs of
the last ``skew_seconds`` plus one page, however long the organization has
only compiled. The mark records the watermark it was set against and is used
only while the pointer still has that watermark: a rebuild moves it forward,
a rollback back (and the writes after the older watermark must be seen
again).

- No pointer yet: due when the ledger holds any entry a rebuild would apply.
- A pointer that records no watermark (published before watermarks were):
  due; that rebuild republishes it with one.
- An entry stored by a clock lagging behind the watermark (or the mark)
  sorts before it and is not seen here; the write's own rebuild request
  applies it (each rebuild re-reads ``TITEN_SKEW_SECONDS`` behind its
  watermark). The mark never passes a run younger than that window, and a
  write completed later than 60 s after its id was minted is stored under
  a fresh key (core/ledger.py), so no entry can land behind the mark.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from core.ids import uuid7_ms
from core.layout import RUN_SUFFIX, entry_hex_of, ledger_prefix, pointer_key, runs_listed_key
from core.storage import ObjectNotFound, PreconditionFailed, Store

PAGE_SIZE = 1000


@dataclass(frozen=True)
class Backlog:
    org_id: str
    due: bool
    generation: int  # the published generation (0: none yet)
    reason: str


def backlog(store: Store, org_id: str, *, skew_seconds: float = 600.0, now_ms: int | None = None) -> Backlog:
    try:
        pointer = json.loads(store.get(pointer_key(org_id)).body)
    except ObjectNotFound:
        pointer = None
    generation = int(pointer["generation"]) if pointer else 0
    if pointer is not None and "watermark" not in pointer:
        return Backlog(org_id, True, generation, "pointer records no watermark")
    if pointer is not None and pointer.get("erasures"):
        # published, but the build stopped before finishing them (a purge
        # refused): the next build finishes them (ErasureWork.recover)
        from core.erasure import records
        unfinished = {r["erasure_id"] for r in records.pending(store, org_id)} & set(pointer["erasures"])
        if unfinished:
            return Backlog(org_id, True, generation, f"erasure {min(unfinished)} is published but not complete")
    prefix = ledger_prefix(org_id)
    watermark = pointer["watermark"] if pointer else ""
    start_after = prefix + watermark + "~" if watermark else None  # past "<hex>.json" and "<hex>.run.json"
    found, runs, last = _scan(store, prefix, start_after, PAGE_SIZE)
    if found is None and runs == PAGE_SIZE:  # a page of runs: resume where an earlier pass found only runs
        mark, etag = _read_mark(store, org_id, prefix, watermark)
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        # the mark never passes a run of the skew window: a late write could still land behind it
        cutoff = now - int(skew_seconds * 1000)
        found, _, settled = _scan(store, prefix, max(last, mark or ""), None, settled_before_ms=cutoff)
        if (found is None and settled.endswith(RUN_SUFFIX) and (mark is None or settled > mark)
                and uuid7_ms(entry_hex_of(settled)) < cutoff):
            _move_mark(store, org_id, etag, settled, watermark)
    if found is not None:
        return Backlog(org_id, True, generation, f"ledger entry {found.rsplit('/', 1)[1]} is not applied")
    return Backlog(org_id, False, generation, "nothing new")


def _scan(store: Store, prefix: str, start_after: str | None, limit: int | None, *,
          settled_before_ms: int | None = None) -> tuple[str | None, int, str]:
    """(the first key a rebuild would apply, or None; how many runs were
    listed before it; the last of them — with ``settled_before_ms``, the
    last minted before that instant) after ``start_after``, reading at most
    ``limit`` keys."""
    runs, last = 0, start_after or ""
    for key in store.list_keys(prefix, start_after, page_size=PAGE_SIZE):
        if not key.endswith(RUN_SUFFIX):
            return key, runs, last
        runs += 1
        if settled_before_ms is None or uuid7_ms(entry_hex_of(key)) < settled_before_ms:
            last = key
        if limit is not None and runs == limit:
            break
    return None, runs, last


def _read_mark(store: Store, org_id: str, prefix: str, watermark: str) -> tuple[str | None, str | None]:
    """(the mark, its ETag); (None, None) when there is none. A mark set
    against another watermark is not used (a rollback moves the watermark
    back, and writes between it and the mark must be seen again), nor one
    that does not name one of this ledger's runs."""
    try:
        obj = store.get(runs_listed_key(org_id))
    except ObjectNotFound:
        return None, None
    try:
        mark = json.loads(obj.body)
        listed_through, set_against = mark["listed_through"], mark["watermark"]
    except (ValueError, KeyError, TypeError):
        return None, obj.etag  # unreadable: replaced by the next mark
    if (set_against != watermark or not isinstance(listed_through, str)
            or not listed_through.startswith(prefix) or not listed_through.endswith(RUN_SUFFIX)):
        return None, obj.etag
    return listed_through, obj.etag


def _move_mark(store: Store, org_id: str, etag: str | None, listed_through: str, watermark: str) -> None:
    """A lost race or a failed write only means the next pass lists more."""
    body = json.dumps({"listed_through": listed_through, "watermark": watermark}).encode()
    try:
        if etag is None:
            store.put_if_absent(runs_listed_key(org_id), body)
        else:
            store.compare_and_swap(runs_listed_key(org_id), body, etag)
    except PreconditionFailed:
        pass  # another pass moved it first
