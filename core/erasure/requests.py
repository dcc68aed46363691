"""Asking for an erasure, and reading how far it got (docs/api.md §16).

``DELETE /v1/subjects/{id}`` and ``DELETE /v1/observations/{id}`` need the
``memory:erase`` scope. A request is checked, then recorded — first the
status object (which alone names the target, until the erasure completes),
then a content-free ``erasure`` ledger entry (who, when, a hash of the id)
— and answered 202: the work is the next rebuild's (core/snapshot/build.py
with core/erasure/work.py), which the write hook asks for like any write's.

Scope rules as everywhere: an observation the caller may not read, or of
another organization, is ``NOT_FOUND`` exactly like one that does not
exist. A subject erasure reaches every record about the subject in the
caller's organization, whoever wrote it: erasure is an administrative act.
Its counts, though, are of the records the requester could read (a record
the caller may not read reaches no count; the ledger's
``erasure_complete`` entry keeps the totals), and only the requester reads
them. Erasing a subject with no records completes with zero counts.
"""

from __future__ import annotations

from typing import Callable

from core.bodies import IDENTIFIER
from core.errors import NotFound, ValidationError, echo, printable
from core.erasure import records
from core.ids import entry_hex, entry_of, minted_at, parse_id, subject_tag
from core.keys import Principal
from core.layout import erasure_key
from core.ledger import ERASED, Ledger, observations_in
from core.scope import can_read
from core.storage import PreconditionFailed, Store


class ErasureDesk:
    def __init__(self, store: Store, on_write: Callable[[str], None] | None = None):
        self.store = store
        self.ledger = Ledger(store)
        self.on_write = on_write or (lambda org_id: None)

    def erase_subject(self, principal: Principal, subject_id: str) -> dict:
        principal.require("memory:erase")
        if not IDENTIFIER.fullmatch(subject_id or ""):
            # a path's value: its unprintable characters quoted as escapes (api.md §1)
            raise ValidationError(f"subject_id '{printable(echo(subject_id))}' is not an identifier "
                                  "(letters, digits, '_.:@-')")
        erasure_id = self._record(principal, "subject", subject_id, subject_tag(principal.org_id, subject_id))
        return {"erasure_id": erasure_id, "subject_id": subject_id, "status": "pending"}

    def erase_observation(self, principal: Principal, observation_id: str) -> dict:
        principal.require("memory:erase")
        found = self._readable_observation(principal, observation_id)
        erasure_id = self._record(principal, "observation", observation_id,
                                  subject_tag(principal.org_id, found["subject_id"]))
        return {"erasure_id": erasure_id, "observation_id": observation_id, "status": "pending"}

    def status(self, principal: Principal, erasure_id: str) -> dict:
        """``GET /v1/erasures/{id}``: its requester only, as a stored pack is
        its compiler's only: the counts are of what the requesting key could
        read, so a reader must be that principal with at least that key's
        workspaces (another key of it with fewer could not read them all)."""
        principal.require("memory:erase")
        hex_ = parse_id(erasure_id, "era")
        record = records.read(self.store, principal.org_id, hex_)[0] if hex_ else None
        if (record is None or record.get("requested_by") != principal.principal_id
                or not set(record.get("requested_workspaces") or ()) <= set(principal.workspaces)):
            raise NotFound(f"erasure {erasure_id} not found")
        return {"erasure_id": record["erasure_id"], "target": record["target"],
                "target_sha256": record["target_sha256"], "status": record["status"],
                "requested_at": record["requested_at"], "completed_at": record.get("completed_at"),
                "counts": record.get("counts")}

    def _readable_observation(self, principal: Principal, observation_id: str) -> dict:
        hex_ = parse_id(observation_id, "obs")
        entry = self.ledger.read(principal.org_id, entry_of(hex_)) if hex_ else None
        found = next((o for o in observations_in(entry) if o["observation_id"] == observation_id),
                     None) if entry is not None else None
        if (entry is None or entry.get("type") == ERASED or found is None
                or found["observation_id"] != observation_id
                or not can_read(principal, found["visibility"], found.get("workspace_id"), found["owner_id"])):
            raise NotFound(f"observation {observation_id} not found")
        return found

    def _record(self, principal: Principal, target: str, target_id: str, tag: str) -> str:
        hex_ = entry_hex()
        erasure_id = f"era_{hex_}"
        sha = records.target_sha256(principal.org_id, target, target_id)
        requested_at = minted_at(hex_)
        # the status object first: it alone names the target, which the
        # rebuild needs; the ledger entry without it would be unworkable
        self.store.put_if_absent(erasure_key(principal.org_id, hex_), records.encode({
            "erasure_id": erasure_id, "org_id": principal.org_id, "target": target, "target_sha256": sha,
            "requested_by": principal.principal_id, "requested_workspaces": sorted(principal.workspaces),
            "requested_at": requested_at, "status": "pending",
            "completed_at": None, "counts": None, "pending_target": target_id,
            # (four hex digits of the subject's hash: its context runs carry them)
            "subject_tag": tag}))
        try:
            self.ledger.append(principal.org_id, "erasure", {"erasure_id": erasure_id, "target": target,
                                                             "target_sha256": sha},
                               actor=principal.principal_id, entry_hex=hex_)
        except PreconditionFailed:
            # a rebuild that met the status object first stored this entry
            # itself (core.erasure.work.ErasureWork.pending): it is there,
            # which is all the request needs; a 503 here would hide an
            # erasure that goes on, and its retry would read zero counts
            pass
        self.on_write(principal.org_id)
        return erasure_id
