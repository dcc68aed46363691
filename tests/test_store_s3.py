"""S3-only behaviour the contract suite cannot reach: error mapping for answers
moto never gives (409 ConditionalRequestConflict), prefix handling, config."""

import boto3
import pytest
from botocore.stub import ANY, Stubber

import core.storage.s3 as store_s3
from core.storage import ObjectNotFound, PreconditionFailed, StoreError
from core.storage.s3 import S3Store

BUCKET = "titen-test"


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(store_s3.time, "sleep", lambda s: None)
    client = boto3.client("s3", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    store = S3Store.from_url(f"s3://{BUCKET}/pfx", client=client)
    with Stubber(client) as stub:
        yield store, stub
        stub.assert_no_pending_responses()


def _put(stub, key, *, code=None, status=None, etag='"new"', **cond):
    params = {"Bucket": BUCKET, "Key": key, "Body": ANY, **cond}
    if code:
        stub.add_client_error("put_object", service_error_code=code, http_status_code=status,
                              expected_params=params)
    else:
        stub.add_response("put_object", {"ETag": etag}, params)


def _head(stub, key, etag=None):
    params = {"Bucket": BUCKET, "Key": key}
    if etag is None:
        stub.add_client_error("head_object", service_error_code="404", http_status_code=404,
                              expected_params=params)
    else:
        stub.add_response("head_object", {"ETag": etag}, params)


# -- 409 ConditionalRequestConflict ------------------------------------------

def test_cas_conflict_with_unchanged_etag_is_retried(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/p/c", code="ConditionalRequestConflict", status=409, IfMatch='"old"')
    _head(stub, "pfx/p/c", '"old"')
    _put(stub, "pfx/p/c", IfMatch='"old"')
    assert store.compare_and_swap("p/c", b"x", '"old"') == '"new"'


def test_cas_conflict_after_the_etag_moved_is_precondition_failed(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/p/c", code="ConditionalRequestConflict", status=409, IfMatch='"old"')
    _head(stub, "pfx/p/c", '"other"')
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("p/c", b"x", '"old"')


def test_cas_conflict_after_the_key_vanished_is_precondition_failed(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/p/c", code="ConditionalRequestConflict", status=409, IfMatch='"old"')
    _head(stub, "pfx/p/c", None)
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("p/c", b"x", '"old"')


def test_put_if_absent_conflict_while_still_absent_is_retried(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/k", code="ConditionalRequestConflict", status=409, IfNoneMatch="*")
    _head(stub, "pfx/k", None)
    _put(stub, "pfx/k", IfNoneMatch="*")
    assert store.put_if_absent("k", b"x") == '"new"'


def test_put_if_absent_conflict_after_the_key_appeared_is_precondition_failed(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/k", code="ConditionalRequestConflict", status=409, IfNoneMatch="*")
    _head(stub, "pfx/k", '"theirs"')
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("k", b"x")


def test_persistent_conflict_gives_up_after_a_bounded_number_of_tries(stubbed):
    store, stub = stubbed
    for _ in range(store_s3._CONFLICT_ATTEMPTS):
        _put(stub, "pfx/k", code="ConditionalRequestConflict", status=409, IfNoneMatch="*")
        _head(stub, "pfx/k", None)
    with pytest.raises(StoreError, match="ConditionalRequestConflict") as err:
        store.put_if_absent("k", b"x")
    assert not isinstance(err.value, PreconditionFailed)


def test_upload_file_rewinds_the_body_when_retrying_a_conflict(stubbed, tmp_path):
    store, stub = stubbed
    src = tmp_path / "f"
    src.write_bytes(b"payload")
    seen = []
    stub.client.meta.events.register(
        "before-parameter-build.s3.PutObject", lambda params, **kw: seen.append(params["Body"].tell()))
    _put(stub, "pfx/u/f", code="ConditionalRequestConflict", status=409, IfNoneMatch="*")
    _head(stub, "pfx/u/f", None)
    _put(stub, "pfx/u/f", IfNoneMatch="*")
    assert store.upload_file("u/f", str(src)) == '"new"'
    assert seen == [0, 0]


# -- other mappings ----------------------------------------------------------

def test_412_maps_to_precondition_failed(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/k", code="PreconditionFailed", status=412, IfMatch='"e"')
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("k", b"x", '"e"')


def test_cas_on_a_missing_key_404_maps_to_precondition_failed(stubbed):
    store, stub = stubbed
    _put(stub, "pfx/k", code="NoSuchKey", status=404, IfMatch='"e"')
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("k", b"x", '"e"')


def test_get_304_is_unchanged_and_no_such_key_is_not_found(stubbed):
    store, stub = stubbed
    stub.add_client_error("get_object", service_error_code="304", http_status_code=304,
                          expected_params={"Bucket": BUCKET, "Key": "pfx/k", "IfNoneMatch": '"e"'})
    stub.add_client_error("get_object", service_error_code="NoSuchKey", http_status_code=404,
                          expected_params={"Bucket": BUCKET, "Key": "pfx/k"})
    assert store.get_if_changed("k", '"e"') is None
    with pytest.raises(ObjectNotFound):
        store.get("k")


def test_other_client_errors_become_store_errors_with_a_clear_message(stubbed):
    store, stub = stubbed
    stub.add_client_error("put_object", service_error_code="AccessDenied", http_status_code=403,
                          service_message="Access Denied")
    with pytest.raises(StoreError, match=r"PutObject s3://titen-test/pfx/k failed: AccessDenied \(HTTP 403\)") as err:
        store.put_if_absent("k", b"x")
    assert type(err.value) is StoreError


def test_a_missing_bucket_is_a_store_error_not_a_missing_key(stubbed):
    store, stub = stubbed
    stub.add_client_error("get_object", service_error_code="NoSuchBucket", http_status_code=404)
    stub.add_client_error("put_object", service_error_code="NoSuchBucket", http_status_code=404)
    for call in (lambda: store.get("k"), lambda: store.compare_and_swap("k", b"x", '"e"')):
        with pytest.raises(StoreError, match="NoSuchBucket") as err:
            call()
        assert type(err.value) is StoreError


def test_invalid_keys_are_refused_like_the_local_store(stubbed):
    store, _ = stubbed
    for key in ["", "/abs", "a//b", "a/../b", "a/.hidden"]:
        with pytest.raises(StoreError):
            store.put_if_absent(key, b"x")


# -- prefix handling & configuration -----------------------------------------

def test_from_url_parses_bucket_and_prefix():
    client = object()
    assert (S3Store.from_url("s3://b/a/b/", client=client).bucket,
            S3Store.from_url("s3://b/a/b/", client=client).prefix) == ("b", "a/b")
    bare = S3Store.from_url("s3://b", client=client)
    assert bare.prefix == "" and bare.url == "s3://b"
    with pytest.raises(StoreError):
        S3Store.from_url("file:///tmp/x", client=client)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_keys_live_under_the_prefix_and_come_back_without_it(store):
    store.put_if_absent("a/1", b"1")
    store.put_if_absent("a/2", b"2")
    raw = boto3.client("s3", region_name="us-east-1")
    raw.put_object(Bucket=BUCKET, Key="elsewhere/a/3", Body=b"x")
    raw.put_object(Bucket=BUCKET, Key="pfxother/a/4", Body=b"x")
    listed = [o["Key"] for o in raw.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "pfx/a/1" in listed and "pfx/a/2" in listed
    assert list(store.list_keys("a/")) == ["a/1", "a/2"]
    assert list(store.list_keys("")) == ["a/1", "a/2"]
    assert list(store.list_keys("a/", start_after="a/1")) == ["a/2"]
    unprefixed = S3Store.from_url(f"s3://{BUCKET}")
    assert unprefixed.get("pfx/a/1").body == b"1"


def test_client_config_region_and_endpoint_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("TITEN_S3_ENDPOINT_URL", "http://localhost:9000")
    client = S3Store.from_url("s3://b/p").client
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.endpoint_url == "http://localhost:9000"
    # botocore reads "max_attempts" as retries: 1 try + 5 retries, bounded.
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 6}


@pytest.mark.parametrize("bounded, timeouts, attempts", [(False, (60, 60), 6), (True, (3.0, 10.0), 3)])
def test_only_a_process_whose_requests_have_deadlines_waits_seconds_on_s3(monkeypatch, bounded, timeouts,
                                                                          attempts):
    # the API function's attempts must fit in a request's time; a rebuild
    # uploading a large snapshot keeps botocore's patient timeouts
    from core.storage import deadline

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(deadline, "_BOUNDED", bounded)
    config = S3Store.from_url("s3://b/p").client.meta.config
    assert (config.connect_timeout, config.read_timeout) == timeouts
    # botocore sleeps a retry's backoff (up to 2^n s) before the deadline's
    # check sees it: with deadlines, at most two retries, so at most 2 s
    assert config.retries == {"mode": "standard", "total_max_attempts": attempts}


def _versions(store, key):
    full = f"pfx/{key}"
    answer = store.client.list_object_versions(Bucket=BUCKET, Prefix=full)
    return [v for v in answer.get("Versions", []) + answer.get("DeleteMarkers", []) if v["Key"] == full]


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_purge_history_leaves_one_version_in_a_versioned_bucket(store):
    etag = store.put_if_absent("orgs/a/ledger/0001.json", b"the text")
    store.compare_and_swap("orgs/a/ledger/0001.json", b"a stub", etag)
    assert len(_versions(store, "orgs/a/ledger/0001.json")) == 2
    assert store.purge_history("orgs/a/ledger/0001.json") == 1
    (only,) = _versions(store, "orgs/a/ledger/0001.json")
    assert only["IsLatest"]


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_purge_leaves_no_version_and_no_delete_marker(store):
    store.put_if_absent("orgs/a/claims/0001.json", b"v1")
    store.delete("orgs/a/claims/0001.json")  # a versioned bucket keeps v1 behind a delete marker
    assert len(_versions(store, "orgs/a/claims/0001.json")) == 2
    store.purge("orgs/a/claims/0001.json")
    assert _versions(store, "orgs/a/claims/0001.json") == []


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_purge_prefix_reaches_versions_of_deleted_keys(store):
    store.put_if_absent("orgs/a/snapshots/0001.sqlite", b"old generation")
    store.delete("orgs/a/snapshots/0001.sqlite")
    store.put_if_absent("orgs/a/snapshots/0002.sqlite", b"new generation")
    store.purge_prefix("orgs/a/snapshots/", keep={"orgs/a/snapshots/0002.sqlite"})
    assert _versions(store, "orgs/a/snapshots/0001.sqlite") == []
    assert len(_versions(store, "orgs/a/snapshots/0002.sqlite")) == 1


# -- a request's deadline (core/storage/deadline.py) ---------------------------

def _throttled(store):
    """Every attempt answered 503 SlowDown before it reaches moto; returns
    the list the attempts are counted in."""
    from s3_faults import _error

    attempts = []

    def throttle(request, **_):
        attempts.append(request.context["retries"]["attempt"])
        return _error(request.url, 503, "SlowDown", "Please reduce your request rate.")
    store.client.meta.events.register_last("before-send.s3", throttle)  # after the deadline's check
    return attempts


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_no_store_call_begins_once_the_request_deadline_has_passed(store):
    from core.storage import deadline

    store.put_if_absent("a/1", b"1")
    attempts = _throttled(store)
    with deadline.within(-1), pytest.raises(deadline.DeadlinePassed) as caught:
        store.get("a/1")
    assert attempts == [] and isinstance(caught.value, StoreError)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_retry_that_could_outlast_the_request_deadline_is_not_begun(store):
    # throttled, botocore retried with backoff up to five times (and each
    # attempt could wait out its timeouts): on Lambda past the 29 s limit
    from core.storage import deadline

    store.put_if_absent("a/1", b"1")
    attempts = _throttled(store)
    with deadline.within(store_s3.ATTEMPT_SECONDS - 1), pytest.raises(deadline.DeadlinePassed):
        store.get("a/1")
    assert attempts == [1]


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_without_a_deadline_a_call_is_answered_as_before(store):
    from core.storage import deadline

    store.put_if_absent("a/1", b"1")
    assert deadline.remaining() is None and store.get("a/1").body == b"1"
    with deadline.within(60):
        assert store.get("a/1").body == b"1"
