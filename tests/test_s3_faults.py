"""Faults on S3 (docs/architecture.md, "Faults on S3"): the API and the rebuild
over a real boto3 client and moto, with ``tests/s3_faults.FaultLayer`` injecting
5xx, throttling, dropped connections, slow reads, 409 conflicts and publish races
(412) on every kind of call they make. Across more than 1,000 injected faults:
no acknowledged write is lost or doubled, and no file that fails its sha256 is
ever served. Every answer is 2xx or a 503/409 in the envelope, never a 500.

The test shrinks botocore's backoff scale (throttling 1 s -> 10 ms, other
errors 50 -> 5 ms) so a thousand retries run in seconds; the backoff's shape
(jittered, exponential, capped) and the retry budget are botocore's own."""

import json

import pytest

from conftest import ALL_SCOPES, Api, serialize_moto
from core.config import Settings
from core.snapshot.build import SnapshotBuilder
from core.checksum import file_sha256
from core.snapshot.pages import hash_file
from core.snapshot.pointer import read_pointer
from core.service import Service
from core.snapshot.reader import SnapshotReader
from s3_faults import FaultLayer

BUCKET = "titen-faults"
ORG = "acme"
FAULTS = 1050
MAX_WRITES = 3000


@pytest.fixture
def s3_store(monkeypatch):
    import boto3
    from botocore.retries.standard import ExponentialBackoff
    from moto import mock_aws

    from core.storage.s3 import S3Store

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("TITEN_S3_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(ExponentialBackoff, "_DEFAULT_BACKOFF_CONFIG",
                        {"throttling_base_scale": 0.01, "non_throttling_base_scale": 0.005})
    serialize_moto(monkeypatch)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield S3Store.from_url(f"s3://{BUCKET}/pfx")


@pytest.fixture
def unverified(monkeypatch):
    """Every generation the reader opens, checked against its pointer: the
    file's sha256 when published whole, its page digest when made from deltas."""
    opened, bad = [], []
    load = SnapshotReader._load

    def checked(self, org_id, state, pointer):
        snapshot, digests = load(self, org_id, state, pointer)
        opened.append(snapshot.generation)
        if pointer.get("deltas"):
            if hash_file(snapshot.path, whole=False)[1].digest() != pointer["digest"]:
                bad.append(snapshot.generation)
        elif file_sha256(snapshot.path) != pointer["sha256"]:
            bad.append(snapshot.generation)
        return snapshot, digests

    monkeypatch.setattr(SnapshotReader, "_load", checked)
    return opened, bad


def observation(i):
    return {"subject_id": "user_rama", "kind": "tool_result", "content": f"Fact number {i} holds.",
            "source": {"type": "tool", "ref": f"faults#{i}"}, "visibility": "organization",
            "claim": {"statement": f"Fact number {i} holds.", "kind": "semantic_fact", "confidence": 0.9}}


def test_a_thousand_s3_faults_lose_nothing_double_nothing_and_serve_nothing_unverified(
        s3_store, tmp_path, unverified):
    settings = Settings.from_env(store_url=s3_store.url, env={
        "TITEN_SNAPSHOT_TTL": "0", "TITEN_CACHE_DIR": str(tmp_path / "cache"),
        "TITEN_SKEW_SECONDS": "2"})  # (a 600 s window re-lists every entry at every rebuild: slow under moto)
    service = Service(settings, store=s3_store)
    api = Api(service)
    key = api.key(ORG, "alice", ALL_SCOPES)

    def competing_publish():
        SnapshotBuilder(s3_store, ORG, work_dir=str(tmp_path / "rival")).rebuild(force=True)

    faults = FaultLayer(s3_store.client, BUCKET, rate=0.27, race_rate=0.3, on_race=competing_publish)
    faults.enabled = True

    acked, refused, answers = {}, [], []

    def write(i: int) -> None:
        r = api.post("/v1/observations", observation(i), key)
        answers.append(r.status_code)
        if r.status_code == 201:
            acked[r.json()["data"]["observation_id"]] = f"Fact number {i} holds."
        else:
            refused.append(i)

    i = -1
    while faults.total < FAULTS and i < MAX_WRITES:  # writes until enough faults were injected
        i += 1
        write(i)
        if i % 40 == 39:
            answers.append(api.post("/v1/admin/rebuild", b"", key).status_code)
            c = api.compile(key, f"fact number {i}")
            answers.append(c.status_code)
            if c.status_code == 200:  # whatever it serves is a verified generation
                assert c.json()["meta"]["generation"] >= 1
        if i % 50 == 49:
            c = api.get(f"/v1/claims/claim_{'0' * 32}/evidence", key)
            answers.append(c.status_code)
    # a rebuild deletes about one object (an older generation): a run of ~20
    # rebuilds may fault none of its deletes by chance (0.73^17: one run in
    # two hundred), so more rounds until one is, as the run would continue
    for _ in range(60):
        if faults.by_operation["DeleteObject"]:
            break
        i += 1
        write(i)
        answers.append(api.post("/v1/admin/rebuild", b"", key).status_code)
    faults.enabled = False

    assert faults.total >= 1000, faults.counts
    for kind in ("refused_500", "applied_then_500", "throttle_503", "connection_dropped", "slow_read",
                 "conflict_409", "race_412"):
        assert faults.counts[kind] > 0, kind
    for operation in ("PutObject", "GetObject", "ListObjectsV2", "HeadObject", "DeleteObject"):
        assert faults.by_operation[operation] > 0, (operation, faults.by_operation, faults.calls)
    assert set(answers) <= {200, 201, 404, 409, 503}, sorted(set(answers))
    writes = i + 1
    assert len(acked) >= writes * 0.5, (len(acked), len(refused))  # most faults are retried away

    # every acknowledged write is in the ledger exactly once, and in the snapshot once
    service.rebuild(ORG)
    snapshot = service.reader.current(ORG)
    rows = dict(snapshot.db.execute("SELECT observation_id, content FROM observations"))
    assert not [o for o in acked if o not in rows], "lost writes"
    contents = list(rows.values())
    assert len(contents) == len(set(contents)), "a write stored twice"
    assert len(rows) <= writes
    pointer, _ = read_pointer(s3_store, ORG)
    assert file_sha256(snapshot.path) == pointer["sha256"]
    opened, bad = unverified
    assert opened and bad == [], bad
    print(f"\n{faults.total} faults injected: {dict(faults.counts)}; by operation {dict(faults.by_operation)}"
          f" of {dict(faults.calls)} calls; "
          f"{writes} writes, {len(acked)} acknowledged, {len(refused)} answered 503; generations opened {len(opened)}")


def test_a_retried_put_if_absent_that_landed_is_a_success_not_a_conflict(s3_store):
    faults = FaultLayer(s3_store.client, BUCKET, rate=1.0, max_in_a_row=1)
    faults.enabled = True
    faults.rng.random = lambda: 0.8  # applied_then_500 on every first attempt
    etag = s3_store.put_if_absent("orgs/acme/ledger/x.json", b'{"a":1}')
    faults.enabled = False
    assert faults.by_operation["PutObject"] == 1  # (the read-back GET may be faulted too)
    assert s3_store.get("orgs/acme/ledger/x.json").etag == etag
    from core.storage import PreconditionFailed
    with pytest.raises(PreconditionFailed):  # a first attempt that loses is a real conflict
        s3_store.put_if_absent("orgs/acme/ledger/x.json", b'{"a":1}')


def test_a_retried_pointer_swap_that_landed_publishes_once(s3_store, tmp_path):
    from core.keys import Principal
    from core.writes import Writes
    writer = Principal(ORG, "alice", "key_test", frozenset({"memory:write"}), ())
    Writes(s3_store, reader=None).record_observation(writer, observation(1))
    builder = SnapshotBuilder(s3_store, ORG, work_dir=str(tmp_path / "b"))
    assert builder.rebuild().generation == 1
    Writes(s3_store, reader=None).record_observation(writer, observation(2))
    faults = FaultLayer(s3_store.client, BUCKET, rate=1.0, max_in_a_row=1)
    original = faults.before_send

    def only_the_swap(request, event_name, **kw):
        if request.method == "PUT" and "If-Match" in request.headers:
            return original(request, event_name, **kw)
        return None

    s3_store.client.meta.events.unregister("before-send.s3", original)
    s3_store.client.meta.events.register_first("before-send.s3", only_the_swap)
    faults.rng.random = lambda: 0.8  # applied_then_500
    faults.enabled = True
    result = builder.rebuild()
    faults.enabled = False
    assert faults.counts["applied_then_500"] >= 1
    pointer, _ = read_pointer(s3_store, ORG)
    assert result.published and result.generation == pointer["generation"] == 2
    assert json.loads(s3_store.get(pointer_key := f"orgs/{ORG}/snapshots/current.json").body)["snapshot_key"] \
        == result.snapshot_key, pointer_key
    assert s3_store.get(result.snapshot_key)  # its upload was not withdrawn as a "lost race"
