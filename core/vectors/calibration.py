"""How a model's cosine becomes semantic relevance (0–1), and which neighbours may enter.

A cosine means different things for different models: MiniLM puts unrelated
text around 0.1 and a good paraphrase around 0.6; another model's scale is
its own. Rescaling within a request's candidates (``sim / best_sim``) handed
the nearest neighbour of every task a 1.0, tying the best keyword match
however weak its cosine, and so made every quality figure worse (issue #17).
The calibration is absolute instead, measured once per model on a set of
real questions and answers (``bench.calibration_eval --sweep``,
docs/vectors.md):

- ``floor``: a neighbour below it never enters ranking (relevance 0);
- ``ceiling``: at or above it, semantic relevance is ``cap``;
- between them relevance rises linearly, so the midpoint scores ``cap / 2``;
- ``knn``: at most this many nearest neighbours are asked of the index;
- ``cap``: the most a neighbour can score, reached at the ceiling. At 1 a
  neighbour at the ceiling ties the best keyword match (whose lexical
  relevance is 1 by the ranking's rule), and the tie goes to the claim with
  the stronger other signal (``core.compile.ranking``: agreement): the
  measured choice for MiniLM (docs/vectors.md §3). Below 1 a neighbour only
  ever rises above weaker keyword matches: the safe shape for a model not
  yet measured (Bedrock's provisional calibration).

It is part of the embedder's ``Fingerprint`` but not of its ``key()``: the
vectors stay valid when the calibration changes, so nothing is re-embedded;
the snapshot records the calibration ``id`` it was built for and compile
refuses (answers lexical, ``vector: "error"``) a snapshot recorded with
another one, so no answer mixes two calibrations.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


def fields_id(fields: dict) -> str:
    """16 hex digits naming a set of settings (a fingerprint's key, a
    calibration's id): the sha256 of their canonical JSON."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Calibration:
    floor: float
    ceiling: float
    knn: int
    cap: float = 1.0
    basis: str = ""  # where the numbers come from (a set and a date), for the operator

    def __post_init__(self):
        if not -1.0 <= self.floor < self.ceiling <= 1.0:
            raise ValueError("calibration: need -1 <= floor < ceiling <= 1")
        if not 1 <= self.knn <= 4096:  # vec0's own limit on k
            raise ValueError("calibration: knn must be 1-4096")
        if not 0.0 < self.cap <= 1.0:
            raise ValueError("calibration: cap must be in (0, 1]")

    @property
    def midpoint(self) -> float:
        """The cosine halfway from floor to ceiling: it scores ``cap / 2``."""
        return (self.floor + self.ceiling) / 2

    def relevance(self, cosine: float) -> float:
        """``cosine`` mapped linearly from floor (0) to ceiling (``cap``), clipped."""
        if cosine <= self.floor:
            return 0.0
        if cosine >= self.ceiling:
            return self.cap
        return self.cap * (cosine - self.floor) / (self.ceiling - self.floor)

    def id(self, fingerprint_key: str) -> str:
        """Identifies this calibration of that vector space (``basis`` aside:
        it documents, it does not change a ranking)."""
        return fields_id({"key": fingerprint_key, "floor": self.floor, "ceiling": self.ceiling, "knn": self.knn,
                          "cap": self.cap})

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> "Calibration":
        """``TITEN_EMBED_CALIBRATION``: ``floor,ceiling,knn[,cap]``."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (3, 4):
            raise ValueError(f"TITEN_EMBED_CALIBRATION {text!r}: expected floor,ceiling,knn[,cap]")
        try:
            floor, ceiling, knn = float(parts[0]), float(parts[1]), int(parts[2])
            cap = float(parts[3]) if len(parts) == 4 else 1.0
        except ValueError:
            raise ValueError(f"TITEN_EMBED_CALIBRATION {text!r}: expected floor,ceiling,knn[,cap]") from None
        return cls(floor, ceiling, knn, cap, basis="TITEN_EMBED_CALIBRATION")
