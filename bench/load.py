"""Load path: build organizations from the reference workload through the real CLI.

    .venv/bin/python -m bench.load                              # 1000,10000,50000,100000,342000
    .venv/bin/python -m bench.load --sizes 1000000 --no-incremental

For each size n: wipe ``bench/.data/n<n>/``, write the first n corpus claims
as NDJSON observation bodies (``bench.common.write_observations``: same
rule, same bodies as the other benches), then run, as subprocesses, exactly
what an operator runs:

    .venv/bin/titen import FILE --org bench --data-dir DIR      (batches of 500)
    .venv/bin/titen rebuild --org bench --data-dir DIR          (from empty: no snapshot yet)

and report the wall seconds of each command (interpreter start-up included),
the rebuild's own ``seconds`` (its JSON line), and the snapshot bytes. The
finished store is left in place with a ``.bench-build.json`` record in the
format ``bench.common.build_org`` writes, so ``bench.compile`` and
``bench.compile_http`` reuse it instead of building again.

Then the incremental rebuild (unless ``--no-incremental``): the 342k
organization (``--incremental-base``) is hard-link copied (``cp -al``; store
objects are immutable, every write is a new inode) to
``bench/.data/incr-n<n>/``, 100 new observations with claims (corpus claims
n..n+99) are imported with ``--batch-size 1`` — 100 separate ledger entries —
and ``titen rebuild --org bench`` is timed: previous snapshot + 100 entries →
new generation. Each round also reports the bytes the rebuild published (a
delta, core/snapshot/delta.py, or the whole file) and what an in-process
reader serving the previous generation downloads and how long its
apply-and-verify takes (``SnapshotReader``'s ``last_load``). The copy is
deleted afterwards.

Targets (issue): rebuild of 50k from an empty snapshot <= 30 s; incremental
100 entries on 342k <= 5 s. Results are printed and merged (by size) into
``bench/results/load.json``. ``--reuse`` reports a finished earlier CLI build
of a size instead of building it again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common

RESULTS_FILE = common.RESULTS_DIR / "load.json"
DEFAULT_SIZES = "1000,10000,50000,100000,342000"
TARGETS = {"rebuild_50k_s": 30.0, "incremental_100_on_342k_s": 5.0}


def _titen(*args: str) -> tuple[float, list[dict], str]:
    """Run the CLI; (wall seconds, JSON lines printed on stdout, stderr tail)."""
    t0 = time.perf_counter()
    proc = subprocess.run([*common.TITEN, *args], cwd=common.ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"titen {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return wall, lines, proc.stderr[-500:]


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def build_size(n: int, *, reuse: bool, progress=common.log) -> dict:
    directory = common.store_dir(n)
    record_path = directory / common.BUILD_RECORD
    with common.build_lock(directory):
        if reuse and record_path.exists():
            record = json.loads(record_path.read_text())
            if record.get("via") == "titen-cli" and record.get("n") == n:
                progress(f"load n={n}: reusing the CLI build of {record.get('built_at')}")
                return {**record, "reused": True}
        progress(f"load n={n}: wiping {directory}")
        for child in directory.iterdir():
            if child.name != ".bench-build.lock":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        ndjson = directory / "import.ndjson"
        write_s = common.write_observations(ndjson, n)
        progress(f"load n={n}: titen import ({ndjson.stat().st_size / 1e6:.1f} MB NDJSON)")
        load_before = os.getloadavg()[0]
        import_s, out, _ = _titen("import", str(ndjson), "--org", common.ORG, "--data-dir", str(directory))
        summary = out[-1]
        progress(f"load n={n}: import {import_s:.1f}s; titen rebuild")
        rebuild_s, out, _ = _titen("rebuild", "--org", common.ORG, "--data-dir", str(directory))
        result = out[-1]
        load_after = os.getloadavg()[0]
        assert result["claim_count"] == n and result["published"], result
        progress(f"load n={n}: rebuild {rebuild_s:.1f}s, snapshot {result['snapshot_bytes'] / 1e6:.1f} MB")
        record = {"format": common.BUILD_FORMAT, "n": n, "org_id": common.ORG, "via": "titen-cli",
                  "built_at": common.now(), "snapshot_code": common.snapshot_code_fingerprint(),
                  "rebuild_from_scratch": False, "write_ndjson_s": round(write_s, 3),
                  "ndjson_bytes": ndjson.stat().st_size,
                  "import_s": round(import_s, 3), "rebuild_s": round(rebuild_s, 3),
                  "rebuild_internal_s": round(result["seconds"], 3), "build_s": round(import_s + rebuild_s, 3),
                  "import": summary, "claim_count": result["claim_count"],
                  "entries_applied": result["entries_applied"], "content_hash": result["content_hash"],
                  "snapshot_bytes": result["snapshot_bytes"], "generation": result["generation"],
                  "claims_per_s_import": round(n / import_s), "loadavg_1m": [round(load_before, 2),
                                                                               round(load_after, 2)]}
        ndjson.unlink()
        record["store_bytes"] = dir_bytes(directory)
        record_path.write_text(json.dumps(record, indent=1))
        return {**record, "reused": False}


def incremental(base_n: int, entries: int = 100, progress=common.log) -> dict:
    base = common.store_dir(base_n)
    if not (base / common.BUILD_RECORD).exists():
        raise SystemExit(f"incremental: no finished build of {base_n} in {base}; run with --sizes {base_n}")
    copy = common.DATA_DIR / f"incr-n{base_n}"
    if copy.exists():
        shutil.rmtree(copy)
    copy.mkdir(parents=True)
    with common.build_lock(base):
        for child in base.iterdir():
            if child.name in ("cache", ".bench-build.lock", "import.ndjson"):
                continue
            subprocess.run(["cp", "-al", str(child), str(copy / child.name)], check=True)
    try:
        ndjson = copy / "incremental.ndjson"
        common.write_observations(ndjson, base_n + entries, start=base_n)
        progress(f"incremental: {entries} entries (titen import --batch-size 1) onto the {base_n:,} store copy")
        import_s, out, _ = _titen("import", str(ndjson), "--org", common.ORG, "--batch-size", "1",
                                  "--data-dir", str(copy))
        assert out[-1]["batches_written"] == entries, out
        rounds = []
        # a reader (in process, as an API instance holds one) serving the
        # generation before each round: what it downloads and how long its
        # apply-and-verify takes when the round's generation appears
        from core.snapshot.reader import SnapshotReader
        reader = SnapshotReader(common.open_local_store(copy), str(copy / "bench-reader"), ttl_seconds=0)
        reader.refresh(common.ORG, force=True)
        for round_ in (1, 2):
            if round_ == 2:
                # the steady state of a scheduled rebuild: the previous
                # generation is the one round 1 kept in the work directory
                common.write_observations(ndjson, base_n + 2 * entries, start=base_n + entries)
                _titen("import", str(ndjson), "--org", common.ORG, "--batch-size", "1", "--data-dir", str(copy))
            load_before = os.getloadavg()[0]
            rebuild_s, out, _ = _titen("rebuild", "--org", common.ORG, "--data-dir", str(copy))
            load_after = os.getloadavg()[0]
            result = out[-1]
            assert (result["entries_applied"] == entries
                    and result["claim_count"] == base_n + round_ * entries), result
            progress(f"incremental round {round_}: rebuild {rebuild_s:.2f}s (internal {result['seconds']:.2f}s), "
                     f"published {result.get('published_bytes') or 0:,} bytes")
            reader.refresh(common.ORG, force=True)
            loaded = reader.status(common.ORG)["last_load"] or {}
            assert loaded.get("generation") == result["generation"], (loaded, result)
            progress(f"incremental round {round_}: reader {loaded['road']}, downloaded {loaded['downloaded_bytes']:,} "
                     f"bytes, apply and verify {loaded['seconds']:.3f}s")
            rounds.append({"rebuild_s": round(rebuild_s, 3), "rebuild_internal_s": round(result["seconds"], 3),
                           "published_bytes": result.get("published_bytes"),
                           "reader_road": loaded["road"], "reader_downloaded_bytes": loaded["downloaded_bytes"],
                           "reader_apply_verify_s": loaded["seconds"],
                           "entries_applied": result["entries_applied"], "claim_count": result["claim_count"],
                           "snapshot_bytes": result["snapshot_bytes"], "generation": result["generation"],
                           "previous": "downloaded" if round_ == 1 else "kept",
                           "loadavg_1m": [round(load_before, 2), round(load_after, 2)]})
        return {"base_claims": base_n, "entries": entries, "import_s": round(import_s, 3),
                **rounds[1], "first": rounds[0], "measured_at": common.now()}
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def print_tables(builds: list[dict], incr: dict | None) -> None:
    import apsw
    print(f"\nLoad through the CLI (titen import, batches of 500; titen rebuild from empty); python "
          f"{platform.python_version()}, SQLite {apsw.sqlite_lib_version()}, {os.cpu_count()} CPUs")
    head = ("claims", "import s", "claims/s", "rebuild s", "(internal)", "snapshot MB", "store MB", "load 1m")
    rows = []
    for b in builds:
        mark = "*" if b.get("reused") else ""
        rows.append((f"{b['n']:,}", f"{b['import_s']:.1f}{mark}", f"{b['claims_per_s_import']:,}",
                     f"{b['rebuild_s']:.1f}{mark}", f"{b['rebuild_internal_s']:.1f}",
                     f"{b['snapshot_bytes'] / 1e6:.1f}", f"{b['store_bytes'] / 1e6:.0f}",
                     "{:.1f}->{:.1f}".format(*b["loadavg_1m"])))
    common.print_table(head, rows)
    if any(b.get("reused") for b in builds):
        print("* reused (--reuse): the figure is from the earlier run that built the store")
    fifty = next((b for b in builds if b["n"] == 50000), None)
    if fifty:
        ok = fifty["rebuild_s"] <= TARGETS["rebuild_50k_s"]
        print(f"target: rebuild 50k from empty <= {TARGETS['rebuild_50k_s']:.0f} s: {fifty['rebuild_s']:.1f} s "
              f"{'MET' if ok else 'MISSED'}")
    if incr:
        ok = incr["rebuild_s"] <= TARGETS["incremental_100_on_342k_s"]
        first = incr.get("first")
        if first:
            print(f"\nIncremental, first build on the copy (previous generation downloaded from the store and "
                  f"sha256-checked): {first['rebuild_s']:.2f} s wall ({first['rebuild_internal_s']:.2f} s "
                  f"internal), load {first['loadavg_1m'][0]:.1f}->{first['loadavg_1m'][1]:.1f}")
        for label, r in (("first", first), ("steady", incr)):
            if r and r.get("published_bytes") is not None:
                print(f"Incremental ({label}): published {r['published_bytes'] / 1e6:.2f} MB for generation "
                      f"{r['generation']}; a reader holding the previous generation took the {r['reader_road']} road, "
                      f"downloaded {r['reader_downloaded_bytes'] / 1e6:.2f} MB, apply and verify "
                      f"{r['reader_apply_verify_s']:.3f} s (targets: <= 5 MB, <= 5 MB, <= 0.5 s)")
        print(f"Incremental: {incr['entries']} single-observation ledger entries (titen import --batch-size 1, "
              f"{incr['import_s']:.1f} s) onto {incr['base_claims']:,} claims, then titen rebuild "
              f"(previous generation {incr.get('previous', 'downloaded')}): "
              f"{incr['rebuild_s']:.2f} s wall ({incr['rebuild_internal_s']:.2f} s internal), "
              f"{incr['entries_applied']} entries applied, snapshot {incr['snapshot_bytes'] / 1e6:.1f} MB, "
              f"load {incr['loadavg_1m'][0]:.1f}->{incr['loadavg_1m'][1]:.1f}; target <= "
              f"{TARGETS['incremental_100_on_342k_s']:.0f} s: {'MET' if ok else 'MISSED'}")
    print()


def write_results(builds: list[dict], incr: dict | None, path: Path) -> None:
    """Builds merged by size; the incremental result replaced when measured."""
    common.write_results(path, "load", builds, key="n", field="builds", targets=TARGETS,
                         python=platform.python_version(), cpus=os.cpu_count(),
                         incremental=incr or common.read_results(path).get("incremental"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma list (default {DEFAULT_SIZES}; 1000000 optional)")
    parser.add_argument("--reuse", action="store_true", help="report an earlier CLI build instead of building again")
    parser.add_argument("--no-incremental", action="store_true")
    parser.add_argument("--incremental-base", type=int, default=342000)
    parser.add_argument("--out", default=str(RESULTS_FILE))
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    builds = [build_size(n, reuse=args.reuse) for n in common.parse_sizes(args.sizes)]
    incr = None if args.no_incremental else incremental(args.incremental_base)
    print_tables(builds, incr)
    print(f"load average (1/5/15 min) before {tuple(round(x, 2) for x in load_start)}, "
          f"after {tuple(round(x, 2) for x in os.getloadavg())}")
    write_results(builds, incr, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
