"""Liveness while a rebuild runs: ``/healthz`` latency during ``POST
/v1/admin/rebuild`` of an n-claim organization, against ``titen serve``.

    .venv/bin/python -m bench.liveness              # n = 50000
    .venv/bin/python -m bench.liveness --claims 5000

The reference corpus (``bench.common.import_corpus``) is imported into a
fresh local store *after* the server started (so its start-up rebuild has
nothing to do); then one thread posts the admin rebuild, which applies all n claims, while this thread
sends ``GET /healthz`` every 10 ms on fresh connections until the rebuild
answers. Each healthz wall time (connect -> last byte) is one sample; printed
as p50/p95/p99/max with the rebuild's duration. Target: p99 <= 50 ms
(docs/architecture.md, "HTTP and errors"). Timings on a shared machine are
noisy; the numbers are what they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time

from bench.common import Served, create_key, import_corpus, summary_ms

ORG = "live"
SCOPES = ("admin", "context:compile")


def measure(n: int, data_dir: str, interval: float = 0.01) -> dict:
    """Healthz samples (seconds) taken while an n-claim admin rebuild runs."""
    key = create_key(data_dir, ORG, SCOPES, principal="ops")
    with Served(data_dir) as served:
        import_corpus(data_dir, n, ORG)
        outcome = {}

        def rebuild():
            t0 = time.perf_counter()
            status, _, body = served.request("POST", "/v1/admin/rebuild", b"",
                                             {"authorization": f"Bearer {key}"}, timeout=900)
            outcome.update(status=status, body=json.loads(body), seconds=time.perf_counter() - t0)

        worker = threading.Thread(target=rebuild)
        samples, failures = [], 0
        worker.start()
        while worker.is_alive():
            t0 = time.perf_counter()
            try:
                status, _, _ = served.request("GET", "/healthz", timeout=10)
                if status != 200:
                    failures += 1
            except OSError:
                failures += 1
            samples.append(time.perf_counter() - t0)
            time.sleep(interval)
        worker.join()
    return {"claims": n, "samples": samples, "failures": failures, "rebuild": outcome}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.liveness", description=__doc__.split("\n")[0])
    parser.add_argument("--claims", type=int, default=50000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="titen-liveness-") as data_dir:
        result = measure(args.claims, data_dir)
    rebuild = result["rebuild"]
    stats = summary_ms(result["samples"])
    print(f"claims {result['claims']}: admin rebuild {rebuild['status']} in {rebuild['seconds']:.1f} s "
          f"(entries_applied {rebuild['body']['data'].get('entries_applied')}, "
          f"claim_count {rebuild['body']['data'].get('claim_count')})")
    print(f"/healthz during it: n={stats['n']} p50 {stats['p50_ms']} ms  p95 {stats['p95_ms']} ms  "
          f"p99 {stats['p99_ms']} ms  max {stats['max_ms']} ms  failures {result['failures']}  "
          f"(target p99 <= 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
