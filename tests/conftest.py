"""Shared fixtures: real stores (local directory; S3 under moto), real SQLite."""

import pytest

from core.store_local import LocalStore

STORE_BACKENDS = ["local"]


@pytest.fixture(params=STORE_BACKENDS)
def store(request, tmp_path):
    if request.param == "local":
        yield LocalStore(str(tmp_path / "store"))
    else:  # pragma: no cover - extended by the S3 backend
        raise AssertionError(request.param)
