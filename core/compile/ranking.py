"""Ranking: five components, weighted, times confidence (docs/api.md §9.4).

Pure, no I/O. Each component is in [0, 1]:

| component | weight | rule |
| relevance | 0.45 | BM25 strength / best strength among the candidates (1 for the best);
|           |      | 0 when the lexical index never matched; with vectors, the larger of
|           |      | that and the semantic relevance, normalized separately and
|           |      | absolutely (the embedder's calibration: 0 at its floor, 1 at its
|           |      | ceiling, never rescaled to the best neighbour) |
| trust     | 0.20 | trust level / 3 (unverified 0 … policy_approved 3) |
| recency   | 0.15 | 0.5 ** (floor(age_days) / 90), age from creation to ``at`` |
| utility   | 0.10 | 0.5 below 3 feedback signals, else ((pos − neg) / total + 1) / 2 |
| conflict  | 0.10 | 1 when the claim is disputed |

score = round(confidence × Σ weight × component, 6); components are reported
rounded to 6 decimals. Ties break by relevance, then by *agreement* — the
smaller of a candidate's lexical and semantic relevance, so that of two
claims scoring the same the one both indexes found comes first — then by
claim id, so a ranking never depends on row order. Without vectors every
agreement is 0 and ties go from relevance straight to claim id. (The
agreement tie-break is what lets a semantic neighbour at its calibrated
ceiling tie the best keyword match without turning the tie into a coin toss:
measured in docs/vectors.md §3.)

A claim's trust and utility (and confidence) are the same for every request
on a snapshot generation: ``ClaimSignals`` holds them, computed once, so the
caller can keep them per generation; a ``RankInput`` adds what the request
decides (dispute as this reader sees it, BM25, similarity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter

WEIGHTS = {"relevance": 0.45, "trust": 0.20, "recency": 0.15, "utility": 0.10, "conflict": 0.10}
HALF_LIFE_DAYS = 90
MIN_FEEDBACK_SIGNALS = 3


_W_REL, _W_TRUST, _W_REC, _W_UTIL, _W_CONF = (WEIGHTS[k] for k in ("relevance", "trust", "recency", "utility",
                                                                     "conflict"))


@dataclass(slots=True)  # shared per generation, never mutated; not frozen: frozen init costs 4x
class ClaimSignals:
    """The parts of a claim's score no request changes. ``weighted_trust``
    and ``weighted_utility`` are the products the score sums, computed once
    (the same floats the sum would compute: the score is bit-identical).
    A caller may subclass it to keep its own per-claim facts alongside:
    ``Ranked.signals`` hands the same object back."""
    claim_id: str
    confidence: float
    created_s: float
    trust: float
    utility: float
    weighted_trust: float
    weighted_utility: float

    @classmethod
    def of(cls, claim_id: str, confidence: float, trust_level: int, created_s: float, feedback_total: int,
           feedback_positive: int, feedback_negative: int, *more):
        """``more``: a subclass's own fields, in order."""
        t = trust(trust_level)
        u = utility(feedback_total, feedback_positive, feedback_negative)
        return cls(claim_id, confidence, created_s, t, u, _W_TRUST * t, _W_UTIL * u, *more)


@dataclass(slots=True)  # built ~200 times per compile: frozen init costs 4x
class RankInput:
    signals: ClaimSignals
    disputed: bool                   # as this reader sees it
    bm25: float | None = None        # FTS5 bm25(): lower is better, None when unmatched
    # semantic relevance in [0, 1], already calibrated (core.vectors.calibration),
    # None when not a semantic hit
    similarity: float | None = None


class Ranked:
    """One ranked claim: its score and the unrounded components behind it.

    What is reported is rounded to 6 decimals: ``score`` and ``components``
    are rounded on first use. Of ~200 ranked candidates the packer prices
    about a dozen and sends a handful, and round() on every score and
    component was a fifth of compile."""
    __slots__ = ("signals", "weighted", "relevance", "agreement", "recency", "conflict", "_score", "_components")

    def __init__(self, signals: ClaimSignals, weighted: float, relevance: float, recency: float, conflict: float,
                 agreement: float = 0.0):
        self.signals = signals
        self.weighted = weighted  # confidence × Σ weight × component, unrounded
        self.relevance = relevance
        self.agreement = agreement  # min(lexical, semantic relevance): a tie-break only, never scored
        self.recency = recency
        self.conflict = conflict
        self._score = None
        self._components = None

    @property
    def claim_id(self) -> str:
        return self.signals.claim_id

    @property
    def score(self) -> float:
        if self._score is None:
            self._score = round(self.weighted, 6)
        return self._score

    @property
    def components(self) -> dict:
        """The components as reported: rounded to 6 decimals, in weight order."""
        if self._components is None:
            s = self.signals
            self._components = {"relevance": round(self.relevance, 6), "trust": round(s.trust, 6),
                                "recency": round(self.recency, 6), "utility": round(s.utility, 6),
                                "conflict": self.conflict}
        return self._components

    def __repr__(self) -> str:
        return f"Ranked({self.claim_id!r}, {self.score!r})"


def recency(created_s: float, at_s: float) -> float:
    age_days = max(0, math.floor((at_s - created_s) / 86400))
    return 0.5 ** (age_days / HALF_LIFE_DAYS)


def utility(total: int, positive: int, negative: int) -> float:
    if total < MIN_FEEDBACK_SIGNALS:
        return 0.5
    return ((positive - negative) / total + 1) / 2


def trust(level: int) -> float:
    return level / 3


def relevances(candidates: list[RankInput]) -> list[float]:
    """Lexical strengths rescaled to the best one; the semantic relevance as
    calibrated (absolute: a weak nearest neighbour stays weak); larger wins."""
    return [relevance for relevance, _ in relevance_pairs(candidates)]


def relevance_pairs(candidates: list[RankInput]) -> list[tuple[float, float]]:
    """Per candidate (relevance, agreement): relevance is the larger of the
    lexical and the semantic part, agreement the smaller (the tie-break)."""
    strengths = [(-c.bm25 if c.bm25 is not None else 0.0) for c in candidates]
    best = max(strengths, default=0.0)
    if not any(c.similarity is not None for c in candidates):
        # lexical only (no vector capability): the semantic side is 0 for every
        # candidate, so max(lexical, 0.0) is the lexical part floored at 0, and
        # min(lexical, 0.0) — the agreement — is 0
        if best > 0:
            return [((s / best if s >= 0 else 0.0) if c.bm25 is not None else 0.0, 0.0)
                    for c, s in zip(candidates, strengths)]
        return [(1.0 if c.bm25 is not None else 0.0, 0.0) for c in candidates]
    out = []
    for c, s in zip(candidates, strengths):
        lexical = (s / best if best > 0 else 1.0) if c.bm25 is not None else 0.0
        lexical = max(lexical, 0.0)
        semantic = min(max(c.similarity, 0.0), 1.0) if c.similarity is not None else 0.0
        out.append((lexical, semantic) if lexical >= semantic else (semantic, lexical))
    return out


def rank(candidates: list[RankInput], at_s: float) -> list[Ranked]:
    """The candidates, best first. Per candidate only the float score is
    computed, summed in the documented order (relevance, trust, recency,
    utility, conflict); the rounded components wait until asked for."""
    by_day: dict[int, float] = {}  # recency memo: many candidates share an age in whole days
    remembered = by_day.get
    floor = math.floor
    ranked = []
    append = ranked.append
    for c, (rel, agreement) in zip(candidates, relevance_pairs(candidates)):
        s = c.signals
        days = floor((at_s - s.created_s) / 86400)  # recency()'s own day count: one key, one value
        rec = remembered(days)
        if rec is None:
            rec = by_day[days] = recency(s.created_s, at_s)
        conf = 1.0 if c.disputed else 0.0
        raw = _W_REL * rel + s.weighted_trust + _W_REC * rec + s.weighted_utility + _W_CONF * conf
        append(Ranked(s, raw * s.confidence, rel, rec, conf, agreement))
    return in_rank_order(ranked)


# Two values more than this apart never round to the same 6 decimals (a
# rounding bucket is 1e-6 wide; the margin covers float error many times over).
_DISTINCT = 2e-6


def in_rank_order(ranked: list[Ranked]) -> list[Ranked]:
    """Sorted by reported (rounded) score, ties by reported relevance, then
    agreement (rounded alike), then claim id — so a ranking never depends on
    row order.

    Rounding is monotone, so sorting by the unrounded score already orders
    any two candidates whose rounded scores differ. Only a cluster of
    neighbours closer than ``_DISTINCT`` can hold equal rounded scores: each
    such cluster alone is re-sorted by the full key. The rest are never
    rounded here at all."""
    ranked.sort(key=_weighted, reverse=True)
    i, n = 0, len(ranked)
    while i < n:
        j = i + 1
        while j < n and ranked[j - 1].weighted - ranked[j].weighted <= _DISTINCT:
            j += 1
        if j - i > 1:
            ranked[i:j] = sorted(ranked[i:j], key=_full_key)
        i = j
    return ranked


_weighted = attrgetter("weighted")


def _full_key(r: Ranked) -> tuple[float, float, float, str]:
    return -r.score, -round(r.relevance, 6), -round(r.agreement, 6), r.claim_id
