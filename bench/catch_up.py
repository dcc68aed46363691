"""What one pass of ``titen serve``'s catch-up costs its supervisor
(``core.serving.catch_up`` → ``Service.catch_up``: for each organization, a
pointer read and a listing of the ledger after the published watermark),
on a local store whose ledger holds n entries.

    .venv/bin/python -m bench.catch_up                    # n = 10000, 100000
    .venv/bin/python -m bench.catch_up --entries 50000 --passes 20

The entries are context runs (``<uuid7>.run.json``, one per compile), the
ones a ledger gathers fastest and the check passes over; a local listing
walks the whole directory whatever the watermark, so the cost grows with
the ledger, and a pass is spaced by at least 20 times its own duration
(``core.serving.CATCH_UP_SHARE``). Prints p50/p95/p99 of a pass and the
share of one core it then takes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from core.config import Settings
from core.ids import new_id
from core.rebuild.backlog import backlog
from core.serving import CATCH_UP_SECONDS, CATCH_UP_SHARE
from core.service import Service
from bench.common import summary_ms


def measure(n: int, passes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="titen-catch-up-") as root:
        service = Service(Settings.from_env(data_dir=root), serves=False)
        service.keys.create("acme", "bench", ["admin"], [])
        service.rebuild("acme")  # a published generation: nothing is due
        ledger = os.path.join(root, "orgs", "acme", "ledger")
        os.makedirs(ledger, exist_ok=True)
        for _ in range(n - len(os.listdir(ledger))):
            with open(os.path.join(ledger, new_id("ctx").split("_", 1)[1] + ".run.json"), "w") as f:
                f.write("{}")
        # the check itself, which raises if it fails (catch_up would log it and go on)
        assert not backlog(service.store, "acme").due
        samples = []
        for _ in range(passes):
            started = time.perf_counter()
            scheduled = service.catch_up()
            samples.append(time.perf_counter() - started)
        assert scheduled == [], scheduled  # runs alone never make a rebuild due
        stats = summary_ms(samples)
        spacing = max(CATCH_UP_SECONDS, CATCH_UP_SHARE * stats["p50_ms"] / 1000)
        return {"ledger_entries": len(os.listdir(ledger)), **stats,
                "share_of_a_core": round(stats["p50_ms"] / 1000 / spacing, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    for n in args.entries:
        print(json.dumps(measure(n, args.passes)), flush=True)


if __name__ == "__main__":
    main()
