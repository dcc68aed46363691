"""Observation writes: one observation (with its optional direct claim), or a batch."""

from __future__ import annotations

from core.bodies import BATCH
from core.errors import TitenError
from core.ids import minted_at, record_hex
from core.keys import Principal
from core.validation import Fields
from core.writes.desk import WriteDesk
from core.writes.idempotency import Attempt
from core.writes.records import build_observation, observation_answer


class ObservationWrites(WriteDesk):
    def record_observation(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        principal.require("memory:write")
        attempt = attempt or Attempt()
        hex_ = attempt.entry_hex
        observation, claims = build_observation(principal, body, f"obs_{hex_}",
                                                     f"claim_{record_hex(hex_, 1)}", minted_at(hex_))
        result = observation_answer(observation, claims)
        self._append(principal, "observation", {"observation": observation, "claims": claims}, attempt,
                     201, result)
        return result

    def record_observation_batch(self, principal: Principal, body: dict, attempt: Attempt | None = None) -> dict:
        """Up to ``MAX_BATCH_ITEMS`` observation bodies in one ledger entry:
        each valid item is stored, each invalid one reported by its index and
        stored nowhere. When no item is valid the answer is still 201 with a
        result per item, as the contract says, and nothing is written: no
        ledger entry, no idempotency record (a retry finds the same errors)."""
        principal.require("memory:write")
        attempt = attempt or Attempt()
        f = Fields(body, "body", BATCH)
        items = f.take("items")
        hex_ = attempt.entry_hex
        created_at = minted_at(hex_)
        results, observations, claims = [], [], []
        for i, item in enumerate(items):
            try:
                obs, obs_claims = build_observation(
                    principal, item, f"obs_{record_hex(hex_, 2 * i + 1)}", f"claim_{record_hex(hex_, 2 * i + 2)}",
                    created_at, path=f"items[{i}]")
            except TitenError as exc:
                results.append({"index": i, "error": {"code": exc.code, "message": exc.message}})
                continue
            observations.append(obs)
            claims.extend(obs_claims)
            results.append({"index": i, "data": observation_answer(obs, obs_claims)})
        result = {"results": results}
        if not observations:
            return result
        self._append(principal, "batch", {"observations": observations, "claims": claims}, attempt, 201, result)
        return result
