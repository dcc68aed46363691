"""Consolidations: caller-supplied claims citing evidence by id.

Every cited observation must exist and be readable by the writer: it is
read from the ledger itself (``core.ids.entry_of`` locates its entry), so
evidence written a second ago can be cited before any rebuild. A claim's
trust is capped by its supporting evidence and its visibility is never wider
than that evidence's.
"""

from __future__ import annotations

from core.bodies import CLAIM_SOURCE, CONSOLIDATED_CLAIM, CONSOLIDATION
from core.domain import TRUST_LEVELS, VISIBILITY_RANK, narrowest_visibility, strongest_trust
from core.errors import NotFound, ValidationError, echo
from core.ids import entry_of, minted_at, parse_id, record_hex
from core.keys import Principal
from core.ledger import observations_in
from core.scope import can_read
from core.validation import Fields
from core.writes.desk import WriteDesk
from core.writes.idempotency import Attempt
from core.writes.records import check_trust, check_workspace, claim_fields, claim_record


class ConsolidationWrites(WriteDesk):
    def record_consolidation(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        principal.require("memory:write")
        attempt = attempt or Attempt()
        f = Fields(body, "body", CONSOLIDATION)
        subject_id = f.take("subject_id")
        project_id = f.take("project_id")
        raw_claims = f.take("claims")
        hex_ = attempt.entry_hex
        created_at = minted_at(hex_)
        parsed = []
        for i, raw in enumerate(raw_claims):
            path = f"claims[{i}]"
            cf = Fields(raw, path, CONSOLIDATED_CLAIM)
            fields = claim_fields(cf, path, created_at=created_at)
            trust = cf.take("trust")
            check_trust(principal, trust, f"{path}.trust")
            visibility = cf.take("visibility")
            workspace_id = cf.take("workspace_id")
            sources = []
            for j, raw_source in enumerate(cf.take("sources")):
                sf = Fields(raw_source, f"{path}.sources[{j}]", CLAIM_SOURCE)
                observation_id = sf.take("observation_id")
                relation = sf.take("relation")
                if parse_id(observation_id, "obs") is None:
                    raise ValidationError(f"{path}.sources[{j}].observation_id is not an observation id")
                cited = next((s["relation"] for s in sources if s["observation_id"] == observation_id), None)
                if cited is None:
                    sources.append({"observation_id": observation_id, "relation": relation})
                elif cited != relation:
                    # one piece of evidence cannot both support and contradict a claim:
                    # the claim would be disputed by its own evidence
                    raise ValidationError(f"{path}.sources[{j}]: {observation_id} is already cited as "
                                          f"'{cited}'; an observation is cited with one relation")
            if not any(s["relation"] == "supports" for s in sources):
                raise ValidationError(f"{path}.sources needs at least one 'supports' source")
            parsed.append((path, fields, trust, visibility, workspace_id, sources))
        # Every cited observation must exist and be readable: read from the
        # ledger itself, so evidence written a moment ago can be cited.
        cache: dict[str, dict] = {}
        # one read and parse per ledger entry: a batch or an import entry holds
        # many observations, and a consolidation citing fifty of them re-read
        # and re-parsed the whole entry fifty times (1.8 s for one import entry)
        entries: dict[str, dict[str, dict]] = {}
        claims = []
        for index, (path, fields, trust, visibility, workspace_id, sources) in enumerate(parsed, start=1):
            supporting = []
            for s in sources:
                obs = cache.get(s["observation_id"]) or self._observation(principal, s["observation_id"], entries)
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
                detail = (f"team evidence spans workspaces {', '.join(echo(w) for w in sorted(team_workspaces))}"
                          if len(team_workspaces) > 1 else f"its evidence allows at most {narrowest}")
                raise ValidationError(f"{path}.visibility {final_visibility} is wider than its evidence: {detail}")
            if final_visibility == "team":
                if workspace_id is None and len(team_workspaces) == 1:
                    workspace_id = next(iter(team_workspaces))
                if workspace_id is not None and team_workspaces and workspace_id not in team_workspaces:
                    raise ValidationError(f"{path}.workspace_id would widen the visibility of its team evidence")
                check_workspace(principal, final_visibility, workspace_id, path)
            claims.append(claim_record(
                principal, record_hex(hex_, index), fields, created_at, subject_id=subject_id,
                project_id=project_id, visibility=final_visibility,
                workspace_id=workspace_id if final_visibility == "team" else None,
                trust=final_trust, sources=sources))
        result = {"claim_ids": [c["claim_id"] for c in claims], "model_used": False}
        self._append(principal, "consolidation", {"subject_id": subject_id, "project_id": project_id,
                                                  "claims": claims}, attempt, 201, result)
        return result

    def _observation(self, principal: Principal, observation_id: str, entries: dict[str, dict[str, dict]]) -> dict:
        """The cited observation, read from the ledger; ``entries`` holds the
        observations of every entry this request has read, by id."""
        hex_ = parse_id(observation_id, "obs")
        obs = None
        if hex_:
            entry_hex = entry_of(hex_)
            if entry_hex not in entries:
                entry = self.ledger.read(principal.org_id, entry_hex)
                entries[entry_hex] = {o["observation_id"]: o for o in observations_in(entry)} if entry else {}
            obs = entries[entry_hex].get(observation_id)
        if obs is None or obs["observation_id"] != observation_id or not can_read(
                principal, obs["visibility"], obs.get("workspace_id"), obs["owner_id"]):
            raise NotFound(f"observation {observation_id} not found")
        return obs

