"""template.yaml: cfn-lint clean, the properties docs/architecture.md ("Lambda") asks for,
least-privilege IAM checked against what the code really does, and the alarms and dashboard
checked against the metrics the code writes (core/observe/metrics.py).

The IAM tests record every store operation the API and the rebuild perform
on a real (local) store during a full flow and evaluate each one against the
template's inline policies: a permission the code needs but the template
lacks fails here, not in production; a permission granted beyond that shows
up in the explicit "cannot" tests.
"""

import json
import os
import re
import time
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from cfnlint.api import lint_file
from cfnlint.decode import decode

from core.config import Settings
from core.ledger import Ledger
from core.layout import entry_key
from core.snapshot.build import SnapshotBuilder
from core.layout import pointer_key
from core.service import Service
from core.storage import ObjectNotFound, Store
from core.storage.local import LocalStore
from conftest import ALL_SCOPES, Api

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_PATH = ROOT / "template.yaml"
BUCKET_ARN = "arn:aws:s3:::titen-bucket"
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:titen-rebuild.fifo"


@pytest.fixture(scope="module")
def template():
    parsed, errors = decode(str(TEMPLATE_PATH))
    assert not errors, errors
    return parsed


def resource(template, name):
    return template["Resources"][name]


def function(template, name):
    """A function's properties with the SAM Globals merged in."""
    merged = dict(template.get("Globals", {}).get("Function", {}))
    merged.update(resource(template, name)["Properties"])
    return merged


# -- lint -----------------------------------------------------------------------

def test_cfn_lint_reports_nothing():
    matches = lint_file(TEMPLATE_PATH)
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


# -- functions ------------------------------------------------------------------------

def test_handlers_named_in_the_template_exist(template):
    for name in ("ApiFunction", "RebuildFunction"):
        module, attribute = function(template, name)["Handler"].rsplit(".", 1)
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert f"\n{attribute} = " in source or f"\ndef {attribute}(" in source, (name, module, attribute)


def test_functions_run_python312_on_arm64(template):
    for name in ("ApiFunction", "RebuildFunction"):
        props = function(template, name)
        assert props["Architectures"] == ["arm64"] and props["Runtime"] == "python3.12"


def test_functions_load_their_dependencies_from_an_arm64_python312_layer(template):
    layer = resource(template, "DependenciesLayer")
    assert layer["Type"] == "AWS::Serverless::LayerVersion" and "Metadata" not in layer
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    for name in ("ApiFunction", "RebuildFunction"):
        assert {"Ref": "DependenciesLayer"} in function(template, name)["Layers"]


def test_rebuilds_run_in_parallel_bounded_by_the_queue_mapping(template):
    # one writer per organization comes from the FIFO group, not from a
    # concurrency of 1 (docs/operations.md)
    for name in ("ApiFunction", "RebuildFunction"):
        assert "ReservedConcurrentExecutions" not in function(template, name)
    scaling = resource(template, "RebuildQueueMapping")["Properties"]["ScalingConfig"]
    assert scaling == {"MaximumConcurrency": {"Ref": "RebuildMaxConcurrency"}}
    assert template["Parameters"]["RebuildMaxConcurrency"]["Default"] > 1


def test_api_timeout_fits_the_http_api_integration_limit_and_rebuild_has_fifteen_minutes(template):
    assert function(template, "ApiFunction")["Timeout"] <= 29
    assert function(template, "RebuildFunction")["Timeout"] == 900


def test_api_event_is_a_payload_v2_catch_all_route(template):
    events = function(template, "ApiFunction")["Events"]
    assert len(events) == 1
    (http,) = events.values()
    assert http["Type"] == "HttpApi"
    assert http["Properties"]["PayloadFormatVersion"] == "2.0"
    # no Path/Method: SAM wires the $default route, so every path reaches the app
    assert "Path" not in http["Properties"] and "Method" not in http["Properties"]


def test_rebuild_schedule_is_a_parameter_defaulting_to_five_minutes(template):
    (schedule,) = function(template, "RebuildFunction")["Events"].values()
    assert schedule["Type"] == "Schedule"
    assert schedule["Properties"]["Schedule"] == {"Ref": "RebuildSchedule"}
    assert template["Parameters"]["RebuildSchedule"]["Default"] == "rate(5 minutes)"


def test_environment_points_both_functions_at_the_bucket_and_the_rebuild_queue(template):
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["TITEN_STORE"] == {"Fn::Sub": "s3://${DataBucket}/"}
    assert env["TITEN_REBUILD_QUEUE_URL"] == {"Ref": "RebuildQueue"}
    assert env["TITEN_SNAPSHOT_TTL"] == {"Ref": "SnapshotTtlSeconds"}
    assert template["Parameters"]["SnapshotTtlSeconds"]["Default"] == 1
    assert env["TITEN_EMBEDDER"]["Fn::If"][2] == {"Ref": "Embedder"}
    assert template["Parameters"]["Embedder"]["Default"] == ""
    assert function(template, "ApiFunction")["EphemeralStorage"] == {"Size": {"Ref": "EphemeralStorageSize"}}


def test_the_snapshot_cache_budget_is_derived_from_the_ephemeral_storage_size(template):
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["TITEN_EPHEMERAL_MB"] == {"Ref": "EphemeralStorageSize"}
    assert Settings.from_env(env={"TITEN_EPHEMERAL_MB": "2048"}).cache_bytes == int(2048 * 2**20 * 0.75)


# -- bucket ------------------------------------------------------------------------

def test_bucket_is_encrypted_with_sse_s3(template):
    rules = resource(template, "DataBucket")["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert [r["ServerSideEncryptionByDefault"]["SSEAlgorithm"] for r in rules] == ["AES256"]


def test_bucket_blocks_all_public_access(template):
    block = resource(template, "DataBucket")["Properties"]["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                     "IgnorePublicAcls": True, "RestrictPublicBuckets": True}


def test_bucket_is_versioned_and_expires_noncurrent_versions(template):
    props = resource(template, "DataBucket")["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    rules = [r for r in props["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" in r]
    assert rules and all(r["Status"] == "Enabled" for r in rules)


def test_bucket_outlives_the_stack(template):
    bucket = resource(template, "DataBucket")
    assert bucket["DeletionPolicy"] == "Retain" and bucket["UpdateReplacePolicy"] == "Retain"


# -- IAM: a small evaluator over the inline policies -----------------------------------

def _resolve(value) -> str:
    if isinstance(value, str):
        return value
    if "Fn::GetAtt" in value:
        if list(value["Fn::GetAtt"]) == ["RebuildFunction", "Arn"]:
            return "arn:aws:lambda:us-east-1:123456789012:function:titen-rebuild"
        if list(value["Fn::GetAtt"]) == ["RebuildQueue", "Arn"]:
            return QUEUE_ARN
        assert list(value["Fn::GetAtt"]) == ["DataBucket", "Arn"], value
        return BUCKET_ARN
    if "Fn::Sub" in value:
        return (value["Fn::Sub"].replace("${DataBucket.Arn}", BUCKET_ARN).replace("${AWS::Partition}", "aws")
                .replace("${AWS::Region}", "us-east-1")
                .replace("${BedrockEmbeddingModel}", "amazon.titan-embed-text-v2:0"))
    raise AssertionError(f"unexpected resource expression {value!r}")


def _statements(template, name, bedrock=False):
    statements = []
    for document in function(template, name)["Policies"]:
        if "Fn::If" in document:
            condition, when_true, when_false = document["Fn::If"]
            assert condition == "UseBedrockEmbedder", document
            document = when_true if bedrock else when_false
            if document == {"Ref": "AWS::NoValue"}:
                continue
        assert isinstance(document, dict), "only inline policy documents (no managed or SAM policy templates)"
        for st in document["Statement"]:
            assert not {"Condition", "NotAction", "NotResource"} & set(st), "evaluator handles plain statements only"
            assert st["Effect"] == "Allow"
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            statements.append(([a.lower() for a in actions], [_resolve(r) for r in resources]))
    return statements


def allowed(template, name, action, key=None, arn=None) -> bool:
    arn = arn or (BUCKET_ARN if key is None else f"{BUCKET_ARN}/{key}")
    return any(any(fnmatchcase(action.lower(), a) for a in actions) and any(fnmatchcase(arn, r) for r in resources)
               for actions, resources in _statements(template, name))


class RecordingStore(Store):
    """A real store that notes the S3 action and key of every operation."""

    ACTIONS = {"get": "s3:GetObject", "get_if_changed": "s3:GetObject", "download_file": "s3:GetObject",
               "put_if_absent": "s3:PutObject", "compare_and_swap": "s3:PutObject", "upload_file": "s3:PutObject",
               "delete": "s3:DeleteObject"}

    def __init__(self, inner: Store):
        self.inner = inner
        self.url = inner.url
        self.calls: list[tuple[str, str | None]] = []
        self.misses: list[str] = []  # GETs of absent keys: S3 answers 404 only with s3:ListBucket

    def _note(self, op, key):
        self.calls.append((self.ACTIONS[op], key))

    def get(self, key):
        self._note("get", key)
        try:
            return self.inner.get(key)
        except ObjectNotFound:
            self.misses.append(key)
            raise

    def get_if_changed(self, key, etag):
        self._note("get_if_changed", key)
        try:
            return self.inner.get_if_changed(key, etag)
        except ObjectNotFound:
            self.misses.append(key)
            raise

    def list_keys(self, prefix, start_after=None, **kw):
        self.calls.append(("s3:ListBucket", None))
        return self.inner.list_keys(prefix, start_after, **kw)

    def list_modified(self, prefix):
        self.calls.append(("s3:ListBucket", None))
        return self.inner.list_modified(prefix)

    def put_if_absent(self, key, body):
        self._note("put_if_absent", key)
        return self.inner.put_if_absent(key, body)

    def compare_and_swap(self, key, body, expected_etag):
        self._note("compare_and_swap", key)
        return self.inner.compare_and_swap(key, body, expected_etag)

    def delete(self, key):
        self._note("delete", key)
        return self.inner.delete(key)

    def upload_file(self, key, path):
        self._note("upload_file", key)
        return self.inner.upload_file(key, path)

    def download_file(self, key, path):
        self._note("download_file", key)
        return self.inner.download_file(key, path)

    # on S3 these list the versions (bucket-level) and delete each one
    def purge(self, key):
        self.calls += [("s3:ListBucketVersions", None), ("s3:DeleteObjectVersion", key)]
        return self.inner.purge(key)

    def purge_history(self, key):
        self.calls += [("s3:ListBucketVersions", None), ("s3:DeleteObjectVersion", key)]
        return self.inner.purge_history(key)

    def purge_prefix(self, prefix, keep, spare=None):
        self.calls.append(("s3:ListBucketVersions", None))
        self.calls += [("s3:DeleteObjectVersion", k) for k in self.inner.list_keys(prefix)
                       if k not in keep and not (spare and spare(k))]
        return self.inner.purge_prefix(prefix, keep, spare)


def _rebuild(store, tmp_path):
    for org_id in Ledger(store).organizations():
        SnapshotBuilder(store, org_id, work_dir=str(tmp_path / "build")).rebuild()


def test_api_role_allows_every_s3_access_the_api_makes(template, tmp_path):
    inner = LocalStore(str(tmp_path / "store"))
    recording = RecordingStore(inner)
    settings = Settings.from_env(data_dir=str(tmp_path / "unused"),
                                 env={"TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(tmp_path / "cache")})
    api = Api(Service(settings, store=recording))
    key = api.key("acme", "alice", ALL_SCOPES)
    recording.calls.clear()  # keys are created from a workstation, not by the API
    # writes before any snapshot exists, one with an Idempotency-Key sent twice
    obs = api.observe(key, claim={"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                                  "confidence": 0.9})
    for _ in range(2):
        r = api.post("/v1/observations/batch", {"items": [{
            "subject_id": "user_rama", "kind": "tool_result", "content": "Canary passed.",
            "source": {"type": "tool", "ref": "canary#1"}}]}, {**key, "Idempotency-Key": "batch-1"})
        assert r.status_code == 201, r.text
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {"statement": "Release needs a green smoke run.", "kind": "procedural", "confidence": 0.8,
         "sources": [{"observation_id": obs["observation_id"], "relation": "supports"}]}]}, key)
    assert r.status_code == 201, r.text
    consolidated = r.json()["data"]["claim_ids"][0]
    assert api.post(f"/v1/claims/{consolidated}/expire", {"expected_version": 1}, key).status_code == 200
    assert api.get("/readyz", key).status_code == 200
    _rebuild(inner, tmp_path)  # the RebuildFunction's work, not the API's
    # reads and writes against a published snapshot
    r = api.compile(key, "does the deploy smoke need to pass before release")
    assert r.status_code == 200 and r.json()["data"]["items"], r.text
    context_id = r.json()["data"]["context_id"]
    assert api.get(f"/v1/context/{context_id}", key).status_code == 200
    assert api.get(f"/v1/claims/{obs['claim_id']}/evidence", key).status_code == 200
    r = api.post(f"/v1/context/{context_id}/feedback", {"outcome": "useful", "claim_id": obs["claim_id"]}, key)
    assert r.status_code == 201, r.text
    r = api.post(f"/v1/claims/{obs['claim_id']}/supersede",
                 {"expected_version": 1, "statement": "Deploy smoke and canary must pass."}, key)
    assert r.status_code == 201, r.text
    assert api.get("/readyz").status_code == 200
    assert api.get("/readyz", {"authorization": "Bearer titen_sk_" + "x" * 43}).status_code == 401
    # asking for erasures, and reading how far they got
    headers = {"authorization": key["authorization"]}
    erasure = api.client.delete("/v1/subjects/user_gone", headers=headers)
    assert erasure.status_code == 202, erasure.text
    assert api.client.delete(f"/v1/observations/{obs['observation_id']}", headers=headers).status_code == 202
    assert api.get(f"/v1/erasures/{erasure.json()['data']['erasure_id']}", key).status_code == 200
    assert {action for action, _ in recording.calls} >= {"s3:GetObject", "s3:PutObject"}
    denied = sorted({(a, k) for a, k in recording.calls if not allowed(template, "ApiFunction", a, k)},
                    key=lambda c: (c[0], c[1] or ""))
    assert denied == []
    # the API reads absent keys (unknown API key, no snapshot yet, a claim's
    # first transition) and needs the 404 that only s3:ListBucket gives
    assert recording.misses and allowed(template, "ApiFunction", "s3:ListBucket")


def test_rebuild_role_allows_every_s3_access_the_rebuild_makes(template, tmp_path):
    inner = LocalStore(str(tmp_path / "store"))
    api = Api(Service(Settings.from_env(data_dir=str(tmp_path / "api")), store=inner))
    key = api.key("acme", "alice", ALL_SCOPES)
    recording = RecordingStore(inner)
    r = api.post("/v1/observations", {"subject_id": "user_rama", "kind": "tool_result", "content": "Canary passed.",
                                      "source": {"type": "tool", "ref": "canary#1"}}, {**key, "Idempotency-Key": "k"})
    assert r.status_code == 201
    (record,) = inner.list_keys("orgs/acme/idempotency/")  # aged past its 24 hours:
    path = os.path.join(inner.root, *record.split("/"))
    body = json.loads(inner.get(record).body)
    with open(path, "w") as f:
        json.dump({**body, "created_at": "2000-01-01T00:00:00.000000Z"}, f)
    os.utime(path, (time.time() - 2 * 86400,) * 2)
    for round_ in range(7):  # enough generations that old ones are retired
        api.observe(key, content=f"Smoke run {round_} returned 200.")
        _rebuild(recording, tmp_path)
    _rebuild(recording, tmp_path)  # nothing new: reads only
    # an erasure carried out: the ledger purged, every older generation with its versions
    gone = api.observe(key, subject_id="user_gone", content="To be forgotten.",
                       claim={"statement": "Forget me.", "kind": "semantic_fact", "confidence": 0.9})
    _rebuild(recording, tmp_path)
    assert api.client.delete("/v1/subjects/user_gone", headers={"authorization": key["authorization"]}
                             ).status_code == 202
    _rebuild(recording, tmp_path)
    assert {"s3:DeleteObjectVersion", "s3:ListBucketVersions"} <= {a for a, _ in recording.calls}
    assert api.get(f"/v1/claims/{gone['claim_id']}/evidence", key).status_code == 404
    SnapshotBuilder(recording, "acme", work_dir=str(tmp_path / "build")).rebuild(from_scratch=True)
    assert ("s3:DeleteObject" in {a for a, _ in recording.calls})
    assert list(inner.list_keys("orgs/acme/idempotency/")) == []  # the rebuild's housekeeping took it
    # the schedule past a page of context runs: reads and moves its mark
    from core.rebuild import backlog as backlog_module
    from core.ledger import Ledger
    for _ in range(3):
        Ledger(inner).append("acme", "context_run", {"note": "a compile"}, actor="alice", suffix=".run.json")
    old_page, backlog_module.PAGE_SIZE = backlog_module.PAGE_SIZE, 2
    try:
        assert not backlog_module.backlog(recording, "acme", skew_seconds=0).due
    finally:
        backlog_module.PAGE_SIZE = old_page
    assert ("s3:PutObject", "orgs/acme/runs-listed.json") in recording.calls
    denied = sorted({(a, k) for a, k in recording.calls if not allowed(template, "RebuildFunction", a, k)},
                    key=lambda c: (c[0], c[1] or ""))
    assert denied == []


def _snapshot_keys():
    return [pointer_key("acme"), "orgs/acme/snapshots/000000000007-0a1b2c3d.sqlite"]


def test_api_role_cannot_write_or_delete_snapshots(template):
    for key in _snapshot_keys():
        assert not allowed(template, "ApiFunction", "s3:PutObject", key)
        assert not allowed(template, "ApiFunction", "s3:DeleteObject", key)
    assert allowed(template, "ApiFunction", "s3:PutObject", entry_key("acme", "0" * 32))


def test_api_role_cannot_create_keys_or_register_organizations(template):
    assert not allowed(template, "ApiFunction", "s3:PutObject", "keys/" + "0" * 64 + ".json")
    assert not allowed(template, "ApiFunction", "s3:PutObject", "organizations/acme")


def test_rebuild_role_cannot_read_keys_and_the_api_role_cannot_purge_versions(template):
    assert not allowed(template, "RebuildFunction", "s3:GetObject", "keys/" + "0" * 64 + ".json")
    assert not allowed(template, "RebuildFunction", "s3:PutObject", "keys/" + "0" * 64 + ".json")
    for key in (entry_key("acme", "0" * 32), "orgs/acme/snapshots/000000000001-00000000.sqlite"):
        assert not allowed(template, "ApiFunction", "s3:DeleteObjectVersion", key)
    assert not allowed(template, "ApiFunction", "s3:ListBucketVersions")
    # only to carry an erasure out does the rebuild rewrite the ledger (docs/operations.md, "Erasure")
    assert allowed(template, "RebuildFunction", "s3:PutObject", entry_key("acme", "0" * 32))
    assert allowed(template, "RebuildFunction", "s3:PutObject", pointer_key("acme"))



def test_the_api_may_invoke_only_the_rebuild_function(template):
    lambda_statements = [(a, r) for a, r in _statements(template, "ApiFunction") if any("lambda" in x for x in a)]
    assert lambda_statements == [(["lambda:invokefunction"],
                                  ["arn:aws:lambda:us-east-1:123456789012:function:titen-rebuild"])]
    env = function(template, "ApiFunction")["Environment"]["Variables"]
    assert env["TITEN_REBUILD_FUNCTION"] == {"Ref": "RebuildFunction"}


@pytest.mark.parametrize("name", ["ApiFunction", "RebuildFunction"])
def test_the_bedrock_parameter_adds_exactly_invoke_model_on_that_model(template, name):
    without = _statements(template, name, bedrock=False)
    with_bedrock = _statements(template, name, bedrock=True)
    added = [st for st in with_bedrock if st not in without]
    assert added == [(["bedrock:invokemodel"],
                      ["arn:aws:bedrock:us-east-1::foundation-model/amazon.titan-embed-text-v2:0"])]
    assert len(with_bedrock) == len(without) + 1


def test_the_bedrock_parameter_sets_the_embedder(template):
    env = template["Globals"]["Function"]["Environment"]["Variables"]["TITEN_EMBEDDER"]
    condition, when_true, when_false = env["Fn::If"]
    assert condition == "UseBedrockEmbedder"
    assert when_true == {"Fn::Sub": "bedrock:${BedrockEmbeddingModel}:${BedrockEmbeddingDimensions}"}
    assert when_false == {"Ref": "Embedder"}


# -- the rebuild queue ------------------------------------------------------------------

# What the event source mapping does with the function's role (AWS Lambda
# docs, "Using Lambda with Amazon SQS": the execution role needs these).
EVENT_SOURCE_MAPPING_ACTIONS = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")


@pytest.fixture
def recorded_sqs_actions(tmp_path, monkeypatch):
    """The SQS actions the API's write path and the schedule's enqueue make,
    recorded from the botocore calls against a moto queue."""
    import boto3
    from moto import mock_aws

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        url = boto3.client("sqs").create_queue(QueueName="titen-rebuild.fifo",
                                                Attributes={"FifoQueue": "true"})["QueueUrl"]
        settings = Settings.from_env(data_dir=str(tmp_path / "store"),
                                     env={"TITEN_SNAPSHOT_TTL": "0", "TITEN_REBUILD_QUEUE_URL": url})
        service = Service(settings)
        calls: list[str] = []
        service.rebuild_queue.client.meta.events.register(
            "before-call.sqs", lambda model, **kw: calls.append(f"sqs:{model.name}"))
        api = Api(service)
        key = api.key("acme", "alice", ALL_SCOPES)
        api.observe(key, content="Smoke run returned 200.")
        api_calls = list(calls)
        calls.clear()
        service.rebuild_queue.request("acme")  # what the scheduled run sends for a due organization
        yield {"api": api_calls, "schedule": list(calls)}


def test_api_role_allows_every_sqs_call_a_write_makes_and_nothing_else(template, recorded_sqs_actions):
    assert recorded_sqs_actions["api"] == ["sqs:SendMessage"]
    assert all(allowed(template, "ApiFunction", a, arn=QUEUE_ARN) for a in recorded_sqs_actions["api"])
    for action in EVENT_SOURCE_MAPPING_ACTIONS + ("sqs:PurgeQueue", "sqs:SetQueueAttributes"):
        assert not allowed(template, "ApiFunction", action, arn=QUEUE_ARN), action


def test_rebuild_role_allows_the_queue_mapping_and_the_schedule_and_nothing_else(template, recorded_sqs_actions):
    for action in EVENT_SOURCE_MAPPING_ACTIONS + tuple(recorded_sqs_actions["schedule"]):
        assert allowed(template, "RebuildFunction", action, arn=QUEUE_ARN), action
    assert not allowed(template, "RebuildFunction", "sqs:PurgeQueue", arn=QUEUE_ARN)
    other_queue = QUEUE_ARN.replace("titen-rebuild", "someone-else")
    for action in EVENT_SOURCE_MAPPING_ACTIONS:
        assert not allowed(template, "RebuildFunction", action, arn=other_queue), action


def test_no_sam_sqs_event_attaches_a_managed_policy_on_every_queue(template):
    for name in ("ApiFunction", "RebuildFunction"):
        assert all(e["Type"] != "SQS" for e in function(template, name)["Events"].values())
    mapping = resource(template, "RebuildQueueMapping")
    assert mapping["Type"] == "AWS::Lambda::EventSourceMapping"


def test_the_queue_mapping_feeds_the_rebuild_function_with_partial_batch_responses(template):
    props = resource(template, "RebuildQueueMapping")["Properties"]
    assert props["EventSourceArn"] == {"Fn::GetAtt": ["RebuildQueue", "Arn"]}
    assert props["FunctionName"] == {"Ref": "RebuildFunction"}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert 1 <= props["BatchSize"] <= 10  # the FIFO limit


def test_the_rebuild_queue_is_fifo_with_a_fifo_dead_letter_queue(template):
    queue = resource(template, "RebuildQueue")["Properties"]
    dead = resource(template, "RebuildDeadLetterQueue")["Properties"]
    assert queue["FifoQueue"] is True and dead["FifoQueue"] is True
    assert queue["ContentBasedDeduplication"] is False  # the sender sets organization + time bucket
    assert queue["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": ["RebuildDeadLetterQueue", "Arn"]},
                                      "maxReceiveCount": {"Ref": "RebuildMaxReceiveCount"}}
    # Lambda refuses a mapping whose queue hides a message for less than the function may run
    assert queue["VisibilityTimeout"] >= function(template, "RebuildFunction")["Timeout"]


@pytest.mark.parametrize("alarm, metric, queue", [
    ("RebuildDeadLetterAlarm", "ApproximateNumberOfMessagesVisible", "RebuildDeadLetterQueue"),
    ("RebuildQueueAgeAlarm", "ApproximateAgeOfOldestMessage", "RebuildQueue"),
])
def test_alarms_watch_the_dead_letter_depth_and_the_queue_age(template, alarm, metric, queue):
    props = resource(template, alarm)["Properties"]
    assert props["Namespace"] == "AWS/SQS" and props["MetricName"] == metric
    assert props["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
    assert props["ComparisonOperator"] == "GreaterThanThreshold"


def test_failed_rebuild_requests_are_counted_from_the_api_log(template):
    from core.rebuild.queue import log as queue_log  # noqa: F401  (the logger the filter reads)
    props = resource(template, "RebuildRequestFailuresMetric")["Properties"]
    assert props["LogGroupName"] == {"Ref": "ApiLogGroup"}
    # the stack's own namespace, like every other metric: two stacks in one region never share it
    assert props["MetricTransformations"][0]["MetricNamespace"] == {"Fn::Sub": "titen/${AWS::StackName}"}
    source = (ROOT / "core" / "rebuild" / "queue.py").read_text()
    # every term of the filter pattern occurs in the line the code logs
    for term in ("rebuild request for", "not sent"):
        assert f'"{term}"' in props["FilterPattern"] and term in source


# -- operations: alarms and the dashboard ------------------------------------------------

NAMESPACE = {"Fn::Sub": "titen/${AWS::StackName}"}
ACTIONS = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


def alarms(template) -> dict:
    return {name: r["Properties"] for name, r in template["Resources"].items()
            if r["Type"] == "AWS::CloudWatch::Alarm"}


def alarm_metrics(props) -> list[dict]:
    """The metrics an alarm reads: its own, or those of its metric math."""
    if "MetricName" in props:
        return [{"Namespace": props["Namespace"], "MetricName": props["MetricName"],
                 "Dimensions": props.get("Dimensions", [])}]
    return [m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m]


def test_the_operations_alarms_exist(template):
    # API 5xx rate, compile p95, freshness lag, rebuild failures, dead letters, and the queue's age
    assert set(alarms(template)) == {
        "ApiErrorRateAlarm", "CompileLatencyAlarm", "FreshnessLagAlarm", "RebuildFailuresAlarm",
        "RebuildDeadLetterAlarm", "RebuildQueueAgeAlarm"}


def test_every_alarm_threshold_is_a_parameter(template):
    for name, props in alarms(template).items():
        threshold = props["Threshold"]
        assert set(threshold) == {"Ref"} and threshold["Ref"] in template["Parameters"], name
        assert template["Parameters"][threshold["Ref"]]["Type"] == "Number", name


def test_every_alarm_notifies_the_optional_topic_and_none_without_it(template):
    assert template["Parameters"]["AlarmTopicArn"]["Default"] == ""
    assert template["Conditions"]["HasAlarmTopic"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}
    for name, props in alarms(template).items():
        assert props["AlarmActions"] == ACTIONS and props["OKActions"] == ACTIONS, name


@pytest.mark.parametrize("alarm, metric, statistic", [
    ("CompileLatencyAlarm", "CompileLatency", ("ExtendedStatistic", "p95")),
    ("FreshnessLagAlarm", "FreshnessLag", ("Statistic", "Maximum")),
])
def test_alarms_on_titens_metrics_read_the_series_the_code_writes(template, alarm, metric, statistic):
    from core.observe.metrics import ALARMED, CATALOGUE
    props = resource(template, alarm)["Properties"]
    assert (props["Namespace"], props["MetricName"]) == (NAMESPACE, metric)
    assert props["Dimensions"] == [{"Name": "Service", "Value": ALARMED[metric]}]
    assert CATALOGUE[metric][1] == ("Service",)
    assert props[statistic[0]] == statistic[1]


def test_the_namespace_alarms_read_is_the_one_the_functions_write(template):
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["TITEN_METRICS"] == "emf" and env["TITEN_METRICS_NAMESPACE"] == NAMESPACE
    assert env["TITEN_METRICS_ORGS"] == {"Ref": "MetricsOrganizations"}
    assert template["Parameters"]["MetricsOrganizations"]["Default"] == ""  # no Organization dimension


def test_the_api_error_rate_is_5xx_over_all_answers_of_the_http_api(template):
    props = resource(template, "ApiErrorRateAlarm")["Properties"]
    read = {m["Id"]: m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m}
    assert {i: (m["Namespace"], m["MetricName"], m["Dimensions"]) for i, m in read.items()} == {
        "errors": ("AWS/ApiGateway", "5xx", [{"Name": "ApiId", "Value": {"Ref": "HttpApi"}}]),
        "requests": ("AWS/ApiGateway", "Count", [{"Name": "ApiId", "Value": {"Ref": "HttpApi"}}])}
    (returned,) = [m for m in props["Metrics"] if m.get("ReturnData")]
    assert returned["Expression"] == "100 * FILL(errors, 0) / requests"


def test_rebuild_failures_count_failed_organizations_and_crashed_invocations(template):
    from core.observe.metrics import ALARMED
    props = resource(template, "RebuildFailuresAlarm")["Properties"]
    read = {m["Id"]: m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m}
    assert (read["failed"]["Namespace"], read["failed"]["MetricName"], read["failed"]["Dimensions"]) == (
        NAMESPACE, "RebuildFailures", [{"Name": "Service", "Value": ALARMED["RebuildFailures"]}])
    assert (read["crashed"]["Namespace"], read["crashed"]["MetricName"], read["crashed"]["Dimensions"]) == (
        "AWS/Lambda", "Errors", [{"Name": "FunctionName", "Value": {"Ref": "RebuildFunction"}}])
    (returned,) = [m for m in props["Metrics"] if m.get("ReturnData")]
    assert returned["Expression"] == "FILL(failed, 0) + FILL(crashed, 0)"


def dashboard(template) -> dict:
    """The dashboard body as CloudFormation renders it (parameters at their defaults)."""
    body = resource(template, "OperationsDashboard")["Properties"]["DashboardBody"]["Fn::Sub"]
    names = set(template["Parameters"]) | set(template["Resources"])

    def value(match):
        name = match.group(1)
        if name.startswith("AWS::"):
            return {"AWS::StackName": "titen-prod", "AWS::Region": "us-east-1"}[name]
        assert name.split(".")[0] in names, f"${{{name}}} names nothing in the template"
        if name in template["Parameters"]:
            return str(template["Parameters"][name]["Default"])
        return f"<{name}>"

    return json.loads(re.sub(r"\$\{([^}]+)\}", value, body))


def dashboard_series(board) -> set[tuple]:
    """(namespace, metric name, dimensions) of every series the dashboard graphs."""
    series = set()
    for widget in board["widgets"]:
        for row in widget["properties"].get("metrics", []):
            names = [x for x in row if isinstance(x, str)]
            if names:
                series.add((names[0], names[1], tuple(zip(names[2::2], names[3::2]))))
            for option in (x for x in row if isinstance(x, dict) and "expression" in x):
                found = re.search(r"\{\\?\"?([^,\"\\]+)\\?\"?,([^}]*)\} MetricName=\"(\w+)\"", option["expression"])
                if found:
                    series.add((found.group(1), found.group(3), tuple((d, "*") for d in found.group(2).split(","))))
    return series


def _rendered(value) -> str:
    if isinstance(value, dict) and "Fn::Sub" in value:
        return value["Fn::Sub"].replace("${AWS::StackName}", "titen-prod")
    if isinstance(value, dict):
        return "<" + ".".join(value.get("Fn::GetAtt") or [value["Ref"]]) + ">"
    return value


def test_the_dashboard_graphs_every_alarmed_series(template):
    series = dashboard_series(dashboard(template))
    for name, props in alarms(template).items():
        for metric in alarm_metrics(props):
            wanted = (_rendered(metric["Namespace"]), metric["MetricName"],
                      tuple((d["Name"], _rendered(d["Value"])) for d in metric["Dimensions"]))
            assert wanted in series, (name, wanted)


def test_the_dashboard_graphs_every_metric_the_code_writes(template):
    from core.observe.metrics import CATALOGUE
    graphed = {(ns, metric, tuple(d for d, _ in dims)) for ns, metric, dims in dashboard_series(dashboard(template))
               if ns == "titen/titen-prod"}
    assert {(name, dims) for name, (_, dims) in CATALOGUE.items()} <= {(m, d) for _, m, d in graphed}


def test_the_dashboard_shows_the_state_of_every_alarm(template):
    (status,) = [w for w in dashboard(template)["widgets"] if w["type"] == "alarm"]
    assert sorted(status["properties"]["alarms"]) == sorted(f"<{name}.Arn>" for name in alarms(template))


def test_the_dashboard_annotates_each_graphed_threshold_with_its_parameters_default(template):
    board = dashboard(template)
    annotated = {w["properties"]["title"]: [a["value"] for a in w["properties"]["annotations"]["horizontal"]]
                 for w in board["widgets"] if "annotations" in w.get("properties", {})}
    params = template["Parameters"]
    assert annotated == {
        "API: 5xx answers (%)": [params["ApiErrorRateAlarmPercent"]["Default"]],
        "Compile latency (ms)": [params["CompileLatencyAlarmMilliseconds"]["Default"]],
        "Freshness lag (s): write to published": [params["FreshnessLagAlarmSeconds"]["Default"]],
        "Rebuild failures": [params["RebuildFailuresAlarmCount"]["Default"]]}
