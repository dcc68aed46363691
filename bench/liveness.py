"""Liveness while a rebuild runs: ``/healthz`` latency during ``POST
/v1/admin/rebuild`` of an n-claim organization, against ``titen serve``.

    .venv/bin/python bench/liveness.py              # n = 50000
    .venv/bin/python bench/liveness.py --claims 5000

The reference corpus (``bench/corpus.py``) is imported into a fresh local store
*after* the server started (so its start-up rebuild has nothing to do); then one
thread posts the admin rebuild, which applies all n claims, while this thread
sends ``GET /healthz`` every 10 ms on fresh connections until the rebuild
answers. Each healthz wall time (connect -> last byte) is one sample; printed
as p50/p95/p99/max with the rebuild's duration. Target: p99 <= 50 ms
(docs/architecture.md, "HTTP and errors"). Timings on a shared machine are
noisy; the numbers are what they are.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from bench import corpus  # noqa: E402
from bench.compile import summary_ms  # noqa: E402
from bench.served import Served  # noqa: E402

ORG = "live"


def load_claims(data_dir: str, n: int) -> None:
    from core.config import Settings
    from core.writes.importer import import_file
    from core.keys import Principal
    from core.storage import open_store

    store = open_store(Settings.from_env(data_dir=data_dir).store_url)
    ndjson = os.path.join(data_dir, "import.ndjson")
    with open(ndjson, "w") as f:
        for claim in corpus.generate(n):
            f.write(json.dumps(corpus.to_observation(claim, "user_bench")) + "\n")
    principal = Principal(ORG, "importer", "cli", frozenset({"admin", "memory:write", "memory:verify"}), ())
    import_file(store, principal, ndjson)
    os.unlink(ndjson)


def admin_key(data_dir: str) -> str:
    from core.config import Settings
    from core.keys import KeyRing
    from core.storage import open_store

    store = open_store(Settings.from_env(data_dir=data_dir).store_url)
    return KeyRing(store).create(ORG, "ops", ["admin", "context:compile"], [])["api_key"]


def measure(n: int, data_dir: str, interval: float = 0.01) -> dict:
    """Healthz samples (seconds) taken while an n-claim admin rebuild runs."""
    key = admin_key(data_dir)
    with Served(data_dir) as served:
        load_claims(data_dir, n)
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
