"""Cold path of the Lambda API: from `import handler.api` to the first answered compile.

    .venv/bin/python -m bench.cold_path [--claims 50000] [--runs 3]

Two fresh interpreters, because one cannot measure both honestly:

1. **imports** -- a fresh `python -c "import handler.api"` with an s3:// store
   URL and no network traffic (module init builds the Service and its boto3
   client, nothing more). Run `--runs` times; the median is reported.
2. **first invocation** -- a second fresh interpreter starts moto (mock_aws, in
   process, with the same lock tests/conftest.py uses), builds an organization
   of `--claims` claims in the mocked bucket exactly as `titen import` +
   the RebuildFunction would (core.writes.importer.import_file from the
   reference corpus, ``bench.common.generate``, then
   core.snapshot.build.SnapshotBuilder.rebuild), creates a key, then imports
   handler.api and sends it infra/events/compile.json (task and subject from
   the reference workload) through `handler.api.handler`: the first request of
   a new execution environment, with an empty /tmp cache. The store and the
   snapshot reader are wrapped with timers to split that invocation into key
   lookup, pointer GET, snapshot download, sha256, open, first query (FTS5 +
   rank + pack + the HTTP layer) and recording the context run.

moto answers from memory, so its "download" is a memory copy: the table adds
an estimate for real S3 (`--s3-mbps`, default 80 MB/s for one GetObject
stream from Lambda) beside the measured figure. Results are printed and
written to bench/results/cold_path.json.

``--store local`` measures the same path on the embedded LOCAL store instead
(``titen serve``'s store; no moto, no boto3, no mangum):

    .venv/bin/python -m bench.cold_path --store local --claims 50000,342000

For each size the organization is built or reused under ``bench/.data/n<n>``
(``bench.common.build_org``; the CLI-built stores of ``bench.load`` are reused),
a ``context:compile`` key is created, and then ``--runs`` fresh interpreters
(``-X importtime`` off, a NEW empty ``TITEN_CACHE_DIR`` each) each do, timed
from their first line: import ``core.api.app`` and ``core.service`` (starlette,
apsw, the handler.api-equivalent modules), build the ``Service`` and the ASGI
app, and send one ``POST /v1/context/compile`` straight into the ASGI app
(no socket), split into key lookup, snapshot pointer, snapshot fetch (copy
into the cache), sha256, open, first query (FTS5 + rank + pack + HTTP layer)
and recording the context run. The median of each phase over the runs is
printed; the store's files are usually in the OS page cache (a machine that
just built them), so the copy is a memory-speed copy, not a cold disk read.
Target (issue): at 50k, import → first answered compile <= 1 s. Results are
written to bench/results/cold_path_local.json.

``bench.common`` is imported only where it is used, never at the top: the
children are this module run again (``-m bench.cold_path --child``), and
what they import before their first timed line would go unmeasured.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cold_path.json"
BUCKET = "titen-cold-path"
ORG = "bench"

# as the template configures ApiFunction, metrics (EMF on stdout) and request lines included
BASE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "TITEN_STORE": f"s3://{BUCKET}/", "TITEN_SNAPSHOT_TTL": "5",
            "TITEN_METRICS": "emf", "TITEN_METRICS_NAMESPACE": "titen/cold-path"}


def child_env(cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "TITEN_")) and k not in ("PYTHONPATH",)}
    env.update(BASE_ENV)
    env["TITEN_CACHE_DIR"] = cache_dir
    return env


# -- child 1: imports ------------------------------------------------------------------

# ``whole``: handler.api in one go (what Lambda's init does). ``split``: the
# same imports one group at a time, to see where the time goes.
IMPORT_PROBE = """
import json, sys, time
marks = [("start", time.perf_counter())]
if sys.argv[1] == "split":
    import boto3; marks.append(("boto3 + botocore", time.perf_counter()))
    import apsw; marks.append(("apsw", time.perf_counter()))
    import starlette.applications, starlette.routing; marks.append(("starlette", time.perf_counter()))
    import mangum; marks.append(("mangum", time.perf_counter()))
    import core.api.app, core.service; marks.append(("core", time.perf_counter()))
import handler.api
marks.append(("handler.api (Service, S3 client, app)", time.perf_counter()))
print(json.dumps({name: (t - marks[i][1]) * 1000 for i, (name, t) in enumerate(marks[1:])}))
"""


def measure_imports(runs: int, mode: str) -> list[dict]:
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            out = subprocess.run([sys.executable, "-c", IMPORT_PROBE, mode], env=child_env(cache), cwd=ROOT,
                                 check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


# -- child 2: the first invocation -------------------------------------------------------

def first_invocation(args) -> dict:
    """Runs inside the second fresh interpreter (``--child``)."""
    import threading

    import boto3
    from moto import mock_aws
    from moto.core.botocore_stubber import BotocoreStubber

    lock = threading.Lock()
    unlocked = BotocoreStubber.process_request

    def process_request(self, *a, **kw):
        with lock:
            return unlocked(self, *a, **kw)

    BotocoreStubber.process_request = process_request
    from bench import common

    workload = common.load_workload()
    report: dict = {"claims": args.claims}
    with mock_aws(), tempfile.TemporaryDirectory() as work:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        from core.writes.importer import import_file
        from core.keys import KeyRing, Principal
        from core.snapshot.build import SnapshotBuilder
        from core.snapshot.pointer import read_pointer
        from core.storage import open_store

        store = open_store(os.environ["TITEN_STORE"])
        ndjson = Path(work) / "observations.ndjson"
        t = time.perf_counter()
        common.write_observations(ndjson, args.claims, subject_id=workload["subject_id"])
        importer = Principal(ORG, "importer", "cli", frozenset({"admin", "memory:write"}), ())
        imported = import_file(store, importer, str(ndjson))
        report["import_seconds"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        built = SnapshotBuilder(store, ORG, work_dir=str(Path(work) / "build")).rebuild()
        report["rebuild_seconds"] = round(time.perf_counter() - t, 2)
        report["ledger_batches"] = imported["batches_written"]
        pointer, _ = read_pointer(store, ORG)
        report["snapshot_bytes"] = pointer["bytes"]
        report["snapshot_claims"] = pointer["claim_count"]
        assert built.claim_count == args.claims, built
        api_key = KeyRing(store).create(ORG, "agent", ["context:compile"], [])["api_key"]

        # -- the execution environment starts here (deps already loaded by moto) --
        t = time.perf_counter()
        import handler.api as api
        report["import_handler_api_in_this_process_ms"] = (time.perf_counter() - t) * 1000

        import core.snapshot.chain as chain_module
        import core.snapshot.reader as snapshot_module

        spans: dict[str, float] = {}

        def timed(name, fn):
            def run(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    spans[name] = spans.get(name, 0.0) + (time.perf_counter() - t0) * 1000
            return run

        s = api.service.store
        s.get = timed("key_lookup", s.get)  # the only plain GET before the query: keys/<hash>.json
        s.get_if_changed = timed("pointer_get", s.get_if_changed)
        s.download_file = timed("snapshot_download", s.download_file)
        s.put_if_absent = timed("record_context_run", s.put_if_absent)
        snapshot_module.file_sha256 = timed("sha256", snapshot_module.file_sha256)
        # a whole generation is verified by core.snapshot.chain (sha256 and page digests in one pass)
        chain_module.hash_file = timed("sha256", chain_module.hash_file)
        snapshot_module.open_readonly = timed("open", snapshot_module.open_readonly)

        event = json.loads((ROOT / "infra" / "events" / "compile.json").read_text())
        event["headers"]["authorization"] = f"Bearer {api_key}"

        def compile_event(task):
            body = json.dumps({"subject_id": workload["subject_id"], "task": task,
                               "max_tokens": workload["max_tokens"]}).encode()
            return {**event, "body": base64.b64encode(body).decode(),
                    "headers": {**event["headers"], "content-length": str(len(body))}}

        task = workload["tasks"][0]
        t = time.perf_counter()
        response = api.handler(compile_event(task), None)
        total = (time.perf_counter() - t) * 1000
        body = json.loads(response["body"])
        assert response["statusCode"] == 200, body
        report["first_invocation_ms"] = total
        report["spans_ms"] = dict(spans)
        report["first_query_ms"] = total - sum(spans.values())
        report["items"] = len(body["data"]["items"])
        report["candidates"] = body["meta"]["candidates"]
        report["generation"] = body["meta"]["generation"]
        warm = []
        for task in workload["tasks"][1:6]:
            t = time.perf_counter()
            assert api.handler(compile_event(task), None)["statusCode"] == 200
            warm.append((time.perf_counter() - t) * 1000)
        report["warm_invocation_ms_median"] = statistics.median(warm)
    return report


# -- --store local: the embedded store ------------------------------------------------

LOCAL_RESULTS = ROOT / "bench" / "results" / "cold_path_local.json"


def local_child(args) -> dict:
    """A fresh interpreter: imports → Service → one compile through the ASGI app."""
    t_start = time.perf_counter()
    marks: dict[str, float] = {}
    import core.api.app  # noqa: F401  (starlette, apsw, core.*)
    import core.service  # noqa: F401
    marks["imports"] = (time.perf_counter() - t_start) * 1000
    import asyncio

    import core.snapshot.chain as chain_module
    import core.snapshot.reader as snapshot_module
    from core.config import Settings
    from core.api.app import create_app
    from core.service import Service

    t = time.perf_counter()
    service = Service(Settings.from_env(data_dir=args.data_dir))
    app = create_app(service)
    marks["service_and_app"] = (time.perf_counter() - t) * 1000
    spans: dict[str, float] = {}
    depth = [0]

    def timed(name, fn):
        # outermost span only: LocalStore.get_if_changed calls self.get, which
        # must count as the pointer read, not as a key lookup
        def run(*a, **kw):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spans[name] = spans.get(name, 0.0) + (time.perf_counter() - t0) * 1000
        return run

    s = service.store
    s.get = timed("key_lookup", s.get)  # keys/<hash>.json (the pointer is read by get_if_changed)
    s.get_if_changed = timed("pointer_get", s.get_if_changed)
    s.download_file = timed("snapshot_fetch", s.download_file)
    s.put_if_absent = timed("record_context_run", s.put_if_absent)
    snapshot_module.file_sha256 = timed("sha256", snapshot_module.file_sha256)
    chain_module.hash_file = timed("sha256", chain_module.hash_file)
    snapshot_module.open_readonly = timed("open", snapshot_module.open_readonly)
    workload = json.loads(Path(args.workload).read_text())

    def call(task: str) -> tuple[int, dict]:
        body = json.dumps({"subject_id": workload["subject_id"], "task": task,
                           "max_tokens": workload["max_tokens"]}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/context/compile", "raw_path": b"/v1/context/compile",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8787),
                 "headers": [(b"host", b"127.0.0.1:8787"), (b"content-type", b"application/json"),
                             (b"authorization", f"Bearer {args.api_key}".encode()),
                             (b"content-length", str(len(body)).encode())]}
        out = {"status": 0, "body": b""}
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
            elif message["type"] == "http.response.body":
                out["body"] += message.get("body", b"")

        asyncio.run(app(scope, receive, send))
        return out["status"], json.loads(out["body"])

    t = time.perf_counter()
    status, doc = call(workload["tasks"][0])
    first = (time.perf_counter() - t) * 1000
    assert status == 200, doc
    total = (time.perf_counter() - t_start) * 1000
    first_spans = dict(spans)  # the first request's; the warm calls below add to ``spans`` only
    warm = []
    for task in workload["tasks"][1:6]:
        t = time.perf_counter()
        assert call(task)[0] == 200
        warm.append((time.perf_counter() - t) * 1000)
    return {"marks_ms": marks, "spans_ms": first_spans, "first_request_ms": first,
            "first_query_ms": first - sum(first_spans.values()), "total_ms": total,
            "items": len(doc["data"]["items"]), "candidates": doc["meta"]["candidates"],
            "generation": doc["meta"].get("generation"), "warm_ms_median": statistics.median(warm)}


LOCAL_PHASES = (
    ("imports (fresh interpreter: core.api.app, core.service, starlette, apsw)", lambda c: c["marks_ms"]["imports"]),
    ("Service + ASGI app", lambda c: c["marks_ms"]["service_and_app"]),
    ("key lookup (keys/<sha256>.json)", lambda c: c["spans_ms"].get("key_lookup", 0.0)),
    ("snapshot pointer (current.json)", lambda c: c["spans_ms"].get("pointer_get", 0.0)),
    ("snapshot fetch (copy into the cache)", lambda c: c["spans_ms"].get("snapshot_fetch", 0.0)),
    ("snapshot sha256", lambda c: c["spans_ms"].get("sha256", 0.0)),
    ("open (read-only, immutable)", lambda c: c["spans_ms"].get("open", 0.0)),
    ("first query (FTS5/postings, rank, pack, HTTP layer)", lambda c: c["first_query_ms"]),
    ("record context run (ledger entry)", lambda c: c["spans_ms"].get("record_context_run", 0.0)),
)


def local_main(args) -> int:
    from bench import common
    from core.config import Settings
    from core.keys import KeyRing
    from core.storage import open_store

    sizes = common.parse_sizes(str(args.claims))
    results = []
    for n in sizes:
        build = common.build_org(None, n)
        data_dir = build["data_dir"]
        store = open_store(Settings.from_env(data_dir=data_dir).store_url)
        api_key = KeyRing(store).create(common.ORG, "cold-path", ["context:compile"], [])["api_key"]
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                env = {k: v for k, v in os.environ.items() if not k.startswith("TITEN_")}
                env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
                env["TITEN_CACHE_DIR"] = cache
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "bench.cold_path", "--store", "local",
                                       "--child", "--claims", str(n), "--data-dir", data_dir,
                                       "--api-key", api_key, "--workload", str(common.WORKLOAD_PATH)],
                                      env=env, cwd=ROOT, capture_output=True, text=True)
                wall = (time.perf_counter() - t) * 1000
            if proc.returncode:
                sys.stderr.write(proc.stderr)
                return proc.returncode
            child = json.loads(proc.stdout.strip().splitlines()[-1])
            child["process_wall_ms"] = wall
            runs.append(child)
        phases = {name: statistics.median(f(c) for c in runs) for name, f in LOCAL_PHASES}
        results.append({"claims": n, "snapshot_bytes": build["snapshot_bytes"], "runs": runs,
                        "phases_ms_median": {k: round(v, 2) for k, v in phases.items()},
                        "total_ms_median": round(statistics.median(c["total_ms"] for c in runs), 2),
                        "process_wall_ms_median": round(statistics.median(c["process_wall_ms"] for c in runs), 2),
                        "loadavg": os.getloadavg()})
    print(f"cold path, LOCAL store: fresh interpreter → first answered compile (median of {args.runs} runs); "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs")
    names = [name for name, _ in LOCAL_PHASES]
    width = max(len(x) for x in names + ["total: first line of the interpreter to the answered compile"])
    head = f"| {'phase':<{width}} |" + "".join(f" {r['claims']:>9,} |" for r in results)
    print("\n" + head)
    print(f"|{'-' * (width + 2)}|" + "".join(f"{'-' * 10}:|" for _ in results))
    for name in names:
        print(f"| {name:<{width}} |" + "".join(f" {r['phases_ms_median'][name]:>9.1f} |" for r in results))
    print(f"| {'total: first line of the interpreter to the answered compile':<{width}} |"
          + "".join(f" {r['total_ms_median']:>9.1f} |" for r in results))
    print(f"| {'(whole process incl. interpreter start, 5 warm compiles, exit)':<{width}} |"
          + "".join(f" {r['process_wall_ms_median']:>9.1f} |" for r in results))
    print()
    for r in results:
        c = r["runs"][0]
        print(f"{r['claims']:,}: snapshot {r['snapshot_bytes'] / 1e6:.1f} MB; first compile {c['items']} items "
              f"from {c['candidates']} candidates; warm compile median {c['warm_ms_median']:.1f} ms; totals "
              f"per run (ms) {', '.join(format(x['total_ms'], '.0f') for x in r['runs'])}; load 1m "
              f"{r['loadavg'][0]:.2f}")
        if r["claims"] == 50000:
            print(f"target at 50,000: import → first answered compile <= 1000 ms on the local store: "
                  f"{r['total_ms_median']:.0f} ms {'MET' if r['total_ms_median'] <= 1000 else 'MISSED'}")
    out = Path(args.out if args.out != str(RESULTS) else LOCAL_RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "cold-path-local", "python": platform.python_version(),
                               "cpus": os.cpu_count(), "results": results}, indent=1) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


# -- orchestration -------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_path", description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("s3", "local"), default="s3",
                        help="s3: moto (default); local: the embedded store under bench/.data")
    parser.add_argument("--claims", default="50000", help="with --store local: a comma list (50000,342000)")
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--api-key", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=3, help="fresh-interpreter import measurements")
    parser.add_argument("--s3-mbps", type=float, default=80.0, help="S3 GetObject throughput for the estimate")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.store == "local":
        if args.child:
            print(json.dumps(local_child(args)))
            return 0
        return local_main(args)
    args.claims = int(args.claims)
    if args.child:
        print(json.dumps(first_invocation(args)))
        return 0

    imports = [sum(r.values()) for r in measure_imports(args.runs, "whole")]
    split_runs = measure_imports(args.runs, "split")
    split = {name: statistics.median(r[name] for r in split_runs) for name in split_runs[0]}
    print(f"imports measured ({args.runs} fresh interpreters); building {args.claims:,} claims in moto ...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as cache:
        proc = subprocess.run([sys.executable, "-m", "bench.cold_path", "--child",
                               "--claims", str(args.claims)],
                              env=child_env(cache), cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    spans = child["spans_ms"]
    import_ms = statistics.median(imports)
    download_estimate = child["snapshot_bytes"] / (args.s3_mbps * 1e6) * 1000
    rows = [
        ("imports (fresh interpreter: handler.api, core, starlette, mangum, boto3, apsw)", import_ms, import_ms),
        ("key lookup (GET keys/<sha256>.json)", spans.get("key_lookup", 0.0), spans.get("key_lookup", 0.0)),
        ("snapshot pointer (GET current.json)", spans.get("pointer_get", 0.0), spans.get("pointer_get", 0.0)),
        ("snapshot download", spans.get("snapshot_download", 0.0), download_estimate),
        ("snapshot sha256", spans.get("sha256", 0.0), spans.get("sha256", 0.0)),
        ("open (read-only, immutable)", spans.get("open", 0.0), spans.get("open", 0.0)),
        ("first query (FTS5, rank, pack, HTTP layer)", child["first_query_ms"], child["first_query_ms"]),
        ("record context run (PUT ledger entry)", spans.get("record_context_run", 0.0),
         spans.get("record_context_run", 0.0)),
    ]
    total = sum(r[1] for r in rows)
    total_estimate = sum(r[2] for r in rows)
    mb = child["snapshot_bytes"] / 1e6
    lines = [f"cold path: {args.claims:,} claims, snapshot {mb:.1f} MB "
             f"({child['snapshot_claims']:,} claims), Python {platform.python_version()} on "
             f"{platform.machine()}, {os.cpu_count()} CPUs",
             "",
             f"| {'phase':<78} | {'ms (moto)':>10} | {'ms (S3 est.)':>12} |",
             f"|{'-' * 80}|{'-' * 11}:|{'-' * 13}:|"]
    for name, measured, estimate in rows:
        lines.append(f"| {name:<78} | {measured:>10.1f} | {estimate:>12.1f} |")
    lines.append(f"| {'total: import to first answered compile':<78} | {total:>10.1f} | {total_estimate:>12.1f} |")
    lines += ["",
              f"S3 estimate: the download at {args.s3_mbps:.0f} MB/s; other S3 calls as measured on moto "
              f"(real S3 adds ~10-30 ms per request).",
              f"first compile: {child['items']} items from {child['candidates']} candidates, generation "
              f"{child['generation']}; warm compile (same environment) median "
              f"{child['warm_invocation_ms_median']:.1f} ms",
              f"imports per run (ms): {', '.join(f'{x:.0f}' for x in imports)}; split (median ms): "
              + ", ".join(f"{name} {ms:.0f}" for name, ms in split.items()),
              f"setup (not part of the cold path): import {child['import_seconds']} s "
              f"({child['ledger_batches']} batch entries), rebuild {child['rebuild_seconds']} s"]
    print("\n".join(lines))
    result = {"claims": args.claims, "snapshot_bytes": child["snapshot_bytes"],
              "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "imports_ms": imports, "imports_ms_median": import_ms, "imports_split_ms_median": split,
              "phases_ms": {name: round(m, 2) for name, m, _ in rows},
              "phases_ms_s3_estimate": {name: round(e, 2) for name, _, e in rows},
              "total_ms": round(total, 2), "total_ms_s3_estimate": round(total_estimate, 2),
              "s3_mbps_assumed": args.s3_mbps, "child": child}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
