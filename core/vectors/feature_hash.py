"""A deterministic test embedder: feature hashing, no dependencies, no model.

Word unigrams and bigrams and character trigrams of the lower-cased text are
hashed (blake2b) into ``dims`` signed buckets; the vector is L2-normalized.
Texts sharing words or word pieces are similar; nothing else is. It stands in
for a model in tests (paraphrase here means shared stems, not meaning).
"""

from __future__ import annotations

import hashlib
import math
import re

from core.vectors.calibration import Calibration
from core.vectors.embedder import Fingerprint, prepare

WORD = re.compile(r"\w+")
# not measured on real text (this is no model): low enough that shared word
# pieces count, so tests can make paraphrases out of shared stems
CALIBRATION = Calibration(floor=0.1, ceiling=0.6, knn=100, basis="tests only, not calibrated")


class HashEmbedder:
    def __init__(self, dims: int = 256, calibration: Calibration = CALIBRATION):
        if not 8 <= dims <= 4096:
            raise ValueError("hash embedder dimensions must be 8–4096")
        self.dims = dims
        self.fingerprint = Fingerprint("hash", "feature-hash-w12-c3", "1", dims, calibration)

    def _features(self, text: str) -> list[str]:
        words = WORD.findall(prepare(text).lower())
        feats = [f"w:{w}" for w in words] + [f"b:{a} {b}" for a, b in zip(words, words[1:])]
        for w in words:
            padded = f"#{w}#"
            feats += [f"c:{padded[i:i + 3]}" for i in range(len(padded) - 2)]
        return feats

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * self.dims
            for feat in self._features(text):
                h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "big")
                vec[h % self.dims] += 1.0 if (h >> 32) & 1 else -1.0
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            out.append([v / norm for v in vec])
        return out
