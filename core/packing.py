"""Packing: the ranked claims that fit the token budget (DESIGN §5 step 5).

Pure, no I/O. The envelope — the whole ``data`` object with no items, its
numbers at their widest — is estimated first and reserved; then the ranked
list is walked greedily: an item is taken whole when its charged estimate
(plus its conflict entry, if any, and the separators) fits what is left and
its kind has fewer than 3 items; otherwise it is skipped and the walk goes
on. An item is charged ``estimate(prefix) + estimate(suffix)`` — its fields
and its score serialized apart — which the estimate's subadditivity makes
never lower than the estimate of the whole item, and which lets the prefix's
estimate be computed once per generation. The caller then estimates the
serialized ``data`` exactly as it will be sent, so the whole payload never
exceeds ``max_tokens`` by the estimate. ``used_tokens`` is the sum of the
packed items' charged estimates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from core.domain import INSTRUCTIONS, POLICY_SNAPSHOT
from core.tokens import estimate_tokens

MAX_PER_KIND = 3

# The response's fixed fragments and their real cl100k_base token counts
# (checked against the tokenizer in tests/test_payload_estimate.py). The
# generic estimate overprices JSON keys by about a third; for text we wrote
# ourselves the price is known, so each occurrence is charged its real count
# plus SEAM_SLACK: one token for the seams on either side, one for the
# estimate's own per-call constant, which a fragment inside a larger text
# does not pay again (measured: slack 1 undercounts whole envelopes by up
# to 9 tokens, slack 2 never did over 3,000 random envelopes).
SEAM_SLACK = 2
KNOWN_FRAGMENTS = {
    f'"policy_snapshot":"{POLICY_SNAPSHOT}","instructions":"{INSTRUCTIONS}"}}': 36,
    '{"context_id":"ctx_': 6,
    '"query":{"task":': 5,
    '"scope":{"subject_id":': 6,
    ',"project_id":': 4,
    '"budget":{"max_tokens":': 6,
    ',"used_tokens":': 4,
    '"items":[': 3,
    '],"conflicts":[': 4,
    '"score_components":{"relevance":': 7,
    '"evidence_ids":["obs_': 7,
}
_DISCOUNTS = tuple((f, estimate_tokens(f) - real - SEAM_SLACK) for f, real in KNOWN_FRAGMENTS.items()
                   if estimate_tokens(f) - real - SEAM_SLACK > 0)


# Alternating hex letters and digits is the costliest a 32-hex id can be
# estimated (checked in tests/test_payload_estimate.py).
WORST_CONTEXT_ID = "ctx_" + "a0" * 16


def payload_tokens(text: str) -> int:
    """The estimate used for everything packed: the conservative generic
    estimate, with our own fixed fragments charged at their known price."""
    tokens = estimate_tokens(text)
    for fragment, discount in _DISCOUNTS:
        tokens -= text.count(fragment) * discount
    return tokens


def dumps(value) -> str:
    """The one serialization used for estimating and for sending."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class BudgetTooSmall(Exception):
    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


class Scored(Protocol):
    """What the packer reads of a ranked claim, and only when it prices the
    item: ``core.ranking.Ranked`` builds its rounded components on first use."""
    score: float
    components: dict


@dataclass(frozen=True, slots=True)
class Score:
    """A score and its components known up front (a ``Scored``)."""
    score: float
    components: dict


@dataclass(slots=True)
class PackCandidate:
    """One ranked claim as the packer sees it. Its item serializes as
    ``prefix + suffix`` (``item_prefix``/``item_suffix``): the prefix — every
    field but the score — is the same for every request on a generation, so
    its estimate is computed once; by subadditivity of the estimate,
    ``prefix_tokens + payload_tokens(suffix)`` never undercounts the item.
    Most candidates are skipped on kind and prefix alone, so the score is
    read (and its suffix serialized) only for those actually priced."""
    claim_id: str
    kind: str
    prefix_tokens: int
    scored: Scored
    conflict: str | None = None  # the serialized conflict entry, for a disputed item

    @property
    def suffix(self) -> str:
        return item_suffix(self.scored.score, self.scored.components)


@dataclass
class PackResult:
    picked: list[int]            # indexes into the candidates, rank order
    item_tokens: list[int]       # the charged estimate of each picked item
    used_tokens: int
    envelope_tokens: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (claim_id, "kind_full" | "no_fit")


def item_fields(claim_id: str, claim: str, kind: str, confidence: float, trust: str, status: str,
                observer_id: str | None, valid_from: str, valid_to: str | None, evidence_ids: list[str]) -> dict:
    """An item's documented fields but its score, in the order they are sent."""
    return {"claim_id": claim_id, "claim": claim, "kind": kind, "confidence": confidence, "trust": trust,
            "status": status, "observer_id": observer_id, "valid_from": valid_from, "valid_to": valid_to,
            "evidence_ids": evidence_ids}


def item_prefix(fields: dict) -> str:
    """The item's JSON up to its score: ``fields`` ends with evidence_ids."""
    return dumps(fields)[:-1] + ","


def item_suffix(score: float, components: dict) -> str:
    # what dumps() gives for a float is its repr; formatted by hand on the hot path
    return ('"score":' + repr(score) + ',"score_components":{'
            + ",".join(f'"{k}":{v!r}' for k, v in components.items()) + "}}")


def envelope_cost(envelope: dict, max_tokens: int) -> int:
    """The estimate of ``data`` with no items, its budget numbers at their
    widest for this ``max_tokens`` and its context id at its costliest — so
    the reserve, and with it the pack, never depends on which id was drawn."""
    probe = dict(envelope, context_id=WORST_CONTEXT_ID, items=[], conflicts=[])
    probe["budget"] = dict(envelope["budget"], max_tokens=max_tokens, used_tokens=max_tokens)
    return payload_tokens(dumps(probe))


def pack(candidates: list[PackCandidate], envelope: dict, max_tokens: int) -> PackResult:
    """``candidates`` best first; ``envelope``: the ``data`` object without
    items/conflicts, its ``budget`` filled in."""
    envelope_tokens = envelope_cost(envelope, max_tokens)
    if envelope_tokens > max_tokens:
        needed = envelope_tokens
        while envelope_cost(envelope, needed) > needed:
            needed += 1
        raise BudgetTooSmall(needed)
    remaining = max_tokens - envelope_tokens
    per_kind: dict[str, int] = {}
    picked, charged, skipped = [], [], []
    for index, c in enumerate(candidates):
        if per_kind.get(c.kind, 0) >= MAX_PER_KIND:
            skipped.append((c.claim_id, "kind_full"))
            continue
        # the prefix alone bounds the cost from below: most skips stop here
        if c.prefix_tokens + 1 > remaining:
            skipped.append((c.claim_id, "no_fit"))
            continue
        item_tokens = c.prefix_tokens + payload_tokens(c.suffix)
        cost = item_tokens + 1 + (payload_tokens(c.conflict) + 1 if c.conflict else 0)
        if cost > remaining:
            skipped.append((c.claim_id, "no_fit"))
            continue
        remaining -= cost
        per_kind[c.kind] = per_kind.get(c.kind, 0) + 1
        picked.append(index)
        charged.append(item_tokens)
    return PackResult(picked, charged, sum(charged), envelope_tokens, skipped)


def assemble(envelope: dict, items: list[dict], conflicts: list[dict], used_tokens: int) -> dict:
    data = dict(envelope, items=items, conflicts=conflicts)
    data["budget"] = dict(envelope["budget"], used_tokens=used_tokens)
    return data
