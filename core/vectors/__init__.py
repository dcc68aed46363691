"""The vector path: embedders, the ``vec0`` index in a snapshot, and its KNN.

Chosen by ``TITEN_EMBEDDER`` (``core.config``); unset means no vector
capability, and then nothing under this package is imported (a subprocess
test checks it). A provider module is imported only when its spec is chosen:

| spec | provider | module |
| bedrock:amazon.titan-embed-text-v2:0[:dims] | Amazon Bedrock (boto3 bedrock-runtime) | core.vectors.bedrock |
| local:all-MiniLM-L6-v2 | int8 ONNX MiniLM on onnxruntime, no network (extra ``vector``) | core.vectors.minilm |
| hash:<dims> | deterministic feature hashing, no dependencies (tests) | core.vectors.feature_hash |

``embedder`` is the interface every provider implements (and the
fingerprint), ``calibration`` how a model's cosine becomes relevance,
``index`` builds and maintains the snapshot's ``claims_vec`` table,
``search`` is compile's semantic candidate step and ``signs`` its first,
sign-bit pass.
"""

from __future__ import annotations


def from_spec(spec: str):
    """The embedder a ``TITEN_EMBEDDER`` value names (ValueError if none)."""
    provider, _, rest = spec.partition(":")
    if provider == "bedrock":
        from core.vectors.bedrock import BedrockTitanEmbedder
        return BedrockTitanEmbedder.from_spec(rest)
    if provider == "local":
        from core.vectors.minilm import LocalOnnxEmbedder
        return LocalOnnxEmbedder.from_spec(rest)
    if provider == "hash":
        from core.vectors.feature_hash import HashEmbedder
        return HashEmbedder(int(rest or 256))
    raise ValueError(f"TITEN_EMBEDDER {spec!r}: expected bedrock:<model>[:dims], local:<model> or hash:<dims>")
