"""Compile latency over HTTP: ``titen serve`` on loopback, at concurrency 1 and more.

    .venv/bin/python -m bench.compile_http                # 1000,10000,50000 (+ 100k/342k if built)
    .venv/bin/python -m bench.compile_http --sizes 50000,342000
    .venv/bin/python -m bench.compile_http --sizes 10000 --concurrency 1,4,16

For each size: build or reuse ``bench/.data/n<n>`` (``bench.common.build_org``;
the stores ``bench.load`` builds through the CLI are reused as they are),
create a key with ``titen keys create --org bench --principal bench --scopes
context:compile --json``, start ``titen serve --port P --data-dir DIR`` as a
subprocess (``bench.common.Served``), wait for ``/readyz``, and replay the
workload's 20 warm-up compiles (``max_tokens`` 1200) over one keep-alive
connection. Then, on that same server, each ``--concurrency`` level in turn
(default ``1``):

- **1**: the 200 measured compiles one at a time over ONE persistent
  keep-alive connection (``http.client.HTTPConnection``), in this process.
  Each request's client-side wall time (send → last byte read,
  ``time.perf_counter``) is one sample. After this level the server's peak
  resident memory (``VmHWM`` in ``/proc/<pid>/status``) is read.
- **N > 1**: N client *processes*, each with its own keep-alive connection,
  each replaying the 200 measured tasks once, round-robin from its own
  offset (client k starts at task ``k * 200 // N``), so N × 200 requests in
  all and the clients never ask for the same task at the same moment. Each
  client sends one unmeasured compile first, after all N have started.
  Processes, not threads: a client thread holds the GIL while it encodes
  JSON and parses the answer, so N threads in one interpreter would queue
  behind each other and the client, not the server, would bound throughput
  and inflate latency (the client's share of the 2 CPUs is the same either
  way). Throughput is requests / (last answer − first request, across the
  clients); an error is any answer other than 200 or a failed connection.

Per level: requests, errors, wall seconds, requests/s and p50/p95/p99.

Then, in this process with the server gone, the bare FTS5 candidate query
(``core.compile.retrieval.fts_candidates``: same snapshot file, same
principal, same scope from ``CompileScope.where()``, same MATCH expression)
runs for the same 200 tasks after the same warm-up, and the HTTP compile p95
(concurrency 1) is divided by its p95. ``step p95`` is the candidate step
compile actually runs (``core.compile.retrieval.lexical_candidates``).

Printed beside the reference (TypeScript server, same workload, HTTP loopback,
concurrency 1: 13.0 / 62.6 / 255 ms p95) and the issue's targets (p95 <= 3 /
8 / 25 ms at 1k / 10k / 50k; at >= 50k, p95 <= 1.5x the bare query's p95;
peak RSS at 50k <= 100 MiB), all at concurrency 1. Results are merged (by
size) into ``bench/results/compile-http.json``.

Each compile records a context run in the store's ledger, as in production.

``--embedder SPEC`` (a ``TITEN_EMBEDDER`` value, e.g. ``local:all-MiniLM-L6-v2``)
measures each size twice: lexical only, as above, and with vectors — on a
copy of the built store (``bench/.data/n<n>-<spec>``) that one rebuild with
the embedder has indexed (that first full embed is timed and printed, and
reused on later runs while the embedder's fingerprint and calibration are
the same), served by ``titen serve`` with ``TITEN_EMBEDDER=SPEC``. Task
embedding is inside every measured compile. Printed: both p50/p95/p99 and
the p95 difference against the issue's bound (vectors <= lexical + 15 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import common

RESULTS_FILE = common.RESULTS_DIR / "compile-http.json"
DEFAULT_SIZES = (1000, 10000, 50000)
OPTIONAL_SIZES = (100000, 342000)  # added by default when already built (1M: --sizes)
TARGET_P95_MS = {1000: 3.0, 10000: 8.0, 50000: 25.0}
TARGET_RATIO = 1.5       # HTTP compile p95 / bare FTS5 query p95, at >= 50k
TARGET_RSS_MIB = 100.0   # peak server RSS at 50k
TARGET_VECTOR_P95_EXTRA_MS = 15.0  # with vectors: p95 <= lexical p95 + this (issue #17)
COMPILE = "/v1/context/compile"


def compile_bodies(workload: dict, tasks: list[str]) -> list[str]:
    return [json.dumps({"subject_id": workload["subject_id"], "task": task, "max_tokens": workload["max_tokens"]})
            for task in tasks]


def concurrent_client(port: int, api_key: str, bodies: list[str], warmup_body: str, barrier) -> dict:
    """One client process (``common.run_clients``): its own keep-alive
    connection, its share of the requests; returns its samples (seconds),
    errors and its monotonic start and end."""
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    barrier.wait()  # every client started: connect now (an idle keep-alive is closed after 5 s)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", COMPILE, warmup_body, headers)
    conn.getresponse().read()
    samples, errors = [], []
    start = time.monotonic()
    for body in bodies:
        t0 = time.perf_counter()
        try:
            conn.request("POST", COMPILE, body, headers)
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}: {raw[:200]!r}")
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        samples.append(time.perf_counter() - t0)
    end = time.monotonic()
    conn.close()
    return {"samples": samples, "errors": errors, "start": start, "end": end}


def run_concurrent(port: int, api_key: str, workload: dict, clients: int) -> dict:
    """The 200 measured tasks replayed by each of ``clients`` processes at once."""
    bodies = compile_bodies(workload, workload["tasks"])
    warmup = compile_bodies(workload, workload["warmup_tasks"])
    per_client = []
    for k in range(clients):
        offset = k * len(bodies) // clients
        per_client.append((port, api_key, bodies[offset:] + bodies[:offset], warmup[k % len(warmup)]))
    outs = common.run_clients(concurrent_client, per_client)
    samples = [s for o in outs for s in o["samples"]]
    errors = [e for o in outs for e in o["errors"]]
    wall = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    return {"concurrency": clients, "requests": len(samples), "errors": len(errors), "first_errors": errors[:5],
            "wall_s": round(wall, 3), "requests_per_s": round(len(samples) / wall, 1), **common.summary_ms(samples)}


def vector_store(n: int, spec: str, build: dict, *, progress=common.log) -> tuple[Path, dict]:
    """A copy of the built n-claim store whose snapshot one rebuild with the
    embedder ``spec`` has indexed: (directory, {embed_s, embedded, ...})."""
    import shutil

    from core.config import Settings
    from core.service import Service
    from core.snapshot.pointer import read_pointer

    source = Path(build["data_dir"])
    directory = common.DATA_DIR / f"n{n}-{spec.replace(':', '-')}"
    record_path = directory / ".bench-vectors.json"
    settings = Settings.from_env(data_dir=str(directory), env={"TITEN_EMBEDDER": spec})
    if record_path.exists():
        service = Service(settings)
        pointer, _ = read_pointer(service.store, common.ORG)
        record = json.loads(record_path.read_text())
        if record.get("content_hash") == build.get("content_hash") and pointer:
            if pointer.get("vector") != service.builder(common.ORG)._vector_record("ok"):
                # another index layout or calibration: a rebuild recreates the
                # index from the snapshot's embedding cache, embedding nothing
                t0 = time.perf_counter()
                service.rebuild(common.ORG)
                progress(f"vectors n={n}: index recreated from the embedding cache in "
                         f"{time.perf_counter() - t0:.1f} s")
            return directory, {**record, "cached": True}
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("cache", ".serve-*", ".bench-build.lock"))
    service = Service(settings)
    progress(f"vectors n={n}: first full embed with {spec}")
    t0 = time.perf_counter()
    result = service.rebuild(common.ORG)
    embed_s = time.perf_counter() - t0
    record = {"embedder": spec, "embed_s": round(embed_s, 2), "claims": result.claim_count,
              "snapshot_bytes": result.snapshot_bytes, "content_hash": build.get("content_hash"),
              "measured_at": common.now()}
    record_path.write_text(json.dumps(record, indent=1))
    progress(f"vectors n={n}: rebuild with {spec} (embedding {result.claim_count} claims) took {embed_s:.1f} s, "
             f"snapshot {result.snapshot_bytes / 1e6:.1f} MB")
    return directory, {**record, "cached": False}


def run_size(n: int, workload: dict, levels: list[int], *, progress=common.log, embedder: str | None = None,
             workers: int | None = None) -> dict:
    build = common.build_org(None, n, progress=progress)
    directory = Path(build["data_dir"])
    vectors = None
    env = None
    if embedder:
        directory, vectors = vector_store(n, embedder, build, progress=progress)
        env = {"TITEN_EMBEDDER": embedder}
    cache = directory / "cache"
    before_cache = set(os.listdir(cache)) if cache.exists() else set()
    key = json.loads(subprocess.run(
        [*common.TITEN, "keys", "create", "--org", common.ORG, "--principal", "bench", "--scopes",
         "context:compile", "--json", "--data-dir", str(directory)],
        check=True, capture_output=True, text=True).stdout)
    load_before = os.getloadavg()
    t_start = time.monotonic()
    levels_out: dict[str, dict] = {}
    c1: dict = {}
    with common.Served(directory, start_timeout=600, env=env, extra_args=common.workers_args(workers)) as served:
        served.wait_ready()
        startup_s = time.monotonic() - t_start
        progress(f"http n={n}: server pid {served.pid} ready on :{served.port} after {startup_s:.1f}s")
        headers = {"authorization": f"Bearer {key['api_key']}", "content-type": "application/json"}
        conn = served.connection()

        def compile_one(body: str) -> tuple[float, dict]:
            t0 = time.perf_counter()
            conn.request("POST", COMPILE, body, headers)
            resp = conn.getresponse()
            raw = resp.read()
            wall = time.perf_counter() - t0
            if resp.status != 200:
                raise SystemExit(f"http n={n}: HTTP {resp.status}: {raw[:500]!r}")
            if resp.getheader("connection", "").lower() == "close":
                raise SystemExit("the server closed the keep-alive connection")
            return wall, json.loads(raw)

        for body in compile_bodies(workload, workload["warmup_tasks"]):
            compile_one(body)
        for level in levels:
            if level == 1:
                walls, items, candidates = [], [], []
                t0 = time.monotonic()
                for body in compile_bodies(workload, workload["tasks"]):
                    wall, doc = compile_one(body)
                    walls.append(wall)
                    items.append(len(doc["data"]["items"]))
                    if embedder and doc["meta"]["degraded"]["vector"] != "used":
                        raise SystemExit(f"http n={n}: vector {doc['meta']['degraded']['vector']}, not used")
                    candidates.append(doc["meta"]["candidates"])
                elapsed = time.monotonic() - t0
                memory = common.rss_mib(served.pid)
                c1 = {"walls": walls, "items": items, "candidates": candidates, "memory": memory,
                      "generation": doc["meta"].get("generation")}
                levels_out["1"] = {"concurrency": 1, "requests": len(walls), "errors": 0, "wall_s": round(elapsed, 3),
                                   "requests_per_s": round(len(walls) / elapsed, 1), **common.summary_ms(walls)}
            else:
                conn.close()  # idle while the clients run: the server would close it after 5 s
                progress(f"http n={n}: concurrency {level} ({level} client processes x "
                         f"{len(workload['tasks'])} compiles)")
                levels_out[str(level)] = run_concurrent(served.port, key["api_key"], workload, level)
                conn = served.connection()
            levels_out[str(level)]["server_memory_mib"] = common.rss_mib(served.pid)
            levels_out[str(level)]["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
        conn.close()
    load_after = os.getloadavg()
    # the server's snapshot copies in the cache: it never deletes them on exit
    if cache.exists():
        for name in set(os.listdir(cache)) - before_cache:
            path = cache / name
            if path.is_file() and name.endswith(".sqlite"):
                path.unlink()
    progress(f"http n={n}: bare FTS5 candidate queries (server stopped)")
    fts, step = bare_queries(directory, key["api_key"], workload)
    fts_summary = common.summary_ms(fts)
    result = {
        "claims": n, "measured_at": common.now(), "embedder": embedder, "vectors": vectors,
        "build": {k: build.get(k) for k in ("via", "cached", "import_s", "rebuild_s", "snapshot_bytes",
                                             "claim_count", "generation", "data_dir")},
        "server_startup_s": round(startup_s, 2),
        "fts_candidates": fts_summary,
        "candidate_step": common.summary_ms(step),
        "concurrency": levels_out,
        "workers": workers,
        "loadavg": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "reference_ts_http": common.REFERENCE.get(n),
        "target_p95_ms": TARGET_P95_MS.get(n),
    }
    if c1:
        compile_summary = common.summary_ms(c1["walls"])
        result.update({
            "compile_http": {**compile_summary, "mean_items": round(statistics.fmean(c1["items"]), 2),
                             "mean_candidates": round(statistics.fmean(c1["candidates"]), 2),
                             "min_candidates": min(c1["candidates"]), "generation": c1["generation"]},
            "server_memory_mib": {"peak_rss": c1["memory"].get("VmHWM"), "rss_at_end": c1["memory"].get("VmRSS"),
                                  "largest_process_peak": c1["memory"].get("VmHWM_max"),
                                  "processes": c1["memory"].get("processes")},
            "ratio_p95_http_to_fts": round(compile_summary["p95_ms"] / fts_summary["p95_ms"], 2),
        })
    return result


def bare_queries(directory: Path, api_key: str, workload: dict) -> tuple[list[float], list[float]]:
    """The 200 tasks through fts_candidates and lexical_candidates, on the
    published snapshot file itself (opened read-only, immutable)."""
    from core.compile.planning import plan_query
    from core.compile.retrieval import CompileScope, fts_candidates, lexical_candidates
    from core.instants import canonical, now_utc
    from core.keys import KeyRing
    from core.snapshot.pointer import read_pointer
    from core.snapshot.reader import Snapshot, open_readonly
    from core.storage.local import LocalStore

    store = LocalStore(str(directory))
    pointer, _ = read_pointer(store, common.ORG)
    path = store._path(pointer["snapshot_key"])
    db = open_readonly(path)
    try:
        snapshot = Snapshot(common.ORG, pointer["generation"], pointer, path, db, "")
        principal = KeyRing(store).authenticate("Bearer " + api_key)
        scope = CompileScope(principal, workload["subject_id"], None, canonical(now_utc()))
        where, params = scope.where()
        for task in workload["warmup_tasks"]:
            plan = plan_query(task)
            if plan.match:
                fts_candidates(db, where, params, plan.match)
                lexical_candidates(snapshot, scope, plan)
        fts, step = [], []
        for task in workload["tasks"]:
            plan = plan_query(task)
            t0 = time.perf_counter()
            rows = fts_candidates(db, where, params, plan.match) if plan.match else []
            fts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fast = lexical_candidates(snapshot, scope, plan) if plan.match else []
            step.append(time.perf_counter() - t0)
            assert fast == rows, "the candidate step must equal the FTS5 query"
    finally:
        db.close()
    return fts, step


def print_tables(results: list[dict]) -> None:
    import apsw
    single = [r for r in results if "compile_http" in r]
    if single:
        print(f"\nCompile over HTTP (titen serve, uvicorn, loopback, concurrency 1, one keep-alive connection): "
              f"max_tokens 1200, 200 tasks after 20 warm-up; python {platform.python_version()}, "
              f"SQLite {apsw.sqlite_lib_version()}, {os.cpu_count()} CPUs")
        head = ("claims", "p50 ms", "p95 ms", "p99 ms", "items", "cands", "FTS p95", "step p95", "p95/FTS",
                "peak RSS MiB", "ref p95", "x ref", "target p95", "load 1m")
        rows = []
        for r in single:
            c, ref, target = r["compile_http"], r["reference_ts_http"], r["target_p95_ms"]
            ratio = r["ratio_p95_http_to_fts"]
            rows.append((f"{r['claims']:,}", f"{c['p50_ms']:.1f}", f"{c['p95_ms']:.1f}", f"{c['p99_ms']:.1f}",
                         f"{c['mean_items']:.1f}", f"{c['mean_candidates']:.0f}",
                         f"{r['fts_candidates']['p95_ms']:.1f}", f"{r['candidate_step']['p95_ms']:.1f}",
                         f"{ratio:.2f}x", f"{r['server_memory_mib']['peak_rss']:.0f}",
                         f"{ref['p95_ms']}" if ref else "-",
                         f"{ref['p95_ms'] / c['p95_ms']:.1f}x" if ref else "-",
                         (f"<={target:g} " + ("MET" if c["p95_ms"] <= target else "MISSED")) if target else "-",
                         "{:.1f}->{:.1f}".format(r["loadavg"]["before"][0], r["loadavg"]["after"][0])))
        common.print_table(head, rows)
        for r in single:
            if r["claims"] >= 50000:
                ok = r["ratio_p95_http_to_fts"] <= TARGET_RATIO
                print(f"target at {r['claims']:,}: HTTP p95 <= {TARGET_RATIO}x bare FTS5 p95: "
                      f"{r['ratio_p95_http_to_fts']:.2f}x {'MET' if ok else 'MISSED'}")
            if r["claims"] == 50000:
                rss = r["server_memory_mib"]["peak_rss"]
                print(f"target at 50,000: peak server RSS <= {TARGET_RSS_MIB:.0f} MiB: {rss:.0f} MiB "
                      f"{'MET' if rss <= TARGET_RSS_MIB else 'MISSED'}")
        print("ref = the TypeScript reference server, same workload, HTTP loopback, concurrency 1; "
              "x ref = ref p95 / our p95\n")
    print("By concurrency (same server per size; N > 1: N client processes, each replaying the 200 tasks "
          "from its own offset over its own keep-alive connection)")
    head = ("claims", "clients", "requests", "errors", "wall s", "req/s", "p50 ms", "p95 ms", "p99 ms",
            "server RSS MiB", "load 1m after")
    rows = []
    for r in results:
        for level in r["concurrency"].values():
            rows.append((f"{r['claims']:,}", level["concurrency"], level["requests"], level["errors"],
                         f"{level['wall_s']:.2f}", f"{level['requests_per_s']:.1f}", f"{level['p50_ms']:.1f}",
                         f"{level['p95_ms']:.1f}", f"{level['p99_ms']:.1f}",
                         f"{level['server_memory_mib'].get('VmRSS', 0):.0f}", f"{level['loadavg_1m_after']:.1f}"))
    common.print_table(head, rows)
    for r in results:
        for level in r["concurrency"].values():
            if level["errors"]:
                print(f"{r['claims']:,} at concurrency {level['concurrency']}: {level['errors']} errors, "
                      f"first: {level['first_errors']}")
    print()


def print_vector_comparison(lexical: list[dict], vectors: list[dict]) -> None:
    """Lexical against vectors per size, concurrency 1, and the first full embed."""
    head = ("claims", "lexical p50", "lexical p95", "vectors p50", "vectors p95", "vectors p99", "p95 extra",
            f"target <= +{TARGET_VECTOR_P95_EXTRA_MS:g} ms", "first full embed s")
    rows = []
    for lex, vec in zip(lexical, vectors):
        a, b = lex["compile_http"], vec["compile_http"]
        extra = b["p95_ms"] - a["p95_ms"]
        rows.append((f"{lex['claims']:,}", f"{a['p50_ms']:.1f}", f"{a['p95_ms']:.1f}", f"{b['p50_ms']:.1f}",
                     f"{b['p95_ms']:.1f}", f"{b['p99_ms']:.1f}", f"{extra:+.1f}",
                     "MET" if extra <= TARGET_VECTOR_P95_EXTRA_MS else "MISSED",
                     f"{vec['vectors']['embed_s']:.1f}" + (" (earlier run)" if vec["vectors"]["cached"] else "")))
    common.print_table(head, rows)


def default_sizes() -> list[int]:
    built = [n for n in OPTIONAL_SIZES if (common.store_dir(n) / common.BUILD_RECORD).exists()]
    return [*DEFAULT_SIZES, *built]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_http", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=None,
                        help="comma list (default 1000,10000,50000 plus 100000/342000 when built)")
    parser.add_argument("--concurrency", default="1",
                        help="comma list of client counts, each run on the same server per size (default 1)")
    parser.add_argument("--embedder", default=None,
                        help="a TITEN_EMBEDDER spec: measure each size lexical only and with these vectors")
    parser.add_argument("--out", default=str(RESULTS_FILE))
    parser.add_argument("--workers", type=int, default=None,
                        help="titen serve --workers (default: titen serve's own, the CPU count up to 4)")
    args = parser.parse_args(argv)
    sizes = common.parse_sizes(args.sizes) if args.sizes else default_sizes()
    levels = common.parse_sizes(args.concurrency)
    if not levels or min(levels) < 1:
        parser.error("--concurrency: one or more client counts >= 1")
    workload = common.load_workload()
    start = os.getloadavg()
    results = [run_size(n, workload, levels, workers=args.workers) for n in sizes]
    print_tables(results)
    if args.embedder:
        with_vectors = [run_size(n, workload, levels, embedder=args.embedder, workers=args.workers)
                        for n in sizes]
        print(f"With vectors ({args.embedder}):")
        print_tables(with_vectors)
        print_vector_comparison(results, with_vectors)
        common.write_results(Path(args.out).with_name("compile-http-vectors.json"), "compile-http-vectors",
                             with_vectors, python=platform.python_version(), cpus=os.cpu_count(),
                             embedder=args.embedder)
    print(f"load average (1/5/15 min) before {tuple(round(x, 2) for x in start)}, "
          f"after {tuple(round(x, 2) for x in os.getloadavg())}")
    common.write_results(Path(args.out), "compile-http", results, python=platform.python_version(),
                         cpus=os.cpu_count(),
                         targets={"p95_ms": TARGET_P95_MS, "ratio_at_50k_and_up": TARGET_RATIO,
                                  "peak_rss_mib_at_50k": TARGET_RSS_MIB})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
