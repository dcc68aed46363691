"""Writes you can retry: the ``Idempotency-Key`` layer (docs/api.md §12).

Why it exists: a client whose write timed out cannot know whether it was
stored, so it retries; without a key the retry is stored again. With a key,
for one (organization, principal, route, key) within ``TTL_SECONDS``:

- the same request replays the first answer (same status and ``data``) and
  stores nothing; another request under the key is a ``Conflict``;
- concurrent duplicates store exactly once.

How, with nothing but the store's conditional writes:

1. Before its first durable write, a write claims the key with a
   put-if-absent *record* (``core.layout.idempotency_key``: the hash covers
   principal, route and key) naming the ledger entry it is about to
   write and a hash of the request (route parameters and body).
2. Its ledger entry carries the answer (``idempotency: {status, data}``).
3. A later request finding the record replays the entry's answer. If the
   entry is missing (the first writer crashed, failed or is still on its
   way), the request *takes over*: it runs the write again under the entry
   id the record names, so every id it mints is the one the first attempt
   would have minted, and the ledger's put-if-absent lets exactly one of
   them land; whoever loses reads the winner's entry back and replays it.

So a crash between the record and the entry never leaves a key stuck: the
next retry completes the write. A record older than ``TTL_SECONDS`` counts
as absent (the next write under the key replaces it by compare-and-swap) and
the rebuild deletes it (core/snapshot/housekeeping.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from core.bodies import SUPERSEDE, TRANSITION, Integer
from core.errors import Conflict, TitenError, ValidationError
from core.ids import entry_hex as new_entry_hex
from core.ids import tagged
from core.instants import canonical, now_utc, parse_instant
from core.keys import Principal
from core.layout import IDEMPOTENCY_TTL_SECONDS, idempotency_key
from core.ledger import ERASED, ERASED_RECORDS, Ledger
from core.storage import ObjectNotFound, PreconditionFailed, Store
from core.validation import RoundedToWhole

TTL_SECONDS = IDEMPOTENCY_TTL_SECONDS
HEADER = "Idempotency-Key"
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, no space


def parse_key(value: str | None) -> str | None:
    """The header's key, ``None`` when absent, else ``ValidationError``."""
    if value is None:
        return None
    if not _KEY.fullmatch(value):
        raise ValidationError(f"{HEADER} must be 1 to 255 visible ASCII characters (no spaces or controls)")
    return value


# The members a write body reads as integers (core.bodies; all at the top of
# a transition's body). There a number whose fraction a float rounds away
# (``1.00000000000000000001``) is no integer, so another request than the
# whole number; in a number field (``confidence``) or free metadata it is
# the float it rounds to (docs/api.md §4).
INTEGER_MEMBERS = frozenset(name for record in (TRANSITION, SUPERSEDE)
                            for name, spec in record.fields.items() if isinstance(spec, Integer))


def _as_read(value, *, integral_floats: bool = True, integer_member: bool = False, top: bool = False):
    """The body as the service reads it (docs/api.md §4), so a retry that
    says the same thing another way is the same request: a member set to null
    is absent, and a number is its value (``1.0`` and ``1e0`` are ``1``; JSON
    has one number type, and float-only encoders write every number so)."""
    if isinstance(value, dict):
        return {k: _as_read(v, integral_floats=integral_floats, integer_member=top and k in INTEGER_MEMBERS)
                for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_as_read(v, integral_floats=integral_floats) for v in value]
    if integer_member and isinstance(value, RoundedToWhole):
        return value  # hashed as a float: not the integer it rounds to
    if integral_floats and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def request_hash(params: dict, body, *, integral_floats: bool = True) -> str:
    text = json.dumps({"params": params, "body": _as_read(body, integral_floats=integral_floats, top=True)},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _same_request(recorded: str, params: dict, body, rhash: str) -> bool:
    # Records written before integral floats were read as integers (2026-12-07)
    # hold the older hash; they replay for the 24 hours they live, so a retry
    # that spans the release is not a conflict. Remove after 2026-12-09.
    return recorded == rhash or recorded == request_hash(params, body, integral_floats=False)


class _ClaimLost(Exception):
    """A concurrent duplicate claimed the key first: look it up again."""


class Attempt:
    """One try of a write: the entry id it writes under, and the hook that
    claims the idempotency key just before its first durable write.

    Every write function takes one; without a key it only mints the id."""

    def __init__(self, entry_hex: str | None = None, *, record_key: str | None = None,
                 request_hash: str | None = None, replace_etag: str | None = None,
                 store: Store | None = None, claimed: bool = False, tag: str | None = None):
        # ``tag``: the subject tag the entry id carries (core.ids.subject_tag)
        self.entry_hex = entry_hex or (tagged(new_entry_hex(), tag) if tag else new_entry_hex())
        self.keyed = record_key is not None
        self.claimed = claimed
        self.entry_key: str | None = None
        self._record_key = record_key
        self._request_hash = request_hash
        self._replace_etag = replace_etag
        self._store = store

    def claim(self, entry_key: str) -> None:
        """Record that this request writes ``entry_key``; ``_ClaimLost`` when
        another request holds the key. Call before the first durable write."""
        if not self.keyed or self.claimed:
            return
        body = json.dumps({"entry_key": entry_key, "entry_id": self.entry_hex,
                           "request_hash": self._request_hash, "created_at": canonical(now_utc())}).encode()
        try:
            if self._replace_etag is None:
                self._store.put_if_absent(self._record_key, body)
            else:
                self._store.compare_and_swap(self._record_key, body, self._replace_etag)
        except PreconditionFailed:
            raise _ClaimLost() from None
        self.claimed = True
        self.entry_key = entry_key

    def answer(self, status: int, data) -> dict:
        """Fields to store in the entry so a replay can answer from it, and
        the record's key, so an erasure of what the entry holds finds the
        record and drops its hash of the request (core/erasure/purge.py)."""
        return {"idempotency": {"status": status, "data": data, "record": self._record_key}} if self.keyed else {}


@dataclass(frozen=True)
class Outcome:
    status: int
    data: object
    replay: bool | None  # None: the request carried no key


Command = Callable[[Attempt], tuple[int, object]]


class Idempotency:
    def __init__(self, store: Store, ttl_seconds: int = TTL_SECONDS):
        self.store = store
        self.ttl = timedelta(seconds=ttl_seconds)

    def run(self, principal: Principal, route: str, key: str | None, params: dict, body,
            command: Command, tag: str | None = None) -> Outcome:
        """``tag``: the subject tag new entry ids carry (feedback on a pack:
        the pack's), so an erasure of the subject finds them by name."""
        if key is None:
            status, data = command(Attempt(tag=tag))
            return Outcome(status, data, None)
        rkey = idempotency_key(principal.org_id, principal.principal_id, route, key)
        rhash = request_hash(params, body)
        failed_once = False
        for _ in range(8):
            record, etag = self._read(rkey)
            if record is None:
                attempt = Attempt(record_key=rkey, request_hash=rhash, replace_etag=etag, store=self.store,
                                  tag=tag)
            else:
                if record.get("request_hash") is None or not _same_request(record["request_hash"], params, body,
                                                                          rhash):
                    if record.get("request_hash") is None:
                        # an erasure dropped the hash: its entry says what went (409)
                        self._answer(record["entry_key"])
                    raise Conflict(f"this {HEADER} was used with another request in the last 24 hours; "
                                   "send a new key for a new request")
                stored = self._answer(record["entry_key"])
                if stored is not None:
                    return stored
                attempt = Attempt(record["entry_id"], record_key=rkey, request_hash=rhash, claimed=True)
                attempt.entry_key = record["entry_key"]
            try:
                status, data = command(attempt)
            except _ClaimLost:
                continue
            except (TitenError, PreconditionFailed):
                # a takeover (or a slow original) can fail because the other
                # one is finishing the same write: then its answer is ours.
                # One more run lets it see that write through (a transition
                # completes the pending entry of the claim head it lost to).
                if not attempt.claimed:
                    # A concurrent duplicate may have claimed the key and
                    # finished while this one ran (a transition then finds
                    # the claim already moved): then its answer is ours.
                    if self._read(rkey)[0] is None:
                        raise
                    continue
                stored = self._answer(attempt.entry_key)
                if stored is not None:
                    return stored
                if failed_once:
                    raise
                failed_once = True
                continue
            return Outcome(status, data, False)
        raise Conflict(f"this {HEADER} is in use by a concurrent request; retry")

    def _read(self, rkey: str) -> tuple[dict | None, str | None]:
        """The live record, or (None, etag of an expired one to replace)."""
        try:
            obj = self.store.get(rkey)
        except ObjectNotFound:
            return None, None
        record = json.loads(obj.body)
        if parse_instant(record["created_at"]) + self.ttl <= now_utc():
            return None, obj.etag
        return record, obj.etag

    def _answer(self, entry_key: str | None) -> Outcome | None:
        if not entry_key:
            return None
        entry = Ledger(self.store).read_key(entry_key, missing_ok=True)  # follows a moved stub
        if entry is None:
            return None
        if entry.get("type") == ERASED:
            raise Conflict(f"what the request under this {HEADER} stored was erased ({entry.get('erasure_id')}); "
                           "send a new key for a new request")
        if entry.get(ERASED_RECORDS):
            # the first answer names records that are gone: not handed back
            erasures = ", ".join(sorted(entry[ERASED_RECORDS]))
            raise Conflict(f"what the request under this {HEADER} stored was partly erased ({erasures}); "
                           "send a new key for a new request")
        stored = entry["idempotency"]
        return Outcome(stored["status"], stored["data"], True)
