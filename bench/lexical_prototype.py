"""Prototype check: core.lexical.top_candidates against the FTS5 candidate query.

For each size: copy the bench snapshot (bench/.data/n<N>) to /tmp, add the
lex tables (timed; size added), open the copy the way the reader does
(read-only, immutable), then for the reference workload's 200 tasks run both
the FTS5 candidate query (core.retrieval's SQL, same scope) and
top_candidates, compare them exactly (rowids, order, bm25 bit for bit), and
report nearest-rank p50/p95 of each. Both run after the 20 warm-up tasks,
interleaved per task (alternating which goes first) so cache state is shared.

    .venv/bin/python bench/lexical_prototype.py --sizes 1000,10000,50000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import apsw  # noqa: E402

from core import lexical  # noqa: E402
from core.keys import Principal  # noqa: E402
from core.compile.planning import plan_query  # noqa: E402
from core.compile.retrieval import CompileScope, fts_candidates  # noqa: E402

WORKLOAD = Path("/work/shared/bench/reference-workload/workload-seed20260817.json")


def percentile(values, p):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def snapshot_path(n: int) -> Path:
    base = ROOT / "bench" / ".data" / f"n{n}"
    pointer = json.loads((base / "orgs" / "bench" / "snapshots" / "current.json").read_text())
    return base / pointer["snapshot_key"]


def run(n: int, workload: dict, repeat: int) -> dict:
    src = snapshot_path(n)
    work = Path(f"/tmp/lexical-proto-n{n}.sqlite")
    shutil.copyfile(src, work)
    before = os.path.getsize(work)
    db = apsw.Connection(str(work))
    db.execute("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-65536")
    t0 = time.perf_counter()
    with db:
        stats = lexical.build_lexical_index(db)
    build_s = time.perf_counter() - t0
    db.execute("VACUUM")
    db.close()
    after = os.path.getsize(work)
    # the size the lex tables add, against a vacuumed copy without them
    base_copy = Path(f"/tmp/lexical-proto-n{n}-base.sqlite")
    shutil.copyfile(src, base_copy)
    b = apsw.Connection(str(base_copy))
    b.execute("VACUUM")
    b.close()
    base_size = os.path.getsize(base_copy)
    base_copy.unlink()

    db = apsw.Connection(f"file:{work}?immutable=1", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    db.execute("PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY")
    principal = Principal("bench", "principal_bench", "key_bench", frozenset({"context:compile"}), ())
    scope = CompileScope(principal, workload["subject_id"], None, "2030-01-01T00:00:00.000000Z")
    where, params = scope.where()

    def fts(plan):
        return fts_candidates(db, where, params, plan.match)

    def fast(plan):
        return lexical.top_candidates(db, scope.subject_id, where, params, plan.terms)

    for task in workload["warmup_tasks"]:
        plan = plan_query(task)
        if plan.match:
            fts(plan)
            fast(plan)
    t_fts, t_fast, mismatches, fallbacks, max_rel, rows = [], [], 0, 0, 0.0, []
    for rep in range(repeat):
        for i, task in enumerate(workload["tasks"]):
            plan = plan_query(task)
            if not plan.match:
                continue
            runs = [("fts", fts), ("fast", fast)]
            if (i + rep) % 2:
                runs.reverse()
            out = {}
            for name, fn in runs:
                t = time.perf_counter()
                out[name] = fn(plan)
                (t_fts if name == "fts" else t_fast).append(time.perf_counter() - t)
            if rep:
                continue
            ref, got = out["fts"], out["fast"]
            rows.append(len(ref))
            if got is None:
                fallbacks += 1
                continue
            same = [r for r, _ in ref] == [r for r, _ in got] and all(a[1] == b[1] for a, b in zip(ref, got))
            if not same:
                mismatches += 1
            for a, b in zip(ref, got):
                if a[0] == b[0]:
                    max_rel = max(max_rel, abs(a[1] - b[1]) / max(abs(a[1]), 1e-300))
    db.close()
    work.unlink()
    ms = lambda xs, p: round(percentile(xs, p) * 1000, 3)  # noqa: E731
    return {"claims": n, "build_s": round(build_s, 3), **{f"lex_{k}": v for k, v in stats.items()},
            "bytes_base_vacuumed": base_size, "bytes_with_lex_vacuumed": after,
            "bytes_added": after - base_size, "tasks": len(rows), "mean_rows": sum(rows) / len(rows),
            "mismatches": mismatches, "fallbacks": fallbacks, "max_rel_bm25_diff": max_rel,
            "fts_p50_ms": ms(t_fts, 50), "fts_p95_ms": ms(t_fts, 95), "fts_max_ms": ms(t_fts, 100),
            "lex_p50_ms": ms(t_fast, 50), "lex_p95_ms": ms(t_fast, 95), "lex_max_ms": ms(t_fast, 100),
            "samples": len(t_fast)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=1, help="timed passes over the 200 tasks")
    args = parser.parse_args(argv)
    workload = json.loads(WORKLOAD.read_text())
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        r = run(n, workload, args.repeat)
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{'claims':>7} {'build s':>8} {'+MB':>6} {'FTS p50':>8} {'FTS p95':>8} {'lex p50':>8} {'lex p95':>8}"
          f" {'lex max':>8} {'mismatch':>8} {'fallback':>8}")
    for r in results:
        print(f"{r['claims']:>7} {r['build_s']:>8.2f} {r['bytes_added'] / 1e6:>6.1f} {r['fts_p50_ms']:>8.2f}"
              f" {r['fts_p95_ms']:>8.2f} {r['lex_p50_ms']:>8.2f} {r['lex_p95_ms']:>8.2f} {r['lex_max_ms']:>8.2f}"
              f" {r['mismatches']:>8} {r['fallbacks']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
