"""Freshness on Lambda: how long from a write's 201 to a compile that returns it.

Every step goes through the Lambda entry points, as deployed:

    handler.api (observation event) ─► ledger PUT ─► SQS SendMessage (FIFO, group = org)
    ─► receive ─► handler.rebuild (SQS event) ─► bucket wait, rebuild, upload, pointer swap
    ─► the API's next pointer check (TTL phase) ─► download + sha256 ─► handler.api (compile event)

The organization holds the reference corpus of ``--claims`` claims
(``bench.common.build_org``), copied afresh for each size. Each sample writes
one observation whose claim carries a unique marker word, then measures until
a compile for that word returns it. Components:

- ``enqueue``: the write's SendMessage (inside the write's own latency,
  before its 201; not part of ``total``);
- ``queue``: from the 201 until the rebuild function holds the message;
- ``rebuild``: from there to the pointer swap, minus the upload (pointer
  read, ledger listing, apply, index, hash), starting from the file the
  rebuild environment kept from its previous build (a warm environment);
- ``upload``: the new generation's PUT;
- ``ttl``: the API notices the new ``current.json`` at its next check; under
  steady traffic that check comes a uniform fraction of ``TITEN_SNAPSHOT_TTL``
  after the publish, drawn here (``random.uniform(0, ttl)``) and slept;
- ``reader``: the API's download and verification of the generation: the
  deltas after the generation it serves, applied to a copy and checked by
  page digest, or the whole file and its sha256 (core/snapshot/reader.py);
  the bytes published per generation and the bytes the reader downloaded
  are printed beside the table;
- ``compile``: the compile that returns the write (after the reader);
- ``total`` = queue + rebuild + upload + ttl + reader + compile: from the
  201 to the compile that returns the write;
- ``follow_up`` (not in ``total``): what the rebuild function spends after
  the publish when the first listing came before the request's one-second
  bucket closed — waiting for it to close (writes are spread uniformly over
  the bucket) and rebuilding once more; a write folded into the request
  meanwhile is visible after that instead.

The S3 model (stated, not measured): the local store, with every request
taking at least ``--latency-ms`` (default 20 ms, first byte of a same-region
S3 request from Lambda) plus its body at ``--bandwidth-mbs`` (default 80 MB/s,
one stream); an operation already slower on this machine is not slowed
further. A ledger listing pays one latency per 1000 keys. SQS is moto,
in-process, plus ``--sqs-latency-ms`` per call (default 10 ms); the event
source mapping's polling is modelled as immediate (it long-polls).

    .venv/bin/python -m bench.freshness --sizes 10000,50000 --samples 20

Prints p50/p95/p99 (nearest rank, ``bench.common.percentile``) per
component and in total, and the snapshot size; the machine it runs on is
shared and loaded (2 cores), so the CPU-bound parts (rebuild, verify,
compile) are noisy and slower than on a Lambda with its own vCPU.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (ORG, RESULTS_DIR, ROOT, ModelledS3, build_org, load_workload, parse_sizes, percentile,
                          print_table)

EVENTS = ROOT / "infra" / "events"


def _event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def _http(api, name: str, key: str, body: dict) -> tuple[int, dict]:
    evt = _event(name)
    raw = json.dumps(body).encode()
    evt["headers"]["authorization"] = f"Bearer {key}"
    evt["body"], evt["headers"]["content-length"] = base64.b64encode(raw).decode(), str(len(raw))
    response = api.handler(evt, None)
    return response["statusCode"], json.loads(response["body"])


def _sqs_event(messages: list[dict]) -> dict:
    template = _event("sqs-rebuild.json")["Records"][0]
    return {"Records": [{**template, "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                         "body": m["Body"], "attributes": {**template["attributes"], **m["Attributes"]}}
                        for m in messages]}


def run_size(n: int, args) -> dict:
    import boto3
    from moto import mock_aws

    built = build_org(None, n)
    work = Path(tempfile.mkdtemp(prefix=f"titen-freshness-n{n}-"))
    try:
        shutil.copytree(built["data_dir"], work / "store", symlinks=True,
                        ignore=shutil.ignore_patterns("cache", ".bench-build.*"))
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_DEFAULT_REGION": "us-east-1", "TITEN_STORE": f"file://{work / 'store'}",
                           "TITEN_SNAPSHOT_TTL": str(args.ttl)})
        with mock_aws():
            sqs = boto3.client("sqs")
            queue = sqs.create_queue(QueueName="titen-rebuild.fifo",
                                     Attributes={"FifoQueue": "true", "VisibilityTimeout": "960"})["QueueUrl"]
            os.environ["TITEN_REBUILD_QUEUE_URL"] = queue
            import core.service

            stores = []

            def open_modelled(url):
                store = ModelledS3(url[len("file://"):], args.latency_ms / 1000, args.bandwidth_mbs * 1e6)
                stores.append(store)
                return store

            core.service.open_store = open_modelled
            os.environ["TITEN_CACHE_DIR"] = str(work / "api-tmp")
            sys.modules.pop("handler.api", None)
            api = importlib.import_module("handler.api")
            os.environ["TITEN_CACHE_DIR"] = str(work / "rebuild-tmp")
            sys.modules.pop("handler.rebuild", None)
            rebuild = importlib.import_module("handler.rebuild")
            api_store, rebuild_store = stores
            sqs_latency = args.sqs_latency_ms / 1000
            for client in (sqs, api.service.rebuild_queue.client):
                client.meta.events.register("before-send.sqs", lambda **kw: time.sleep(sqs_latency))
            from core.keys import KeyRing

            key = KeyRing(api_store).create(ORG, "bench-agent", ["context:compile", "memory:write"], [])["api_key"]
            subject = load_workload()["subject_id"]

            loads: list[float] = []
            real_load = api.service.reader._load

            def timed_load(org_id, state, pointer):
                t = time.perf_counter()
                try:
                    return real_load(org_id, state, pointer)
                finally:
                    loads.append(time.perf_counter() - t)

            api.service.reader._load = timed_load
            sends: list[float] = []
            real_request = api.service.rebuild_queue.request

            def timed_request(org_id):
                t = time.perf_counter()
                try:
                    return real_request(org_id)
                finally:
                    sends.append(time.perf_counter() - t)

            api.service.writes.on_write = timed_request
            rng = random.Random(n)

            def compile_marker(marker):
                status, body = _http(api, "compile.json", key, {"subject_id": subject, "task": marker,
                                                                 "max_tokens": 1200})
                assert status == 200, body
                return any(marker in item["claim"] for item in body["data"]["items"])

            compile_marker("warmup")  # the API environment loads the current generation
            samples = []
            for i in range(args.warmup + args.samples):
                time.sleep(rng.uniform(0, 1.0))  # a uniform phase within the one-second bucket
                marker = f"freshmark{n}x{i:04d}"
                upload_before = len(rebuild_store.timings.get("upload", []))
                swaps_before = len(rebuild_store.timings.get("pointer_swapped_at", []))
                t0 = time.perf_counter()
                status, body = _http(api, "observation.json", key, {
                    "subject_id": subject, "kind": "user_statement", "content": f"Note {marker}.",
                    "source": {"type": "bench", "ref": marker}, "visibility": "organization",
                    "claim": {"statement": f"The release checklist names {marker}.", "kind": "procedural",
                              "confidence": 0.9}})
                assert status == 201, body
                t_ack = time.perf_counter()
                messages = []
                while not messages:
                    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                                                   AttributeNames=["All"]).get("Messages", [])
                t_rebuild = time.perf_counter()
                line_capture = []
                real_emit = rebuild.runner.emit  # the rebuild function's log lines
                rebuild.runner.emit = line_capture.append
                try:
                    response = rebuild.handler(_sqs_event(messages), None)
                finally:
                    rebuild.runner.emit = real_emit
                assert response["batchItemFailures"] == [], response
                for m in messages:
                    sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
                t_done = time.perf_counter()
                (line,) = line_capture
                assert line["status"] == "published", line
                # the write is served from the first publish on; a follow-up
                # rebuild (its bucket still open at the first listing) runs
                # after it and changes nothing a reader sees unless it publishes
                t_swap = rebuild_store.timings["pointer_swapped_at"][swaps_before]
                upload = rebuild_store.timings["upload"][upload_before]
                ttl_phase = rng.uniform(0, args.ttl)  # the API's next check after the publish
                time.sleep(ttl_phase)
                # the model: the check comes ttl_phase after the publish, whenever
                # the previous one was (a fast rebuild may publish less than a
                # TTL after the last compile's check)
                api.service.reader._state(ORG).checked_at = float("-inf")
                loads_before = len(loads)
                t_check = time.perf_counter()
                assert compile_marker(marker), (f"generation {line['generation']} does not show {marker}: "
                                                f"{api.service.reader.status(ORG)}")
                t_visible = time.perf_counter()
                reader = sum(loads[loads_before:])
                loaded = api.service.reader.status(ORG)["last_load"] or {}
                sample = {"total": (t_swap - t_ack) + ttl_phase + (t_visible - t_check),
                          "enqueue": sends[-1], "queue": t_rebuild - t_ack,
                          "rebuild": (t_swap - t_rebuild) - upload, "upload": upload, "ttl": ttl_phase,
                          "reader": reader, "compile": (t_visible - t_check) - reader, "write": t_ack - t0,
                          "follow_up": t_done - t_swap, "bytes": line["bytes"],
                          "published_bytes": line.get("published_bytes") or 0,
                          "reader_bytes": loaded.get("downloaded_bytes", 0), "reader_road": loaded.get("road")}
                if i >= args.warmup:
                    samples.append(sample)
            return {"n": n, "samples": samples, "snapshot_bytes": samples[-1]["bytes"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for name in ("TITEN_REBUILD_QUEUE_URL", "TITEN_CACHE_DIR", "TITEN_STORE"):
            os.environ.pop(name, None)


COMPONENTS = ("enqueue", "queue", "rebuild", "upload", "ttl", "reader", "compile", "total", "follow_up")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.freshness", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=80.0)
    parser.add_argument("--sqs-latency-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    print(f"S3 model: >= {args.latency_ms:g} ms per request + body at {args.bandwidth_mbs:g} MB/s; "
          f"SQS +{args.sqs_latency_ms:g} ms per call; TTL {args.ttl:g} s; "
          f"{args.samples} samples after {args.warmup} warm-up (seconds; 'total' = write 201 -> compile returns it)")
    results = []
    for n in parse_sizes(args.sizes):
        result = run_size(n, args)
        results.append(result)
        rows = []
        for c in COMPONENTS:
            values = [s[c] for s in result["samples"]]
            rows.append((c, f"{statistics.median(values):.3f}", f"{percentile(values, 95):.3f}",
                         f"{percentile(values, 99):.3f}"))
        print(f"\nclaims {n}: snapshot {result['snapshot_bytes'] / 1e6:.1f} MB; write (201) p50 "
              f"{statistics.median(s['write'] for s in result['samples']) * 1000:.0f} ms")
        published = [s["published_bytes"] / 1e6 for s in result["samples"]]
        downloaded = [s["reader_bytes"] / 1e6 for s in result["samples"]]
        roads = sorted({s["reader_road"] for s in result["samples"]} - {None})
        print(f"published per generation MB p50 {statistics.median(published):.2f} p95 "
              f"{percentile(published, 95):.2f}; reader downloaded MB p50 {statistics.median(downloaded):.2f} "
              f"p95 {percentile(downloaded, 95):.2f} (roads: {', '.join(roads)})")
        print_table(("component", "p50", "p95", "p99"), rows)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    (RESULTS_DIR / "freshness.json").write_text(json.dumps(
        {"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
