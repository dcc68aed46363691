"""Packing: the ranked claims that fit the token budget, counted exactly.

Pure, no I/O. The budget is measured in real cl100k_base tokens
(``core.budget.tokens``) over the compact JSON of the whole ``data`` object
(``core.budget.items.dumps``). The walk is greedy over the ranked list: an item is taken
whole when its exact cost fits what is left and its kind has fewer than 3
items; otherwise it is skipped and the walk goes on.

Why the running cost is exact, not estimated
--------------------------------------------
cl100k_base first cuts text into pieces with a regular expression and
encodes each piece on its own, so the count of a text is the sum of the
counts of its pieces. Every fragment the packer prices is cut where the
pieces of the whole payload are cut, or where the piece that spans the cut
is always the same string:

- an item is its **prefix** plus its **suffix**, counted apart
  (``core.budget.items``): the prefix's count is stored at snapshot build,
  the suffix's is arithmetic.
- an item always opens with the piece ``{"`` and closes with ``}}``; in the
  payload those fuse with the list's punctuation into ``":[{"``,
  ``}},{"`` or ``}}],"``, whatever the items hold. A conflict opens with
  ``{"`` and closes with ``"]}``. The difference these fused pieces make
  (``Seams``) is a constant, computed here from the tokenizer.

So ``envelope + Σ item costs`` is the payload's real count, with two slacks:
the envelope is priced with ``used_tokens`` at its widest (what the budget
leaves after the empty envelope; ``envelope_tokens``), at most 1 token more
than the final number takes, and with its context id
at ``CONTEXT_ID_TOKENS``, at most 7 more than the id drawn. The caller still counts
the final payload with the tokenizer before sending it (``verify``) and
drops the last item if it were ever over, so the budget holds even if this
reasoning had a hole. ``used_tokens`` is the sum of the packed items' own
real counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from core.budget.items import dumps, item_suffix, number_tokens, suffix_tokens
from core.budget.tokens import count_tokens

MAX_PER_KIND = 3


@dataclass(frozen=True, slots=True)
class Seams:
    """What the fixed punctuation around items and conflicts costs in the
    payload, beyond the items' own counts (see the module docstring)."""
    item_first: int   # the first item turns '":[],"' into '":[{"' … '}}],"'
    item_next: int    # each further item adds '}},{"' in place of its own '{"' and the last '}}'
    item_edges: int   # count('{"') + count('}}'): an item's own opening and closing pieces
    conflict_first: int
    conflict_next: int
    conflict_edges: int

    @classmethod
    def measured(cls) -> "Seams":
        c = count_tokens
        return cls(item_first=c('":[{"') + c('}}],"') - c('":[],"'), item_next=c('}},{"'),
                   item_edges=c('{"') + c('}}'),
                   conflict_first=c('":[{"') + c('"]}],"') - c('":[],"'), conflict_next=c('"]},{"'),
                   conflict_edges=c('{"') + c('"]}'))


SEAMS = Seams.measured()

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
    """One ranked claim as the packer sees it: its kind, the exact count of
    its item's prefix, its score, and its conflict entry (serialized, with
    its count) when the item is disputed for this reader. Most candidates
    are skipped on kind and prefix alone, so the score is read (and its
    suffix serialized and counted) only for those actually priced."""
    claim_id: str
    kind: str
    prefix_tokens: int
    scored: Scored
    conflict: str | None = None
    conflict_tokens: int = 0

    @property
    def suffix(self) -> str:
        return item_suffix(self.scored.score, self.scored.components)


@dataclass
class PackResult:
    picked: list[int]            # indexes into the candidates, rank order
    item_tokens: list[int]       # the real count of each picked item's own JSON
    used_tokens: int
    envelope_tokens: int         # the real count of the empty envelope, used_tokens at its widest
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (claim_id, "kind_full" | "no_fit")

# Context ids are drawn until one costs 15 to 22 tokens (over the next
# years' timestamps about 93% of draws do; a draw costs ~8 us), and the
# envelope is priced as if its id cost exactly 22: the reserve, and with it
# the pack, never depends on which id was drawn. A cheaper id leaves at most
# 7 tokens unspent, which with the 1 of used_tokens' width is the 8-token
# seam allowance of docs/api.md §9.5.
CONTEXT_ID_TOKENS = 22
CONTEXT_ID_MIN_TOKENS = 15


def envelope_tokens(envelope: dict, max_tokens: int) -> int:
    """The real count of ``data`` with no items, its ``used_tokens`` at its
    widest for this ``max_tokens`` and its context id at its charged cost
    (``CONTEXT_ID_TOKENS``). Between ``":"`` and ``","`` the id is pieces of
    its own, so its count adds; so does a number's, one token per three digits.

    ``used_tokens`` can be no wider than what the budget leaves after the
    empty envelope, plus the first item's seam (the items' own counts exceed
    what they take of the budget by that much: ``Seams``). Pricing it at
    ``max_tokens`` instead made the reserve jump by two tokens at a budget of
    1000 (both numbers grow a token), so 999 could hold an envelope that
    1000 could not; priced so, the reserve grows by at most one token a step
    and every budget from the smallest that holds the envelope holds it."""
    probe = dict(envelope, items=[], conflicts=[])
    probe["budget"] = dict(envelope["budget"], max_tokens=max_tokens, used_tokens=0)
    empty = count_tokens(dumps(probe)) - count_tokens(envelope["context_id"]) + CONTEXT_ID_TOKENS
    widest = min(max_tokens, max(0, max_tokens - empty + SEAMS.item_edges - SEAMS.item_first))
    return empty - number_tokens(0) + number_tokens(widest)


def smallest_budget(envelope: dict, floor: int) -> int:
    """The smallest ``max_tokens`` (at least ``floor``) whose envelope fits it."""
    needed = max(floor, envelope_tokens(envelope, floor))
    while envelope_tokens(envelope, needed) > needed:
        needed += 1
    return needed


def pack(candidates: list[PackCandidate], envelope: dict, max_tokens: int) -> PackResult:
    """``candidates`` best first; ``envelope``: the ``data`` object without
    items/conflicts, its ``context_id``, ``query`` and ``budget`` filled in."""
    reserve = envelope_tokens(envelope, max_tokens)
    if reserve > max_tokens:
        raise BudgetTooSmall(smallest_budget(envelope, max_tokens))
    remaining = max_tokens - reserve
    per_kind: dict[str, int] = {}
    picked, counts, skipped = [], [], []
    conflicts = 0
    seams = SEAMS
    for index, c in enumerate(candidates):
        if per_kind.get(c.kind, 0) >= MAX_PER_KIND:
            skipped.append((c.claim_id, "kind_full"))
            continue
        join = seams.item_next if picked else seams.item_first
        # the prefix alone (and a suffix of at least its closing piece) bounds the cost from below
        if c.prefix_tokens + 1 - seams.item_edges + join > remaining:
            skipped.append((c.claim_id, "no_fit"))
            continue
        item_tokens = c.prefix_tokens + suffix_tokens(c.scored.score, c.scored.components)
        cost = item_tokens - seams.item_edges + join
        if c.conflict is not None:
            cost += c.conflict_tokens - seams.conflict_edges + (
                seams.conflict_next if conflicts else seams.conflict_first)
        if cost > remaining:
            skipped.append((c.claim_id, "no_fit"))
            continue
        remaining -= cost
        per_kind[c.kind] = per_kind.get(c.kind, 0) + 1
        conflicts += c.conflict is not None
        picked.append(index)
        counts.append(item_tokens)
    return PackResult(picked, counts, sum(counts), reserve, skipped)


def assemble(envelope: dict, items: list[dict], conflicts: list[dict], used_tokens: int) -> dict:
    data = dict(envelope, items=items, conflicts=conflicts)
    data["budget"] = dict(envelope["budget"], used_tokens=used_tokens)
    return data
