"""Loading memory over HTTP: observations, then consolidations citing them, from
several clients at once, against ``titen serve``; and how long until the last
write is compile-visible.

    .venv/bin/python -m bench.load_http                          # 10,000 claims, 4 clients, both visibility runs
    .venv/bin/python -m bench.load_http --claims 2000 --clients 2 --visibility poll

A fresh store per run in ``bench/.data/load-http/<visibility>-<ns>/``, a key with
``memory:write``, ``admin`` and ``context:compile``, and ``titen serve`` on
loopback (``bench.common.Served``; its rebuild process, a quarter of a
second after writes runs as in local mode, during the load). The first
``--claims`` lines of the reference corpus are dealt to ``--clients`` client
processes in contiguous blocks (client k: lines ``k*N//C`` up to
``(k+1)*N//C``), each with its own keep-alive connection. For each of its
lines a client sends one ``POST /v1/observations`` — the corpus line as an
observation WITHOUT a claim: ``kind`` user_statement, trust asserted,
visibility organization, source ``{type: tool, ref: bench#<i>}`` — and after
every ``--group`` (50) observations one ``POST /v1/consolidations`` carrying
those lines' claims (statement, kind, confidence from the corpus line), each
citing its observation as ``supports`` (a last, shorter group when the block
does not divide). Processes, not threads: see ``bench.common.run_clients``.
Everything is deterministic but the timings: same lines, same bodies, same
order per client.

Reported per run: claims accepted / wall seconds (first request to last
answer, across the clients), requests/s, p50/p95/p99 per route (client-side,
send → last byte), errors (any answer but 201, or a failed connection: must
be 0), the server's peak RSS; then the time from the last answer until the
last write is compile-visible:

- ``poll`` (visible without forcing): ``GET /readyz`` with the key every
  20 ms until its ``claim_count`` is every claim accepted (the server's own
  rebuilds after writes published it), then one compile whose task is the
  statement of the last claim written, which must return that claim;
- ``force``: ``POST /v1/admin/rebuild`` sent at once; its answer time, and the
  same checks after it. It shares the organization's rebuild lock with the
  server's own rebuild after writes, so it first waits for the one running
  when the load ends; the seconds of its own build are printed beside it.

Each needs the store as the load left it, so ``--visibility both`` (the
default) runs the whole load twice, on two fresh stores and servers: first
``poll``, then ``force``. The stores are removed when the bench ends (and
any left over when it starts), never between runs: on this machine's ext4
(no journal) the allocator passes over an inode deleted in the last 60-360
s (``recently_deleted``), so deleting a 20k-file store just before a run
made each of that run's ledger writes slower (11% of all CPU in ``openat``,
perf). Series of runs pass ``--keep-stores`` and clean up afterwards. Printed as a table and merged (by claims, clients
and visibility) into ``bench/results/load-http.json``.

For scale, on this 2-core machine with 4 clients: the TypeScript reference
implementation accepted 830-950 claims/s; titen-lambda was measured at
460-540 before this bench existed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from bench import common

RESULTS_FILE = common.RESULTS_DIR / "load-http.json"
ROUTES = ("observations", "consolidations")
REFERENCE_CLAIMS_PER_S = {"reference (TypeScript)": "830-950", "titen-lambda, earlier measurement": "460-540"}
SCOPES = ("memory:write", "admin", "context:compile")


def client(port: int, api_key: str, subject: str, start: int, stop: int, group: int, barrier) -> dict:
    """One client process (``common.run_clients``): corpus lines ``start`` …
    ``stop - 1``, an observation each, a consolidation after every ``group``."""
    lines = list(common.generate(stop, start))
    bodies = [json.dumps(common.to_observation(line, subject, with_claim=False)) for line in lines]
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    samples: dict[str, list[float]] = {route: [] for route in ROUTES}
    errors: list[str] = []
    accepted = 0
    last_claim = None
    barrier.wait()  # every client started: connect now (an idle keep-alive is closed after 5 s)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(route: str, body: str) -> dict | None:
        nonlocal conn
        t0 = time.perf_counter()
        try:
            conn.request("POST", f"/v1/{route}", body, headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            samples[route].append(time.perf_counter() - t0)
            errors.append(f"{route}: {type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            return None
        samples[route].append(time.perf_counter() - t0)
        if resp.status != 201:
            errors.append(f"{route}: HTTP {resp.status}: {raw[:300]!r}")
            return None
        return json.loads(raw)["data"]

    def consolidate(cited: list[tuple[dict, str]]) -> None:
        nonlocal accepted, last_claim
        if not cited:
            return
        claims = [{**common.to_claim(line), "sources": [{"observation_id": obs_id, "relation": "supports"}]}
                  for line, obs_id in cited]
        data = post("consolidations", json.dumps({"subject_id": subject, "claims": claims}))
        if data is not None:
            accepted += len(data["claim_ids"])
            last_claim = {"claim_id": data["claim_ids"][-1], "statement": cited[-1][0]["statement"]}

    first = time.monotonic()
    cited: list[tuple[dict, str]] = []
    for n, (line, body) in enumerate(zip(lines, bodies), 1):
        data = post("observations", body)
        if data is not None:
            cited.append((line, data["observation_id"]))
        if n % group == 0:
            consolidate(cited)
            cited = []
    consolidate(cited)
    last = time.monotonic()
    conn.close()
    return {"samples": samples, "errors": errors, "accepted": accepted, "observations": len(lines),
            "first": first, "last": last, "last_claim": last_claim}


def wait_visible(served: common.Served, headers: dict, claims: int, timeout: float = 600.0) -> dict:
    """Poll ``GET /readyz`` (with the key: this organization) until it serves ``claims`` claims."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        status, _, raw = served.request("GET", "/readyz", headers=headers, timeout=30)
        polls += 1
        data = json.loads(raw)["data"]
        if status == 200 and data["claim_count"] >= claims:
            return {"claim_count": data["claim_count"], "generation": data["generation"], "polls": polls}
        if time.monotonic() > deadline:
            raise SystemExit(f"not visible after {timeout:.0f} s: /readyz {status} {data}")
        time.sleep(0.02)


def compile_finds(served: common.Served, headers: dict, subject: str, last_claim: dict) -> bool:
    body = json.dumps({"subject_id": subject, "task": last_claim["statement"], "max_tokens": 1200}).encode()
    status, _, raw = served.request("POST", "/v1/context/compile", body, headers)
    if status != 200:
        raise SystemExit(f"compile after the load: HTTP {status}: {raw[:300]!r}")
    return any(item["claim_id"] == last_claim["claim_id"] for item in json.loads(raw)["data"]["items"])


def run(args, visibility: str, progress=common.log) -> dict:
    directory = common.DATA_DIR / "load-http" / f"{visibility}-{time.time_ns()}"
    directory.mkdir(parents=True)
    key = common.create_key(directory, common.ORG, SCOPES)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    subject = common.load_workload()["subject_id"]
    n, c = args.claims, args.clients
    load_before = common.loadavg()
    with common.Served(directory, extra_args=common.workers_args(args.workers)) as served:
        per_client = [(served.port, key, subject, k * n // c, (k + 1) * n // c, args.group) for k in range(c)]
        progress(f"load-http ({visibility}): {n:,} claims, {c} client processes, server pid {served.pid}")
        outs = common.run_clients(client, per_client)
        received = time.monotonic()
        t_first = min(o["first"] for o in outs)
        t_last = max(o["last"] for o in outs)
        last_claim = max(outs, key=lambda o: o["last"])["last_claim"]
        accepted = sum(o["accepted"] for o in outs)
        progress(f"load-http ({visibility}): {accepted:,} claims accepted in {t_last - t_first:.1f} s; "
                 f"waiting until compile-visible")
        if visibility == "poll":
            seen = wait_visible(served, headers, accepted)
            visible_s = time.monotonic() - t_last
            forced = None
        else:
            status, _, raw = served.request("POST", "/v1/admin/rebuild", b"", headers, timeout=600)
            visible_s = time.monotonic() - t_last
            if status != 200:
                raise SystemExit(f"admin rebuild: HTTP {status}: {raw[:300]!r}")
            forced = json.loads(raw)["data"]
            seen = wait_visible(served, headers, accepted, timeout=0)
        found = compile_finds(served, headers, subject, last_claim) if last_claim else False
        memory = common.rss_mib(served.pid)
    errors = [e for o in outs for e in o["errors"]]
    wall = t_last - t_first
    requests = sum(len(o["samples"][r]) for o in outs for r in ROUTES)
    routes = {}
    for route in ROUTES:
        samples = [s for o in outs for s in o["samples"][route]]
        routes[route] = common.summary_ms(samples) if samples else {"n": 0}
    return {
        "key": f"claims={n},clients={c},visibility={visibility}",
        "claims": n, "clients": c, "group": args.group, "visibility": visibility, "workers": args.workers, "measured_at": common.now(),
        "claims_accepted": accepted, "observations_sent": sum(o["observations"] for o in outs),
        "requests": requests, "errors": len(errors), "first_errors": errors[:5],
        "wall_s": round(wall, 3), "claims_per_s": round(accepted / wall, 1),
        "requests_per_s": round(requests / wall, 1),
        "latency": routes,
        "visible_after_last_answer_s": round(visible_s, 3),
        "parent_received_after_last_answer_s": round(received - t_last, 3),
        "visible": {**seen, "last_claim_found_by_compile": found},
        "forced_rebuild": forced,
        "server_memory_mib": {"peak_rss": memory.get("VmHWM"), "rss_at_end": memory.get("VmRSS"),
                              "largest_process_peak": memory.get("VmHWM_max"), "processes": memory.get("processes")},
        "loadavg": {"before": load_before, "after": common.loadavg()},
    }


def print_table(results: list[dict]) -> None:
    print(f"\nHTTP load: titen serve, loopback; observations without claims, then a consolidation per "
          f"{results[0]['group']} of them citing each as supports; python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs")
    head = ("visibility", "claims", "clients", "errors", "wall s", "claims/s", "req/s", "obs p50/p95/p99 ms",
            "cons p50/p95/p99 ms", "visible s", "peak RSS MiB", "load 1m")
    rows = []
    for r in results:
        lat = {route: "/".join(f"{r['latency'][route].get(k, 0):.1f}" for k in ("p50_ms", "p95_ms", "p99_ms"))
               for route in ROUTES}
        rows.append((r["visibility"], f"{r['claims_accepted']:,}", r["clients"], r["errors"], f"{r['wall_s']:.1f}",
                     f"{r['claims_per_s']:.0f}", f"{r['requests_per_s']:.0f}", lat["observations"],
                     lat["consolidations"], f"{r['visible_after_last_answer_s']:.2f}",
                     f"{r['server_memory_mib']['peak_rss']:.0f}",
                     "{:.1f}->{:.1f}".format(r["loadavg"]["before"][0], r["loadavg"]["after"][0])))
    common.print_table(head, rows)
    for r in results:
        v = r["visible"]
        how = (f"forced: POST /v1/admin/rebuild answered {r['visible_after_last_answer_s']:.2f} s after the last "
               f"answer (its rebuild {r['forced_rebuild']['seconds']:.2f} s, "
               f"{r['forced_rebuild']['entries_applied']} entries applied)"
               if r["forced_rebuild"] else
               f"not forced: /readyz served all {v['claim_count']:,} claims {r['visible_after_last_answer_s']:.2f} s "
               f"after the last answer ({v['polls']} polls)")
        print(f"{r['visibility']}: {how}; generation {v['generation']}; last claim returned by compile: "
              f"{v['last_claim_found_by_compile']}")
        if r["errors"]:
            print(f"{r['visibility']}: {r['errors']} ERRORS, first: {r['first_errors']}")
    print("for scale, 4 clients on this machine: "
          + "; ".join(f"{k} {v} claims/s" for k, v in REFERENCE_CLAIMS_PER_S.items()) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_http", description=__doc__.split("\n")[0])
    parser.add_argument("--claims", type=int, default=10000, help="corpus lines to load (default 10000)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--group", type=int, default=50, help="observations per consolidation (1-50, default 50)")
    parser.add_argument("--visibility", choices=("poll", "force", "both"), default="both",
                        help="how the last write is made visible: wait for the server's own rebuild (poll), "
                             "POST /v1/admin/rebuild (force), or one load run each (both, the default)")
    parser.add_argument("--out", default=str(RESULTS_FILE))
    parser.add_argument("--keep-stores", action="store_true",
                        help="leave every run's store in bench/.data/load-http/ (default: removed when the "
                             "bench ends, and any left over removed before it starts)")
    parser.add_argument("--workers", type=int, default=None,
                        help="titen serve --workers (default: titen serve's own, the CPU count up to 4)")
    args = parser.parse_args(argv)
    if not 1 <= args.group <= 50:
        parser.error("--group: 1 to 50 (a consolidation carries at most 50 claims)")
    if args.clients < 1 or args.claims < args.clients:
        parser.error("--clients: at least 1, and at most --claims")
    modes = ["poll", "force"] if args.visibility == "both" else [args.visibility]
    stores = common.DATA_DIR / "load-http"
    if stores.exists() and not args.keep_stores:
        common.log(f"load-http: removing the stores of an earlier run ({stores})")
        shutil.rmtree(stores, ignore_errors=True)
    start = common.loadavg()
    try:
        results = [run(args, mode) for mode in modes]
    finally:
        if not args.keep_stores:
            shutil.rmtree(stores, ignore_errors=True)
    print_table(results)
    print(f"load average (1/5/15 min) before {tuple(start)}, after {tuple(common.loadavg())}")
    common.write_results(Path(args.out), "load-http", results, key="key", environment=common.environment())
    print(f"wrote {args.out}")
    return 0 if all(r["errors"] == 0 and r["claims_accepted"] == args.claims for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
