"""The Lambda entry points, driven by the event files in infra/events/.

S3 is moto (mock_aws), with the same lock as tests/conftest.py so moto's
conditional writes are atomic like S3's. ``handler.api`` and
``handler.rebuild`` do all their initialisation at import, so each test
imports them afresh *inside* the mock, after the environment is set, exactly
as a Lambda execution environment would at init.
"""

import base64
import importlib
import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
from conftest import serialize_moto
import pytest
from moto import mock_aws

from core.keys import KeyRing
from core.ledger import Ledger
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer

EVENTS = Path(__file__).resolve().parent.parent / "infra" / "events"
BUCKET = "titen-lambda-test"
ALL_SCOPES = ["context:compile", "context:feedback", "memory:write", "memory:verify", "admin"]


class LambdaContext:
    """The attributes of the Lambda context object the handlers may read."""

    function_name = "titen-test"
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:titen-test"
    memory_limit_in_mb = 1024

    def __init__(self, remaining_ms=900_000):
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self):
        return self.remaining_ms


def _fresh_import(name):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.fixture
def lam(tmp_path, monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1",
                        "TITEN_STORE": f"s3://{BUCKET}/", "TITEN_CACHE_DIR": str(tmp_path / "tmp-titen"),
                        "TITEN_SNAPSHOT_TTL": "0"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_REGION", "AWS_PROFILE", "TITEN_S3_ENDPOINT_URL", "TITEN_EMBEDDER", "TITEN_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    serialize_moto(monkeypatch)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        api = _fresh_import("handler.api")
        rebuild = _fresh_import("handler.rebuild")
        key = KeyRing(api.service.store).create("demo", "agent", ALL_SCOPES, [])["api_key"]
        yield SimpleNamespace(api=api, rebuild=rebuild, key=key, store=api.service.store)
    sys.modules.pop("handler.api", None)
    sys.modules.pop("handler.rebuild", None)


def event(name, key=None):
    data = json.loads((EVENTS / name).read_text())
    if key is not None and "authorization" in data.get("headers", {}):
        data["headers"]["authorization"] = data["headers"]["authorization"].replace("REPLACE_WITH_KEY", key)
    return data


def call(lam, name, **body_overrides):
    """Invoke the API function with an event file; returns (status, json body, response)."""
    evt = event(name, lam.key)
    if body_overrides:
        body = json.loads(base64.b64decode(evt["body"]))
        body.update(body_overrides)
        raw = json.dumps(body).encode()
        evt["body"] = base64.b64encode(raw).decode()
        evt["headers"]["content-length"] = str(len(raw))
    response = lam.api.handler(evt, LambdaContext())
    assert response["isBase64Encoded"] is False
    return response["statusCode"], json.loads(response["body"]), response


def scheduled(lam, remaining_ms=900_000):
    return lam.rebuild.handler(event("schedule.json"), LambdaContext(remaining_ms))


def rebuild_lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


# -- the event files ------------------------------------------------------------

@pytest.mark.parametrize("name", ["healthz.json", "readyz.json", "observation.json", "observation-batch.json",
                                  "compile.json", "consolidation.json", "claim-evidence.json",
                                  "claim-supersede.json", "claim-revoke.json", "claim-expire.json",
                                  "context-get.json", "context-feedback.json", "admin-rebuild.json",
                                  "openapi-get.json"])
def test_http_event_files_are_http_api_payload_v2_with_base64_bodies(name):
    evt = event(name)
    assert evt["version"] == "2.0" and evt["routeKey"] == "$default" and evt["isBase64Encoded"] is True
    assert evt["rawPath"] == evt["requestContext"]["http"]["path"]
    body = base64.b64decode(evt["body"], validate=True)
    if evt["requestContext"]["http"]["method"] == "POST":
        assert isinstance(json.loads(body), dict)
        assert evt["headers"]["authorization"] == "Bearer REPLACE_WITH_KEY"


# -- the API function -------------------------------------------------------------

def test_healthz_answers_through_mangum_with_a_request_id(lam):
    status, body, response = call(lam, "healthz.json")
    assert status == 200 and body["data"] == {"status": "ok"}
    assert response["headers"]["x-request-id"] == body["meta"]["request_id"]
    assert body["meta"]["request_id"].startswith("req_")


@pytest.mark.parametrize("name", ["healthz.json", "readyz.json"])
def test_head_answers_through_mangum_with_the_gets_status_and_headers_and_no_body(lam, name):
    get = lam.api.handler(event(name, lam.key), LambdaContext())
    evt = event(name, lam.key)
    evt["requestContext"]["http"]["method"] = "HEAD"
    head = lam.api.handler(evt, LambdaContext())
    assert head["statusCode"] == get["statusCode"] == 200
    assert head["body"] == ""
    assert head["headers"]["content-type"] == get["headers"]["content-type"]
    assert head["headers"]["x-request-id"].startswith("req_")


def _unreadable(name, change):
    evt = event(name, "titen_sk_" + "A" * 43)
    change(evt)
    return evt


@pytest.mark.parametrize("evt", [
    _unreadable("observation.json", lambda e: e.update(body="%%% not base64 %%%")),
    _unreadable("observation.json", lambda e: e.update(headers=None)),
    _unreadable("observation.json", lambda e: e["requestContext"]["http"].pop("method")),
    _unreadable("observation.json", lambda e: e["headers"].update({"x-titen": 5})),
    _unreadable("observation.json", lambda e: e["headers"].update({"x-titen": None})),
    _unreadable("observation.json", lambda e: e.update(rawQueryString=None)),
    _unreadable("observation.json", lambda e: e["requestContext"]["http"].pop("sourceIp")),
    _unreadable("observation.json", lambda e: e.update(version="1.0")),
    _unreadable("observation.json", lambda e: e["headers"].update({"x-forwarded-port": "abc"})),
    _unreadable("observation.json", lambda e: e["headers"].update({"host": "api.example:port"})),
    _unreadable("observation.json", lambda e: e.update(cookies="a=b")),
    _unreadable("observation.json", lambda e: e.update(body=5)),
    json.loads((EVENTS / "schedule.json").read_text()),
    json.loads((EVENTS / "sqs-rebuild.json").read_text()),
], ids=["body-not-base64", "headers-null", "no-method", "header-value-a-number", "header-value-null",
        "query-string-null", "no-source-ip", "version-1.0", "forwarded-port-not-a-number", "host-port-not-a-number",
        "cookies-not-a-list", "body-a-number", "schedule-event", "sqs-event"])
def test_an_event_the_api_cannot_read_is_a_400_envelope_not_an_exception(lam, evt):
    response = lam.api.handler(evt, LambdaContext())
    assert response["statusCode"] == 400
    body = json.loads(response["body"])
    assert body["error"]["code"] == "VALIDATION_ERROR" and "HTTP API event" in body["error"]["message"]
    assert response["headers"]["x-request-id"] == body["meta"]["request_id"]
    assert list(lam.store.list_keys("orgs/")) == []


def test_a_fault_past_the_app_on_a_readable_event_is_a_500_envelope_not_the_callers_400(lam, monkeypatch, caplog):
    def broken(event, context):
        raise RuntimeError("secret internals")
    monkeypatch.setattr(lam.api, "asgi", broken)
    with caplog.at_level("ERROR", logger="titen"):
        response = lam.api.handler(event("healthz.json", lam.key), LambdaContext())
    assert response["statusCode"] == 500
    body = json.loads(response["body"])
    assert body["error"]["code"] == "INTERNAL" and "secret" not in response["body"]
    assert body["meta"]["request_id"] in caplog.text and "secret internals" in caplog.text


@pytest.mark.parametrize("name", ["compile.json", "observation.json"])
def test_with_no_time_left_for_the_store_a_request_is_the_503_envelope_and_stores_nothing(lam, name, caplog):
    # a throttled or hanging S3 held the request past the function's 29 s:
    # the caller got API Gateway's bare error instead of this envelope
    evt = event(name, lam.key)
    left_ms = int((lam.api.ANSWER_MARGIN_SECONDS - 0.5) * 1000)  # less than the margin: no store time
    with caplog.at_level("WARNING", logger="titen"):
        response = lam.api.handler(evt, LambdaContext(left_ms))
    # the request's time ran out, the store may be healthy: one line, no traceback at ERROR
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert "request's time" in caplog.text
    body = json.loads(response["body"])
    assert response["statusCode"] == 503 and body["error"]["code"] == "UNAVAILABLE"
    assert response["headers"]["x-request-id"] == body["meta"]["request_id"]
    assert list(lam.store.list_keys("orgs/demo/ledger/")) == []
    assert call(lam, name)[0] in (200, 201)  # the next invocation, with its time, is answered


def test_observation_event_is_accepted_with_its_claim_id(lam):
    status, body, _ = call(lam, "observation.json")
    assert status == 201, body
    assert body["data"]["observation_id"].startswith("obs_")
    assert body["data"]["claim_id"].startswith("claim_")
    assert len(list(lam.store.list_keys("orgs/demo/ledger/"))) == 1


def test_a_keyed_batch_event_sent_twice_is_stored_once_and_replayed(lam):
    status, first, _ = call(lam, "observation-batch.json")
    assert status == 201, first
    assert [("data" in r, r["index"]) for r in first["data"]["results"]] == [(True, 0), (False, 1)]
    assert first["meta"]["idempotent_replay"] is False
    status, again, _ = call(lam, "observation-batch.json")
    assert status == 201 and again["data"] == first["data"] and again["meta"]["idempotent_replay"] is True
    assert len(list(lam.store.list_keys("orgs/demo/ledger/"))) == 1
    assert len(list(lam.store.list_keys("orgs/demo/idempotency/"))) == 1
    status, other, _ = call(lam, "observation-batch.json", items=[])
    assert status == 409 and other["error"]["code"] == "CONFLICT"


def test_observation_without_a_valid_key_is_401(lam):
    evt = event("observation.json", "titen_sk_" + "A" * 43)
    response = lam.api.handler(evt, LambdaContext())
    assert response["statusCode"] == 401
    assert json.loads(response["body"])["error"]["code"] == "UNAUTHENTICATED"


def test_readyz_moves_to_the_new_generation_without_reimporting_the_handler(lam):
    status, body, _ = call(lam, "readyz.json")
    assert status == 200 and body["data"]["generation"] == 0
    call(lam, "observation.json")
    scheduled(lam)
    api_module = sys.modules["handler.api"]
    status, body, _ = call(lam, "readyz.json")
    assert sys.modules["handler.api"] is api_module
    assert status == 200 and body["data"]["generation"] == 1
    assert body["data"]["claim_count"] == 1 and body["data"]["last_refresh_error"] is None


def test_an_organization_named_in_titen_preload_orgs_is_loaded_at_import(lam, monkeypatch):
    """The init phase loads it: the first invocation reads no snapshot."""
    call(lam, "observation.json")
    scheduled(lam)
    monkeypatch.setenv("TITEN_PRELOAD_ORGS", "demo, nobody-yet")
    monkeypatch.setenv("TITEN_CACHE_DIR", lam.api.service.settings.cache_dir + "-second-environment")
    api = _fresh_import("handler.api")
    assert api.service.reader.status("demo")["generation"] == 1  # before any invocation
    assert api.service.reader.status("nobody-yet")["generation"] == 0  # nothing published: nothing to hold
    held = api.service.reader.current("demo")
    lam.api = api
    status, body, _ = call(lam, "compile.json")
    assert status == 200 and body["meta"]["generation"] == 1
    assert api.service.reader.current("demo") is held  # served by the snapshot loaded at import


def test_a_preload_that_fails_never_stops_the_import(lam, monkeypatch, caplog):
    monkeypatch.setenv("TITEN_PRELOAD_ORGS", "demo")
    monkeypatch.setenv("TITEN_STORE", "s3://no-such-bucket/")
    with caplog.at_level("WARNING", logger="titen"):
        api = _fresh_import("handler.api")
    assert api.service.reader.status("demo")["generation"] == 0
    assert "preloading demo's snapshot failed" in caplog.text


def test_compile_after_the_scheduled_rebuild_returns_the_claim(lam):
    _, written, _ = call(lam, "observation.json")
    scheduled(lam)
    status, body, _ = call(lam, "compile.json")
    assert status == 200, body
    assert [item["claim_id"] for item in body["data"]["items"]] == [written["data"]["claim_id"]]
    assert body["data"]["items"][0]["evidence_ids"] == [written["data"]["observation_id"]]
    assert body["meta"]["generation"] == 1


def test_compile_before_any_rebuild_is_an_empty_success(lam):
    call(lam, "observation.json")
    status, body, _ = call(lam, "compile.json")
    assert status == 200 and body["data"]["items"] == [] and body["data"]["context_id"].startswith("ctx_")


def test_store_outage_answers_503_and_logs_the_request_id(lam, caplog):
    s3 = boto3.client("s3", region_name="us-east-1")
    for obj in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    s3.delete_bucket(Bucket=BUCKET)
    with caplog.at_level(logging.ERROR, logger="titen.http"):
        status, body, _ = call(lam, "observation.json")
    assert status == 503 and body["error"]["code"] == "UNAVAILABLE"
    assert "Traceback" not in json.dumps(body)
    assert any(body["meta"]["request_id"] in record.getMessage() for record in caplog.records)


# -- the rebuild function -----------------------------------------------------------

def test_scheduled_rebuild_publishes_organizations_with_new_entries(lam):
    call(lam, "observation.json")
    summary = scheduled(lam)
    assert summary["published"] == ["demo"] and summary["failed"] == [] and summary["conflicts"] == []
    pointer, _ = read_pointer(lam.store, "demo")
    assert pointer["generation"] == 1 and pointer["claim_count"] == 1


def test_rebuild_logs_one_json_line_per_organization(lam, capsys):
    KeyRing(lam.store).create("other", "agent", ALL_SCOPES, [])
    call(lam, "observation.json")
    capsys.readouterr()
    scheduled(lam)
    lines = rebuild_lines(capsys)
    assert sorted(line["org_id"] for line in lines) == ["demo", "other"]
    for line in lines:
        assert {"org_id", "generation", "published", "entries_applied", "seconds", "bytes"} <= set(line)
    demo = next(line for line in lines if line["org_id"] == "demo")
    assert demo["published"] is True and demo["generation"] == 1 and demo["entries_applied"] == 1
    assert demo["bytes"] > 0


def test_second_scheduled_rebuild_with_nothing_new_publishes_nothing(lam):
    call(lam, "observation.json")
    scheduled(lam)
    pointer_before, etag_before = read_pointer(lam.store, "demo")
    summary = scheduled(lam)
    assert summary["published"] == [] and summary["unchanged"] == ["demo"]
    result = summary["results"][0]
    assert result["published"] is False and result["entries_applied"] == 0 and result["generation"] == 1
    assert read_pointer(lam.store, "demo")[1] == etag_before


def test_direct_invoke_rebuilds_only_the_named_organization(lam):
    other = KeyRing(lam.store).create("other", "agent", ALL_SCOPES, [])["api_key"]
    call(lam, "observation.json")
    evt = event("observation.json", other)
    assert lam.api.handler(evt, LambdaContext())["statusCode"] == 201
    summary = lam.rebuild.handler(event("rebuild-org.json"), LambdaContext())
    assert summary["organizations"] == 1 and summary["published"] == ["demo"]
    assert read_pointer(lam.store, "demo")[0]["generation"] == 1
    assert read_pointer(lam.store, "other")[0] is None


def test_direct_invoke_from_scratch_republishes_the_same_content(lam):
    call(lam, "observation.json")
    first = lam.rebuild.handler(event("rebuild-org.json"), LambdaContext())["results"][0]
    again = lam.rebuild.handler({**event("rebuild-org.json"), "from_scratch": True}, LambdaContext())
    result = again["results"][0]
    assert result["published"] is True and result["generation"] == 2 and result["from_scratch"] is True
    assert result["content_hash"] == first["content_hash"]


def test_direct_invoke_for_an_unknown_organization_is_refused(lam):
    with pytest.raises(ValueError, match="no organization 'nobody'"):
        lam.rebuild.handler({"org_id": "nobody"}, LambdaContext())
    assert read_pointer(lam.store, "nobody")[0] is None


def test_direct_invoke_from_scratch_without_an_organization_is_refused(lam):
    call(lam, "observation.json")
    with pytest.raises(ValueError, match="from_scratch needs org_id"):
        lam.rebuild.handler({"from_scratch": True}, LambdaContext())
    assert read_pointer(lam.store, "demo")[0] is None


def test_a_rebuild_conflict_is_reported_in_the_summary_not_raised(lam, tmp_path):
    call(lam, "observation.json")
    real_store = lam.rebuild.service.store

    class RivalPublishesFirst:
        """Delegates to the real store; just before this rebuild uploads its
        snapshot, a rival rebuild of the same organization publishes."""

        def __init__(self):
            self.raced = False

        def __getattr__(self, name):
            return getattr(real_store, name)

        def upload_file(self, key, path):
            if not self.raced:
                self.raced = True
                SnapshotBuilder(real_store, "demo", work_dir=str(tmp_path / "rival")).rebuild()
            return real_store.upload_file(key, path)

    lam.rebuild.service.store = RivalPublishesFirst()
    summary = scheduled(lam)
    assert summary["conflicts"] == ["demo"] and summary["published"] == []
    assert summary["results"][0]["generation"] == 1  # the rival's generation serves
    snapshots = [k for k in real_store.list_keys("orgs/demo/snapshots/") if k.endswith(".sqlite")]
    assert len(snapshots) == 1  # the loser withdrew its upload


def test_a_failing_organization_does_not_stop_the_others_but_fails_the_invocation(lam, capsys):
    KeyRing(lam.store).create("broken", "agent", ALL_SCOPES, [])
    call(lam, "observation.json")
    real_store = lam.rebuild.service.store

    class BrokenLedgerForOneOrg:
        def __getattr__(self, name):
            return getattr(real_store, name)

        def list_keys(self, prefix, start_after=None, **kw):
            if prefix.startswith("orgs/broken/"):
                from core.storage import StoreError
                raise StoreError("S3 ListObjectsV2 failed: SlowDown")
            return real_store.list_keys(prefix, start_after, **kw)

    lam.rebuild.service.store = BrokenLedgerForOneOrg()
    capsys.readouterr()
    with pytest.raises(lam.rebuild.RebuildFailed, match="broken"):
        scheduled(lam)
    lines = {line["org_id"]: line for line in rebuild_lines(capsys)}
    assert lines["broken"]["status"] == "failed" and "SlowDown" in lines["broken"]["error"]
    assert lines["demo"]["status"] == "published"


def test_organizations_are_deferred_when_the_invocation_runs_short_of_time(lam):
    call(lam, "observation.json")
    summary = scheduled(lam, remaining_ms=lam.rebuild.TIME_MARGIN_MS - 1)
    assert summary["deferred"] == ["demo"] and summary["published"] == []
    assert read_pointer(lam.store, "demo")[0] is None
    assert Ledger(lam.store).organizations() == ["demo"]


def test_admin_rebuild_on_lambda_invokes_the_rebuild_function(tmp_path, monkeypatch):
    """With TITEN_REBUILD_FUNCTION set, the API asks the rebuild function
    (whose role may write snapshots) instead of building in-process."""
    import io

    import boto3
    from botocore.stub import Stubber

    from core.config import Settings
    from core.service import Service

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    lam = boto3.client("lambda", region_name="us-east-1")
    stub = Stubber(lam)
    line = {"org_id": "acme", "status": "published", "published": True, "generation": 4, "entries_applied": 2,
            "claim_count": 9, "content_hash": "ab" * 32, "snapshot_key": "orgs/acme/snapshots/x", "seconds": 0.4,
            "bytes": 1024}
    stub.add_response("invoke", {"StatusCode": 200, "Payload": io.BytesIO(json.dumps({"results": [line]}).encode())},
                      {"FunctionName": "titen-rebuild", "Payload": json.dumps({"org_id": "acme", "from_scratch": False}).encode()})
    stub.add_client_error("invoke", "TooManyRequestsException", http_status_code=429)
    monkeypatch.setattr(boto3, "client", lambda name, **kw: lam)
    settings = Settings.from_env(data_dir=str(tmp_path), env={"TITEN_REBUILD_FUNCTION": "titen-rebuild"})
    service = Service(settings)
    with stub:
        result = service.rebuild("acme")
        assert (result.generation, result.published, result.claim_count) == (4, True, 9)
        from core.errors import Conflict
        with pytest.raises(Conflict):
            service.rebuild("acme")


@pytest.mark.parametrize("code,status", [("ResourceNotFoundException", 404), ("AccessDeniedException", 403)])
def test_an_admin_rebuild_on_lambda_whose_function_cannot_be_invoked_is_unavailable_naming_why(
        tmp_path, monkeypatch, code, status):
    import boto3
    from botocore.stub import Stubber

    from core.config import Settings
    from core.errors import Unavailable
    from core.service import Service

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    lam = boto3.client("lambda", region_name="us-east-1")
    stub = Stubber(lam)
    stub.add_client_error("invoke", code, http_status_code=status)
    monkeypatch.setattr(boto3, "client", lambda name, **kw: lam)
    service = Service(Settings.from_env(data_dir=str(tmp_path), env={"TITEN_REBUILD_FUNCTION": "titen-rebuild"}))
    with stub, pytest.raises(Unavailable, match=f"could not be invoked \\({code}\\)"):
        service.rebuild("acme")


def test_an_admin_rebuild_on_lambda_longer_than_the_api_may_wait_is_a_503_envelope(tmp_path, monkeypatch):
    """The API function times out at 29 s; a rebuild function still running
    by then must give the error envelope, not API Gateway's own 5xx: the
    invoke gives up reading after REMOTE_REBUILD_WAIT_SECONDS and is not
    retried (a retry would start a second rebuild)."""
    import socketserver
    import threading

    import boto3

    import core.service
    from core.config import Settings
    from core.errors import Unavailable
    from core.service import Service

    asked = []

    class Slow(socketserver.BaseRequestHandler):
        def handle(self):
            asked.append(self.request.recv(65536))
            time.sleep(2)  # the rebuild function is still running

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(core.service, "REMOTE_REBUILD_WAIT_SECONDS", 0.5)
    for name, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    real_client = boto3.client
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(boto3, "client", lambda name, **kw: real_client(name, endpoint_url=endpoint, **kw))
    service = Service(Settings.from_env(data_dir=str(tmp_path), env={"TITEN_REBUILD_FUNCTION": "titen-rebuild"}))
    try:
        with pytest.raises(Unavailable, match="still running"):
            service.rebuild("acme")
        assert len(asked) == 1  # asked once: no retry started a second rebuild
    finally:
        server.shutdown()
