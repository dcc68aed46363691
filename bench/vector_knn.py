"""The semantic candidate step alone: exact float KNN against the two-pass KNN compile runs.

    .venv/bin/python -m bench.vector_knn --sizes 10000,50000     # after bench.compile_http --embedder ...

On the vector stores ``bench.compile_http --embedder`` leaves
(``bench/.data/n<n>-<spec>``), for the workload's 200 measured tasks
(embedded once, outside the timings), with the bench principal's scope:

- **exact**: ``embedding MATCH`` over the float column, ``k = knn`` — what
  compile ran before issue #17 (with k 100);
- **two-pass**: ``core.vectors.search.VectorSearch.nearest`` (compile's
  KNN, the task already embedded): sign bits in numpy (``SHORTLIST`` × knn,
  ``core.vectors.signs``; read once per generation, before the timings),
  then exact cosines from the embedding cache.

Prints p50/p95/p99 of each and the two-pass recall: the share of the exact
``knn`` nearest that the two-pass search also returns (before the floor),
so what the speed costs in quality is a number, not a guess.
"""

from __future__ import annotations

import argparse
import time

from bench import common


def measure(n: int, spec: str) -> dict:
    from core.compile.retrieval import CompileScope
    from core.config import Settings
    from core.instants import canonical, now_utc
    from core.keys import Principal
    from core.service import Service
    from core.vectors.index import pack_vector, scope_key, subject_key
    from core.vectors.search import SHORTLIST

    directory = common.DATA_DIR / f"n{n}-{spec.replace(':', '-')}"
    service = Service(Settings.from_env(data_dir=str(directory), env={"TITEN_EMBEDDER": spec,
                                                                       "TITEN_SNAPSHOT_TTL": "0"}))
    workload = common.load_workload()
    snapshot = service.reader.current(common.ORG)
    principal = Principal(common.ORG, "bench", "key", frozenset({"context:compile"}), ())
    scope = CompileScope(principal, workload["subject_id"], None, canonical(now_utc()))
    search = service.vectors
    problem = search.problem(snapshot)
    if problem:
        raise SystemExit(f"n={n}: {problem}")
    knn = search.fingerprint.calibration.knn
    vectors = service.embedder.embed(workload["warmup_tasks"] + workload["tasks"])
    warm, measured = vectors[:len(workload["warmup_tasks"])], vectors[len(workload["warmup_tasks"]):]
    exact_sql = ("SELECT rowid FROM claims_vec WHERE embedding MATCH ? AND k = ? AND subject_key = ?"
                 " AND reader_key IN (?, ?)")
    exact_t, two_t, recall = [], [], []
    with snapshot.lease():
        for phase, batch in (("warm", warm), ("measured", measured)):
            for vector in batch:
                t0 = time.perf_counter()
                exact = [r for r, in snapshot.db.execute(exact_sql, (
                    pack_vector(vector), knn, subject_key(common.ORG, workload["subject_id"]), scope_key("org"),
                    scope_key("private:bench")))]
                t1 = time.perf_counter()
                fast = search.nearest(snapshot, scope, vector)
                t2 = time.perf_counter()
                if phase == "measured":
                    exact_t.append(t1 - t0)
                    two_t.append(t2 - t1)
                    recall.append(len(set(exact) & {r for r, _ in fast}) / max(len(exact), 1))
    return {"claims": n, "knn": knn, "shortlist": SHORTLIST * knn, "exact": common.summary_ms(exact_t),
            "two_pass": common.summary_ms(two_t), "recall": sum(recall) / len(recall)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vector_knn", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--embedder", default="local:all-MiniLM-L6-v2")
    args = parser.parse_args(argv)
    rows = [measure(n, args.embedder) for n in common.parse_sizes(args.sizes)]
    head = ("claims", "knn", "shortlist", "exact p50", "exact p95", "exact p99", "two-pass p50", "two-pass p95",
            "two-pass p99", "recall@knn")
    common.print_table(head, [(f"{r['claims']:,}", r["knn"], r["shortlist"], f"{r['exact']['p50_ms']:.2f}",
                               f"{r['exact']['p95_ms']:.2f}", f"{r['exact']['p99_ms']:.2f}",
                               f"{r['two_pass']['p50_ms']:.2f}", f"{r['two_pass']['p95_ms']:.2f}",
                               f"{r['two_pass']['p99_ms']:.2f}", f"{r['recall']:.3f}") for r in rows])
    print(f"load average {tuple(round(x, 2) for x in common.loadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
