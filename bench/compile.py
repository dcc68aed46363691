"""In-process compile latency on the reference workload.

For each corpus size: build (or reuse) ``bench/.data/n<n>`` (see
``bench/common.py``), open a ``Service`` on it, create a ``context:compile``
key, run the workload's 20 warm-up tasks and then its 200 measured tasks
through ``service.compiler.compile`` (no HTTP), and report nearest-rank
p50/p95/p99 of the wall time per call (``time.perf_counter``), mean items,
mean candidates, and the mean of each stage in ``outcome.timings``. Then the
same 200 tasks run through ``core.compile.retrieval.fts_candidates`` alone (same
scope, same MATCH expression): the bare FTS5 candidate query, for the
compile/FTS overhead ratio; and through ``core.compile.retrieval.lexical_candidates``,
the candidate step compile runs (``step``), checked to return the same rows.
``fts-only`` is the MATCH with no join to ``claims`` and no scope predicates,
for scale.

Every compile appends a context run to the ledger (the ``record`` stage), as
in production: each run adds 220 small files under the store's ledger.

    .venv/bin/python -m bench.compile --sizes 10000,50000
    .venv/bin/python -m bench.compile --sizes 50000 --at 2000-01-01T00:00:00Z   # nothing in scope

Results are printed and merged (by size) into
``bench/results/compile-inprocess.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench import common

STAGES = ("plan", "candidates", "hydrate", "rank", "pack", "record")
RESULTS_FILE = common.RESULTS_DIR / "compile-inprocess.json"
AT_RESULTS_FILE = common.RESULTS_DIR / "compile-inprocess-at.json"


def run_size(n: int, workload: dict, *, progress=common.log, at: str | None = None) -> dict:
    from core.config import Settings
    from core.instants import canonical, now_utc, parse_instant
    from core.compile.planning import plan_query
    from core.compile.retrieval import MAX_CANDIDATES, CompileScope, fts_candidates, lexical_candidates
    from core.service import Service

    build = common.build_org(None, n, progress=progress)
    load_before = os.getloadavg()
    service = Service(Settings.from_env(data_dir=build["data_dir"]))
    created = service.keys.create(common.ORG, "bench", ["context:compile"], [])
    principal = service.keys.authenticate("Bearer " + created["api_key"])
    subject, max_tokens = workload["subject_id"], workload["max_tokens"]

    t0 = time.perf_counter()
    snapshot = service.reader.current(common.ORG)
    load_s = time.perf_counter() - t0
    if snapshot is None or snapshot.claim_count != n:
        raise SystemExit(f"n={n}: the store at {build['data_dir']} serves "
                         f"{snapshot.claim_count if snapshot else 'no'} claims; rebuild with "
                         f"`python -m bench.common build --sizes {n} --force`")
    try:
        def compile_one(task: str):
            body = {"subject_id": subject, "task": task, "max_tokens": max_tokens}
            if at is not None:
                body["at"] = at
            return service.compiler.compile(principal, body)

        progress(f"n={n}: {len(workload['warmup_tasks'])} warm-up compiles")
        for task in workload["warmup_tasks"]:
            compile_one(task)
        progress(f"n={n}: {len(workload['tasks'])} measured compiles")
        walls, items, candidates = [], [], []
        stages = {s: [] for s in STAGES}
        for task in workload["tasks"]:
            t0 = time.perf_counter()
            outcome = compile_one(task)
            walls.append(time.perf_counter() - t0)
            items.append(len(outcome.data["items"]))
            candidates.append(outcome.meta["candidates"])
            for s in STAGES:
                stages[s].append(outcome.timings.get(s, 0.0))
        stage_sum = [sum(stages[s][k] for s in STAGES) for k in range(len(walls))]
        other = [w - s for w, s in zip(walls, stage_sum)]

        # The bare FTS5 candidate query (the floor the issue measures against),
        # same scope and MATCH as compile builds, and the candidate step compile
        # actually runs (precomputed postings summed with numpy, exact, FTS5 as the fallback).
        progress(f"n={n}: bare FTS5 candidate queries")
        scope = CompileScope(principal, subject, None, canonical(parse_instant(at) if at else now_utc()))
        where, params = scope.where()
        plans = [plan_query(t) for t in workload["tasks"]]
        for task in workload["warmup_tasks"]:
            plan = plan_query(task)
            if plan.match:
                fts_candidates(snapshot.db, where, params, plan.match)
                lexical_candidates(snapshot, scope, plan)
        fts, fts_rows, step = [], [], []
        for plan in plans:
            t0 = time.perf_counter()
            rows = fts_candidates(snapshot.db, where, params, plan.match) if plan.match else []
            fts.append(time.perf_counter() - t0)
            fts_rows.append(len(rows))
            t0 = time.perf_counter()
            fast = lexical_candidates(snapshot, scope, plan) if plan.match else []
            step.append(time.perf_counter() - t0)
            assert fast == rows, "the candidate step must equal the FTS5 query"
        raw_sql = ("SELECT rowid, bm25(claims_fts) AS b FROM claims_fts WHERE claims_fts MATCH ?"
                   f" ORDER BY b LIMIT {MAX_CANDIDATES}")
        fts_only = []
        for plan in plans:
            t0 = time.perf_counter()
            if plan.match:
                list(snapshot.db.execute(raw_sql, (plan.match,)))
            fts_only.append(time.perf_counter() - t0)
    finally:
        # The reader copies the snapshot into <data dir>/cache and never deletes
        # it on exit; drop this run's copy so repeated runs do not pile up.
        snapshot.db.close()
        try:
            os.unlink(snapshot.path)
        except FileNotFoundError:
            pass

    compile_summary = common.summary_ms(walls)
    fts_summary = common.summary_ms(fts)
    return {
        "claims": n,
        "at": at,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build": {k: build.get(k) for k in ("cached", "import_reused", "rebuild_reused", "built_at", "rebuilt_at",
                                             "rebuild_from_scratch", "import_s", "rebuild_s", "build_s",
                                             "snapshot_bytes", "claim_count", "generation", "snapshot_code",
                                             "data_dir")},
        "snapshot_load_ms": round(load_s * 1000, 3),
        "compile": {**compile_summary,
                    "mean_items": round(statistics.fmean(items), 2),
                    "mean_candidates": round(statistics.fmean(candidates), 2),
                    "min_candidates": min(candidates)},
        "stages_mean_ms": {**{s: round(statistics.fmean(v) * 1000, 3) for s, v in stages.items()},
                           "other": round(statistics.fmean(other) * 1000, 3)},
        "stages_p95_ms": {s: round(common.percentile(v, 95) * 1000, 3) for s, v in stages.items()},
        "fts_candidates": {**fts_summary, "mean_rows": round(statistics.fmean(fts_rows), 2)},
        "fts_only": common.summary_ms(fts_only),
        "candidate_step": common.summary_ms(step),
        "overhead_ratio": {"p50": round(compile_summary["p50_ms"] / fts_summary["p50_ms"], 2),
                           "p95": round(compile_summary["p95_ms"] / fts_summary["p95_ms"], 2)},
        "peak_rss_mib_process": common.peak_rss_mib(),
        # other work on the machine skews these figures: the 1-minute load average
        # before and after this size's runs (2 CPUs idle ≈ 0)
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "reference_ts_http": common.REFERENCE.get(n),
    }


def print_tables(results: list[dict], env: dict) -> None:
    print(f"\nIn-process compile, reference workload seed {env['workload_seed']}: max_tokens {env['max_tokens']}, "
          f"{env['tasks']} tasks after {env['warmup_tasks']} warm-up; python {env['python']}, "
          f"SQLite {env['sqlite']}, {env['cpus']} CPUs, tokenizer '{env['tokenizer'].split(':')[0]}'")
    head = ("claims", "build s", "(import", "rebuild)", "snap MB", "p50 ms", "p95 ms", "p99 ms", "items",
            "cands", "FTS p50", "FTS p95", "step p95", "p95 ratio", "ref p50/p95/p99 (TS, HTTP)")
    rows = []
    for r in results:
        b, c, f, ref = r["build"], r["compile"], r["fts_candidates"], r["reference_ts_http"]
        rows.append((f"{r['claims']:,}", f"{b['build_s']:.1f}",
                     f"{b['import_s']:.1f}" + ("*" if b["import_reused"] else ""),
                     f"{b['rebuild_s']:.1f}" + ("*" if b["rebuild_reused"] else "")
                     + ("s" if b.get("rebuild_from_scratch") else ""),
                     f"{b['snapshot_bytes'] / 1e6:.1f}",
                     f"{c['p50_ms']:.1f}", f"{c['p95_ms']:.1f}", f"{c['p99_ms']:.1f}", f"{c['mean_items']:.1f}",
                     f"{c['mean_candidates']:.0f}", f"{f['p50_ms']:.1f}", f"{f['p95_ms']:.1f}",
                     f"{r['candidate_step']['p95_ms']:.1f}", f"{r['overhead_ratio']['p95']:.2f}x",
                     f"{ref['p50_ms']}/{ref['p95_ms']}/{ref['p99_ms']}" if ref else "-"))
    common.print_table(head, rows)
    if any(r["build"]["import_reused"] or r["build"]["rebuild_reused"] for r in results):
        print("* reused from an earlier run (bench/.data): the figure is that run's")
    if any(r["build"].get("rebuild_from_scratch") for r in results):
        print("s rebuilt from scratch, from the kept ledger, after a change to the snapshot code")
    print("\nMean ms per stage (outcome.timings; 'other' = wall minus the stages: request parsing etc.)")
    head = ("claims", *STAGES, "other", "mean wall", "FTS-only p50/p95", "peak RSS MiB", "load 1m")
    rows = []
    for r in results:
        s = r["stages_mean_ms"]
        rows.append((f"{r['claims']:,}", *(f"{s[k]:.2f}" for k in STAGES), f"{s['other']:.2f}",
                     f"{r['compile']['mean_ms']:.2f}",
                     f"{r['fts_only']['p50_ms']:.1f}/{r['fts_only']['p95_ms']:.1f}",
                     f"{r['peak_rss_mib_process']:.0f}",
                     "{:.1f}->{:.1f}".format(*r["loadavg_1m"])))
    common.print_table(head, rows)
    print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="in-process compile p50/p95/p99 on the reference workload")
    parser.add_argument("--sizes", default="10000,50000", help="comma list of corpus sizes (1000, 10000, 50000, …)")
    parser.add_argument("--out", help=f"results file (default {RESULTS_FILE.name}, or {AT_RESULTS_FILE.name} with --at)")
    parser.add_argument("--at", help="compile every task as of this instant (e.g. 2000-01-01T00:00:00Z, before all "
                                     "of the workload's memory: nothing is in scope)")
    args = parser.parse_args(argv)
    sizes = common.parse_sizes(args.sizes)
    workload = common.load_workload()
    env = common.environment(workload)
    out = args.out or str(AT_RESULTS_FILE if args.at else RESULTS_FILE)
    results = [run_size(n, workload, at=args.at) for n in sizes]
    print_tables(results, env)
    common.write_results(Path(out), "compile-inprocess", [{**r, "environment": env} for r in results])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
