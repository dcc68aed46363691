"""Storage: one contract (``contract``), two backends (``local``, ``s3``).

``open_store`` picks the backend for a URL; a backend module is imported
only when its URL is used, so the local store never loads boto3 and the
backends depend on the contract, never on this package's face.
"""

from __future__ import annotations

from core.storage.contract import ObjectNotFound, PreconditionFailed, Store, StoredObject, StoreError

__all__ = ["ObjectNotFound", "PreconditionFailed", "Store", "StoredObject", "StoreError", "open_store"]


def open_store(url: str) -> Store:
    """A store for ``file://DIR`` (or a bare path) or ``s3://bucket/prefix``."""
    if url.startswith("s3://"):
        from core.storage.s3 import S3Store

        return S3Store.from_url(url)
    from core.storage.local import LocalStore

    path = url[len("file://"):] if url.startswith("file://") else url
    return LocalStore(path)
