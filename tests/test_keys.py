"""Key administration against every backend (see conftest `store`)."""

import pytest

from core.errors import NotFound
from core.keys import KeyRing
from core.storage import StoreError


@pytest.mark.parametrize("refused", ["the record", "the by-id pointer"])
def test_a_key_the_store_failed_to_create_is_neither_listed_nor_half_there(store, monkeypatch, refused):
    # its creator never saw the key: a record left behind would be a working
    # key in the listing that nobody holds, and without its pointer no
    # operator could revoke it by id
    ring = KeyRing(store)
    put = store.put_if_absent

    def one_refused(key, body):
        if key.startswith("keys/") and key.startswith("keys/by-id/") == (refused == "the by-id pointer"):
            raise StoreError("S3 PutObject failed: SlowDown (HTTP 503)")
        return put(key, body)

    monkeypatch.setattr(store, "put_if_absent", one_refused)
    with pytest.raises(StoreError):
        ring.create("acme", "rama", ["admin"], [])
    monkeypatch.undo()
    assert ring.listing("acme") == []
    assert [k for k in store.list_keys("keys/") if not k.startswith("keys/by-id/")] == []  # no record
    for pointer in store.list_keys("keys/by-id/"):  # one left names no key
        with pytest.raises(NotFound):
            ring.revoke(pointer[len("keys/by-id/"):-len(".json")])


def test_revoking_a_pointer_left_without_its_record_says_no_key(store):
    store.put_if_absent("keys/by-id/key_" + "1" * 32 + ".json", b'{"key_hash": "' + b"0" * 64 + b'"}')
    with pytest.raises(NotFound, match="no key key_1"):
        KeyRing(store).revoke("key_" + "1" * 32)


def test_a_key_whose_record_landed_with_its_answer_lost_is_created_and_revocable(store, monkeypatch):
    ring = KeyRing(store)
    put = store.put_if_absent

    def answer_lost(key, body):
        etag = put(key, body)
        if key.startswith("keys/") and not key.startswith("keys/by-id/"):
            raise StoreError("S3 PutObject failed: connection closed before the answer")
        return etag

    monkeypatch.setattr(store, "put_if_absent", answer_lost)
    created = ring.create("acme", "rama", ["admin"], [])
    monkeypatch.undo()
    assert ring.authenticate("Bearer " + created["api_key"]).principal_id == "rama"
    assert ring.revoke(created["key_id"])["revoked_at"]
