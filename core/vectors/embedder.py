"""The embedder interface: ``embed(texts) -> list[list[float]]`` plus a fingerprint.

Every provider (``core.vectors.from_spec`` names them) embeds
``prepare(text)`` and returns L2-normalized vectors compared by cosine; the
fingerprint says which vectors these are, so vectors from another model,
revision, size or preprocessing are never compared with them. The
fingerprint also carries the model's ``Calibration`` (how its cosine becomes
relevance, ``core.vectors.calibration``), outside ``key()``: recalibrating
re-embeds nothing, and the snapshot records the calibration separately.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Protocol

from core.vectors.calibration import Calibration, fields_id

PREPROCESSING = "ws1"  # whitespace runs collapsed to one space, ends stripped


class EmbedderError(Exception):
    """The embedder failed, timed out or answered something unusable."""


def prepare(text: str) -> str:
    return " ".join(text.split())


def text_digest(text: str) -> bytes:
    """The embedding cache's key of a text: the sha256 of what is embedded."""
    return hashlib.sha256(prepare(text).encode()).digest()


def text_sha256(text: str) -> str:
    return text_digest(text).hex()


@dataclass(frozen=True)
class Fingerprint:
    provider: str
    model: str
    revision: str
    dimensions: int
    calibration: Calibration
    metric: str = "cosine"
    preprocessing: str = PREPROCESSING

    def key(self) -> str:
        """Identifies the vector space: everything but the calibration, which
        applies at query time only and so never forces a re-embedding."""
        fields = {k: v for k, v in asdict(self).items() if k != "calibration"}
        return fields_id(fields)

    def calibration_id(self) -> str:
        """What a snapshot records and compile checks besides ``key()``."""
        return self.calibration.id(self.key())

    def with_calibration(self, calibration: Calibration) -> "Fingerprint":
        return replace(self, calibration=calibration)

    def as_dict(self) -> dict:
        return {**asdict(self), "key": self.key(), "calibration_id": self.calibration_id()}


class Embedder(Protocol):
    fingerprint: Fingerprint

    def embed(self, texts: list[str]) -> list[list[float]]: ...

