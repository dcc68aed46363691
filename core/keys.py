"""API keys: who is calling, for which organization, with which scopes.

Keys live beside the organizations, outside any snapshot
(``keys/<sha256 of the key>.json``, plus ``keys/by-id/<key_id>.json`` so a
key can be revoked by its id), so creating or revoking one takes effect
without a rebuild. Only the hash of a key is ever stored. Lookups are cached
for ``CACHE_SECONDS`` (positive and negative alike), which bounds how long a
revoked key keeps working.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass

from core.domain import SCOPES
from core.errors import Forbidden, NotFound, Unauthenticated, ValidationError
from core.ids import new_id, parse_id
from core.instants import canonical, now_utc
from core.ledger import Ledger
from core.observe.request_line import note_organization
from core.storage import ObjectNotFound, PreconditionFailed, Store
from core.validation import IDENTIFIER

CACHE_SECONDS = 2.0
ORG_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_KEY_FORMAT = re.compile(r"^titen_sk_[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True)
class Principal:
    org_id: str
    principal_id: str
    key_id: str
    scopes: frozenset
    workspaces: tuple

    def require(self, scope: str) -> None:
        if scope not in self.scopes and "admin" not in self.scopes:
            raise Forbidden(f"this key lacks the {scope} scope")

    def has(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class KeyRing:
    def __init__(self, store: Store, cache_seconds: float = CACHE_SECONDS):
        self.store = store
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    # -- administration (CLI) ----------------------------------------------

    def create(self, org_id: str, principal_id: str, scopes: list[str], workspaces: list[str]) -> dict:
        if not ORG_ID.fullmatch(org_id or ""):
            raise ValidationError("--org must be 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter or digit")
        if not IDENTIFIER.fullmatch(principal_id or ""):
            raise ValidationError("--principal must be an identifier (letters, digits, '_.:@-')")
        unknown = [s for s in scopes if s not in SCOPES]
        if unknown or not scopes:
            raise ValidationError(f"--scopes must be a comma list of {', '.join(SCOPES)}")
        bad_ws = [w for w in workspaces if not IDENTIFIER.fullmatch(w)]
        if bad_ws:
            raise ValidationError(f"--workspaces: {bad_ws[0]!r} is not an identifier")
        api_key = "titen_sk_" + secrets.token_urlsafe(32)
        key_id = new_id("key")
        digest = key_hash(api_key)
        record = {"key_id": key_id, "org_id": org_id, "principal_id": principal_id,
                  "scopes": sorted(set(scopes)), "workspaces": sorted(set(workspaces)),
                  "created_at": canonical(now_utc()), "revoked_at": None}
        # The record is what makes the key work, so it is written last: a
        # store failing part-way leaves no working key behind that its
        # creator never saw and an operator could not revoke by id. A
        # pointer left to no record names no key (``revoke``, ``listing``).
        Ledger(self.store).register_organization(org_id)
        self.store.put_if_absent(f"keys/by-id/{key_id}.json", json.dumps({"key_hash": digest}).encode())
        try:
            self.store.put_if_absent(f"keys/{digest}.json", json.dumps(record).encode())
        except Exception as failure:
            # it may have landed with every answer lost: then it is made
            try:
                landed = json.loads(self.store.get(f"keys/{digest}.json").body).get("key_id") == key_id
            except Exception:
                raise failure from None
            if not landed:
                raise
        return {"key_id": key_id, "api_key": api_key, "org_id": org_id, "principal_id": principal_id}

    def listing(self, org_id: str) -> list[dict]:
        """The organization's keys, oldest first, as an operator reads them:
        id, principal, scopes, workspaces, when created and revoked; never
        the key or its hash."""
        records = []
        for name in self.store.list_keys("keys/"):
            if name.startswith("keys/by-id/") or not name.endswith(".json"):
                continue
            try:
                record = json.loads(self.store.get(name).body)
            except (ObjectNotFound, ValueError):
                continue  # revoked and removed meanwhile, or not a key record
            if record.get("org_id") == org_id:
                records.append({k: record.get(k) for k in ("key_id", "principal_id", "scopes", "workspaces",
                                                           "created_at", "revoked_at")})
        return sorted(records, key=lambda r: (r["created_at"] or "", r["key_id"] or ""))

    def revoke(self, key_id: str) -> dict:
        # a malformed value is never echoed: it may be (part of) an API key,
        # and an error line lands in terminals and logs
        if "titen_sk_" in key_id.lower():
            raise ValidationError("that is an API key, not a key_id: pass the key_id (key_…) printed when "
                                  "the key was created; the API key itself is not shown again")
        if parse_id(key_id, "key") is None:
            raise NotFound("no key with that id: a key_id is key_ followed by 32 hex digits")
        try:
            pointer = json.loads(self.store.get(f"keys/by-id/{key_id}.json").body)
        except (ObjectNotFound, ValueError):
            raise NotFound(f"no key {key_id}") from None
        key = f"keys/{pointer['key_hash']}.json"
        for _ in range(5):
            try:
                obj = self.store.get(key)
            except ObjectNotFound:  # its creation failed before the record was written
                raise NotFound(f"no key {key_id}") from None
            record = json.loads(obj.body)
            if record.get("revoked_at"):
                return record
            record["revoked_at"] = canonical(now_utc())
            try:
                self.store.compare_and_swap(key, json.dumps(record).encode(), obj.etag)
                return record
            except PreconditionFailed:
                continue
        raise PreconditionFailed(f"{key_id} kept changing; try again")

    # -- authentication (every request) ------------------------------------

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthenticated("missing Authorization: Bearer <key> header")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be 'Bearer <key>'")
        if not _KEY_FORMAT.match(token):
            raise Unauthenticated("the API key is not valid")
        digest = key_hash(token)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            principal = hit[1]
        else:
            principal = self._load(digest)
            with self._lock:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[digest] = (now + self.cache_seconds, principal)
        if principal is None:
            raise Unauthenticated("the API key is not valid or has been revoked")
        note_organization(principal.org_id)  # the request line's org_id (a no-op outside a request)
        return principal

    def cached(self, authorization: str | None) -> Principal | None:
        """The principal of a well-formed key looked up (and valid) within the
        cache period, without I/O; None otherwise (``authenticate`` decides)."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            return None
        token = authorization[7:].strip()
        if not _KEY_FORMAT.match(token):
            return None
        with self._lock:
            hit = self._cache.get(key_hash(token))
        if hit is None or hit[0] <= time.monotonic():
            return None
        if hit[1] is not None:
            note_organization(hit[1].org_id)  # the request line's org_id, as authenticate notes it
        return hit[1]

    def _load(self, digest: str) -> Principal | None:
        try:
            record = json.loads(self.store.get(f"keys/{digest}.json").body)
        except ObjectNotFound:
            return None
        if record.get("revoked_at"):
            return None
        return Principal(org_id=record["org_id"], principal_id=record["principal_id"],
                         key_id=record["key_id"], scopes=frozenset(record["scopes"]),
                         workspaces=tuple(record.get("workspaces") or ()))
