"""The embedder interface: ``embed(texts) -> list[list[float]]`` plus a fingerprint.

Every provider (``core.vectors.from_spec`` names them) embeds
``prepare(text)`` and returns L2-normalized vectors compared by cosine; the
fingerprint says which vectors these are, so vectors from another model,
revision, size or preprocessing are never compared with them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Protocol

PREPROCESSING = "ws1"  # whitespace runs collapsed to one space, ends stripped


class EmbedderError(Exception):
    """The embedder failed, timed out or answered something unusable."""


def prepare(text: str) -> str:
    return " ".join(text.split())


def text_sha256(text: str) -> str:
    return hashlib.sha256(prepare(text).encode()).hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    provider: str
    model: str
    revision: str
    dimensions: int
    cosine_floor: float
    metric: str = "cosine"
    preprocessing: str = PREPROCESSING

    def key(self) -> str:
        """Identifies the vector space: everything but the floor, which only
        filters hits at query time and so never forces a re-embedding."""
        fields = {k: v for k, v in asdict(self).items() if k != "cosine_floor"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        return {**asdict(self), "key": self.key()}


class Embedder(Protocol):
    fingerprint: Fingerprint

    def embed(self, texts: list[str]) -> list[list[float]]: ...

