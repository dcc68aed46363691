"""Soak: bounded mixed compile + write traffic against ``titen serve`` on
loopback, with rebuilds running, checking that nothing is lost or leaks.

    .venv/bin/python -m bench.soak                     # 10 minutes
    .venv/bin/python -m bench.soak --seconds 180       # shorter

Setup: a fresh local store with ``--claims`` claims of the reference corpus
(``bench.common.import_corpus``) imported, an API key, and ``titen serve`` started on it
(its start-up rebuild publishes generation 1). Then for ``--seconds``:
``--concurrency`` client threads, each on its own keep-alive connection, send
``POST /v1/context/compile`` (a workload task, max_tokens 1200) or, with
probability ``--write-ratio``, ``POST /v1/observations`` with a unique claim;
every ``--rebuild-every`` seconds one more thread sends ``POST
/v1/admin/rebuild`` (and the server's own rebuild after writes runs too).
An error is any answer other than 200/201, or a failed connection.

Printed: latency p50/p95/p99 per kind (client wall time, send -> last byte),
errors (must be 0), the server's RSS a minute in (or after warm-up, for short
runs) and at the end, and the check that every acknowledged write is in the
final generation exactly once (its claim read back through
``GET /v1/claims/{id}/evidence``, and the published snapshot counted for
duplicates). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time

from bench.common import Served, create_key, import_corpus, load_workload, rss_mib, summary_ms

ORG = "live"


class Client:
    def __init__(self, served: Served, key: str):
        self.served, self.headers = served, {"authorization": f"Bearer {key}",
                                             "content-type": "application/json"}
        self.conn = served.connection(timeout=120)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else b""
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            return resp.status, json.loads(resp.read() or b"{}")
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = self.served.connection(timeout=120)
            raise


def soak(seconds: float, concurrency: int, claims: int, write_ratio: float, rebuild_every: float,
         data_dir: str, log_path: str | None = None) -> dict:
    tasks = [t["task"] if isinstance(t, dict) else t for t in load_workload()["tasks"]]
    key = create_key(data_dir, ORG, ("admin", "context:compile"), principal="ops")
    import_corpus(data_dir, claims, ORG)
    with Served(data_dir, log_path=log_path) as served:
        lock = threading.Lock()
        samples = {"compile": [], "write": [], "rebuild": []}
        errors: list[str] = []
        acked: dict[str, str] = {}  # claim_id -> statement
        stop = time.monotonic() + seconds
        rss_start: dict = {}

        def worker(n: int) -> None:
            client, rng, i = Client(served, key), random.Random(n), 0
            while time.monotonic() < stop:
                i += 1
                write = rng.random() < write_ratio
                t0 = time.perf_counter()
                try:
                    if write:
                        statement = f"Soak writer {n} recorded fact {i} about release trains."
                        status, body = client.call("POST", "/v1/observations", {
                            "subject_id": "user_bench", "kind": "tool_result", "content": statement,
                            "source": {"type": "tool", "ref": f"soak#{n}-{i}"}, "visibility": "organization",
                            "claim": {"statement": statement, "kind": "semantic_fact", "confidence": 0.8}})
                    else:
                        status, body = client.call("POST", "/v1/context/compile", {
                            "subject_id": "user_bench", "task": rng.choice(tasks), "max_tokens": 1200})
                except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                    with lock:
                        errors.append(f"{'write' if write else 'compile'}: {type(exc).__name__}")
                    continue
                elapsed = time.perf_counter() - t0
                with lock:
                    samples["write" if write else "compile"].append(elapsed)
                    if status != (201 if write else 200):
                        errors.append(f"{'write' if write else 'compile'}: {status} {body.get('error')}")
                    elif write:
                        acked[body["data"]["claim_id"]] = statement

        def rebuilder() -> None:
            while time.monotonic() + rebuild_every < stop:
                time.sleep(rebuild_every)
                client = Client(served, key)  # fresh: the server closes idle keep-alives after 5 s
                t0 = time.perf_counter()
                try:
                    status, body = client.call("POST", "/v1/admin/rebuild")
                except Exception as exc:  # noqa: BLE001
                    with lock:
                        errors.append(f"rebuild: {type(exc).__name__}")
                    continue
                with lock:
                    samples["rebuild"].append(time.perf_counter() - t0)
                    if status != 200:
                        errors.append(f"rebuild: {status} {body.get('error')}")

        def sample_rss() -> None:
            time.sleep(min(60.0, seconds / 5))
            rss_start.update(rss_mib(served.pid))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
        threads += [threading.Thread(target=rebuilder), threading.Thread(target=sample_rss)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ran = time.monotonic() - started
        rss_end = rss_mib(served.pid)

        # every acknowledged write, in the final generation, exactly once
        client = Client(served, key)
        status, final = client.call("POST", "/v1/admin/rebuild")
        missing = [c for c in acked if client.call("GET", f"/v1/claims/{c}/evidence")[0] != 200]
        from core.config import Settings
        from core.snapshot.pointer import read_pointer
        from core.snapshot.reader import open_readonly
        from core.storage import open_store
        store = open_store(Settings.from_env(data_dir=data_dir).store_url)
        pointer, _ = read_pointer(store, ORG)
        copy = os.path.join(data_dir, "soak-final.sqlite")
        store.download_file(pointer["snapshot_key"], copy)
        db = open_readonly(copy)
        duplicates = db.execute("SELECT count(*) FROM (SELECT statement FROM claims WHERE statement LIKE "
                                "'Soak writer %' GROUP BY statement HAVING count(*) > 1)").fetchone()[0]
        soak_claims = db.execute("SELECT count(*) FROM claims WHERE statement LIKE 'Soak writer %'").fetchone()[0]
        db.close()
    return {"seconds": ran, "concurrency": concurrency, "claims": claims, "samples": samples, "errors": errors,
            "rss_start": rss_start, "rss_end": rss_end, "acked": len(acked), "missing": missing,
            "duplicates": duplicates, "soak_claims": soak_claims, "final_generation": final["data"]["generation"],
            "final_rebuild_status": status}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--claims", type=int, default=5000)
    parser.add_argument("--write-ratio", type=float, default=0.2)
    parser.add_argument("--rebuild-every", type=float, default=10)
    parser.add_argument("--server-log", help="keep the server's log here (default: discarded with the store)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="titen-soak-") as data_dir:
        r = soak(args.seconds, args.concurrency, args.claims, args.write_ratio, args.rebuild_every, data_dir,
                 args.server_log)
    print(f"soak: {r['seconds']:.0f} s, concurrency {r['concurrency']}, {r['claims']} claims imported, "
          f"write ratio {args.write_ratio}, admin rebuild every {args.rebuild_every:g} s")
    for kind in ("compile", "write", "rebuild"):
        if r["samples"][kind]:
            s = summary_ms(r["samples"][kind])
            print(f"  {kind:8} n={s['n']:6}  p50 {s['p50_ms']:8.2f} ms  p95 {s['p95_ms']:8.2f} ms  "
                  f"p99 {s['p99_ms']:8.2f} ms  max {s['max_ms']:8.2f} ms")
    everything = r["samples"]["compile"] + r["samples"]["write"]
    s = summary_ms(everything)
    print(f"  {'all':8} n={s['n']:6}  p50 {s['p50_ms']:8.2f} ms  p95 {s['p95_ms']:8.2f} ms  "
          f"p99 {s['p99_ms']:8.2f} ms  ({s['n'] / r['seconds']:.0f} req/s)")
    print(f"  errors: {len(r['errors'])}" + (f"  first: {r['errors'][:5]}" if r["errors"] else ""))
    print(f"  server RSS: start {r['rss_start'].get('VmRSS')} MiB, end {r['rss_end'].get('VmRSS')} MiB "
          f"(peak {r['rss_end'].get('VmHWM')} MiB)")
    print(f"  acknowledged writes: {r['acked']}; missing from generation {r['final_generation']}: "
          f"{len(r['missing'])}; stored twice: {r['duplicates']}; soak claims in the snapshot: {r['soak_claims']}")
    return 0 if not r["errors"] and not r["missing"] and not r["duplicates"] else 1


if __name__ == "__main__":
    sys.exit(main())
