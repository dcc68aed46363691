"""What forgetting costs: an erasure's rebuild, and request → complete on the Lambda path.

    .venv/bin/python -m bench.erasure --sizes 10000,50000 --subject-claims 200

For each size n the organization holds the n-claim reference corpus (subject
``bench_subject``, ``bench.common.build_org``) and a second subject,
``user_gone``, with ``--subject-claims`` observations carrying claims, written
one per request, and a few compiled packs and feedback on them.

1. **In process, local store.** After a rebuild that holds everything, the
   erasure of ``user_gone`` is asked (``ErasureDesk.erase_subject``) and the
   next rebuild carries it out: its seconds (ledger purge, apply, FTS merge,
   ``VACUUM``, publish, older generations purged) beside an ordinary
   incremental rebuild applying the same number of new entries, and the
   file size before and after.
2. **The Lambda path**, under bench.freshness's S3 model (``ModelledS3``;
   a version purge costs a listing and a delete) and SQS under moto:
   ``handler.api`` answers the DELETE event, its rebuild request goes
   through the FIFO queue to ``handler.rebuild``, and ``handler.api`` reads
   the erasure ``complete``: the time from the 202 to that answer.

Also the write latency of one observation, in process on the local store
(``--writes`` of them, p50/p95), for comparison with a build from before
erasure existed (run this bench on both).
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (ORG, RESULTS_DIR, ROOT, ModelledS3, build_org, environment, parse_sizes, percentile,
                          print_table, write_results)

EVENTS = ROOT / "infra" / "events"
GONE = "user_gone"


def _observation(i: int) -> dict:
    return {"subject_id": GONE, "kind": "user_statement", "content": f"Gone note {i}: the canary rotation {i}.",
            "visibility": "organization", "source": {"type": "bench", "ref": f"gone#{i}"},
            "claim": {"statement": f"The canary rotation {i} runs weekly.", "kind": "procedural",
                      "confidence": 0.8}}


def _service(store_dir: Path, cache: Path):
    from core.config import Settings
    from core.service import Service
    return Service(Settings.from_env(data_dir=str(store_dir), env={"TITEN_SNAPSHOT_TTL": "0",
                                                                   "TITEN_CACHE_DIR": str(cache)}))


def write_latency(count: int) -> dict:
    """One observation per ``Service.write``, local store, one thread."""
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
        service = _service(Path(tmp) / "store", Path(tmp) / "cache")
        created = service.keys.create("acme", "writer", ["memory:write"], [])
        principal = service.keys.authenticate("Bearer " + created["api_key"])
        seconds = []
        for i in range(count):
            t = time.perf_counter()
            service.write(principal, "POST /v1/observations", {}, _observation(i))
            seconds.append(time.perf_counter() - t)
    return {"p50_ms": statistics.median(seconds) * 1000, "p95_ms": percentile(seconds, 95) * 1000}


def in_process(n: int, subject_claims: int) -> dict:
    from core.erasure.requests import ErasureDesk

    built = build_org(None, n)
    work = Path(tempfile.mkdtemp(prefix=f"titen-erasure-n{n}-", dir=ROOT / "bench"))
    try:
        shutil.copytree(built["data_dir"], work / "store", ignore=shutil.ignore_patterns("cache", ".bench-build.*"))
        service = _service(work / "store", work / "cache")
        created = service.keys.create(ORG, "bench-admin", ["admin"], [])
        principal = service.keys.authenticate("Bearer " + created["api_key"])
        for i in range(subject_claims):
            service.write(principal, "POST /v1/observations", {}, _observation(i))
        first = service.rebuild(ORG)
        for i in range(5):
            service.compiler.compile(principal, {"subject_id": GONE, "task": f"canary rotation {i}",
                                                 "max_tokens": 1200})
        # an ordinary incremental rebuild of as many new entries, for scale
        for i in range(subject_claims):
            service.write(principal, "POST /v1/observations", {}, {**_observation(10_000 + i),
                                                                   "subject_id": "user_kept"})
        ordinary = service.rebuild(ORG)
        t = time.perf_counter()
        asked = ErasureDesk(service.store).erase_subject(principal, GONE)
        ask = time.perf_counter() - t
        erased = service.rebuild(ORG)
        status = service.erasures.status(principal, asked["erasure_id"])
        assert status["status"] == "complete", status
        return {"claims": n, "subject_claims": subject_claims, "ask_ms": ask * 1000,
                "ordinary_rebuild_s": ordinary.seconds, "erasure_rebuild_s": erased.seconds,
                "bytes_before": first.snapshot_bytes, "bytes_after": erased.snapshot_bytes,
                "counts": status["counts"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _http(api, evt: dict, key: str) -> tuple[int, dict]:
    evt["headers"]["authorization"] = f"Bearer {key}"
    response = api.handler(evt, None)
    return response["statusCode"], json.loads(response["body"])


def _event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def lambda_path(n: int, subject_claims: int, latency_ms: float, bandwidth_mbs: float) -> dict:
    """Request → complete through the handlers: the local store under the S3
    model of bench.freshness (``ModelledS3``: every request at least
    ``latency_ms``, bodies at ``bandwidth_mbs``, a version purge one listing
    and one delete), SQS under moto."""
    import boto3
    from moto import mock_aws

    import core.service

    built = build_org(None, n)
    work = Path(tempfile.mkdtemp(prefix="titen-erasure-lambda-", dir=ROOT / "bench"))
    shutil.copytree(built["data_dir"], work / "store", ignore=shutil.ignore_patterns("cache", ".bench-build.*"))
    saved = {k: os.environ.get(k) for k in ("TITEN_STORE", "TITEN_CACHE_DIR", "TITEN_REBUILD_QUEUE_URL",
                                            "TITEN_SNAPSHOT_TTL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    real_open = core.service.open_store
    core.service.open_store = lambda url: ModelledS3(url[len("file://"):], latency_ms / 1000, bandwidth_mbs * 1e6)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "TITEN_STORE": f"file://{work / 'store'}",
                       "TITEN_SNAPSHOT_TTL": "0"})
    try:
        with mock_aws():
            sqs = boto3.client("sqs")
            queue = sqs.create_queue(QueueName="titen-rebuild.fifo",
                                     Attributes={"FifoQueue": "true", "VisibilityTimeout": "960"})["QueueUrl"]
            os.environ["TITEN_REBUILD_QUEUE_URL"] = queue
            os.environ["TITEN_CACHE_DIR"] = str(work / "api-tmp")
            sys.modules.pop("handler.api", None)
            api = importlib.import_module("handler.api")
            os.environ["TITEN_CACHE_DIR"] = str(work / "rebuild-tmp")
            sys.modules.pop("handler.rebuild", None)
            rebuild = importlib.import_module("handler.rebuild")
            from core.keys import KeyRing
            key = KeyRing(api.service.store).create(ORG, "bench", ["admin"], [])["api_key"]
            template = _event("sqs-rebuild.json")["Records"][0]

            def deliver() -> int:
                """Hand the queued messages to the rebuild function; how many."""
                messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                                               AttributeNames=["All"]).get("Messages", [])
                if messages:
                    answer = rebuild.handler({"Records": [{**template, "messageId": m["MessageId"],
                                                           "receiptHandle": m["ReceiptHandle"], "body": m["Body"]}
                                                          for m in messages]}, None)
                    assert answer["batchItemFailures"] == [], answer
                    for m in messages:
                        sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
                return len(messages)

            for i in range(subject_claims):
                evt = _event("observation.json")
                raw = json.dumps(_observation(i)).encode()
                evt["body"], evt["headers"]["content-length"] = base64.b64encode(raw).decode(), str(len(raw))
                status, body = _http(api, evt, key)
                assert status == 201, body
            while deliver():
                pass
            evt = _event("erase-subject.json")
            evt["rawPath"] = evt["requestContext"]["http"]["path"] = f"/v1/subjects/{GONE}"
            t0 = time.perf_counter()
            status, body = _http(api, evt, key)
            assert status == 202, body
            t_ack = time.perf_counter()
            while not deliver():
                pass
            t_rebuilt = time.perf_counter()
            evt = _event("erasure-status.json")
            path = f"/v1/erasures/{body['data']['erasure_id']}"
            evt["rawPath"] = evt["requestContext"]["http"]["path"] = path
            status, done = _http(api, evt, key)
            assert status == 200 and done["data"]["status"] == "complete", done
            t_done = time.perf_counter()
            return {"claims": n, "ask_ms": (t_ack - t0) * 1000, "rebuild_s": t_rebuilt - t_ack,
                    "status_ms": (t_done - t_rebuilt) * 1000, "request_to_complete_s": t_done - t_ack,
                    "counts": done["data"]["counts"]}
    finally:
        core.service.open_store = real_open
        shutil.rmtree(work, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.erasure", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--subject-claims", type=int, default=200)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--no-lambda", action="store_true")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=80.0)
    args = parser.parse_args(argv)
    writes = write_latency(args.writes)
    print(f"write latency (one observation, in process, local store): p50 {writes['p50_ms']:.2f} ms, "
          f"p95 {writes['p95_ms']:.2f} ms")
    rows = []
    for n in parse_sizes(args.sizes):
        r = in_process(n, args.subject_claims)
        rows.append(r)
        print_table(("claims", "erased", "ask ms", "ordinary rebuild s", "erasure rebuild s", "MB before",
                     "MB after", "counts"),
                    [(f"{n:,}", args.subject_claims, f"{r['ask_ms']:.1f}", f"{r['ordinary_rebuild_s']:.2f}",
                      f"{r['erasure_rebuild_s']:.2f}", f"{r['bytes_before'] / 1e6:.1f}",
                      f"{r['bytes_after'] / 1e6:.1f}", json.dumps(r["counts"]))])
    lam = []
    for n in ([] if args.no_lambda else parse_sizes(args.sizes)):
        lam.append(lambda_path(n, args.subject_claims, args.latency_ms, args.bandwidth_mbs))
        lam_n = lam[-1]
        print(f"{n:,} claims, Lambda path (S3 model: >= {args.latency_ms:g} ms per request, {args.bandwidth_mbs:g} MB/s; SQS moto): "
              f"request -> complete {lam_n['request_to_complete_s']:.2f} s (queue hand-off and rebuild "
              f"{lam_n['rebuild_s']:.2f} s, status read {lam_n['status_ms']:.0f} ms; the 202 itself "
              f"{lam_n['ask_ms']:.0f} ms); counts {lam_n['counts']}")
    os.makedirs(RESULTS_DIR, exist_ok=True)
    write_results(RESULTS_DIR / "erasure.json", "erasure", rows, write_latency=writes, lambda_path=lam,
                  environment=environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
