"""Write throughput over HTTP, and what an Idempotency-Key costs per write.

    .venv/bin/python -m bench.writes_http                 # 4 clients, 1000 single writes, 40 batches of 100
    .venv/bin/python -m bench.writes_http --clients 4 --singles 2000 --batches 80

Part 1, over HTTP. A fresh store in ``bench/.data/writes``, a key with
``memory:write``, ``titen serve`` (uvicorn, loopback; its rebuild process
after writes runs as in local mode). ``--clients`` threads, each with its
own keep-alive ``http.client.HTTPConnection``, send (``single`` and
``single+key`` alternating in ``--rounds`` rounds, then ``replay``, then
``batch`` and ``batch+key`` alternating, so no scenario is measured on a
bigger ledger than its partner):

- ``single``: ``POST /v1/observations``, one observation with a claim each;
- ``single+key``: the same with a fresh ``Idempotency-Key`` per request;
- ``replay``: the ``single+key`` requests sent again (every answer a replay);
- ``batch``: ``POST /v1/observations/batch`` with 100 such observations;
- ``batch+key``: the same with a fresh key per request.

Each request's client-side wall time (send -> last byte read) is a sample.
Printed per scenario: requests, observations stored, wall seconds,
requests/s, observations/s and p50/p95/p99 latency, plus the server's peak
RSS. The ledger is counted at the end (one entry per non-replayed request).

Part 2, in process, the store operations a write costs: each scenario runs
through ``Service.write`` on a local store wrapped to count ``get``,
``put_if_absent`` and ``compare_and_swap`` calls, with p50/p95 per write.

Timings on a shared 2-core machine are noisy; the operation counts are exact.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid

from bench import common
from bench.common import summary_ms


def observation(i: int) -> dict:
    return {"subject_id": "user_bench", "kind": "tool_result", "content": f"Smoke run {i} returned 200.",
            "source": {"type": "tool", "ref": f"deploy#{i}"}, "visibility": "organization",
            "claim": {"statement": f"release gate number {i} passed", "kind": "episodic_event",
                      "confidence": 0.9}}


def run_clients(port: int, api_key: str, requests: list[tuple[str, bytes, str | None]], clients: int):
    """Send ``requests`` (path, body, idempotency key) split over ``clients``
    threads; (wall seconds, per-request seconds, statuses, bodies)."""
    samples: list[float] = []
    statuses: list[int] = []
    bodies: list[dict] = []
    lock = threading.Lock()
    share = [requests[i::clients] for i in range(clients)]
    start = threading.Barrier(clients + 1)

    def client(mine):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        local = []
        start.wait()
        for path, body, key in mine:
            headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
            if key:
                headers["Idempotency-Key"] = key
            t0 = time.perf_counter()
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            local.append((time.perf_counter() - t0, resp.status, json.loads(data)))
        conn.close()
        with lock:
            for s, status, answer in local:
                samples.append(s)
                statuses.append(status)
                bodies.append(answer)

    threads = [threading.Thread(target=client, args=(mine,)) for mine in share]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, samples, statuses, bodies


def http_part(args) -> list[dict]:
    directory = common.DATA_DIR / "writes"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    key = common.create_key(directory, "bench", ["memory:write"])
    rows = []
    with common.Served(directory, log_path=str(directory / ".serve.log")) as server:
        port = server.port
        server.wait_ready()
        counter = iter(range(10 ** 9))
        single = [("/v1/observations", json.dumps(observation(next(counter))).encode(), None)
                  for _ in range(args.singles)]
        keyed = [("/v1/observations", json.dumps(observation(next(counter))).encode(), uuid.uuid4().hex)
                 for _ in range(args.singles)]
        batches = [("/v1/observations/batch",
                    json.dumps({"items": [observation(next(counter)) for _ in range(100)]}).encode(), None)
                   for _ in range(args.batches)]
        keyed_batches = [(p, b, uuid.uuid4().hex) for p, b, _ in
                         [("/v1/observations/batch",
                           json.dumps({"items": [observation(next(counter)) for _ in range(100)]}).encode(), None)
                          for _ in range(args.batches)]]
        # single and single+key alternate in rounds (then their replays,
        # then the batches alike), so neither is measured on a bigger
        # ledger (the in-process rebuild after writes grows with it)
        rounds = args.rounds
        plan = []
        for r in range(rounds):
            plan += [("single", single[r::rounds], 1), ("single+key", keyed[r::rounds], 1)]
        plan += [("replay", keyed, 0)]
        for r in range(rounds):
            plan += [("batch", batches[r::rounds], 100), ("batch+key", keyed_batches[r::rounds], 100)]
        # a short warm-up on connections of their own
        run_clients(port, key, [("/v1/observations", json.dumps(observation(-1)).encode(), None)] * 20,
                    args.clients)
        measured: dict[str, dict] = {}
        for name, requests, per_request in plan:
            wall, samples, statuses, bodies = run_clients(port, key, requests, args.clients)
            bad = [s for s in statuses if s >= 300]
            if bad:
                raise SystemExit(f"{name}: {len(bad)} failed requests, e.g. {bad[0]}")
            replays = sum(1 for b in bodies if b["meta"].get("idempotent_replay"))
            if (name == "replay") != (replays == len(requests)) or (name != "replay" and replays):
                raise SystemExit(f"{name}: {replays}/{len(requests)} answers were replays")
            m = measured.setdefault(name, {"requests": 0, "stored": 0, "wall": 0.0, "samples": []})
            m["requests"] += len(requests)
            m["stored"] += per_request * len(requests)
            m["wall"] += wall
            m["samples"] += samples
        for name, m in measured.items():
            rows.append({"scenario": name, "clients": args.clients, "requests": m["requests"],
                         "observations_stored": m["stored"], "wall_s": round(m["wall"], 3),
                         "requests_per_s": round(m["requests"] / m["wall"], 1),
                         "observations_per_s": round(m["stored"] / m["wall"], 1), **summary_ms(m["samples"])})
        rss = common.rss_mib(server.pid)
        ledger = sum(1 for _ in (directory / "orgs" / "bench" / "ledger").iterdir())
        expected = 20 + 2 * args.singles + 2 * args.batches
        rows.append({"server_peak_rss_mib": rss.get("VmHWM"), "ledger_entries": ledger,
                     "ledger_entries_expected": expected})
    return rows


class CountingStore:
    """A local store that counts the operations a write makes."""

    def __init__(self, inner):
        self.inner = inner
        self.counts = {"get": 0, "put_if_absent": 0, "compare_and_swap": 0}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in self.counts:
            def counted(*a, **kw):
                self.counts[name] += 1
                return attr(*a, **kw)
            return counted
        return attr


def in_process_part(n: int) -> list[dict]:
    from core.config import Settings
    from core.service import Service
    from core.storage.local import LocalStore

    with tempfile.TemporaryDirectory() as tmp:
        store = CountingStore(LocalStore(os.path.join(tmp, "store")))
        service = Service(Settings.from_env(data_dir=os.path.join(tmp, "store"), env={}), store=store)
        created = service.keys.create("bench", "bench", ["memory:write"], [])
        principal = service.keys.authenticate("Bearer " + created["api_key"])
        rows = []
        keys = [uuid.uuid4().hex for _ in range(n)]
        plans = [("single", "POST /v1/observations", lambda i: observation(i), lambda i: None),
                 ("single+key", "POST /v1/observations", lambda i: observation(10 ** 6 + i), lambda i: keys[i]),
                 ("replay", "POST /v1/observations", lambda i: observation(10 ** 6 + i), lambda i: keys[i]),
                 ("batch of 100", "POST /v1/observations/batch",
                  lambda i: {"items": [observation(2 * 10 ** 6 + 100 * i + j) for j in range(100)]}, lambda i: None)]
        for name, route, body, key in plans:
            count = n if "batch" not in name else max(1, n // 20)
            bodies = [body(i) for i in range(count)]
            samples = []
            before = dict(store.counts)
            for i in range(count):
                t0 = time.perf_counter()
                outcome = service.write(principal, route, {}, bodies[i], key(i))
                samples.append(time.perf_counter() - t0)
                assert (outcome.replay is True) == (name == "replay")
            per = {k: round((store.counts[k] - before[k]) / count, 2) for k in store.counts}
            rows.append({"scenario": name, "writes": count, **{f"{k}_per_write": v for k, v in per.items()},
                         **summary_ms(samples)})
        return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writes_http", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of each pair of scenarios")
    parser.add_argument("--in-process", type=int, default=500, help="writes per in-process scenario")
    args = parser.parse_args(argv)
    print(f"# writes over HTTP: titen serve, loopback, {args.clients} clients (keep-alive), "
          f"load avg {os.getloadavg()[0]:.2f} at start (shared machine: timings are noisy)")
    rows = http_part(args)
    header = f"{'scenario':<11} {'requests':>8} {'obs':>6} {'wall s':>7} {'req/s':>7} {'obs/s':>8} " \
             f"{'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}"
    print(header)
    for r in rows:
        if "scenario" in r:
            print(f"{r['scenario']:<11} {r['requests']:>8} {r['observations_stored']:>6} {r['wall_s']:>7} "
                  f"{r['requests_per_s']:>7} {r['observations_per_s']:>8} {r['p50_ms']:>7} {r['p95_ms']:>7} "
                  f"{r['p99_ms']:>7}")
        else:
            print(f"server peak RSS {r['server_peak_rss_mib']} MiB; ledger entries {r['ledger_entries']} "
                  f"(expected {r['ledger_entries_expected']}: replays store nothing)")
    print("\n# store operations per write, in process (Service.write on a local store, fsync on)")
    print(f"{'scenario':<13} {'writes':>6} {'get':>5} {'put_if_absent':>13} {'cas':>4} {'p50 ms':>7} {'p95 ms':>7}")
    for r in in_process_part(args.in_process):
        print(f"{r['scenario']:<13} {r['writes']:>6} {r['get_per_write']:>5} {r['put_if_absent_per_write']:>13} "
              f"{r['compare_and_swap_per_write']:>4} {r['p50_ms']:>7} {r['p95_ms']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
