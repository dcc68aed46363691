"""Ranking: five components, weighted, times confidence (DESIGN §5 step 4).

Pure, no I/O. Each component is in [0, 1]:

| component | weight | rule |
| relevance | 0.45 | BM25 strength / best strength among the candidates (1 for the best);
|           |      | 0 when the lexical index never matched; with vectors, the larger of
|           |      | that and the separately normalized similarity |
| trust     | 0.20 | trust level / 3 (unverified 0 … policy_approved 3) |
| recency   | 0.15 | 0.5 ** (floor(age_days) / 90), age from creation to ``at`` |
| utility   | 0.10 | 0.5 below 3 feedback signals, else ((pos − neg) / total + 1) / 2 |
| conflict  | 0.10 | 1 when the claim is disputed |

score = round(confidence × Σ weight × component, 6); components are reported
rounded to 6 decimals. Ties break by relevance, then claim id, so a ranking
never depends on row order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WEIGHTS = {"relevance": 0.45, "trust": 0.20, "recency": 0.15, "utility": 0.10, "conflict": 0.10}
HALF_LIFE_DAYS = 90
MIN_FEEDBACK_SIGNALS = 3


@dataclass(slots=True)  # built ~200 times per compile: frozen init costs 4x
class RankInput:
    claim_id: str
    confidence: float
    trust_level: int
    created_s: float
    feedback_total: int
    feedback_positive: int
    feedback_negative: int
    disputed: bool
    bm25: float | None = None        # FTS5 bm25(): lower is better, None when unmatched
    similarity: float | None = None  # semantic similarity, None when not a semantic hit


@dataclass(slots=True)
class Ranked:
    claim_id: str
    score: float
    components: dict


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
    """Lexical strengths rescaled to the best one; semantic likewise; larger wins."""
    strengths = [(-c.bm25 if c.bm25 is not None else 0.0) for c in candidates]
    best = max(strengths, default=0.0)
    sims = [(c.similarity if c.similarity is not None else 0.0) for c in candidates]
    best_sim = max(sims, default=0.0)
    out = []
    for c, s, sim in zip(candidates, strengths, sims):
        lexical = (s / best if best > 0 else 1.0) if c.bm25 is not None else 0.0
        semantic = (sim / best_sim if best_sim > 0 else 0.0) if c.similarity is not None else 0.0
        out.append(max(lexical, semantic))
    return out


def rank(candidates: list[RankInput], at_s: float) -> list[Ranked]:
    w_rel, w_trust, w_rec, w_util, w_conf = (WEIGHTS[k] for k in
                                             ("relevance", "trust", "recency", "utility", "conflict"))
    ranked = []
    for c, rel in zip(candidates, relevances(candidates)):
        t = trust(c.trust_level)
        rec = recency(c.created_s, at_s)
        util = utility(c.feedback_total, c.feedback_positive, c.feedback_negative)
        conf = 1.0 if c.disputed else 0.0
        raw = w_rel * rel + w_trust * t + w_rec * rec + w_util * util + w_conf * conf
        ranked.append(Ranked(c.claim_id, round(raw * c.confidence, 6),
                             {"relevance": round(rel, 6), "trust": round(t, 6), "recency": round(rec, 6),
                              "utility": round(util, 6), "conflict": conf}))
    ranked.sort(key=lambda r: (-r.score, -r.components["relevance"], r.claim_id))
    return ranked
