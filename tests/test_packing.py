"""Packing to the budget (pure): a property test over random claims and budgets."""

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain import CLAIM_KINDS, INSTRUCTIONS, POLICY_SNAPSHOT
from core.packing import (MAX_PER_KIND, BudgetTooSmall, PackCandidate, Score, assemble, dumps, envelope_cost,
                          item_prefix, item_suffix, pack)
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


def candidates_of(ranked):
    return [PackCandidate(item["claim_id"], item["kind"],
                          estimate_tokens(item_prefix({k: v for k, v in item.items()
                                                       if k not in ("score", "score_components")})),
                          Score(item["score"], item["score_components"]), dumps(conflict) if conflict else None)
            for item, conflict in ranked]


@settings(max_examples=300, deadline=None)
@given(ranked=ranked_items(), max_tokens=st.integers(128, 32000), task=TEXT)
def test_the_serialized_pack_never_exceeds_the_budget_and_skips_only_for_cause(ranked, max_tokens, task):
    env = envelope(task, max_tokens)
    cands = candidates_of(ranked)
    try:
        result = pack(cands, env, max_tokens)
    except BudgetTooSmall as exc:
        assert envelope_cost(env, max_tokens) > max_tokens and exc.needed > max_tokens
        return
    items = [ranked[i][0] for i in result.picked]
    conflicts = [ranked[i][1] for i in result.picked if ranked[i][1]]
    data = assemble(env, items, conflicts, result.used_tokens)
    assert estimate_tokens(dumps(data)) <= max_tokens
    # whole items only, in rank order; an item serializes as prefix + suffix
    assert result.picked == sorted(result.picked)
    for item, _ in ranked:
        fields = {k: v for k, v in item.items() if k not in ("score", "score_components")}
        assert item_prefix(fields) + item_suffix(item["score"], item["score_components"]) == dumps(item)
    # the charged cost never undercounts the item
    for i, charged in zip(result.picked, result.item_tokens):
        assert charged >= estimate_tokens(dumps(ranked[i][0]))
    kinds = [i["kind"] for i in items]
    assert all(kinds.count(k) <= MAX_PER_KIND for k in set(kinds))
    # skipped only when it would not fit or its kind was full, at that moment
    remaining = max_tokens - result.envelope_tokens
    counts: dict = {}
    for index, c in enumerate(cands):
        cost = c.prefix_tokens + estimate_tokens(c.suffix) + 1 + (estimate_tokens(c.conflict) + 1 if c.conflict else 0)
        if index in result.picked:
            remaining -= cost
            counts[c.kind] = counts.get(c.kind, 0) + 1
        else:
            assert counts.get(c.kind, 0) >= MAX_PER_KIND or cost > remaining
    assert result.used_tokens == sum(result.item_tokens)


def _plain(claim_id, claim, kind="procedural"):
    return ({"claim_id": claim_id, "claim": claim, "kind": kind, "evidence_ids": [], "score": 0.5,
             "score_components": {"relevance": 1.0}}, None)


def test_an_empty_ranking_packs_nothing_and_uses_zero_tokens():
    result = pack([], envelope(), 1200)
    assert result.picked == [] and result.used_tokens == 0


def test_a_fourth_item_of_a_kind_is_skipped_even_when_it_fits():
    result = pack(candidates_of([_plain(f"claim_{i}", "x") for i in range(4)]), envelope(), 32000)
    assert result.picked == [0, 1, 2]
    assert result.skipped == [("claim_3", "kind_full")]


def test_a_big_item_is_skipped_and_a_smaller_later_one_still_packed():
    ranked = [_plain("claim_big", "word " * 400), _plain("claim_small", "short")]
    result = pack(candidates_of(ranked), envelope(), 300)
    assert result.picked == [1]
    assert result.skipped == [("claim_big", "no_fit")]
