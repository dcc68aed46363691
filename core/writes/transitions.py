"""Lifecycle transitions: supersede, revoke, expire, serialized per claim.

A small head object per claim (``core.layout.claim_head_key``) is swapped
by compare-and-swap: of two writers holding the same ``expected_version``
exactly one succeeds, the other gets 409. The head stores the pending
ledger entry, so a transition interrupted between the swap and the ledger
write is completed by the next writer touching that claim.
"""

from __future__ import annotations

import json

from core.bodies import SUPERSEDE, TRANSITION
from core.domain import ACTION_STATUS, TERMINAL_STATUSES, TRUST_LEVELS
from core.errors import Conflict, NotFound, ValidationError
from core.ids import entry_of, minted_at, parse_id, record_hex
from core.keys import Principal
from core.layout import claim_head_key, entry_key
from core.ledger import encode
from core.scope import can_read
from core.snapshot.lookups import claim_for_reader, claim_sources
from core.storage import ObjectNotFound, PreconditionFailed
from core.validation import Fields
from core.writes.desk import WriteDesk
from core.writes.idempotency import Attempt
from core.writes.records import claim_fields, claim_record

# the HTTP status of each transition's answer
TRANSITION_STATUS = {"supersede": 201, "revoke": 200, "expire": 200}


class TransitionWrites(WriteDesk):
    def transition(self, principal: Principal, claim_id: str, action: str, body: dict,
                   attempt: Attempt | None = None) -> dict:
        principal.require("memory:write")
        attempt = attempt or Attempt()
        f = Fields(body, "body", SUPERSEDE if action == "supersede" else TRANSITION)
        expected = f.take("expected_version")
        reason = f.take("reason")
        hex_ = parse_id(claim_id, "claim")
        if hex_ is None:
            raise NotFound(f"claim {claim_id} not found")
        head_key = claim_head_key(principal.org_id, hex_)
        head, etag = self._head(principal, claim_id, head_key)
        claim = head["claim"]
        if not can_read(principal, claim["visibility"], claim.get("workspace_id"), claim["owner_id"]):
            raise NotFound(f"claim {claim_id} not found")
        if head["status"] in TERMINAL_STATUSES:
            raise Conflict(f"claim {claim_id} is {head['status']}; only active or disputed claims can change")
        if head["version"] != expected:
            raise Conflict(f"claim {claim_id} is at version {head['version']}, not {expected}")
        new_hex = attempt.entry_hex
        created_at = minted_at(new_hex)
        payload = {"claim_id": claim_id, "action": action, "expected_version": expected, "reason": reason}
        result: dict
        if action == "supersede":
            fields = claim_fields(f, "body", created_at=created_at, require_core=False)
            if fields["statement"] is None:
                raise ValidationError("statement is required")
            # Unspecified content fields carry over; the validity window
            # starts afresh (an old valid_to may already lie in the past).
            merged = {k: (fields[k] if fields.get(k) is not None else claim.get(k))
                      for k in ("statement", "kind", "confidence", "observer_id")}
            merged["valid_from"], merged["valid_to"] = fields["valid_from"], fields["valid_to"]
            new_claim = claim_record(
                principal, record_hex(new_hex, 1), merged, created_at, subject_id=claim["subject_id"],
                project_id=claim.get("project_id"), visibility=claim["visibility"],
                workspace_id=claim.get("workspace_id"), sources=claim["sources"],
                # a new statement is only as trusted as its writer may vouch for
                trust=claim["trust"] if principal.has("memory:verify") else min(
                    claim["trust"], "asserted", key=TRUST_LEVELS.__getitem__))
            new_claim["owner_id"] = claim["owner_id"]
            payload["new_claim"] = new_claim
            status = ACTION_STATUS[action]
            result = {"claim_id": new_claim["claim_id"], "superseded": claim_id}
        else:
            status = ACTION_STATUS[action]
            result = {"claim_id": claim_id, "status": status, "version": expected + 1}
        entry = {"entry_id": new_hex, "type": "transition", "org_id": principal.org_id,
                 "actor": principal.principal_id, "recorded_at": created_at, **payload,
                 **attempt.answer(TRANSITION_STATUS[action], result)}
        new_head = {"claim": claim, "version": expected + 1, "status": status, "pending_entry": entry}
        attempt.claim(entry_key(principal.org_id, new_hex))
        try:
            if etag is None:
                self.store.put_if_absent(head_key, json.dumps(new_head).encode())
            else:
                self.store.compare_and_swap(head_key, json.dumps(new_head).encode(), etag)
        except PreconditionFailed:
            raise Conflict(f"claim {claim_id} changed concurrently; read it again and retry") from None
        try:
            self.ledger.store_entry(principal.org_id, new_hex, encode(entry))
        except PreconditionFailed:
            pass  # another writer read our head first and completed this very entry
        self.on_write(principal.org_id)
        return result

    def _head(self, principal: Principal, claim_id: str, head_key: str) -> tuple[dict, str | None]:
        try:
            obj = self.store.get(head_key)
        except ObjectNotFound:
            claim, version, status = self._initial_claim(principal, claim_id)
            return {"claim": claim, "version": version, "status": status}, None
        head = json.loads(obj.body)
        pending = head.get("pending_entry")
        if pending is not None:
            try:  # complete a transition whose writer stopped after the swap
                self.ledger.store_entry(principal.org_id, pending["entry_id"], encode(pending))
            except PreconditionFailed:
                pass
        return head, obj.etag

    def _initial_claim(self, principal: Principal, claim_id: str) -> tuple[dict, int, str]:
        snapshot = self.reader.current(principal.org_id)
        if snapshot is not None:
            with snapshot.lease():  # a connection of its own
                row = claim_for_reader(snapshot.db, principal, claim_id)
                if row is not None:
                    record = {k: row[k] for k in ("claim_id", "subject_id", "project_id", "workspace_id",
                                                  "visibility", "owner_id", "statement", "kind", "confidence",
                                                  "trust", "observer_id", "valid_from", "valid_to")}
                    record["sources"] = claim_sources(snapshot.db, claim_id)
                    return record, row["version"], row["base_status"]
        entry = self.ledger.read(principal.org_id, entry_of(parse_id(claim_id, "claim")))
        if entry is not None:
            candidates = list(entry.get("claims", []))
            if entry.get("new_claim"):
                candidates.append(entry["new_claim"])
            for record in candidates:
                if record["claim_id"] == claim_id and can_read(
                        principal, record["visibility"], record.get("workspace_id"), record["owner_id"]):
                    return record, 1, "active"
        raise NotFound(f"claim {claim_id} not found")
