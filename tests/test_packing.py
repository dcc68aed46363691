"""Packing to the budget (pure): a property test over random claims and budgets."""

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain import CLAIM_KINDS, INSTRUCTIONS, POLICY_SNAPSHOT
from core.packing import MAX_PER_KIND, BudgetTooSmall, assemble, dumps, envelope_cost, pack
from core.packing import payload_tokens as estimate_tokens

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=400)


def envelope(task="deploy smoke", max_tokens=1200):
    return {"context_id": "ctx_" + "a" * 32, "query": {"task": task},
            "scope": {"subject_id": "user_rama", "project_id": None},
            "budget": {"max_tokens": max_tokens, "used_tokens": 0},
            "items": [], "conflicts": [], "policy_snapshot": POLICY_SNAPSHOT, "instructions": INSTRUCTIONS}


@st.composite
def ranked_items(draw):
    n = draw(st.integers(0, 25))
    out = []
    for i in range(n):
        claim_id = f"claim_{i:032x}"
        evidence = [f"obs_{draw(st.integers(0, 2**128 - 1)):032x}" for _ in range(draw(st.integers(1, 4)))]
        item = {"claim_id": claim_id, "claim": draw(TEXT), "kind": draw(st.sampled_from(CLAIM_KINDS)),
                "confidence": draw(st.floats(0, 1)), "trust": "asserted", "status": "active",
                "observer_id": None, "valid_from": "2026-12-01T00:00:00.000000Z", "valid_to": None,
                "evidence_ids": evidence, "score": round(draw(st.floats(0, 1)), 6),
                "score_components": {"relevance": 1.0, "trust": 0.333333, "recency": 1.0, "utility": 0.5,
                                     "conflict": 0.0}}
        conflict = None
        if draw(st.booleans()):
            item["status"] = "disputed"
            conflict = {"claim_id": claim_id, "reason": "contradicting_evidence", "evidence_ids": evidence}
        out.append((item, conflict))
    return out


@settings(max_examples=300, deadline=None)
@given(ranked=ranked_items(), max_tokens=st.integers(128, 32000), task=TEXT)
def test_the_serialized_pack_never_exceeds_the_budget_and_skips_only_for_cause(ranked, max_tokens, task):
    env = envelope(task, max_tokens)
    try:
        result = pack(ranked, env, max_tokens)
    except BudgetTooSmall as exc:
        assert envelope_cost(env, max_tokens) > max_tokens and exc.needed > max_tokens
        return
    data = assemble(env, result)
    assert estimate_tokens(dumps(data)) <= max_tokens
    packed_ids = [i["claim_id"] for i in result.items]
    by_id = {item["claim_id"]: item for item, _ in ranked}
    # no item is truncated or altered, and rank order is kept
    assert [by_id[c] for c in packed_ids] == result.items
    assert packed_ids == [item["claim_id"] for item, _ in ranked if item["claim_id"] in set(packed_ids)]
    # at most 3 per kind
    kinds = [i["kind"] for i in result.items]
    assert all(kinds.count(k) <= MAX_PER_KIND for k in set(kinds))
    # skipped only when it would not fit or its kind was full, at that moment
    remaining = max_tokens - result.envelope_tokens
    counts: dict = {}
    for item, conflict in ranked:
        cost = estimate_tokens(dumps(item)) + 1 + (estimate_tokens(dumps(conflict)) + 1 if conflict else 0)
        if item["claim_id"] in packed_ids:
            remaining -= cost
            counts[item["kind"]] = counts.get(item["kind"], 0) + 1
        else:
            assert counts.get(item["kind"], 0) >= MAX_PER_KIND or cost > remaining
    assert result.used_tokens == sum(estimate_tokens(dumps(i)) for i in result.items)
    assert [c["claim_id"] for c in result.conflicts] == [i["claim_id"] for i in result.items if i["status"] == "disputed"]


def test_an_empty_ranking_packs_nothing_and_uses_zero_tokens():
    result = pack([], envelope(), 1200)
    assert result.items == [] and result.used_tokens == 0


def test_a_fourth_item_of_a_kind_is_skipped_even_when_it_fits():
    items = [({"claim_id": f"claim_{i}", "claim": "x", "kind": "procedural"}, None) for i in range(4)]
    result = pack(items, envelope(), 32000)
    assert [i["claim_id"] for i in result.items] == ["claim_0", "claim_1", "claim_2"]
    assert result.skipped == [("claim_3", "kind_full")]


def test_a_big_item_is_skipped_and_a_smaller_later_one_still_packed():
    items = [({"claim_id": "claim_big", "claim": "word " * 400, "kind": "procedural"}, None),
             ({"claim_id": "claim_small", "claim": "short", "kind": "procedural"}, None)]
    result = pack(items, envelope(), 300)
    assert [i["claim_id"] for i in result.items] == ["claim_small"]
    assert result.skipped == [("claim_big", "no_fit")]
