"""The one storage contract every backend honours (local directory, S3).

Everything durable in titen — keys, ledgers, snapshots, pointers — goes
through this interface, so a rule proven against one backend holds for all:
the same contract suite (tests/test_store_contract.py) runs against each.

Semantics are S3's, deliberately, so the local store can never promise more
than S3 delivers:

- keys are '/'-separated strings; ``list_keys`` yields them in byte order,
  strictly after ``start_after`` (S3 ``StartAfter``);
- ``put_if_absent`` fails with ``PreconditionFailed`` when the key exists
  (S3 ``IfNoneMatch="*"``);
- ``compare_and_swap`` replaces a key only while its current ETag is the one
  given (S3 ``IfMatch``), else ``PreconditionFailed``;
- ``get`` returns the bytes with an opaque ETag; ``get_if_changed`` answers
  ``None`` when the ETag still matches (S3 ``IfNoneMatch`` → 304);
- an acknowledged write is durable (local: write temp, fsync, rename, fsync
  the directory);
- ``purge`` removes every stored version of a key, ``purge_history`` every
  version but the current one (S3 keeps older versions in a versioned
  bucket; the local store keeps none): what erasure needs, so that no older
  copy of erased text stays readable.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Iterator


class StoreError(Exception):
    """A backend failed in a way the caller cannot fix by retrying now."""


class ObjectNotFound(StoreError):
    """No object is stored under the key."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the key exists, or its ETag moved on."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    body: bytes
    etag: str


class Store(abc.ABC):
    """A flat key space of immutable-or-CAS-guarded objects."""

    url: str

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject:
        """The object's bytes and ETag; ``ObjectNotFound`` if absent."""

    @abc.abstractmethod
    def get_if_changed(self, key: str, etag: str | None) -> StoredObject | None:
        """``None`` when the object's ETag equals ``etag``; else as ``get``."""

    @abc.abstractmethod
    def list_keys(self, prefix: str, start_after: str | None = None, *,
                  page_size: int | None = None) -> Iterator[str]:
        """Keys under ``prefix`` in byte order, strictly after ``start_after``.
        ``page_size`` asks the backend for that many keys per round trip (S3
        ``MaxKeys``), for a caller that expects to stop after a few."""

    @abc.abstractmethod
    def list_modified(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(key, last-modified epoch seconds) under ``prefix``, as ``list_keys``:
        what housekeeping needs to find old objects without reading them."""

    def remove_stale_temporaries(self, prefix: str, older_than_seconds: float) -> int:
        """Delete what killed writes left behind under ``prefix`` (never
        listed as keys); returns how many. S3 leaves nothing: a PUT is atomic."""
        return 0

    @abc.abstractmethod
    def put_if_absent(self, key: str, body: bytes) -> str:
        """Create the key; ``PreconditionFailed`` if it exists. Returns the ETag."""

    @abc.abstractmethod
    def compare_and_swap(self, key: str, body: bytes, expected_etag: str) -> str:
        """Replace the key only while its ETag is ``expected_etag``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the key; deleting an absent key is not an error."""

    @abc.abstractmethod
    def purge(self, key: str) -> None:
        """Remove every stored version of the key (and any delete marker);
        absent is not an error."""

    def purge_history(self, key: str) -> int:
        """Remove every version of the key but the current one; returns how
        many. A backend that keeps no versions has none."""
        return 0

    @abc.abstractmethod
    def purge_prefix(self, prefix: str, keep: set[str], spare: Callable[[str], bool] | None = None) -> int:
        """Remove every version of every key under ``prefix``, deleted keys'
        versions included, except the current version of the keys in
        ``keep`` and every version of the keys ``spare`` accepts; returns
        how many versions went."""

    @abc.abstractmethod
    def upload_file(self, key: str, path: str) -> str:
        """Create ``key`` from a local file (put-if-absent); returns the ETag."""

    @abc.abstractmethod
    def download_file(self, key: str, path: str) -> None:
        """Write the object's bytes to ``path`` (streamed, not held in memory)."""

