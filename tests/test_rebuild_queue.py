"""Freshness on Lambda: a write asks for its organization's rebuild on an SQS
FIFO queue, the rebuild function consumes it, the schedule is the safety net
(docs/architecture.md, "Freshness on Lambda").

S3 and SQS are moto. The handlers are imported afresh inside the mock with
the environment a Lambda would have, and driven with the event files in
infra/events/. SQS's side of the event source mapping — receive a batch,
invoke the function with it, delete what the partial-batch response does
not name — is done by ``deliver`` against the moto queue; everything else
(the queue's FIFO groups, deduplication, visibility timeout and redrive) is
moto's. One difference matters to a reader: moto deduplicates only against
messages still on the queue, real SQS for five minutes after the first send
even once it was deleted; real SQS therefore folds more requests, and
correctness never rests on a request being delivered (the consumer waits for
its bucket to close, and the schedule catches up the rest).
"""

import base64
import importlib
import json
import logging
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from conftest import serialize_moto
from moto import mock_aws

from core.rebuild import queue as rebuild_queue
from core.config import Settings
from core.keys import KeyRing
from core.ledger import Ledger
from core.layout import entry_key
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer
from core.service import Service

EVENTS = Path(__file__).resolve().parent.parent / "infra" / "events"
BUCKET = "titen-freshness-test"
SCOPES = ["context:compile", "context:feedback", "memory:write", "admin"]
TTL = 0.3
VISIBILITY_TIMEOUT = 1
MAX_RECEIVES = 2


class LambdaContext:
    function_name = "titen-rebuild"
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"

    def get_remaining_time_in_millis(self):
        return 900_000


def _fresh_import(name):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def _event(name):
    return json.loads((EVENTS / name).read_text())


@pytest.fixture
def lam(tmp_path, monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "TITEN_STORE": f"s3://{BUCKET}/",
                        "TITEN_SNAPSHOT_TTL": str(TTL)}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_REGION", "AWS_PROFILE", "TITEN_S3_ENDPOINT_URL", "TITEN_EMBEDDER", "TITEN_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    serialize_moto(monkeypatch)
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        sqs = boto3.client("sqs")
        dead = sqs.create_queue(QueueName="titen-rebuild-dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        queue = sqs.create_queue(QueueName="titen-rebuild.fifo", Attributes={
            "FifoQueue": "true", "VisibilityTimeout": str(VISIBILITY_TIMEOUT),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": MAX_RECEIVES})})["QueueUrl"]
        monkeypatch.setenv("TITEN_REBUILD_QUEUE_URL", queue)
        # each function has its own environment (and /tmp) on Lambda
        monkeypatch.setenv("TITEN_CACHE_DIR", str(tmp_path / "api-tmp"))
        api = _fresh_import("handler.api")
        monkeypatch.setenv("TITEN_CACHE_DIR", str(tmp_path / "rebuild-tmp"))
        rebuild = _fresh_import("handler.rebuild")
        keys = KeyRing(api.service.store)
        key = keys.create("demo", "agent", SCOPES, [])["api_key"]
        yield SimpleNamespace(api=api, rebuild=rebuild, key=key, keys=keys, store=api.service.store, sqs=sqs,
                              queue=queue, dead=dead)
    sys.modules.pop("handler.api", None)
    sys.modules.pop("handler.rebuild", None)


def http(lam, name, key=None, **body):
    evt = _event(name)
    evt["headers"]["authorization"] = f"Bearer {key or lam.key}"
    if body:
        raw = json.dumps(body).encode()
        evt["body"] = base64.b64encode(raw).decode()
        evt["headers"]["content-length"] = str(len(raw))
    response = lam.api.handler(evt, LambdaContext())
    return response["statusCode"], json.loads(response["body"])


def observe(lam, statement, key=None):
    status, body = http(lam, "observation.json", key, subject_id="user_rama", kind="tool_result",
                        content=f"Observed: {statement}", source={"type": "tool", "ref": "deploy_456#smoke"},
                        visibility="organization",
                        claim={"statement": statement, "kind": "procedural", "confidence": 0.9})
    assert status == 201, body
    return body["data"]


def compile_items(lam, task, key=None):
    status, body = http(lam, "compile.json", key, subject_id="user_rama", task=task, max_tokens=2000)
    assert status == 200, body
    return [item["claim_id"] for item in body["data"]["items"]], body["meta"].get("generation")


def pending(lam, url=None):
    """Every message on the queue now (received, then made visible again)."""
    messages = lam.sqs.receive_message(QueueUrl=url or lam.queue, MaxNumberOfMessages=10,
                                       AttributeNames=["All"]).get("Messages", [])
    for m in messages:
        lam.sqs.change_message_visibility(QueueUrl=url or lam.queue, ReceiptHandle=m["ReceiptHandle"],
                                          VisibilityTimeout=0)
    return messages


def sqs_event(messages):
    """The event the mapping would invoke with, shaped like infra/events/sqs-rebuild.json."""
    template = _event("sqs-rebuild.json")["Records"][0]
    return {"Records": [{**template, "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                         "body": m["Body"], "md5OfBody": m["MD5OfBody"],
                         "attributes": {**template["attributes"], **m["Attributes"]}} for m in messages]}


def receive(lam):
    return lam.sqs.receive_message(QueueUrl=lam.queue, MaxNumberOfMessages=10,
                                   AttributeNames=["All"]).get("Messages", [])


def deliver(lam, messages):
    """Invoke the rebuild function with one batch and settle it as the event
    source mapping does: delete what succeeded, leave the failures."""
    response = lam.rebuild.handler(sqs_event(messages), LambdaContext())
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    for m in messages:
        if m["MessageId"] not in failed:
            lam.sqs.delete_message(QueueUrl=lam.queue, ReceiptHandle=m["ReceiptHandle"])
    return failed


def rebuild_lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{") and '"event": "rebuild"' in line]


def poison(lam, org_id):
    """An organization whose ledger holds an object no rebuild can apply."""
    lam.keys.create(org_id, "agent", SCOPES, [])
    lam.store.put_if_absent(entry_key(org_id, uuid.uuid4().hex), b"{not json")
    lam.rebuild.queue.request(org_id)


# -- a write asks for its organization's rebuild -------------------------------------

def test_a_write_sends_one_rebuild_request_grouped_by_its_organization(lam):
    data = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    (message,) = pending(lam)
    assert message["Attributes"]["MessageGroupId"] == "demo"
    assert message["Attributes"]["MessageDeduplicationId"].startswith("demo-")
    org_id, not_before = rebuild_queue.parse_request(message["Body"])
    assert org_id == "demo"
    created = time.time()
    assert created - 5 < not_before <= created + rebuild_queue.BUCKET_SECONDS
    assert data["claim_id"].startswith("claim_")


@pytest.mark.parametrize("first, second, same", [
    (1000.0, 1000.99, True),   # one bucket: one deduplication id
    (1000.99, 1001.0, False),  # the next bucket starts a new request
    (1000.0, 1003.5, False),
])
def test_requests_share_a_deduplication_id_exactly_within_one_time_bucket(first, second, same):
    a, b = rebuild_queue.message_for("acme", first), rebuild_queue.message_for("acme", second)
    assert (a["MessageDeduplicationId"] == b["MessageDeduplicationId"]) is same
    assert a["MessageGroupId"] == b["MessageGroupId"] == "acme"


def test_the_queue_folds_requests_of_one_bucket_into_one_message(lam):
    now = time.time()
    for _ in range(3):
        lam.sqs.send_message(QueueUrl=lam.queue, **rebuild_queue.message_for("demo", now))
    lam.sqs.send_message(QueueUrl=lam.queue, **rebuild_queue.message_for("other", now))
    assert sorted(m["Attributes"]["MessageGroupId"] for m in pending(lam)) == ["demo", "other"]


def test_a_failed_enqueue_still_answers_201_logs_one_line_and_counts_it(lam, caplog):
    lam.api.service.rebuild_queue.queue_url = lam.queue.replace("titen-rebuild.fifo", "missing.fifo")
    with caplog.at_level(logging.WARNING, logger="titen.rebuild_queue"):
        data = observe(lam, "Canary must stay green for ten minutes.")
    assert lam.api.service.rebuild_queue.failures == 1 and lam.api.service.rebuild_queue.sent == 0
    (record,) = [r for r in caplog.records if r.name == "titen.rebuild_queue"]
    assert "rebuild request for demo" in record.getMessage() and "not sent" in record.getMessage()
    hex_ = data["observation_id"].split("_", 1)[1]
    assert Ledger(lam.store).read("demo", hex_)["observation"]["observation_id"] == data["observation_id"]
    assert pending(lam) == []


def test_without_a_queue_url_nothing_is_sent_and_titen_serve_keeps_its_in_process_rebuild(tmp_path):
    plain = Service(Settings.from_env(data_dir=str(tmp_path / "a"), env={}))
    assert plain.rebuild_queue is None
    local = Service(Settings.from_env(data_dir=str(tmp_path / "b"),
                                      env={"TITEN_REBUILD_QUEUE_URL": "https://sqs.invalid/q.fifo"}),
                    auto_rebuild=True)
    assert local.rebuild_queue is None and local.writes.on_write == local.schedule_rebuild


# -- the rebuild function consumes the queue ------------------------------------------

def test_a_write_is_compile_visible_through_the_lambda_entry_points(lam):
    data = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    assert compile_items(lam, "must deploy smoke checks pass before release")[0] == []
    messages = receive(lam)
    assert [rebuild_queue.parse_request(m["Body"])[0] for m in messages] == ["demo"]
    assert deliver(lam, messages) == set()
    assert receive(lam) == []  # acknowledged
    time.sleep(TTL)
    items, generation = compile_items(lam, "must deploy smoke checks pass before release")
    assert items == [data["claim_id"]] and generation == 1


def test_two_organizations_in_one_batch_rebuild_independently(lam, capsys):
    demo = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    poison(lam, "broken")
    messages = receive(lam)
    by_org = {rebuild_queue.parse_request(m["Body"])[0]: m["MessageId"] for m in messages}
    assert set(by_org) == {"demo", "broken"}
    capsys.readouterr()
    assert deliver(lam, messages) == {by_org["broken"]}
    lines = {line["org_id"]: line for line in rebuild_lines(capsys)}
    assert lines["demo"]["status"] == "published" and lines["broken"]["status"] == "failed"
    assert read_pointer(lam.store, "demo")[0]["claim_count"] == 1
    assert read_pointer(lam.store, "broken")[0] is None
    time.sleep(TTL)
    assert compile_items(lam, "must deploy smoke checks pass before release")[0] == [demo["claim_id"]]


def test_the_sqs_event_file_drives_the_handler_with_a_partial_batch_response(lam):
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    # its two requests date from 2026-01-01: demo's is rebuilt, "other" is not registered and has no ledger
    response = lam.rebuild.handler(_event("sqs-rebuild.json"), LambdaContext())
    assert response == {"batchItemFailures": []}
    assert read_pointer(lam.store, "demo")[0]["generation"] == 1


class ShortContext(LambdaContext):
    """An invocation near its end: too little time left to build."""

    def get_remaining_time_in_millis(self):
        return 1_000


def test_a_request_already_covered_is_acknowledged_even_with_no_time_left_to_build(lam, capsys):
    # it was deferred: redelivered after the visibility timeout, counted
    # toward the dead-letter queue, though there was nothing to build
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    messages = receive(lam)
    _, not_before = rebuild_queue.parse_request(messages[0]["Body"])
    time.sleep(max(0.0, not_before + rebuild_queue.CLOCK_MARGIN_SECONDS + 0.05 - time.time()))
    lam.rebuild.handler({"org_id": "demo"}, LambdaContext())  # built since, by a listing after the request
    capsys.readouterr()
    response = lam.rebuild.handler(sqs_event(messages), ShortContext())
    assert response == {"batchItemFailures": []}
    assert [line["status"] for line in rebuild_lines(capsys)] == ["covered"]


def test_a_request_not_covered_is_deferred_when_no_time_is_left_to_build(lam, capsys):
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    messages = receive(lam)
    capsys.readouterr()
    response = lam.rebuild.handler(sqs_event(messages), ShortContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}
    assert [line["status"] for line in rebuild_lines(capsys)] == ["deferred"]
    assert read_pointer(lam.store, "demo")[0] is None


def test_a_batch_whose_organizations_cannot_be_listed_is_retried_whole_not_raised(lam, monkeypatch, capsys):
    """The store failing at the start of a batch: a partial-batch answer
    naming every message (SQS retries each), and a failed line per
    organization, not an invocation error."""
    from core.storage import StoreError
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    messages = receive(lam)

    def fails():
        raise StoreError("injected: listing failed")
    monkeypatch.setattr(lam.rebuild.service.ledger, "organizations", fails)
    capsys.readouterr()
    assert deliver(lam, messages) == {m["MessageId"] for m in messages}
    (line,) = rebuild_lines(capsys)
    assert line["status"] == "failed" and "listing the organizations failed" in line["error"]
    monkeypatch.undo()
    assert deliver(lam, messages) == set()  # retried: served
    assert read_pointer(lam.store, "demo")[0]["claim_count"] == 1


@pytest.mark.parametrize("damage", ["no messageId", "not from SQS", "a body nested too deep"])
def test_a_record_that_is_not_an_sqs_message_is_rejected_alone(lam, capsys, damage):
    """Never a schedule pass over every organization, never a KeyError: the
    other records of the event are served."""
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    event = sqs_event(receive(lam))
    odd = dict(event["Records"][0])
    if damage == "no messageId":
        del odd["messageId"]
    elif damage == "not from SQS":
        odd["eventSource"] = "aws:kinesis"
    else:
        odd["body"] = "[" * 100_000 + "]" * 100_000
        odd["messageId"] = "deep"
    capsys.readouterr()
    response = lam.rebuild.handler({"Records": [odd, *event["Records"]]}, LambdaContext())
    assert response == {"batchItemFailures": []}
    lines = rebuild_lines(capsys)
    assert [line["status"] for line in lines] == ["rejected", "published"]
    assert read_pointer(lam.store, "demo")[0]["generation"] == 1


def test_a_request_the_serving_generation_covers_is_acknowledged_without_a_rebuild(lam, capsys):
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    first = receive(lam)
    time.sleep(rebuild_queue.BUCKET_SECONDS + rebuild_queue.CLOCK_MARGIN_SECONDS)  # its bucket closed
    capsys.readouterr()
    assert deliver(lam, first) == set()
    (line,) = rebuild_lines(capsys)
    assert line["status"] == "published" and "waited_seconds" not in line  # listed late enough: one rebuild
    _, etag = read_pointer(lam.store, "demo")
    redelivered = lam.rebuild.handler(sqs_event(first), LambdaContext())  # SQS delivers at least once
    assert redelivered == {"batchItemFailures": []}
    (line,) = rebuild_lines(capsys)
    assert line["status"] == "covered" and line["generation"] == 1
    assert read_pointer(lam.store, "demo")[1] == etag


def test_a_write_folded_into_an_earlier_request_is_still_applied(lam, monkeypatch):
    monkeypatch.setattr(rebuild_queue, "BUCKET_SECONDS", 3.0)
    time.sleep(3.0 - time.time() % 3.0)  # start of a bucket
    started = time.time()
    first = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    messages = receive(lam)  # the request is taken, and its rebuild starts, while its bucket is open
    outcome = {}
    consumer = threading.Thread(target=lambda: outcome.update(failed=deliver(lam, messages)))
    consumer.start()
    time.sleep(0.5)
    second = observe(lam, "Canary must stay green for ten minutes before promotion.")
    assert rebuild_queue.bucket_of(time.time()) == rebuild_queue.bucket_of(started), "machine too slow"
    consumer.join()
    assert len(messages) == 1 and outcome["failed"] == set()
    pointer, _ = read_pointer(lam.store, "demo")
    assert pointer["claim_count"] == 2  # the rebuild listed the ledger after the bucket closed
    assert receive(lam) == []  # the second write's request was folded into the first
    time.sleep(TTL)
    items, _ = compile_items(lam, "deploy smoke checks canary green before promotion")
    assert set(items) == {first["claim_id"], second["claim_id"]}


def test_a_burst_of_1000_writes_costs_one_rebuild_and_every_write_is_in_it(lam, capsys):
    started = time.time()
    claims = [observe(lam, f"Release train {i} needs its smoke run green.")["claim_id"] for i in range(1000)]
    seconds = time.time() - started
    messages_sent = lam.api.service.rebuild_queue.sent
    assert messages_sent == 1000  # every write asked ...
    capsys.readouterr()
    received = 0
    while batch := receive(lam):  # ... SQS kept one message per second of the burst
        received += len(batch)
        assert deliver(lam, batch) == set()
    assert received <= int(seconds / rebuild_queue.BUCKET_SECONDS) + 2
    statuses = [line["status"] for line in rebuild_lines(capsys)]
    print(f"burst of 1000 writes in {seconds:.1f} s: {received} messages, rebuild lines {statuses}")
    # one rebuild publishes all 1000; the requests after it are covered, save
    # at most one whose bucket closed after that rebuild listed the ledger
    # (it finds nothing new: "unchanged")
    assert statuses.count("published") == 1 and statuses.count("unchanged") <= 1
    assert set(statuses) <= {"published", "covered", "unchanged"}
    pointer, _ = read_pointer(lam.store, "demo")
    assert pointer["generation"] == 1 and pointer["claim_count"] == 1000
    time.sleep(TTL)
    compile_items(lam, "release train smoke run")  # the API loads the generation
    snapshot = lam.api.service.reader.current("demo")
    stored = {row[0] for row in snapshot.db.execute("SELECT claim_id FROM claims")}
    assert stored == set(claims)


# -- a killed consumer and a poison organization ---------------------------------------

class Killed(BaseException):
    """The execution environment dies mid-rebuild (timeout, out of memory)."""


def test_a_rebuild_killed_midway_leaves_its_request_to_be_retried(lam):
    data = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    real_store = lam.rebuild.service.store

    class DiesDuringUpload:
        def __getattr__(self, name):
            return getattr(real_store, name)

        def upload_file(self, key, path):
            raise Killed()

    lam.rebuild.service.store = DiesDuringUpload()
    hidden = 4  # seconds: longer than the killed attempt takes on a loaded machine
    lam.sqs.set_queue_attributes(QueueUrl=lam.queue, Attributes={"VisibilityTimeout": str(hidden)})
    messages = receive(lam)
    with pytest.raises(Killed):
        deliver(lam, messages)  # no response: the mapping deletes nothing
    assert read_pointer(real_store, "demo")[0] is None  # nothing published; nothing half-published
    assert receive(lam) == []  # still invisible ...
    lam.rebuild.service.store = real_store
    time.sleep(hidden + 0.2)
    again = receive(lam)  # ... until the visibility timeout expires
    assert [m["MessageId"] for m in again] == [m["MessageId"] for m in messages]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    assert deliver(lam, again) == set()
    assert read_pointer(real_store, "demo")[0]["generation"] == 1
    time.sleep(TTL)
    assert compile_items(lam, "must deploy smoke checks pass before release")[0] == [data["claim_id"]]


def test_a_poison_organization_ends_in_the_dead_letter_queue_and_the_others_are_unaffected(lam):
    poison(lam, "broken")
    demo = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    other_key = lam.keys.create("other", "agent", SCOPES, [])["api_key"]
    other = observe(lam, "Rollbacks need an approved change ticket.", key=other_key)
    failures = []
    for _ in range(MAX_RECEIVES + 2):
        batch = receive(lam)
        if not batch:
            time.sleep(VISIBILITY_TIMEOUT + 0.2)
            batch = receive(lam)
        if batch:
            failures.append({rebuild_queue.parse_request(m["Body"])[0] for m in batch
                             if m["MessageId"] in deliver(lam, batch)})
    assert failures[0] == {"broken"}
    dead = lam.sqs.receive_message(QueueUrl=lam.dead, MaxNumberOfMessages=10).get("Messages", [])
    assert [rebuild_queue.parse_request(m["Body"])[0] for m in dead] == ["broken"]
    assert receive(lam) == []
    assert read_pointer(lam.store, "broken")[0] is None
    assert read_pointer(lam.store, "demo")[0]["claim_count"] == 1
    assert read_pointer(lam.store, "other")[0]["claim_count"] == 1
    time.sleep(TTL)
    assert compile_items(lam, "must deploy smoke checks pass before release")[0] == [demo["claim_id"]]
    assert compile_items(lam, "rollbacks approved change ticket", key=other_key)[0] == [other["claim_id"]]


# -- the schedule is the safety net -------------------------------------------------------

def _count_s3(client):
    calls = []

    def note(model, params, **kw):
        calls.append((model.name, params.get("Key") or params.get("Prefix"), params.get("MaxKeys")))

    client.meta.events.register("before-parameter-build.s3", note)
    return calls


def _feedback(ledger, org_id, suffix=".json"):
    ledger.append(org_id, "feedback", {"feedback_id": "fb_x", "context_id": "ctx_x", "claim_id": None,
                                       "outcome": "used"}, actor="agent", suffix=suffix)


def test_the_schedule_enqueues_only_organizations_with_new_entries_and_reads_no_snapshot(lam, tmp_path):
    store, ledger = lam.store, Ledger(lam.store)
    orgs = [f"org-{i:02d}" for i in range(50)]
    for org_id in orgs:
        ledger.register_organization(org_id)
        _feedback(ledger, org_id)
        # a published generation per organization, as the rebuild leaves it
        SnapshotBuilder(store, org_id, work_dir=str(tmp_path / "seed"), keep_bytes=0).rebuild()
    orgs = ledger.organizations()  # and "demo", registered with no ledger and no generation yet
    assert len(orgs) == 51
    due = {"org-07", "org-23", "org-41"}
    for org_id in due:
        _feedback(ledger, org_id)
    for org_id in ("org-01", "org-02"):  # compiles only: context runs no snapshot needs
        _feedback(ledger, org_id, suffix=".run.json")
    calls = _count_s3(lam.rebuild.service.store.client)
    summary = lam.rebuild.handler(_event("schedule.json"), LambdaContext())
    assert set(summary["enqueued"]) == due and summary["failed"] == []
    assert sorted(summary["unchanged"]) == sorted(set(orgs) - due)
    assert sorted(rebuild_queue.parse_request(m["Body"])[0] for m in pending(lam)) == sorted(due)
    assert not [c for c in calls if c[0] == "GetObject" and c[1].endswith(".sqlite")]
    for org_id in set(orgs) - due:
        mine = [c for c in calls if c[1].startswith(f"orgs/{org_id}/")]
        assert sorted(c[0] for c in mine) == ["GetObject", "ListObjectsV2"], (org_id, mine)
        assert [c[2] for c in mine if c[0] == "ListObjectsV2"] == [1000]  # one request, S3's largest page
    assert [c for c in calls if c[0] == "ListObjectsV2" and c[1] == "organizations/"] != []
    assert len(calls) == 1 + 2 * len(orgs)


def test_the_schedule_catches_up_a_write_whose_request_was_lost(lam):
    lam.api.service.rebuild_queue.queue_url = lam.queue.replace("titen-rebuild.fifo", "missing.fifo")
    data = observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    assert pending(lam) == []
    summary = lam.rebuild.handler(_event("schedule.json"), LambdaContext())
    assert summary["enqueued"] == ["demo"]
    assert deliver(lam, receive(lam)) == set()
    time.sleep(TTL)
    assert compile_items(lam, "must deploy smoke checks pass before release")[0] == [data["claim_id"]]
    # and once applied, the next scheduled run finds nothing due
    assert lam.rebuild.handler(_event("schedule.json"), LambdaContext())["enqueued"] == []


# -- the API notices a new generation within the TTL, off each compile's path ----------------

def test_compiles_within_the_ttl_make_no_s3_call_and_one_after_it_makes_one_conditional_read(lam):
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    assert deliver(lam, receive(lam)) == set()
    compile_items(lam, "deploy smoke")  # loads generation 1
    calls = _count_s3(lam.api.service.store.client)
    lam.api.service.reader.ttl = 60  # (so this machine's speed cannot matter)
    compile_items(lam, "deploy smoke")
    compile_items(lam, "deploy smoke")
    assert [c for c in calls if c[1].endswith("current.json")] == []
    lam.api.service.reader.ttl = TTL
    time.sleep(TTL)
    compile_items(lam, "deploy smoke")
    assert [c[0] for c in calls if c[1].endswith("current.json")] == ["GetObject"]
    assert not [c for c in calls if c[1].endswith(".sqlite")]  # unchanged: not downloaded again


def test_a_message_that_is_not_a_rebuild_request_is_dropped_not_retried(lam, capsys):
    observe(lam, "Deploy smoke checks must pass before a release is promoted.")
    evt = _event("sqs-rebuild.json")
    evt["Records"][1]["body"] = '{"org_id": "../../etc", "not_before": "2026-01-01T00:00:01Z"}'
    capsys.readouterr()
    assert lam.rebuild.handler(evt, LambdaContext()) == {"batchItemFailures": []}
    lines = rebuild_lines(capsys)
    assert [line["status"] for line in lines if "message_id" in line] == ["rejected"]
    assert read_pointer(lam.store, "demo")[0]["generation"] == 1


def test_a_request_for_an_organization_no_one_registered_is_dropped_and_builds_nothing(lam, capsys):
    """As a direct invoke refuses it: a stray message (the event file's
    "other", a dev bucket) must not create an organization's snapshots."""
    capsys.readouterr()
    assert lam.rebuild.handler(_event("sqs-rebuild.json"), LambdaContext()) == {"batchItemFailures": []}
    lines = {line["org_id"]: line for line in rebuild_lines(capsys) if "org_id" in line}
    assert lines["other"]["status"] == "rejected" and "no organization 'other'" in lines["other"]["error"]
    assert read_pointer(lam.store, "other")[0] is None
    assert not list(lam.store.list_keys("orgs/other/"))


def test_a_request_dated_in_the_future_waits_no_longer_than_one_bucket():
    """``not_before`` is the end of the bucket the write fell in: never more
    than a bucket ahead. A message claiming a later instant must not hold
    its organization's message group (and the invocation) until then."""
    slept = []
    rebuild_queue.wait_for_bucket(time.time() + 10**9, sleep=slept.append)
    assert 0 < sum(slept) <= rebuild_queue.BUCKET_SECONDS + rebuild_queue.CLOCK_MARGIN_SECONDS


def test_organizations_in_one_batch_rebuild_at_the_same_time(lam, monkeypatch):
    """One organization's follow-up wait (or slow rebuild) must not hold up
    the others in its batch: each runs on its own thread."""
    import threading
    for org in ("alpha", "beta"):
        key = lam.keys.create(org, "agent", SCOPES, [])["api_key"]
        observe(lam, f"{org} deploys need a smoke check.", key=key)
    both = threading.Barrier(2, timeout=10)
    met: set[str] = set()
    runner = lam.rebuild.runner
    inner = runner.rebuild_one

    def meeting(org_id, from_scratch):
        # each organization's first rebuild returns only when the other's has
        # started too; a follow-up rebuild (a write its first one did not
        # cover, on a loaded machine) passes: the barrier has no second party for it
        if org_id not in met:
            met.add(org_id)
            both.wait()
        return inner(org_id, from_scratch)

    monkeypatch.setattr(runner, "rebuild_one", meeting)
    messages = receive(lam)
    assert sorted(rebuild_queue.parse_request(m["Body"])[0] for m in messages) == ["alpha", "beta"]
    assert deliver(lam, messages) == set()
    assert all(read_pointer(lam.store, org)[0]["generation"] >= 1 for org in ("alpha", "beta"))


# -- an erasure on the Lambda path ------------------------------------------------------

def test_an_erasure_asked_through_the_api_is_carried_out_by_the_queued_rebuild(lam):
    boto3.client("s3").put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    # a code with letters past f: no id, hash or ETag in an object can spell it by chance
    # (a digits-only code was once found inside an erasure id's hex)
    observe(lam, "The harbour gate code is kestrelquay.")
    deliver(lam, receive(lam))
    assert compile_items(lam, "harbour gate code")[0]
    evt = _event("erase-subject.json")
    evt["headers"]["authorization"] = f"Bearer {lam.key}"
    asked = lam.api.handler(evt, LambdaContext())
    assert asked["statusCode"] == 202, asked["body"]
    erasure_id = json.loads(asked["body"])["data"]["erasure_id"]
    (message,) = receive(lam)  # the request asked for the organization's rebuild, like a write
    assert json.loads(message["Body"])["org_id"] == "demo"
    assert deliver(lam, [message]) == set()
    evt = _event("erasure-status.json")
    evt["headers"]["authorization"] = f"Bearer {lam.key}"
    for field in (evt, evt["requestContext"]["http"]):
        key = "rawPath" if field is evt else "path"
        field[key] = field[key].replace("REPLACE_WITH_ERASURE_ID", erasure_id)
    status = lam.api.handler(evt, LambdaContext())
    assert status["statusCode"] == 200
    done = json.loads(status["body"])["data"]
    assert done["status"] == "complete" and done["counts"]["claims"] == 1
    time.sleep(TTL)
    assert compile_items(lam, "harbour gate code")[0] == []
    s3 = boto3.client("s3")
    for version in s3.list_object_versions(Bucket=BUCKET).get("Versions", []):
        body = s3.get_object(Bucket=BUCKET, Key=version["Key"], VersionId=version["VersionId"])["Body"].read()
        assert b"kestrelquay" not in body, version["Key"]


def test_lines_written_from_a_batchs_threads_stay_whole_json(lam, capsys):
    """Ten organizations of one batch write their lines at the same time:
    each stays one line of JSON (CloudWatch Logs Insights parses them)."""
    from core.rebuild.runner import print_line
    import threading
    barrier = threading.Barrier(10)

    def burst(i):
        barrier.wait()
        for n in range(200):
            print_line({"event": "rebuild", "org_id": f"org-{i}", "n": n, "pad": "x" * 300})

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2000
    assert all(json.loads(line)["event"] == "rebuild" for line in lines)
