"""The five score components and their combination, as tables (pure)."""

import random

import pytest

from core.compile.ranking import ClaimSignals, RankInput, rank, recency, relevances, trust, utility

DAY = 86400.0


@pytest.mark.parametrize("age_days,expected", [(0, 1.0), (0.9, 1.0), (90, 0.5), (180, 0.25), (45, 0.5 ** 0.5)])
def test_recency_halves_every_ninety_whole_days(age_days, expected):
    assert recency(created_s=0.0, at_s=age_days * DAY) == pytest.approx(expected)


def test_recency_of_a_claim_created_after_at_is_one():
    assert recency(created_s=10 * DAY, at_s=0.0) == 1.0


@pytest.mark.parametrize("level,expected", [(0, 0.0), (1, 1 / 3), (2, 2 / 3), (3, 1.0)])
def test_trust_is_level_over_three(level, expected):
    assert trust(level) == pytest.approx(expected)


@pytest.mark.parametrize("total,positive,negative,expected", [
    (0, 0, 0, 0.5), (2, 2, 0, 0.5), (2, 0, 2, 0.5),
    (3, 3, 0, 1.0), (3, 0, 3, 0.0), (4, 3, 1, 0.75), (4, 2, 2, 0.5)])
def test_utility_is_neutral_below_three_signals_and_moves_after(total, positive, negative, expected):
    assert utility(total, positive, negative) == pytest.approx(expected)


def _input(claim_id, bm25=-2.0, *, confidence=1.0, trust_level=0, created_s=0.0, feedback=(0, 0, 0),
           disputed=False, similarity=None):
    signals = ClaimSignals.of(claim_id, confidence, trust_level, created_s, *feedback)
    return RankInput(signals, disputed, bm25=bm25, similarity=similarity)


def test_relevance_is_bm25_strength_over_the_best_in_the_candidate_set():
    assert relevances([_input("a", -4.0), _input("b", -1.0), _input("c", None)]) == [1.0, 0.25, 0.0]


def test_relevance_prefers_the_larger_of_lexical_and_semantic():
    cands = [_input("a", -4.0, similarity=0.2), _input("b", -1.0, similarity=0.8), _input("c", None, similarity=0.4)]
    assert relevances(cands) == [1.0, 0.8, 0.4]  # semantic relevance as calibrated, never rescaled


@pytest.mark.parametrize("disputed,expected", [(False, 0.0), (True, 1.0)])
def test_conflict_is_one_for_a_disputed_claim(disputed, expected):
    (r,) = rank([_input("a", disputed=disputed)], at_s=0.0)
    assert r.components["conflict"] == expected


def test_worked_example_score_and_its_disputed_twin():
    claim = _input("claim_b", -3.0, confidence=0.95, trust_level=2)
    twin = _input("claim_a", -3.0, confidence=0.9, trust_level=2, disputed=True)
    first, second = rank([claim, twin], at_s=0.0)
    assert (first.claim_id, first.score) == ("claim_a", 0.795)
    assert (second.claim_id, second.score) == ("claim_b", 0.744167)
    assert second.components == {"relevance": 1.0, "trust": 0.666667, "recency": 1.0, "utility": 0.5,
                                 "conflict": 0.0}


def test_ties_break_by_claim_id_whatever_the_input_order():
    a, b = _input("claim_1"), _input("claim_2")
    assert [r.claim_id for r in rank([b, a], 0.0)] == [r.claim_id for r in rank([a, b], 0.0)] == ["claim_1", "claim_2"]


def test_equal_scores_break_by_reported_relevance_before_claim_id():
    # 0.65 x 0.625 and 0.625 x 0.65: the same score from different components
    strong = _input("claim_z", -4.0, confidence=0.625)
    weak = _input("claim_a", -2.0, confidence=0.65, trust_level=3)
    first, second = rank([weak, strong], at_s=0.0)
    assert first.score == second.score == 0.40625
    assert (first.claim_id, first.components["relevance"]) == ("claim_z", 1.0)
    assert (second.claim_id, second.components["relevance"]) == ("claim_a", 0.5)


@pytest.mark.parametrize("keyword_match_similarity,neighbour_bm25,first", [
    (0.9, -1.0, "claim_keyword"),    # the keyword match is also near: it agrees more (0.9 > 0.25)
    (None, -1.0, "claim_neighbour"),  # the keyword match is no neighbour; the neighbour matched a word (0.25)
    (0.1, -2.0, "claim_neighbour"),  # 0.5 lexical agreement beats 0.1 semantic
    (0.6, None, "claim_keyword"),    # the neighbour has no keyword at all: agreement 0
])
def test_a_tie_at_full_relevance_goes_to_the_claim_both_indexes_found(keyword_match_similarity, neighbour_bm25,
                                                                       first):
    # the best keyword match (lexical 1) and a neighbour at its calibrated
    # ceiling (semantic 1) score the same; claim ids would favour claim_keyword
    keyword = _input("claim_keyword", -4.0, similarity=keyword_match_similarity)
    neighbour = _input("claim_neighbour", neighbour_bm25, similarity=1.0)
    ranked = rank([neighbour, keyword], at_s=0.0)
    assert ranked[0].score == ranked[1].score
    assert ranked[0].components["relevance"] == ranked[1].components["relevance"] == 1.0
    assert ranked[0].claim_id == first


def test_agreement_never_outranks_a_higher_score():
    # the neighbour agrees more but scores less: the score decides, not agreement
    keyword = _input("claim_z", -4.0, similarity=None)
    neighbour = _input("claim_a", -3.0, similarity=0.99)
    assert [r.claim_id for r in rank([neighbour, keyword], at_s=0.0)] == ["claim_z", "claim_a"]


def test_without_vectors_ties_go_from_relevance_to_claim_id():
    # no similarity anywhere: agreement is 0 for every candidate
    ranked = rank([_input("claim_2", -3.0), _input("claim_1", -3.0), _input("claim_0", -1.0)], at_s=0.0)
    assert [r.claim_id for r in ranked] == ["claim_1", "claim_2", "claim_0"]
    assert {r.agreement for r in ranked} == {0.0}


def test_signals_that_no_request_changes_are_the_documented_components():
    signals = ClaimSignals.of("claim_1", 0.9, trust_level=2, created_s=0.0, feedback_total=4, feedback_positive=3,
                              feedback_negative=1)
    assert (signals.trust, signals.utility) == (trust(2), utility(4, 3, 1))
    (r,) = rank([RankInput(signals, False, bm25=-1.0)], at_s=0.0)
    assert r.components == {"relevance": 1.0, "trust": 0.666667, "recency": 1.0, "utility": 0.75, "conflict": 0.0}
    assert r.score == round(0.9 * (0.45 + 0.2 * 2 / 3 + 0.15 + 0.1 * 0.75), 6)


def test_order_is_by_reported_score_then_reported_relevance_then_claim_id_even_when_crowded():
    """Scores are compared as reported (rounded to 6 decimals): candidates
    drawn from a few values, so exact and near ties abound, come out exactly
    in the order of the documented key, whatever the input order."""
    rng = random.Random(5)
    for _ in range(200):
        cands = [_input(f"claim_{i:03d}", rng.choice([-1.0, -2.0, -2.0000001, -3.0, None]),
                        confidence=rng.choice([0.5, 0.9, 0.9000001, 1.0]), trust_level=rng.randrange(4),
                        created_s=rng.choice([0.0, -DAY * 90, -DAY * 90.5]), disputed=rng.random() < 0.2)
                 for i in range(rng.randint(0, 40))]
        rng.shuffle(cands)
        ranked = rank(cands, at_s=0.0)
        keys = [(-r.score, -r.components["relevance"], r.claim_id) for r in ranked]
        assert keys == sorted(keys)
        assert sorted(r.claim_id for r in ranked) == sorted(c.signals.claim_id for c in cands)
