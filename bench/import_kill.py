"""An import killed with SIGKILL, re-run and rebuilt, stores every line once.

    .venv/bin/python -m bench.import_kill                  # 20,000 lines, 10 kill points
    .venv/bin/python -m bench.import_kill --lines 5000 --points 4

The full-size version of tests/test_import.py, through the real command.
For each of ``--points`` kill points k (spread over the file's 100-line
blocks): a fresh store in ``bench/.data/import-kill/``; ``titen import FILE
--batch-size 500`` as a subprocess, SIGKILLed as soon as k block markers
exist (polled every 2 ms: so it dies between a marker and its entries, or
amid a group's entries); ``titen rebuild``; a re-run with ``--batch-size``
100, 500 or 1000 in turn; ``titen rebuild``; then the claim count must be
exactly the line count and ``titen rebuild --from-scratch`` must report the
same content hash. Then, on the last store: the finished import re-run with
each batch size (nothing written, same count), and, on a fresh store, two
concurrent imports of the file (batch sizes 500 and 100) followed by a
rebuild. Stray ``.tmp-`` files a kill left in the ledger are counted.

Prints one row per kill point (markers at the kill, entries in the ledger
after it, claims after the re-run, hashes equal) and the seconds each step
took (the machine is shared: timings are noisy). Exits non-zero on any
count or hash mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import DATA_DIR, ROOT, TITEN

DATA = DATA_DIR / "import-kill"


def write_file(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "subject_id": "user_bench", "kind": "imported_source", "content": f"imported line {i}",
                "visibility": "organization", "source": {"type": "import", "ref": f"file#{i}"},
                "claim": {"statement": f"imported fact number {i}", "kind": "semantic_fact",
                          "confidence": 0.8}}, separators=(",", ":")) + "\n")


def titen(*args: str) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    proc = subprocess.run([*TITEN, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"titen {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0, [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def count(directory: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(directory)) if directory.exists() else 0


def killed_import(src: Path, data: Path, markers_at_kill: int, batch_size: int) -> tuple[int, float]:
    markers = data / "orgs" / "bench" / "imports"
    t0 = time.perf_counter()
    proc = subprocess.Popen([*TITEN, "import", str(src), "--org", "bench", "--data-dir", str(data),
                             "--batch-size", str(batch_size)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = 0
    while proc.poll() is None:
        seen = count(markers)
        if seen >= markers_at_kill:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    code = proc.wait()
    if code != -signal.SIGKILL:
        raise SystemExit(f"the import finished (exit {code}) before {markers_at_kill} markers existed")
    return count(markers), time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.import_kill", description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--points", type=int, default=10)
    args = parser.parse_args(argv)
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    src = DATA / "in.ndjson"
    write_file(src, args.lines)
    blocks = -(-args.lines // 100)
    points = [max(1, round(blocks * (i + 0.5) / args.points)) for i in range(args.points)]
    sizes = (100, 500, 1000)
    failures = 0
    print(f"# {args.lines} lines ({blocks} blocks of 100); first run --batch-size 500, SIGKILL at k markers; "
          f"load avg {os.getloadavg()[0]:.2f} (shared machine: timings are noisy)")
    print(f"{'point':>5} {'k':>4} {'markers':>7} {'entries':>7} {'tmp':>3} {'rerun bs':>8} {'claims':>7} "
          f"{'hash ok':>7} {'kill s':>6} {'rerun s':>7} {'rebuild s':>9}")
    for n, k in enumerate(points):
        data = DATA / f"p{n}"
        markers, kill_s = killed_import(src, data, k, 500)
        ledger = data / "orgs" / "bench" / "ledger"
        entries = sum(1 for p in ledger.iterdir() if not p.name.startswith(".")) if ledger.exists() else 0
        tmp = sum(1 for p in ledger.iterdir() if p.name.startswith(".tmp-")) if ledger.exists() else 0
        if entries:
            titen("rebuild", "--org", "bench", "--data-dir", str(data))
        bs = sizes[n % 3]
        rerun_s, _ = titen("import", str(src), "--org", "bench", "--data-dir", str(data), "--batch-size", str(bs))
        rebuild_s, out = titen("rebuild", "--org", "bench", "--data-dir", str(data))
        _, scratch = titen("rebuild", "--org", "bench", "--from-scratch", "--data-dir", str(data))
        claims, same = out[-1]["claim_count"], out[-1]["content_hash"] == scratch[-1]["content_hash"]
        failures += claims != args.lines or not same
        print(f"{n:>5} {k:>4} {markers:>7} {entries:>7} {tmp:>3} {bs:>8} {claims:>7} {str(same):>7} "
              f"{kill_s:>6.2f} {rerun_s:>7.2f} {rebuild_s:>9.2f}")
        if n < args.points - 1:
            shutil.rmtree(data)
    last = DATA / f"p{args.points - 1}"
    for bs in sizes:
        _, out = titen("import", str(src), "--org", "bench", "--data-dir", str(last), "--batch-size", str(bs))
        _, rebuilt = titen("rebuild", "--org", "bench", "--data-dir", str(last))
        ok = out[-1]["batches_written"] == 0 and rebuilt[-1]["claim_count"] == args.lines
        failures += not ok
        print(f"finished import re-run with --batch-size {bs}: batches written {out[-1]['batches_written']}, "
              f"claims {rebuilt[-1]['claim_count']} ({'ok' if ok else 'FAIL'})")
    data = DATA / "concurrent"
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*TITEN, "import", str(src), "--org", "bench", "--data-dir", str(data),
                               "--batch-size", str(bs)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for bs in (500, 100)]
    outs = [json.loads(p.communicate()[0].splitlines()[-1]) for p in procs]
    wall = time.perf_counter() - t0
    _, rebuilt = titen("rebuild", "--org", "bench", "--data-dir", str(data))
    _, scratch = titen("rebuild", "--org", "bench", "--from-scratch", "--data-dir", str(data))
    ok = rebuilt[-1]["claim_count"] == args.lines and rebuilt[-1]["content_hash"] == scratch[-1]["content_hash"]
    failures += not ok
    print(f"two concurrent imports (--batch-size 500 and 100) in {wall:.2f} s: batches written "
          f"{[o['batches_written'] for o in outs]}, claims {rebuilt[-1]['claim_count']}, "
          f"from-scratch hash equal: {rebuilt[-1]['content_hash'] == scratch[-1]['content_hash']} "
          f"({'ok' if ok else 'FAIL'})")
    print("ALL OK" if not failures else f"{failures} FAILURES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
