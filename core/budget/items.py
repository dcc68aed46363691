"""An item of a pack as it is sent, and its exact cost in cl100k_base tokens.

Pure, no I/O. cl100k_base first cuts text into pieces with a regular
expression and encodes each piece on its own, so the count of a text is the
sum of the counts of its pieces. An item is its **prefix** (every field, up
to the letters of ``"score``) plus its **suffix**
(``":<score>,"score_components":{…}}``): a run of letters followed by
punctuation is a piece boundary, so ``count(item) = count(prefix) +
count(suffix)``. The prefix is the same for every request on a generation,
so the snapshot build stores its count (``core.snapshot.projections``); the
suffix's count is arithmetic (below). ``core.compile.packing`` sums these.
"""

from __future__ import annotations

import json

from core.budget.tokens import count_tokens


def dumps(value) -> str:
    """The one serialization used for counting and for sending."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def item_fields(claim_id: str, claim: str, kind: str, confidence: float, trust: str, status: str,
                observer_id: str | None, valid_from: str, valid_to: str | None, evidence_ids: list[str]) -> dict:
    """An item's documented fields but its score, in the order they are sent."""
    return {"claim_id": claim_id, "claim": claim, "kind": kind, "confidence": confidence, "trust": trust,
            "status": status, "observer_id": observer_id, "valid_from": valid_from, "valid_to": valid_to,
            "evidence_ids": evidence_ids}


def item_prefix(fields: dict) -> str:
    """The item's JSON up to the letters of its ``"score`` key: ``fields``
    ends with evidence_ids. ``item_prefix + item_suffix == dumps(item)``."""
    return dumps(fields)[:-1] + ',"score'


def item_suffix(score: float, components: dict) -> str:
    # what dumps() gives for a float is its repr; formatted by hand on the hot path
    return ('":' + repr(score) + ',"score_components":{'
            + ",".join(f'"{k}":{v!r}' for k, v in components.items()) + "}}")


# -- the suffix, counted without encoding it on every request -----------------
#
# A suffix is a fixed skeleton of keys and punctuation with numbers in it.
# Every number is a float's repr (``0.744167``, ``1.0``, ``1e-05``): it
# starts and ends with a digit, and a digit beside punctuation is a piece
# boundary, so the suffix's count is the skeleton's punctuation and keys
# (counted with the tokenizer once per key order, kept) plus each number's.
# Inside a number cl100k_base cuts runs of digits into groups of at most
# three, and ".", "e", "-" and "+" are pieces of their own; every such group
# and sign is one token of cl100k_base's table (tests/test_packing.py checks
# all 1,110 digit strings), so a number's count is arithmetic.

_SKELETON_TOKENS: dict[tuple, int] = {}


def number_tokens(value: float) -> int:
    """``count_tokens(repr(value))`` for a non-negative float or int."""
    tokens = run = 0
    for ch in repr(value):
        if "0" <= ch <= "9":
            run += 1
        else:
            tokens += (run + 2) // 3 + 1  # the digits so far, then this sign
            run = 0
    return tokens + (run + 2) // 3


def suffix_tokens(score: float, components: dict) -> int:
    """``count_tokens(item_suffix(score, components))``, exactly."""
    keys = tuple(components)
    skeleton = _SKELETON_TOKENS.get(keys)
    if skeleton is None:
        # the skeleton with every number a "0" (one token), less those zeros
        skeleton = _SKELETON_TOKENS[keys] = (count_tokens(item_suffix(0, dict.fromkeys(keys, 0)))
                                             - (len(keys) + 1) * count_tokens("0"))
    return skeleton + number_tokens(score) + sum(number_tokens(v) for v in components.values())
