"""Packing: the ranked claims that fit the token budget (DESIGN §5 step 5).

Pure, no I/O. The envelope — the whole ``data`` object with no items, its
numbers at their widest — is estimated first and reserved; then the ranked
list is walked greedily: an item is taken whole when its estimate (plus its
conflict entry, if any, and the separators) fits what is left and its kind
has fewer than 3 items; otherwise it is skipped and the walk goes on. A
final check estimates the serialized ``data`` exactly as it will be sent, so
the whole payload never exceeds ``max_tokens`` by the estimate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from core.tokens import estimate_tokens

MAX_PER_KIND = 3


def dumps(value) -> str:
    """The one serialization used for estimating and for sending."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class BudgetTooSmall(Exception):
    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


@dataclass
class PackResult:
    items: list[dict]
    conflicts: list[dict]
    used_tokens: int
    envelope_tokens: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (claim_id, "kind_full" | "no_fit")


def envelope_cost(envelope: dict, max_tokens: int) -> int:
    """The estimate of ``data`` with no items, its budget numbers at their
    widest for this ``max_tokens``."""
    probe = dict(envelope, items=[], conflicts=[])
    probe["budget"] = dict(envelope["budget"], max_tokens=max_tokens, used_tokens=max_tokens)
    return estimate_tokens(dumps(probe))


def pack(ranked: list[tuple[dict, dict | None]], envelope: dict, max_tokens: int) -> PackResult:
    """``ranked``: (item, conflict entry or None) best first; ``envelope``: the
    ``data`` object without items/conflicts, its ``budget`` filled in."""
    envelope_tokens = envelope_cost(envelope, max_tokens)
    if envelope_tokens > max_tokens:
        needed = envelope_tokens
        while envelope_cost(envelope, needed) > needed:
            needed += 1
        raise BudgetTooSmall(needed)
    remaining = max_tokens - envelope_tokens
    per_kind: dict[str, int] = {}
    items, conflicts, skipped = [], [], []
    used = 0
    for item, conflict in ranked:
        if per_kind.get(item["kind"], 0) >= MAX_PER_KIND:
            skipped.append((item["claim_id"], "kind_full"))
            continue
        item_tokens = estimate_tokens(dumps(item))
        cost = item_tokens + 1 + (estimate_tokens(dumps(conflict)) + 1 if conflict else 0)
        if cost > remaining:
            skipped.append((item["claim_id"], "no_fit"))
            continue
        remaining -= cost
        used += item_tokens
        per_kind[item["kind"]] = per_kind.get(item["kind"], 0) + 1
        items.append(item)
        if conflict:
            conflicts.append(conflict)
    return PackResult(items, conflicts, used, envelope_tokens, skipped)


def assemble(envelope: dict, result: PackResult) -> dict:
    data = dict(envelope, items=result.items, conflicts=result.conflicts)
    data["budget"] = dict(envelope["budget"], used_tokens=result.used_tokens)
    return data
