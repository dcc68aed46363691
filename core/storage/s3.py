"""The production store: one S3 bucket (optionally under a key prefix).

Why it exists: on AWS Lambda there is no durable local disk, so every key,
ledger entry, snapshot and pointer lives in S3. The ``Store`` contract was
written with S3's semantics, so this backend maps each operation onto one S3
call and adds no client-side coordination — S3's conditional writes are the
only concurrency control:

- ``put_if_absent`` / ``upload_file``  -> ``PutObject`` with ``IfNoneMatch="*"``;
- ``compare_and_swap``                 -> ``PutObject`` with ``IfMatch=<etag>``;
- ``get_if_changed``                   -> ``GetObject`` with ``IfNoneMatch=<etag>``
  (a 304 answer means "unchanged" -> ``None``).

Error mapping:

- 412 ``PreconditionFailed`` -> ``core.store.PreconditionFailed``;
- 409 ``ConditionalRequestConflict`` (S3 saw a concurrent conditional write on
  the same key) is *not* an answer: we re-read the key and re-check the
  condition. If it can no longer hold (put-if-absent: the key now exists;
  CAS: the ETag moved on or the key is gone) -> ``PreconditionFailed``;
  otherwise the write is retried, a bounded number of times with a small
  jittered backoff, after which ``StoreError``;
- ``NoSuchKey`` (HeadObject: ``404``) -> ``ObjectNotFound`` (for CAS, a missing key is a lost
  precondition, as in the local store);
- any other S3 or transport error -> ``StoreError`` with a clear message.

Throttling (503 SlowDown), 5xx answers and transient network errors are
retried by botocore's "standard" retry mode with ``max_attempts=5`` (which
botocore reads as 5 retries after the first try, with exponential backoff);
nothing here retries them again, so a caller never waits unboundedly.

A retried conditional write can find its own earlier attempt: S3 applied it
but the answer was lost (a 5xx or a dropped connection after the write). So
when a write that was retried (by botocore, or after a 409 here) loses its
condition, the object now stored is read back: the very bytes we sent mean
the write is ours and succeeded (``_ours``); anything else is a real
``PreconditionFailed``. A first attempt that loses is never read back, so
the contract (a second identical put-if-absent fails) is unchanged. Every
body written under a condition is unique to its writer (ids, generations),
so equal bytes cannot be someone else's write.

Keys are validated with the same rules as the local store, so a key accepted
here is accepted everywhere.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, BinaryIO, Callable, Iterator
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from core.storage import deadline
from core.storage.contract import ObjectNotFound, PreconditionFailed, Store, StoredObject, StoreError

ENDPOINT_ENV = "TITEN_S3_ENDPOINT_URL"

_BOTO_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5})
# In a process whose requests carry deadlines (the Lambda API function:
# core.storage.deadline.bound_requests), connect and read timeouts well
# under botocore's 60 s: S3 answers small requests in milliseconds, so a
# wait this long is a fault, better retried, and one attempt must fit in a
# request's time. (A read timeout is the wait between bytes, not a bound on
# a whole download.)
_CONNECT_TIMEOUT = 3.0
_READ_TIMEOUT = 10.0
# and two retries, not five: botocore sleeps its backoff (up to 2^n s)
# before the deadline's check (_within_deadline) sees the attempt, so a
# late retry's sleep could carry the request past its time; with two, a
# sleep is at most 2 s, inside the Lambda adapter's margin
_REQUEST_BOTO_CONFIG = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=_CONNECT_TIMEOUT,
                              read_timeout=_READ_TIMEOUT)
# what one attempt may wait there: a retry with less time left before the
# request's deadline is not begun
ATTEMPT_SECONDS = _CONNECT_TIMEOUT + _READ_TIMEOUT
_CONFLICT_ATTEMPTS = 5          # tries of one conditional write under 409s
_CONFLICT_BACKOFF = 0.05        # seconds, doubled per attempt, jittered
_CHUNK = 1 << 20

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_NOT_MODIFIED_CODES = frozenset({"304", "NotModified"})


def _within_deadline(request=None, **_) -> None:
    """botocore's hook before each attempt is sent: no call begins after the
    request's deadline, and no retry that could outlast it. The first
    attempt of a call begun before the deadline is always made, whatever
    time is left: a function configured with less time than one attempt
    still reaches its store."""
    left = deadline.remaining()
    if left is None:
        return
    attempt = ((getattr(request, "context", None) or {}).get("retries") or {}).get("attempt", 1)
    if left <= 0 or (attempt > 1 and left < ATTEMPT_SECONDS):
        raise deadline.DeadlinePassed(f"S3 did not answer in the request's time ({max(left, 0):.1f} s left "
                                      f"before attempt {attempt}); retry shortly")


def _error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int | None:
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _retry_attempts(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


def _is_not_found(e: ClientError) -> bool:
    # By code, not bare 404: NoSuchBucket is also a 404 and is a StoreError.
    # (HeadObject has no body, so its 404 arrives with code "404".)
    return _error_code(e) in _NOT_FOUND_CODES


def _is_precondition_failed(e: ClientError) -> bool:
    return _error_code(e) == "PreconditionFailed" or _status(e) == 412


def _is_conflict(e: ClientError) -> bool:
    return _error_code(e) == "ConditionalRequestConflict" or _status(e) == 409


def _describe(e: Exception, op: str, bucket: str, key: str) -> str:
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return (f"S3 {op} s3://{bucket}/{key} failed: {err.get('Code', '?')} "
                f"(HTTP {_status(e)}): {err.get('Message', '')}".rstrip(": "))
    return f"S3 {op} s3://{bucket}/{key} failed: {type(e).__name__}: {e}"


class S3Store(Store):
    """A ``Store`` over ``s3://bucket[/prefix]``; see the module docstring."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any | None = None):
        if not bucket:
            raise StoreError("S3 store needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        # One client per store, created once here (boto3 clients are
        # thread-safe; creating them is not, and is slow on a cold start).
        self.client = client if client is not None else self._make_client()
        if hasattr(self.client, "meta"):  # (a test's stand-in may have none)
            self.client.meta.events.register("before-send.s3", _within_deadline)

    @classmethod
    def from_url(cls, url: str, *, client: Any | None = None) -> "S3Store":
        """``s3://bucket`` or ``s3://bucket/some/prefix``."""
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise StoreError(f"not an s3:// store URL: {url!r}")
        return cls(parsed.netloc, parsed.path, client=client)

    @staticmethod
    def _make_client() -> Any:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        endpoint = os.environ.get(ENDPOINT_ENV) or None
        config = _REQUEST_BOTO_CONFIG if deadline.requests_bounded() else _BOTO_CONFIG
        return boto3.client("s3", region_name=region, endpoint_url=endpoint, config=config)

    # -- keys ----------------------------------------------------------------

    def _full(self, key: str) -> str:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise StoreError(f"invalid store key: {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _full_prefix(self, prefix: str) -> str:
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def _strip(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1:] if self.prefix else full_key

    def _fail(self, e: Exception, op: str, key: str) -> StoreError:
        return StoreError(_describe(e, op, self.bucket, self._full_prefix(key)))

    # -- reads ---------------------------------------------------------------

    def get(self, key: str) -> StoredObject:
        obj = self._get(key, None)
        assert obj is not None
        return obj

    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        return self._get(key, etag)

    def _get(self, key: str, if_none_match: str | None) -> StoredObject | None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if if_none_match is not None:
            kwargs["IfNoneMatch"] = if_none_match
        try:
            resp = self.client.get_object(**kwargs)
            stream = resp["Body"]
            try:
                body = stream.read()
            finally:
                stream.close()
        except ClientError as e:
            if if_none_match is not None and (_error_code(e) in _NOT_MODIFIED_CODES or _status(e) == 304):
                return None
            if _is_not_found(e):
                raise ObjectNotFound(key) from None
            raise self._fail(e, "GetObject", key) from None
        except BotoCoreError as e:
            raise self._fail(e, "GetObject", key) from None
        return StoredObject(key, body, resp["ETag"])

    def list_keys(self, prefix: str, start_after: str | None = None, *,
                  page_size: int | None = None) -> Iterator[str]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._full_prefix(prefix)}
        if start_after is not None:
            kwargs["StartAfter"] = self._full_prefix(start_after)
        if page_size is not None:
            kwargs["PaginationConfig"] = {"PageSize": page_size}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                for item in page.get("Contents", ()):
                    yield self._strip(item["Key"])
        except (ClientError, BotoCoreError) as e:
            raise self._fail(e, "ListObjectsV2", prefix) from None

    def list_modified(self, prefix: str) -> Iterator[tuple[str, float]]:
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._full_prefix(prefix)):
                for item in page.get("Contents", ()):
                    yield self._strip(item["Key"]), item["LastModified"].timestamp()
        except (ClientError, BotoCoreError) as e:
            raise self._fail(e, "ListObjectsV2", prefix) from None

    def download_file(self, key: str, path: str) -> None:
        """Stream the object to ``path`` in 1 MiB chunks (via a temp file in
        the same directory, renamed into place, so a failed download never
        leaves a truncated file at ``path``)."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as e:
            if _is_not_found(e):
                raise ObjectNotFound(key) from None
            raise self._fail(e, "GetObject", key) from None
        except BotoCoreError as e:
            raise self._fail(e, "GetObject", key) from None
        # (StreamingBody.__enter__ hands back the raw stream, which skips
        # botocore's content-length check, so close explicitly instead.)
        stream = resp["Body"]
        tmp = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                for chunk in stream.iter_chunks(_CHUNK):
                    f.write(chunk)
            os.replace(tmp, path)
        except (ClientError, BotoCoreError) as e:
            raise self._fail(e, "GetObject (body)", key) from None
        finally:
            stream.close()
            if os.path.exists(tmp):
                os.unlink(tmp)

    # -- writes --------------------------------------------------------------

    def put_if_absent(self, key: str, body: bytes) -> str:
        return self._conditional_put(key, body, if_match=None)

    def compare_and_swap(self, key: str, body: bytes, expected_etag: str) -> str:
        return self._conditional_put(key, body, if_match=expected_etag)

    def upload_file(self, key: str, path: str) -> str:
        """Create ``key`` from a local file with put-if-absent semantics.

        The file is streamed as the body of one ``PutObject`` with
        ``IfNoneMatch="*"`` (not multipart): fine for the snapshots we store
        (up to a few hundred MB); a single PUT is limited to 5 GB.
        """
        with open(path, "rb") as f:
            return self._conditional_put(key, f, if_match=None)

    def _conditional_put(self, key: str, body: bytes | BinaryIO, if_match: str | None) -> str:
        full = self._full(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if if_match is None:
            kwargs["IfNoneMatch"] = "*"
        else:
            kwargs["IfMatch"] = if_match
        for attempt in range(_CONFLICT_ATTEMPTS):
            if not isinstance(body, (bytes, bytearray)):
                body.seek(0)
            try:
                return self.client.put_object(Body=body, **kwargs)["ETag"]
            except ClientError as e:
                retried = attempt > 0 or _retry_attempts(e) > 0
                if _is_precondition_failed(e):
                    ours = self._ours(key, body) if retried else None
                    if ours is not None:
                        return ours
                    raise PreconditionFailed(
                        f"{key} already exists" if if_match is None else f"{key} changed") from None
                if if_match is not None and _is_not_found(e):
                    raise PreconditionFailed(f"{key} does not exist") from None
                if not _is_conflict(e):
                    raise self._fail(e, "PutObject", key) from None
            except BotoCoreError as e:
                raise self._fail(e, "PutObject", key) from None
            # 409: a concurrent conditional write was in flight. Re-check.
            try:
                self._recheck(key, if_match)
            except PreconditionFailed:
                ours = self._ours(key, body) if retried else None
                if ours is not None:
                    return ours
                raise
            if attempt + 1 < _CONFLICT_ATTEMPTS:
                time.sleep(_CONFLICT_BACKOFF * (2 ** attempt) * (0.5 + random.random()))
        raise StoreError(
            f"S3 PutObject s3://{self.bucket}/{full} failed: ConditionalRequestConflict "
            f"persisted after {_CONFLICT_ATTEMPTS} attempts")

    def _ours(self, key: str, body: bytes | BinaryIO) -> str | None:
        """The stored object's ETag when it holds exactly ``body`` (our own
        earlier attempt landed), else None."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as e:
            if _is_not_found(e):
                return None
            raise self._fail(e, "GetObject", key) from None
        except BotoCoreError as e:
            raise self._fail(e, "GetObject", key) from None
        stream = resp["Body"]
        try:
            if isinstance(body, (bytes, bytearray)):
                same = stream.read() == bytes(body)
            else:
                body.seek(0)
                same = all(body.read(len(chunk)) == chunk for chunk in stream.iter_chunks(_CHUNK))
                same = same and body.read(1) == b""
        except (ClientError, BotoCoreError) as e:
            raise self._fail(e, "GetObject (body)", key) from None
        finally:
            stream.close()
        return resp["ETag"] if same else None

    def _recheck(self, key: str, if_match: str | None) -> None:
        """After a 409: raise ``PreconditionFailed`` if the condition can no
        longer hold, else return so the write is retried."""
        try:
            current = self.client.head_object(Bucket=self.bucket, Key=self._full(key))["ETag"]
        except ClientError as e:
            if not _is_not_found(e):
                raise self._fail(e, "HeadObject", key) from None
            current = None
        except BotoCoreError as e:
            raise self._fail(e, "HeadObject", key) from None
        if if_match is None:
            if current is not None:
                raise PreconditionFailed(f"{key} already exists")
        elif current is None:
            raise PreconditionFailed(f"{key} does not exist")
        elif current.strip('"') != if_match.strip('"'):
            raise PreconditionFailed(f"{key} changed")

    # -- versions (erasure) ---------------------------------------------------

    def _versions(self, full_prefix: str) -> Iterator[tuple[str, str, bool]]:
        """(full key, version id, is latest) of every version and delete
        marker under a full prefix."""
        try:
            for page in self.client.get_paginator("list_object_versions").paginate(
                    Bucket=self.bucket, Prefix=full_prefix):
                for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
                    yield item["Key"], item["VersionId"], bool(item.get("IsLatest"))
        except (ClientError, BotoCoreError) as e:
            raise StoreError(_describe(e, "ListObjectVersions", self.bucket, full_prefix)) from None

    def _delete_versions(self, versions: list[tuple[str, str]]) -> int:
        for start in range(0, len(versions), 1000):
            chunk = versions[start:start + 1000]
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": key, "VersionId": version} for key, version in chunk], "Quiet": True})
            except (ClientError, BotoCoreError) as e:
                raise StoreError(_describe(e, "DeleteObjects", self.bucket, chunk[0][0])) from None
            if answer.get("Errors"):
                error = answer["Errors"][0]
                raise StoreError(f"S3 DeleteObjects s3://{self.bucket}/{error.get('Key')} failed: "
                                 f"{error.get('Code')}: {error.get('Message', '')}")
        return len(versions)

    def purge(self, key: str) -> None:
        full = self._full(key)
        self._delete_versions([(k, v) for k, v, _ in self._versions(full) if k == full])

    def purge_history(self, key: str) -> int:
        full = self._full(key)
        return self._delete_versions([(k, v) for k, v, latest in self._versions(full) if k == full and not latest])

    def purge_prefix(self, prefix: str, keep: set[str], spare: Callable[[str], bool] | None = None) -> int:
        kept = {self._full(k) for k in keep}
        return self._delete_versions([(k, v) for k, v, latest in self._versions(self._full_prefix(prefix))
                                      if not (latest and k in kept) and not (spare and spare(self._strip(k)))])

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as e:
            if _is_not_found(e):
                return
            raise self._fail(e, "DeleteObject", key) from None
        except BotoCoreError as e:
            raise self._fail(e, "DeleteObject", key) from None
