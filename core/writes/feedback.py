"""Feedback on a compiled pack: the loop that moves a claim's utility.

Feedback is checked against the stored context run straight from the ledger
(not the snapshot), so it is accepted the moment the pack exists. Only the
principal that compiled the pack may send it; an unknown context, another
principal's and a claim that was not in the pack all get the same 404. One
signal per (context, claim) counts — a repeat replaces the earlier outcome
at the next rebuild — so repeating feedback cannot inflate utility.
"""

from __future__ import annotations

from core.bodies import FEEDBACK
from core.compile.record import context_run
from core.errors import NotFound
from core.ids import minted_at, parse_id
from core.keys import Principal
from core.layout import RUN_SUFFIX, entry_key
from core.ledger import Ledger
from core.validation import Fields
from core.writes.idempotency import Attempt


class FeedbackDesk:
    def __init__(self, ledger: Ledger, on_write=None):
        self.ledger = ledger
        self.on_write = on_write or (lambda org_id: None)

    def record(self, principal: Principal, context_id: str, body: dict, attempt: Attempt | None = None) -> dict:
        principal.require("context:feedback")
        attempt = attempt or Attempt()
        f = Fields(body, "body", FEEDBACK)
        outcome = f.take("outcome")
        claim_id = f.take("claim_id")
        reason_code = f.take("reason_code")
        run = context_run(self.ledger, principal, context_id)
        if claim_id is not None and (parse_id(claim_id, "claim") is None or
                                     claim_id not in {i["claim_id"] for i in run["items"]}):
            raise NotFound(f"claim {claim_id} not found in context {context_id}")
        hex_ = attempt.entry_hex
        feedback_id = f"fb_{hex_}"
        # feedback on the pack as a whole moves no claim: like the run it
        # annotates, no snapshot needs it, so the rebuild passes it over
        suffix = ".json" if claim_id else RUN_SUFFIX
        result = {"feedback_id": feedback_id, "context_id": context_id, "claim_id": claim_id,
                  "outcome": outcome, "recorded_at": minted_at(hex_)}
        attempt.claim(entry_key(principal.org_id, hex_, suffix))
        self.ledger.append(principal.org_id, "feedback", {
            "feedback_id": feedback_id, "context_id": context_id, "claim_id": claim_id,
            "outcome": outcome, "reason_code": reason_code,
            # who may read the pack: an erasure tells of this feedback only a key that could
            "pack_workspaces": list(run.get("scope", {}).get("workspaces", ())),
            **attempt.answer(201, result)},
            actor=principal.principal_id, entry_hex=hex_, suffix=suffix)
        if claim_id:
            self.on_write(principal.org_id)
        return result
