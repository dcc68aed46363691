"""What every bench shares: the reference workload and its corpora, a built
store per corpus size, the statistics and tables they print, the results
files they merge into, and ``titen serve`` as a subprocess.

Every bench runs from the repository root as a module, with the project's
virtualenv (``make setup``)::

    .venv/bin/python -m bench.<name> ...

and imports only this module from ``bench``: no bench imports another, and
nothing edits ``sys.path`` (``-m`` puts the working directory, the root,
first on it). This module's own command line::

    .venv/bin/python -m bench.common verify                  # generate(n) against the shipped corpus files
    .venv/bin/python -m bench.common build --sizes 1000,10000  # build (or reuse) bench/.data/n<n>
    .venv/bin/python -m bench.common generate 1000           # the corpus as JSONL on stdout

The workload (``bench/reference/workload-seed20260817.json``, a copy of the
shared reference workload) holds the subject, the 20 warm-up and 200 measured
tasks, the vocabulary and the corpus ``generator`` rule:

    statement(i) uses random.Random(f'{seed}:claim:{i}'), 8-30 words,
    30% function words, Zipf(1) content words; kind=CLAIM_KINDS[randrange(6)],
    confidence=round(0.6+0.4*random(),3)

``generate(n)`` implements it; ``verify`` checks it byte for byte against the
shipped ``corpus-seed20260817-n{1000,10000,50000}`` files (it matches all
three exactly). The parts the rule text leaves open, fixed by that match:

- draw order per claim: word count, then per word, then kind, then confidence;
- word count ``rng.randint(8, 30)`` (both ends inclusive);
- per word ``rng.random() < 0.3`` picks ``rng.choice(function_words)``, else a
  content word ``rng.choices(vocab, cum_weights=...)`` with weight
  ``1 / rank`` (rank 1 = ``vocab[0]``), duplicates allowed;
- statement = words joined by one space, first character upper-cased, ``.``
  appended;
- a file line is ``json.dumps({"i", "statement", "kind", "confidence"})``
  (default separators) plus ``\\n``.

Because every claim has its own seed, the corpus of size n is the first n
lines of any larger one.

``build_org(data_dir, n)`` loads a corpus through the same path as ``titen
import`` (``core.writes.importer.import_file``) into a local store and
publishes a snapshot (``core.snapshot.build.SnapshotBuilder``); the built
store is kept under ``bench/.data/n<n>/`` and reused on later runs (its
snapshot rebuilt from scratch when the snapshot code — ``core/snapshot/``
and every ``core`` module it imports — has changed).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import http.client
import itertools
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from core.storage.local import LocalStore

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

WORKLOAD_PATH = Path(os.environ.get("TITEN_BENCH_WORKLOAD")
                     or BENCH_DIR / "reference" / "workload-seed20260817.json")
# The shipped reference corpora, used only by ``verify`` (the benches generate).
REFERENCE_DIR = Path(os.environ.get("TITEN_BENCH_REFERENCE_DIR") or "/work/shared/bench/reference-workload")
DATA_DIR = Path(os.environ.get("TITEN_BENCH_DATA_DIR") or BENCH_DIR / ".data")
RESULTS_DIR = BENCH_DIR / "results"

ORG = "bench"
IMPORT_PRINCIPAL = "importer"  # what ``titen import`` records as the writer by default
BUILD_RECORD = ".bench-build.json"  # a dot name: the local store never lists it as a key
BUILD_FORMAT = 1

# The ``titen`` command of the interpreter running the bench (its virtualenv's
# console script), else the same CLI through ``-m``.
_TITEN_SCRIPT = Path(sys.executable).parent / "titen"
TITEN = [str(_TITEN_SCRIPT)] if _TITEN_SCRIPT.exists() else [sys.executable, "-m", "core.cli"]

# The TypeScript reference server (titen 0.8.7, Bun + SQLite FTS5), over HTTP
# on loopback, concurrency 1, same workload (shared bench README).
REFERENCE = {
    1000: {"p50_ms": 8.6, "p95_ms": 13.0, "p99_ms": 17.6, "mean_items": 5.1, "mean_candidates": 197},
    10000: {"p50_ms": 41.3, "p95_ms": 62.6, "p99_ms": 66.8, "mean_items": 5.3, "mean_candidates": 200},
    50000: {"p50_ms": 217.8, "p95_ms": 255.2, "p99_ms": 303.1, "mean_items": 5.3, "mean_candidates": 200},
}


# -- workload -------------------------------------------------------------------

@lru_cache(maxsize=None)
def load_workload(path: str | os.PathLike | None = None) -> dict:
    with open(path or WORKLOAD_PATH, encoding="utf-8") as f:
        return json.load(f)


# -- corpora --------------------------------------------------------------------

def reference_file(n: int, reference_dir: str | os.PathLike | None = None) -> Path:
    seed = load_workload()["seed"]
    return Path(reference_dir or REFERENCE_DIR) / f"corpus-seed{seed}-n{n}.jsonl.gz"


def iter_reference(path: str | os.PathLike) -> Iterator[dict]:
    """The lines of a shipped corpus file (gzip JSONL), as dicts."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


class Generator:
    """The workload's ``generator`` rule (see the module docstring)."""

    def __init__(self, workload: dict | None = None):
        w = workload or load_workload()
        self.seed = w["seed"]
        self.vocab = list(w["vocab"])
        self.function_words = list(w["function_words"])
        self.kinds = list(w["claim_kinds"])
        assert len(self.vocab) == w["vocab_size"], "vocab_size disagrees with the vocab list"
        # Zipf(1): weight 1/rank; accumulate() here is what random.choices does
        # with ``weights=``, so either spelling draws the same words.
        self.cum_weights = list(itertools.accumulate(1.0 / rank for rank in range(1, len(self.vocab) + 1)))

    def claim(self, i: int) -> dict:
        rng = random.Random(f"{self.seed}:claim:{i}")
        words = []
        for _ in range(rng.randint(8, 30)):
            if rng.random() < 0.3:
                words.append(rng.choice(self.function_words))
            else:
                words.append(rng.choices(self.vocab, cum_weights=self.cum_weights)[0])
        text = " ".join(words)
        statement = text[0].upper() + text[1:] + "."
        kind = self.kinds[rng.randrange(len(self.kinds))]
        confidence = round(0.6 + 0.4 * rng.random(), 3)
        return {"i": i, "statement": statement, "kind": kind, "confidence": confidence}


def generate(n: int, start: int = 0) -> Iterator[dict]:
    """Claims ``start`` … ``n - 1`` of the reference corpus, as dicts."""
    gen = Generator()
    for i in range(start, n):
        yield gen.claim(i)


def corpus_line(claim: dict) -> str:
    """A claim as a line of the shipped files (byte-identical)."""
    return json.dumps({"i": claim["i"], "statement": claim["statement"], "kind": claim["kind"],
                       "confidence": claim["confidence"]}) + "\n"


def to_observation(line: dict, subject_id: str | None = None, *, with_claim: bool = True) -> dict:
    """One corpus line as a ``POST /v1/observations`` body: ``kind``
    user_statement, trust asserted, visibility organization, source
    ``{type: tool, ref: bench#<i>}``, carrying its claim unless
    ``with_claim`` is false (then the claim is for a consolidation)."""
    subject_id = subject_id or load_workload()["subject_id"]
    body = {"subject_id": subject_id, "kind": "user_statement", "content": line["statement"],
            "trust": "asserted", "visibility": "organization",
            "source": {"type": "tool", "ref": f"bench#{line['i']}"}}
    if with_claim:
        body["claim"] = to_claim(line)
    return body


def to_claim(line: dict) -> dict:
    """A corpus line's claim: statement, kind, confidence."""
    return {"statement": line["statement"], "kind": line["kind"], "confidence": line["confidence"]}


def verify(sizes=(1000, 10000, 50000), reference_dir=None) -> list[dict]:
    """Compare ``generate(n)`` with each shipped file, byte for byte."""
    out = []
    for n in sizes:
        path = reference_file(n, reference_dir)
        if not path.exists():
            out.append({"n": n, "file": str(path), "status": "missing"})
            continue
        with gzip.open(path, "rb") as f:
            shipped = f.read()
        ours = "".join(corpus_line(c) for c in generate(n)).encode()
        first_diff = None
        if ours != shipped:
            for k, (a, b) in enumerate(zip(ours.split(b"\n"), shipped.split(b"\n"))):
                if a != b:
                    first_diff = {"line": k, "generated": a.decode(), "shipped": b.decode()}
                    break
        out.append({"n": n, "file": str(path), "status": "identical" if ours == shipped else "differs",
                    "bytes": len(shipped), "generated_bytes": len(ours), "first_difference": first_diff})
    return out


def write_observations(path: str | os.PathLike, n: int, start: int = 0, subject_id: str | None = None) -> float:
    """Corpus claims ``start`` … ``n - 1`` as NDJSON observation bodies (what
    ``titen import`` reads); returns the seconds it took."""
    t0 = time.perf_counter()
    subject_id = subject_id or load_workload()["subject_id"]
    with open(path, "w", encoding="utf-8") as f:
        for claim in generate(n, start):
            f.write(json.dumps(to_observation(claim, subject_id), separators=(",", ":")) + "\n")
    return time.perf_counter() - t0


# -- a built store per size ------------------------------------------------------

def store_dir(n: int) -> Path:
    return DATA_DIR / f"n{n}"


@contextmanager
def build_lock(directory: Path):
    """One builder per directory at a time, across processes."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".bench-build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def log(message: str) -> None:
    """Progress, on stderr (stdout carries the results)."""
    print(message, file=sys.stderr, flush=True)


def _core_module_files(name: str) -> list[Path]:
    """The files importing ``name`` (``core.a.b``) runs: each package's
    ``__init__.py`` on the way and the module itself."""
    parts = name.split(".")
    files = []
    for depth in range(2, len(parts) + 1):
        path = ROOT.joinpath(*parts[:depth])
        if (path / "__init__.py").exists():
            files.append(path / "__init__.py")
        elif path.with_suffix(".py").exists():
            files.append(path.with_suffix(".py"))
    return files


def snapshot_code_fingerprint() -> str:
    """A hash of the code that decides a snapshot's layout and contents:
    every module of ``core/snapshot/`` and every ``core`` module they import,
    transitively (with the packages' ``__init__.py`` an import runs).

    A built store is reused only while this matches: the snapshot schema can
    change without ``SCHEMA_VERSION`` changing, and an old file then fails
    every compile (``no such column``); so any edit to that code means a
    from-scratch rebuild of the cached store's snapshot (its ledger, the
    import, is kept)."""
    import ast
    import hashlib

    todo = [f"core.snapshot.{p.stem}" for p in (ROOT / "core" / "snapshot").glob("*.py") if p.stem != "__init__"]
    seen: dict[Path, None] = {}
    modules: set[str] = set()
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        modules.add(name)
        for path in _core_module_files(name):
            if path in seen:
                continue
            seen[path] = None
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "core":
                    todo.append(node.module)
                    # ``from core.x import y``: y may be a module of package core.x
                    todo.extend(f"{node.module}.{a.name}" for a in node.names)
                elif isinstance(node, ast.Import):
                    todo.extend(a.name for a in node.names if a.name.split(".")[0] == "core")
    h = hashlib.sha256()
    for path in sorted(seen):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def build_org(data_dir: str | os.PathLike | None, n: int, *, force: bool = False,
              progress=log) -> dict:
    """A local store at ``data_dir`` (default ``bench/.data/n<n>``) holding the
    n-claim reference corpus for org ``bench``, imported the way ``titen
    import`` does and published as a snapshot.

    A finished earlier build of the same n is reused as it is when the
    snapshot code is unchanged (``snapshot_code_fingerprint``); when it has
    changed, the import is kept and only the snapshot is rebuilt from scratch.
    ``force`` wipes the directory and does everything again. Returns the
    timings (seconds) and snapshot size; ``import_reused`` / ``rebuild_reused``
    say which figures come from an earlier run, ``cached`` that both do.
    """
    from core.config import Settings
    from core.keys import Principal
    from core.snapshot.build import SnapshotBuilder
    from core.snapshot.pointer import read_pointer
    from core.storage import open_store
    from core.writes.importer import import_file

    directory = Path(data_dir) if data_dir is not None else store_dir(n)
    progress = progress or (lambda message: None)
    with build_lock(directory):
        record_path = directory / BUILD_RECORD
        settings = Settings.from_env(data_dir=str(directory))
        store = open_store(settings.store_url)

        def builder():
            return SnapshotBuilder(store, ORG, work_dir=os.path.join(settings.cache_dir, "build"),
                                   skew_seconds=settings.skew_seconds, progress=progress)

        fingerprint = snapshot_code_fingerprint()
        pointer, _ = read_pointer(store, ORG)
        record = None
        if record_path.exists() and pointer is not None and not force:
            record = json.loads(record_path.read_text())
            if record.get("n") != n or record.get("format") != BUILD_FORMAT:
                record = None
        if record is not None and record.get("snapshot_code") == fingerprint:
            return {**record, "cached": True, "import_reused": True, "rebuild_reused": True,
                    "data_dir": str(directory)}
        if record is not None:
            progress(f"build n={n}: the snapshot code changed since this store was built; "
                     "rebuilding its snapshot from scratch (the import is kept)")
            t0 = time.perf_counter()
            result = builder().rebuild(from_scratch=True)
            rebuild_s = time.perf_counter() - t0
            record.update({"snapshot_code": fingerprint, "rebuild_s": round(rebuild_s, 3),
                           "rebuild_from_scratch": True, "rebuilt_at": now(),
                           "build_s": round(record["import_s"] + rebuild_s, 3),
                           "claim_count": result.claim_count, "entries_applied": result.entries_applied,
                           "content_hash": result.content_hash, "snapshot_bytes": result.snapshot_bytes,
                           "generation": result.generation})
            record_path.write_text(json.dumps(record, indent=1))
            progress(f"build n={n}: rebuild {rebuild_s:.1f}s, snapshot {result.snapshot_bytes / 1e6:.1f} MB")
            return {**record, "cached": False, "import_reused": True, "rebuild_reused": False,
                    "data_dir": str(directory)}
        if force or pointer is not None:
            # a finished build of something else, or asked to start over
            progress(f"build n={n}: wiping {directory}")
            for child in directory.iterdir():
                if child.name != ".bench-build.lock":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            store = open_store(settings.store_url)
        # An interrupted earlier import is simply re-run: batches with a marker are skipped.
        ndjson = directory / "import.ndjson"
        write_s = write_observations(ndjson, n)
        principal = Principal(org_id=ORG, principal_id=IMPORT_PRINCIPAL, key_id="cli",
                              scopes=frozenset({"admin", "memory:write", "memory:verify"}), workspaces=())
        progress(f"build n={n}: importing {ndjson}")
        t0 = time.perf_counter()
        summary = import_file(store, principal, str(ndjson), progress=progress)
        import_s = time.perf_counter() - t0
        progress(f"build n={n}: rebuilding the snapshot")
        t0 = time.perf_counter()
        result = builder().rebuild()
        rebuild_s = time.perf_counter() - t0
        record = {"format": BUILD_FORMAT, "n": n, "org_id": ORG, "built_at": now(),
                  "snapshot_code": fingerprint, "rebuild_from_scratch": False,
                  "write_ndjson_s": round(write_s, 3), "import_s": round(import_s, 3),
                  "rebuild_s": round(rebuild_s, 3), "build_s": round(import_s + rebuild_s, 3),
                  "import": summary, "claim_count": result.claim_count,
                  "entries_applied": result.entries_applied, "content_hash": result.content_hash,
                  "snapshot_bytes": result.snapshot_bytes, "generation": result.generation,
                  "ndjson_bytes": ndjson.stat().st_size}
        record_path.write_text(json.dumps(record, indent=1))
        ndjson.unlink()  # 27 MB at 50k; regenerated (identically) if ever needed
        progress(f"build n={n}: import {import_s:.1f}s, rebuild {rebuild_s:.1f}s, "
                 f"snapshot {result.snapshot_bytes / 1e6:.1f} MB")
        return {**record, "cached": False, "import_reused": False, "rebuild_reused": False,
                "data_dir": str(directory)}


# -- small stores: a key, a corpus imported ---------------------------------------

def open_local_store(data_dir: str | os.PathLike):
    from core.config import Settings
    from core.storage import open_store

    return open_store(Settings.from_env(data_dir=str(data_dir)).store_url)


def create_key(data_dir: str | os.PathLike, org: str, scopes, principal: str = "bench") -> str:
    """A fresh API key in the store at ``data_dir`` (what ``titen keys create`` does)."""
    from core.keys import KeyRing

    return KeyRing(open_local_store(data_dir)).create(org, principal, list(scopes), [])["api_key"]


def import_corpus(data_dir: str | os.PathLike, n: int, org: str, subject_id: str = "user_bench") -> dict:
    """The first n corpus claims imported into ``org`` (``import_file``, as
    ``titen import`` does: ledger entries only, no snapshot)."""
    from core.keys import Principal
    from core.writes.importer import import_file

    ndjson = os.path.join(data_dir, "import.ndjson")
    os.makedirs(data_dir, exist_ok=True)
    write_observations(ndjson, n, subject_id=subject_id)
    principal = Principal(org, IMPORT_PRINCIPAL, "cli", frozenset({"admin", "memory:write", "memory:verify"}), ())
    try:
        return import_file(open_local_store(data_dir), principal, ndjson)
    finally:
        os.unlink(ndjson)


# -- statistics and output -----------------------------------------------------------

def percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(seconds: list[float]) -> dict:
    """p50/p95/p99 (nearest rank), mean and max of samples in seconds, in ms."""
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": round(percentile(ms, 50), 3), "p95_ms": round(percentile(ms, 95), 3),
            "p99_ms": round(percentile(ms, 99), 3), "mean_ms": round(statistics.fmean(ms), 3),
            "max_ms": round(max(ms), 3), "n": len(ms)}


def peak_rss_mib() -> float:
    """This process's peak resident memory."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def print_table(head, rows) -> None:
    """One right-aligned text table, as every bench prints its results."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def parse_sizes(text: str) -> list[int]:
    """``1000,10k,50_000`` -> [1000, 10000, 50000]."""
    return [int(s.replace("_", "").replace("k", "000")) for s in text.split(",") if s]


def loadavg() -> list[float]:
    """The 1/5/15-minute load averages: other work on the machine skews every figure."""
    return [round(x, 2) for x in os.getloadavg()]


def environment(workload: dict | None = None) -> dict:
    """What a result was measured on: versions, CPUs, the workload, and a
    fingerprint of every ``core`` source file."""
    import hashlib
    import platform

    import apsw

    from core.budget.tokens import TOKENIZER_ID

    workload = workload or load_workload()
    core_dir = ROOT / "core"
    h = hashlib.sha256()
    for source in sorted(core_dir.rglob("*.py")):
        h.update(str(source.relative_to(core_dir)).encode() + b"\0" + source.read_bytes())
    return {"core_fingerprint": h.hexdigest()[:16], "python": platform.python_version(),
            "sqlite": apsw.sqlite_lib_version(), "apsw": apsw.apsw_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "workload_seed": workload["seed"], "max_tokens": workload["max_tokens"],
            "tasks": len(workload["tasks"]), "warmup_tasks": len(workload["warmup_tasks"]),
            "tokenizer": TOKENIZER_ID}


def read_results(path: str | os.PathLike) -> dict:
    """A results file, or ``{}`` when there is none (or it is unreadable)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def write_results(path: str | os.PathLike, bench: str, rows: list[dict], *, key: str = "claims",
                  field: str = "results", **top) -> None:
    """Merge ``rows`` into the file's ``field`` list by ``key`` (so sizes can
    be run separately: a row replaces the earlier row of the same key), with
    ``bench``, ``updated_at`` and ``top`` as the document's other fields."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    by_key = {r[key]: r for r in read_results(path).get(field, [])}
    for r in rows:
        by_key[r[key]] = r
    doc = {"bench": bench, "updated_at": now(), **top, field: [by_key[k] for k in sorted(by_key)]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


# -- an S3 model over the local store --------------------------------------------------

class ModelledS3(LocalStore):
    """The local store with S3's per-request latency and bandwidth as a floor
    (the S3 model of bench.freshness and bench.erasure). The local store
    keeps no object versions; purging versions is modelled as the listing
    and the delete S3 needs."""

    def __init__(self, root: str, latency: float, bandwidth: float):
        super().__init__(root)
        self.latency, self.bandwidth = latency, bandwidth
        self.timings: dict[str, list[float]] = {}

    def _floor(self, op: str, started: float, nbytes: int = 0) -> None:
        floor = self.latency + nbytes / self.bandwidth
        elapsed = time.perf_counter() - started
        if elapsed < floor:
            time.sleep(floor - elapsed)
        self.timings.setdefault(op, []).append(time.perf_counter() - started)

    def get(self, key):
        t = time.perf_counter()
        obj = super().get(key)
        self._floor("get", t, len(obj.body))
        return obj

    def get_if_changed(self, key, etag):
        t = time.perf_counter()
        obj = super().get_if_changed(key, etag)
        self._floor("get_if_changed", t, len(obj.body) if obj else 0)
        return obj

    def list_keys(self, prefix, start_after=None, **kw):
        t = time.perf_counter()
        keys = list(super().list_keys(prefix, start_after, **kw))
        pages = max(1, -(-len(keys) // (kw.get("page_size") or 1000)))
        self._floor("list", t)
        time.sleep(self.latency * (pages - 1))
        return iter(keys)

    def put_if_absent(self, key, body):
        t = time.perf_counter()
        try:
            return super().put_if_absent(key, body)
        finally:
            # a generation published as a delta: its upload
            self._floor("upload" if key.endswith(".delta") else "put", t, len(body))
            self._published(key)

    def compare_and_swap(self, key, body, expected_etag):
        t = time.perf_counter()
        try:
            return super().compare_and_swap(key, body, expected_etag)
        finally:
            self._floor("put", t, len(body))
            self._published(key)

    def _published(self, key):
        if key.endswith("/current.json"):
            self.timings.setdefault("pointer_swapped_at", []).append(time.perf_counter())

    def delete(self, key):
        t = time.perf_counter()
        super().delete(key)
        self._floor("delete", t)

    def upload_file(self, key, path):
        t = time.perf_counter()
        try:
            return super().upload_file(key, path)
        finally:
            self._floor("upload", t, os.path.getsize(path))

    def download_file(self, key, path):
        t = time.perf_counter()
        super().download_file(key, path)
        self._floor("download", t, os.path.getsize(path))

    def purge(self, key):
        t = time.perf_counter()
        super().purge(key)
        self._floor("purge", t)
        time.sleep(self.latency)  # S3: list the key's versions, then delete them

    def purge_history(self, key):
        t = time.perf_counter()
        try:
            return super().purge_history(key)
        finally:
            self._floor("purge_history", t)
            time.sleep(self.latency)

    def purge_prefix(self, prefix, keep):
        t = time.perf_counter()
        try:
            return super().purge_prefix(prefix, keep)
        finally:
            self._floor("purge_prefix", t)
            time.sleep(self.latency)


# -- titen serve as a subprocess --------------------------------------------------------

def workers_args(workers: int | None) -> list[str]:
    """``titen serve`` arguments for ``--workers`` (None: its default)."""
    return [] if workers is None else ["--workers", str(workers)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            pass
    return pids


def rss_mib(pid: int) -> dict:
    """Memory of ``titen serve`` in MiB: its supervisor and every process it
    started (server processes, multiprocessing's resource tracker), summed:
    ``VmHWM`` (the sum of each process's peak) and ``VmRSS``; and the largest
    single peak (``VmHWM_max``, a server process) and the process count."""
    out = {"VmHWM": 0.0, "VmRSS": 0.0, "VmHWM_max": 0.0, "processes": 0}
    for p in _process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(("VmHWM:", "VmRSS:")):
                        key, value = line.split(":", 1)
                        mib = int(value.split()[0]) / 1024  # kB -> MiB
                        out[key] = round(out[key] + mib, 1)
                        if key == "VmHWM":
                            out["VmHWM_max"] = round(max(out["VmHWM_max"], mib), 1)
        except FileNotFoundError:
            continue
        out["processes"] += 1
    return out


class Served:
    """``titen serve`` as a subprocess on loopback, for the benches and the
    tests that need the real server (the CLI, uvicorn and the store: no fake).

    ``with Served(data_dir) as s:`` starts it, waits for ``/healthz`` and
    stops it (SIGINT) on exit; ``s.port``, ``s.pid``, ``s.request(...)``,
    ``s.connection()``, ``s.wait_ready()``, ``s.log()``."""

    def __init__(self, data_dir: str | os.PathLike, *, env: dict | None = None, log_path=None,
                 extra_args=(), start_timeout: float = 120.0):
        self.data_dir = str(data_dir)
        self.port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or os.path.join(self.data_dir, f".serve-{self.port}.log")
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Served":
        os.makedirs(self.data_dir, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            TITEN + ["serve", "--port", str(self.port), "--data-dir", self.data_dir, *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env)
        try:
            self._wait_for("/healthz", self.start_timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def _wait_for(self, path: str, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"titen serve exited with {self.process.returncode}: {self.log()[-3000:]}")
            try:
                status, _, _ = self.request("GET", path, timeout=5)
                if status == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"titen serve did not answer {path} with 200 within {timeout:.0f} s")

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Seconds until ``GET /readyz`` answers 200 (the snapshots it serves loaded)."""
        return self._wait_for("/readyz", timeout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, dict, bytes]:
        """One request on a fresh connection: (status, headers, body)."""
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


# -- client processes ---------------------------------------------------------------------

def _client_entry(index: int, target, args: tuple, barrier, results) -> None:
    try:
        results.put((index, True, target(*args, barrier)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        import traceback
        results.put((index, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_clients(target, per_client: list[tuple], timeout: float = 1800.0) -> list:
    """``target(*args, barrier)`` in one fresh process per ``args`` tuple of
    ``per_client``; returns their return values, in order.

    Load generators use processes, not threads: a client thread holds the
    GIL while it encodes a body and parses an answer, so threads in one
    interpreter queue behind each other and the client, not the server,
    bounds throughput and inflates latency. Processes are spawned (nothing
    inherited but the arguments; ``target`` must be a module-level function);
    ``barrier`` (one party per client) lets each wait until all have started
    before opening its connection (``titen serve`` closes an idle keep-alive
    connection after 5 s). ``time.monotonic`` is CLOCK_MONOTONIC, comparable
    across processes."""
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(per_client)), ctx.Queue()
    procs = [ctx.Process(target=_client_entry, args=(i, target, args, barrier, results), daemon=True)
             for i, args in enumerate(per_client)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < len(procs):  # read before join: a full pipe would block a child
            try:
                index, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if i not in out and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"client process {dead[0]} died with exit code {procs[dead[0]].exitcode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"client processes did not finish within {timeout:.0f} s")
                continue
            if not ok:
                raise RuntimeError(f"client process {index} failed: {value}")
            out[index] = value
    finally:
        for p in procs:
            if p.is_alive() and len(out) < len(procs):
                p.terminate()
            p.join(10)
    return [out[i] for i in range(len(procs))]


# -- command line -----------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.common",
                                     description="the reference corpus: verify, generate, build stores")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("verify", help="compare generate(n) with the shipped corpus files")
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--reference-dir", default=None)
    p = sub.add_parser("generate", help="write the n-claim corpus as JSONL to stdout")
    p.add_argument("n", type=int)
    p = sub.add_parser("build", help="build (or reuse) bench/.data/n<n> for each size")
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "verify":
        results = verify(parse_sizes(args.sizes), args.reference_dir)
        for r in results:
            print(json.dumps(r))
        return 0 if all(r["status"] == "identical" for r in results) else 1
    if args.command == "generate":
        out = sys.stdout
        for claim in generate(args.n):
            out.write(corpus_line(claim))
        return 0
    for n in parse_sizes(args.sizes):
        print(json.dumps(build_org(None, n, force=args.force)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
