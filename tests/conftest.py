"""Shared fixtures: real stores (local directory; S3 under moto), real SQLite."""

import threading

import pytest

from core.storage.local import LocalStore

# "local-named": the local store where the platform has no O_TMPFILE, so
# every put-if-absent goes through a named temporary file
STORE_BACKENDS = ["local", "local-named", "s3"]


@pytest.fixture(autouse=True)
def requests_unbounded(monkeypatch):
    """Importing the Lambda API adapter (handler/api.py) marks the process
    as one whose requests carry deadlines, which gives every S3 client it
    opens afterwards the API function's short timeouts and two retries
    (core/storage/deadline.py). A test that imports it must not leave that
    to the next test in the same worker: each starts unmarked."""
    from core.storage import deadline

    monkeypatch.setattr(deadline, "_BOUNDED", False)


def serialize_moto(monkeypatch) -> None:
    """moto checks If-Match / If-None-Match and then writes without a lock,
    so racing threads can both "win" (seen ~1 in 4000 two-thread runs; more
    threads also crash moto). Real S3 evaluates the condition atomically;
    serialize moto's request handling to model that."""
    from moto.core.botocore_stubber import BotocoreStubber

    moto_lock = threading.Lock()
    unlocked = BotocoreStubber.process_request

    def process_request(self, *args, **kwargs):
        with moto_lock:
            return unlocked(self, *args, **kwargs)

    monkeypatch.setattr(BotocoreStubber, "process_request", process_request)


@pytest.fixture(params=STORE_BACKENDS)
def store(request, tmp_path, monkeypatch):
    if request.param == "local":
        yield LocalStore(str(tmp_path / "store"))
    elif request.param == "local-named":
        import core.storage.local

        monkeypatch.setattr(core.storage.local, "_UNNAMED", False)
        yield LocalStore(str(tmp_path / "store"))
    elif request.param == "s3":
        import boto3
        from moto import mock_aws

        from core.storage.s3 import S3Store

        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SECURITY_TOKEN": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_REGION", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("TITEN_S3_ENDPOINT_URL", raising=False)
        serialize_moto(monkeypatch)
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket="titen-test")
            # versioned, as template.yaml's bucket is: older versions must be purged, not just overwritten
            s3.put_bucket_versioning(Bucket="titen-test", VersioningConfiguration={"Status": "Enabled"})
            yield S3Store.from_url("s3://titen-test/pfx")
    else:  # pragma: no cover
        raise AssertionError(request.param)


# -- the service over a real local store, driven through HTTP -----------------

import json as _json

from starlette.testclient import TestClient

from core.config import Settings
from core.api.app import create_app
from core.service import Service

ALL_SCOPES = "context:compile,context:feedback,memory:write,memory:verify,admin"


class Api:
    """A test client bound to one service, with helpers for keys and writes."""

    def __init__(self, service: Service):
        self.service = service
        self.client = TestClient(create_app(service), raise_server_exceptions=False)

    def key(self, org="acme", principal="alice", scopes=ALL_SCOPES, workspaces=()):
        created = self.service.keys.create(org, principal, scopes.split(","), list(workspaces))
        return {"authorization": f"Bearer {created['api_key']}", "_key_id": created["key_id"]}

    def _headers(self, key):
        return {k: v for k, v in (key or {}).items() if not k.startswith("_")}

    def post(self, path, body, key=None, **kw):
        data = body if isinstance(body, (bytes, str)) else _json.dumps(body)
        return self.client.post(path, content=data, headers={**self._headers(key), "content-type": "application/json"}, **kw)

    def get(self, path, key=None):
        return self.client.get(path, headers=self._headers(key))

    def observe(self, key, **fields):
        body = {"subject_id": "user_rama", "kind": "tool_result", "content": "Production smoke returned 200.",
                "source": {"type": "tool", "ref": "deploy_456#smoke"}, "visibility": "organization"}
        body.update(fields)
        r = self.post("/v1/observations", body, key)
        assert r.status_code == 201, r.text
        return r.json()["data"]

    def rebuild(self, key):
        r = self.post("/v1/admin/rebuild", b"", key)
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def compile(self, key, task, max_tokens=1200, **fields):
        return self.post("/v1/context/compile", {"subject_id": "user_rama", "task": task,
                                                 "max_tokens": max_tokens, **fields}, key)

    def ledger_keys(self, org="acme"):
        return list(self.service.store.list_keys(f"orgs/{org}/ledger/"))


@pytest.fixture
def service(tmp_path):
    settings = Settings.from_env(data_dir=str(tmp_path / "titen"), env={"TITEN_SNAPSHOT_TTL": "0"})
    return Service(settings)


@pytest.fixture
def api(service):
    return Api(service)
