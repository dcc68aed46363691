"""Memory writes: observations, consolidations and claim lifecycle transitions.

Each write is validated and authorized completely, resolved to final values
(defaults applied, trust capped by evidence, visibility never wider than the
evidence), and only then appended to the ledger as one entry — so a rejected
write leaves no trace, and the rebuild is a pure apply of what was accepted.

Writes may cite records that are not in the serving snapshot yet: every
record id locates its ledger entry (``core.ids.entry_of``), so a
consolidation can cite an observation written a second ago.

Lifecycle transitions are serialized per claim by a small head object
(``orgs/<org>/claims/<claim hex>.json``) swapped by compare-and-swap: of two
writers holding the same ``expected_version`` exactly one succeeds, the
other gets 409. The head stores the pending ledger entry, so a transition
interrupted between the swap and the ledger write is completed by the next
writer touching that claim.
"""

from __future__ import annotations

import json
from typing import Callable

from core.bodies import BATCH, CLAIM_SOURCE, CONSOLIDATED_CLAIM, CONSOLIDATION, OBSERVATION, SUPERSEDE, TRANSITION
from core.domain import TRUST_LEVELS, VISIBILITY_RANK, narrowest_visibility, strongest_trust
from core.errors import Conflict, Forbidden, NotFound, TitenError, ValidationError
from core.idempotency import Attempt
from core.ids import entry_of, parse_id, record_hex
from core.instants import canonical, from_ms
from core.keys import Principal
from core.ledger import Ledger, encode, entry_key
from core.retrieval import claim_for_reader, claim_sources
from core.scope import can_read
from core.snapshot import SnapshotReader
from core.store import ObjectNotFound, PreconditionFailed, Store
from core.validation import Fields

TRANSITION_STATUS = {"supersede": 201, "revoke": 200, "expire": 200}


def _created_at(entry: str) -> str:
    return canonical(from_ms(int(entry[:12], 16)))


def _check_trust(principal: Principal, trust: str | None, path: str) -> None:
    if trust == "policy_approved":
        raise ValidationError(f"{path}: policy_approved is never accepted from a write")
    if trust == "verified" and not principal.has("memory:verify"):
        raise Forbidden(f"{path}: verified needs the memory:verify scope")


def _check_workspace(principal: Principal, visibility: str, workspace_id: str | None, path: str) -> None:
    if visibility == "team" and workspace_id is None:
        raise ValidationError(f"{path}: workspace_id is required for team visibility")
    if workspace_id is not None and workspace_id not in principal.workspaces:
        raise Forbidden(f"{path}: this key is not a member of workspace {workspace_id}")


def _claim_body(f: Fields, path: str, *, created_at: str, require_core: bool = True) -> dict:
    claim = {
        "statement": f.take("statement", required=require_core),
        "kind": f.take("kind", required=require_core),
        "confidence": f.take("confidence", required=require_core),
        "observer_id": f.take("observer_id"),
    }
    valid_from = f.take("valid_from")
    valid_to = f.take("valid_to")
    if valid_from and valid_to and valid_to <= valid_from:
        raise ValidationError(f"{path}.valid_to must be later than valid_from")
    claim["valid_from"] = canonical(valid_from) if valid_from else None
    claim["valid_to"] = canonical(valid_to) if valid_to else None
    if claim["valid_to"] and not claim["valid_from"] and claim["valid_to"] <= created_at:
        raise ValidationError(f"{path}.valid_to must be later than valid_from (which defaults to now)")
    return claim


class Writes:
    def __init__(self, store: Store, reader: SnapshotReader, on_write: Callable[[str], None] | None = None):
        self.store = store
        self.ledger = Ledger(store)
        self.reader = reader
        self.on_write = on_write or (lambda org_id: None)

    def _append(self, principal: Principal, entry_type: str, payload: dict, attempt: Attempt,
                status: int, result: dict) -> dict:
        """Claim the idempotency key (if any), then store the entry with its answer."""
        hex_ = attempt.entry_hex
        attempt.claim(entry_key(principal.org_id, hex_))
        entry = self.ledger.append(principal.org_id, entry_type, {**payload, **attempt.answer(status, result)},
                                   actor=principal.principal_id, entry_hex=hex_)
        self.on_write(principal.org_id)
        return entry

    # -- observations ----------------------------------------------------------

    def record_observation(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        principal.require("memory:write")
        attempt = attempt or Attempt()
        hex_ = attempt.entry_hex
        observation, claims = self.build_observation(principal, body, f"obs_{hex_}",
                                                     f"claim_{record_hex(hex_, 1)}", _created_at(hex_))
        result = self.observation_answer(observation, claims)
        self._append(principal, "observation", {"observation": observation, "claims": claims}, attempt,
                     201, result)
        return result

    @staticmethod
    def observation_answer(observation: dict, claims: list[dict]) -> dict:
        return {"observation_id": observation["observation_id"],
                "claim_id": claims[0]["claim_id"] if claims else None,
                "subject_id": observation["subject_id"], "project_id": observation["project_id"],
                "trust": observation["trust"], "visibility": observation["visibility"],
                "created_at": observation["created_at"]}

    def record_observation_batch(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        """Up to ``MAX_BATCH_ITEMS`` observation bodies in one ledger entry:
        each valid item is stored, each invalid one reported by its index and
        stored nowhere. When no item is valid nothing is stored and the
        request is a ``ValidationError`` naming the first errors (a 2xx
        always means something was stored)."""
        principal.require("memory:write")
        attempt = attempt or Attempt()
        f = Fields(body, "body", BATCH)
        items = f.take("items")
        hex_ = attempt.entry_hex
        created_at = _created_at(hex_)
        results, observations, claims = [], [], []
        for i, item in enumerate(items):
            try:
                obs, obs_claims = self.build_observation(
                    principal, item, f"obs_{record_hex(hex_, 2 * i + 1)}", f"claim_{record_hex(hex_, 2 * i + 2)}",
                    created_at, path=f"items[{i}]")
            except TitenError as exc:
                results.append({"index": i, "error": {"code": exc.code, "message": exc.message}})
                continue
            observations.append(obs)
            claims.extend(obs_claims)
            results.append({"index": i, "data": self.observation_answer(obs, obs_claims)})
        if not observations:
            errors = "; ".join(r["error"]["message"] for r in results[:3])
            more = f" (and {len(results) - 3} more)" if len(results) > 3 else ""
            raise ValidationError(f"none of the {len(results)} items is valid, nothing was stored: {errors}{more}")
        result = {"results": results}
        self._append(principal, "batch", {"observations": observations, "claims": claims}, attempt, 201, result)
        return result

    @staticmethod
    def build_observation(principal: Principal, body: dict, observation_id: str, claim_id: str,
                          created_at: str, path: str = "body") -> tuple[dict, list[dict]]:
        """Validate one observation body into its final records (no I/O)."""
        f = Fields(body, path, OBSERVATION)
        subject_id = f.take("subject_id")
        project_id = f.take("project_id")
        workspace_id = f.take("workspace_id")
        kind = f.take("kind")
        content = f.take("content")
        src = f.take("source")
        source = {"type": src.take("type"), "ref": src.take("ref")}
        if src.raw("id") is not None:
            source["id"] = src.take("id")
        trust = f.take("trust")
        _check_trust(principal, trust, "trust")
        visibility = f.take("visibility")
        _check_workspace(principal, visibility, workspace_id, path)
        occurred = f.take("occurred_at")
        claim_f = f.take("claim")
        observation = {"observation_id": observation_id, "org_id": principal.org_id,
                       "subject_id": subject_id, "project_id": project_id, "workspace_id": workspace_id,
                       "visibility": visibility, "owner_id": principal.principal_id, "kind": kind,
                       "content": content, "source": source, "trust": trust,
                       "occurred_at": canonical(occurred) if occurred else None, "created_at": created_at}
        claims = []
        if claim_f is not None:
            fields = _claim_body(claim_f, "claim" if path == "body" else f"{path}.claim", created_at=created_at)
            claims.append(Writes._claim_record(principal, claim_id[len("claim_"):], fields, created_at,
                                             subject_id=subject_id, project_id=project_id,
                                             visibility=visibility, workspace_id=workspace_id, trust=trust,
                                             sources=[{"observation_id": observation_id, "relation": "supports"}]))
        return observation, claims

    @staticmethod
    def _claim_record(principal: Principal, hex_: str, fields: dict, created_at: str, **scope) -> dict:
        return {"claim_id": f"claim_{hex_}", "org_id": principal.org_id, "owner_id": principal.principal_id,
                "subject_id": scope["subject_id"], "project_id": scope["project_id"],
                "visibility": scope["visibility"], "workspace_id": scope["workspace_id"],
                "statement": fields["statement"], "kind": fields["kind"], "confidence": fields["confidence"],
                "trust": scope["trust"], "observer_id": fields.get("observer_id"),
                "valid_from": fields.get("valid_from") or created_at, "valid_to": fields.get("valid_to"),
                "created_at": created_at, "sources": scope["sources"]}

    # -- consolidations ----------------------------------------------------------

    def record_consolidation(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        principal.require("memory:write")
        attempt = attempt or Attempt()
        f = Fields(body, "body", CONSOLIDATION)
        subject_id = f.take("subject_id")
        project_id = f.take("project_id")
        raw_claims = f.take("claims")
        hex_ = attempt.entry_hex
        created_at = _created_at(hex_)
        parsed = []
        for i, raw in enumerate(raw_claims):
            path = f"claims[{i}]"
            cf = Fields(raw, path, CONSOLIDATED_CLAIM)
            fields = _claim_body(cf, path, created_at=created_at)
            trust = cf.take("trust")
            _check_trust(principal, trust, f"{path}.trust")
            visibility = cf.take("visibility")
            workspace_id = cf.take("workspace_id")
            sources = []
            for j, raw_source in enumerate(cf.take("sources")):
                sf = Fields(raw_source, f"{path}.sources[{j}]", CLAIM_SOURCE)
                observation_id = sf.take("observation_id")
                relation = sf.take("relation")
                if parse_id(observation_id, "obs") is None:
                    raise ValidationError(f"{path}.sources[{j}].observation_id is not an observation id")
                if {"observation_id": observation_id, "relation": relation} not in sources:
                    sources.append({"observation_id": observation_id, "relation": relation})
            if not any(s["relation"] == "supports" for s in sources):
                raise ValidationError(f"{path}.sources needs at least one 'supports' source")
            parsed.append((path, fields, trust, visibility, workspace_id, sources))
        # Every cited observation must exist and be readable: read from the
        # ledger itself, so evidence written a moment ago can be cited.
        cache: dict[str, dict] = {}
        claims = []
        for index, (path, fields, trust, visibility, workspace_id, sources) in enumerate(parsed, start=1):
            supporting = []
            for s in sources:
                obs = cache.get(s["observation_id"]) or self._observation(principal, s["observation_id"])
                cache[s["observation_id"]] = obs
                if obs["subject_id"] != subject_id or obs.get("project_id") != project_id:
                    raise ValidationError(
                        f"{path}: evidence {s['observation_id']} belongs to another subject or project")
                if s["relation"] == "supports":
                    supporting.append(obs)
            cap = strongest_trust([o["trust"] for o in supporting])
            final_trust = cap if trust is None else min(trust, cap, key=TRUST_LEVELS.__getitem__)
            narrowest = narrowest_visibility([o["visibility"] for o in supporting])
            team_workspaces = {o.get("workspace_id") for o in supporting if o["visibility"] == "team"}
            if len(team_workspaces) > 1:
                # No one workspace may read all of this evidence: the claim
                # can only be as wide as its writer.
                narrowest = "private"
            final_visibility = visibility or narrowest
            if VISIBILITY_RANK[final_visibility] > VISIBILITY_RANK[narrowest]:
                detail = (f"team evidence spans workspaces {', '.join(sorted(team_workspaces))}"
                          if len(team_workspaces) > 1 else f"its evidence allows at most {narrowest}")
                raise ValidationError(f"{path}.visibility {final_visibility} is wider than its evidence: {detail}")
            if final_visibility == "team":
                if workspace_id is None and len(team_workspaces) == 1:
                    workspace_id = next(iter(team_workspaces))
                if workspace_id is not None and team_workspaces and workspace_id not in team_workspaces:
                    raise ValidationError(f"{path}.workspace_id would widen the visibility of its team evidence")
                _check_workspace(principal, final_visibility, workspace_id, path)
            claims.append(Writes._claim_record(
                principal, record_hex(hex_, index), fields, created_at, subject_id=subject_id,
                project_id=project_id, visibility=final_visibility,
                workspace_id=workspace_id if final_visibility == "team" else None,
                trust=final_trust, sources=sources))
        result = {"claim_ids": [c["claim_id"] for c in claims], "model_used": False}
        self._append(principal, "consolidation", {"subject_id": subject_id, "project_id": project_id,
                                                  "claims": claims}, attempt, 201, result)
        return result

    def _observation(self, principal: Principal, observation_id: str) -> dict:
        hex_ = parse_id(observation_id, "obs")
        entry = self.ledger.read(principal.org_id, entry_of(hex_)) if hex_ else None
        obs = None
        if entry is not None and entry["type"] == "observation":
            obs = entry["observation"]
        elif entry is not None and entry["type"] == "batch":
            obs = next((o for o in entry["observations"] if o["observation_id"] == observation_id), None)
        if obs is None or obs["observation_id"] != observation_id or not can_read(
                principal, obs["visibility"], obs.get("workspace_id"), obs["owner_id"]):
            raise NotFound(f"observation {observation_id} not found")
        return obs

    # -- lifecycle transitions ---------------------------------------------------

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
        head_key = f"orgs/{principal.org_id}/claims/{hex_}.json"
        head, etag = self._head(principal, claim_id, head_key)
        claim = head["claim"]
        if not can_read(principal, claim["visibility"], claim.get("workspace_id"), claim["owner_id"]):
            raise NotFound(f"claim {claim_id} not found")
        if head["status"] in ("superseded", "expired", "revoked"):
            raise Conflict(f"claim {claim_id} is {head['status']}; only active or disputed claims can change")
        if head["version"] != expected:
            raise Conflict(f"claim {claim_id} is at version {head['version']}, not {expected}")
        new_hex = attempt.entry_hex
        created_at = _created_at(new_hex)
        payload = {"claim_id": claim_id, "action": action, "expected_version": expected, "reason": reason}
        result: dict
        if action == "supersede":
            fields = _claim_body(f, "body", created_at=created_at, require_core=False)
            if fields["statement"] is None:
                raise ValidationError("statement is required")
            # Unspecified content fields carry over; the validity window
            # starts afresh (an old valid_to may already lie in the past).
            merged = {k: (fields[k] if fields.get(k) is not None else claim.get(k))
                      for k in ("statement", "kind", "confidence", "observer_id")}
            merged["valid_from"], merged["valid_to"] = fields["valid_from"], fields["valid_to"]
            new_claim = Writes._claim_record(
                principal, record_hex(new_hex, 1), merged, created_at, subject_id=claim["subject_id"],
                project_id=claim.get("project_id"), visibility=claim["visibility"],
                workspace_id=claim.get("workspace_id"), sources=claim["sources"],
                # a new statement is only as trusted as its writer may vouch for
                trust=claim["trust"] if principal.has("memory:verify") else min(
                    claim["trust"], "asserted", key=TRUST_LEVELS.__getitem__))
            new_claim["owner_id"] = claim["owner_id"]
            payload["new_claim"] = new_claim
            status = "superseded"
            result = {"claim_id": new_claim["claim_id"], "superseded": claim_id}
        else:
            status = {"revoke": "revoked", "expire": "expired"}[action]
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
        with self.reader.serving_lock(principal.org_id):  # one reader of the snapshot at a time
            snapshot = self.reader.current(principal.org_id)
            row = claim_for_reader(snapshot, principal, claim_id) if snapshot else None
            if row is not None:
                record = {k: row[k] for k in ("claim_id", "subject_id", "project_id", "workspace_id", "visibility",
                                              "owner_id", "statement", "kind", "confidence", "trust",
                                              "observer_id", "valid_from", "valid_to")}
                record["sources"] = claim_sources(snapshot, claim_id)
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
