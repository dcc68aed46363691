"""The embedder interface: ``embed(texts) -> list[list[float]]`` plus a fingerprint.

Chosen by ``TITEN_EMBEDDER`` (``core.config``); unset means no vector
capability, and then neither this module nor any provider is imported.

| spec | provider | module |
| bedrock:amazon.titan-embed-text-v2:0[:dims] | Amazon Bedrock (boto3 bedrock-runtime) | core.embed_bedrock |
| local:all-MiniLM-L6-v2 | int8 ONNX MiniLM on onnxruntime, no network (extra ``vector``) | core.embed_local |
| hash:<dims> | deterministic feature hashing, no dependencies (tests) | core.embed_hash |

A provider is imported only when its spec is chosen. Every provider embeds
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


def from_spec(spec: str) -> Embedder:
    """The embedder a ``TITEN_EMBEDDER`` value names (ValueError if none)."""
    provider, _, rest = spec.partition(":")
    if provider == "bedrock":
        from core.embed_bedrock import BedrockTitanEmbedder
        return BedrockTitanEmbedder.from_spec(rest)
    if provider == "local":
        from core.embed_local import LocalOnnxEmbedder
        return LocalOnnxEmbedder.from_spec(rest)
    if provider == "hash":
        from core.embed_hash import HashEmbedder
        return HashEmbedder(int(rest or 256))
    raise ValueError(f"TITEN_EMBEDDER {spec!r}: expected bedrock:<model>[:dims], local:<model> or hash:<dims>")
