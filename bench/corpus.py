"""Shared helpers for the benches: the reference workload, its corpora, and a
built local store per corpus size.

The workload (``bench/reference/workload-seed20260817.json``, a copy of the
shared reference workload) holds the subject, the 20 warm-up and 200 measured
tasks, the vocabulary and the corpus ``generator`` rule:

    statement(i) uses random.Random(f'{seed}:claim:{i}'), 8-30 words,
    30% function words, Zipf(1) content words; kind=CLAIM_KINDS[randrange(6)],
    confidence=round(0.6+0.4*random(),3)

``generate(n)`` implements it; ``python bench/corpus.py verify`` checks it
byte for byte against the shipped ``corpus-seed20260817-n{1000,10000,50000}``
files (it matches all three exactly). The parts the rule text leaves open,
fixed by that match:

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

``build_org(data_dir, n)`` loads a corpus through the same path as
``titen import`` (``core.importer.import_file``) into a local store and
publishes a snapshot (``core.rebuild.SnapshotBuilder``); the built store is
kept under ``bench/.data/n<n>/`` and reused on later runs (its snapshot rebuilt
from scratch when the snapshot code, ``core/rebuild.py`` and what it imports,
has changed).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import itertools
import json
import os
import random
import shutil
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:  # so ``core`` imports without an editable install too
    sys.path.insert(0, str(ROOT))

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


def to_observation(line: dict, subject_id: str | None = None) -> dict:
    """One corpus line as a ``POST /v1/observations`` body supporting its claim."""
    subject_id = subject_id or load_workload()["subject_id"]
    return {"subject_id": subject_id, "kind": "user_statement", "content": line["statement"],
            "trust": "asserted", "visibility": "organization",
            "source": {"type": "tool", "ref": f"bench#{line['i']}"},
            "claim": {"statement": line["statement"], "kind": line["kind"], "confidence": line["confidence"]}}


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


# -- a built store per size ------------------------------------------------------

def store_dir(n: int) -> Path:
    return DATA_DIR / f"n{n}"


@contextmanager
def _build_lock(directory: Path):
    """One builder per directory at a time, across processes."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".bench-build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def snapshot_code_fingerprint() -> str:
    """A hash of the code that decides a snapshot's layout and contents:
    ``core/rebuild.py`` and every ``core`` module it imports, transitively.

    A built store is reused only while this matches: the snapshot schema can
    change without ``SCHEMA_VERSION`` changing, and an old file then fails
    every compile (``no such column``); so any edit to that code means a
    from-scratch rebuild of the cached store's snapshot (its ledger, the
    import, is kept)."""
    import ast
    import hashlib

    core_dir = ROOT / "core"
    seen: set[str] = set()
    todo = ["rebuild"]
    while todo:
        name = todo.pop()
        if name in seen or not (core_dir / f"{name}.py").exists():
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((core_dir / f"{name}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("core."):
                todo.append(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                todo.extend(a.name.split(".")[1] for a in node.names if a.name.startswith("core."))
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(name.encode() + b"\0" + (core_dir / f"{name}.py").read_bytes())
    return h.hexdigest()[:16]


def build_org(data_dir: str | os.PathLike | None, n: int, *, force: bool = False,
              progress=_log) -> dict:
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
    from core.writes.importer import import_file
    from core.keys import Principal
    from core.snapshot.build import SnapshotBuilder
    from core.snapshot.pointer import read_pointer
    from core.storage import open_store

    directory = Path(data_dir) if data_dir is not None else store_dir(n)
    progress = progress or (lambda message: None)
    with _build_lock(directory):
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
                           "rebuild_from_scratch": True, "rebuilt_at": _now(),
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
        t0 = time.perf_counter()
        subject = load_workload()["subject_id"]
        with open(ndjson, "w", encoding="utf-8") as f:
            for claim in generate(n):
                f.write(json.dumps(to_observation(claim, subject), separators=(",", ":")) + "\n")
        write_s = time.perf_counter() - t0
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
        record = {"format": BUILD_FORMAT, "n": n, "org_id": ORG, "built_at": _now(),
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


def print_table(head, rows) -> None:
    """One right-aligned text table, as every bench prints its results."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# -- command line -----------------------------------------------------------------

def _sizes(text: str) -> list[int]:
    return [int(s.replace("_", "").replace("k", "000")) for s in text.split(",") if s]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
        results = verify(_sizes(args.sizes), args.reference_dir)
        for r in results:
            print(json.dumps(r))
        return 0 if all(r["status"] == "identical" for r in results) else 1
    if args.command == "generate":
        out = sys.stdout
        for claim in generate(args.n):
            out.write(corpus_line(claim))
        return 0
    for n in _sizes(args.sizes):
        print(json.dumps(build_org(None, n, force=args.force)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
