"""The storage contract, run unchanged against every backend (see conftest `store`)."""

import os
import threading

import pytest

from core.storage import ObjectNotFound, PreconditionFailed


def test_get_of_absent_key_raises_not_found(store):
    with pytest.raises(ObjectNotFound):
        store.get("orgs/a/ledger/missing.json")


def test_put_if_absent_creates_and_get_returns_the_bytes(store):
    etag = store.put_if_absent("orgs/a/ledger/0001.json", b'{"x":1}')
    obj = store.get("orgs/a/ledger/0001.json")
    assert obj.body == b'{"x":1}'
    assert obj.etag == etag


def test_put_if_absent_on_existing_key_fails_and_keeps_the_original(store):
    store.put_if_absent("k/one", b"first")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("k/one", b"second")
    assert store.get("k/one").body == b"first"


def test_list_keys_is_in_byte_order_and_starts_strictly_after(store):
    for name in ["0003", "0001", "0002", "0010"]:
        store.put_if_absent(f"orgs/a/ledger/{name}.json", b"{}")
    store.put_if_absent("orgs/b/ledger/0001.json", b"{}")
    assert list(store.list_keys("orgs/a/ledger/")) == [
        "orgs/a/ledger/0001.json", "orgs/a/ledger/0002.json",
        "orgs/a/ledger/0003.json", "orgs/a/ledger/0010.json"]
    assert list(store.list_keys("orgs/a/ledger/", start_after="orgs/a/ledger/0002.json")) == [
        "orgs/a/ledger/0003.json", "orgs/a/ledger/0010.json"]


def test_list_keys_of_an_empty_prefix_is_empty(store):
    assert list(store.list_keys("orgs/nobody/ledger/")) == []


def test_list_keys_pages_past_one_thousand_keys(store):
    for i in range(1005):
        store.put_if_absent(f"many/{i:06d}", b"")
    keys = list(store.list_keys("many/"))
    assert len(keys) == 1005
    assert keys == sorted(keys)


def test_compare_and_swap_with_the_current_etag_replaces(store):
    etag = store.put_if_absent("p/current.json", b"1")
    new_etag = store.compare_and_swap("p/current.json", b"2", etag)
    obj = store.get("p/current.json")
    assert obj.body == b"2" and obj.etag == new_etag and new_etag != etag


def test_compare_and_swap_with_a_stale_etag_fails_and_changes_nothing(store):
    etag = store.put_if_absent("p/current.json", b"1")
    store.compare_and_swap("p/current.json", b"2", etag)
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("p/current.json", b"3", etag)
    assert store.get("p/current.json").body == b"2"


def test_compare_and_swap_on_an_absent_key_fails(store):
    with pytest.raises((PreconditionFailed, ObjectNotFound)):
        store.compare_and_swap("p/none.json", b"1", '"abc"')
    with pytest.raises(ObjectNotFound):
        store.get("p/none.json")


def test_two_concurrent_compare_and_swap_writers_exactly_one_wins(store):
    etag = store.put_if_absent("p/current.json", b"0")
    barrier = threading.Barrier(2)
    results = {}

    def writer(name):
        barrier.wait()
        try:
            store.compare_and_swap("p/current.json", name.encode(), etag)
            results[name] = "won"
        except PreconditionFailed:
            results[name] = "lost"

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == ["lost", "won"]
    winner = next(n for n, r in results.items() if r == "won")
    assert store.get("p/current.json").body == winner.encode()


def test_two_concurrent_put_if_absent_writers_exactly_one_wins(store):
    barrier = threading.Barrier(2)
    results = {}

    def writer(name):
        barrier.wait()
        try:
            store.put_if_absent("p/once", name.encode())
            results[name] = "won"
        except PreconditionFailed:
            results[name] = "lost"

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == ["lost", "won"]


def test_get_if_changed_answers_none_while_the_etag_matches(store):
    etag = store.put_if_absent("p/current.json", b"1")
    assert store.get_if_changed("p/current.json", etag) is None
    new = store.compare_and_swap("p/current.json", b"2", etag)
    changed = store.get_if_changed("p/current.json", etag)
    assert changed is not None and changed.body == b"2" and changed.etag == new


def test_delete_removes_and_is_idempotent(store):
    store.put_if_absent("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")
    with pytest.raises(ObjectNotFound):
        store.get("d/x")
    assert list(store.list_keys("d/")) == []


def test_upload_and_download_file_round_trip(store, tmp_path):
    src = tmp_path / "snap.sqlite"
    src.write_bytes(bytes(range(256)) * 5000)
    store.upload_file("orgs/a/snapshots/000000000001.sqlite", str(src))
    out = tmp_path / "copy.sqlite"
    store.download_file("orgs/a/snapshots/000000000001.sqlite", str(out))
    assert out.read_bytes() == src.read_bytes()


def test_upload_file_returns_the_etag_a_read_reports(store, tmp_path):
    src = tmp_path / "snap.sqlite"
    src.write_bytes(b"generation one" * 1000)
    etag = store.upload_file("orgs/a/snapshots/000000000001.sqlite", str(src))
    assert store.get("orgs/a/snapshots/000000000001.sqlite").etag == etag


def test_upload_file_does_not_overwrite_an_existing_key(store, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"new")
    store.put_if_absent("u/f", b"old")
    with pytest.raises(PreconditionFailed):
        store.upload_file("u/f", str(src))
    assert store.get("u/f").body == b"old"


def test_download_of_absent_key_raises_not_found(store, tmp_path):
    with pytest.raises(ObjectNotFound):
        store.download_file("u/none", str(tmp_path / "x"))


def test_list_modified_reports_each_key_under_the_prefix_with_its_write_time(store):
    import time
    before = time.time() - 5
    store.put_if_absent("p/a", b"1")
    store.put_if_absent("p/b", b"2")
    store.put_if_absent("q/c", b"3")
    listed = list(store.list_modified("p/"))
    assert [k for k, _ in listed] == ["p/a", "p/b"]
    assert all(before <= t <= time.time() + 5 for _, t in listed)


def test_a_temporary_file_of_a_killed_write_is_never_listed_and_removed_once_stale(tmp_path):
    import os
    import time

    from core.storage.local import LocalStore

    local = LocalStore(str(tmp_path / "s"))
    local.put_if_absent("orgs/acme/ledger/a.json", b"{}")
    ledger = tmp_path / "s" / "orgs" / "acme" / "ledger"
    stale, fresh = ledger / ".tmp-0123456789abcdef", ledger / ".tmp-fedcba9876543210"
    stale.write_bytes(b"x" * 424_000)
    fresh.write_bytes(b"y")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert list(local.list_keys("orgs/acme/ledger/")) == ["orgs/acme/ledger/a.json"]
    assert [k for k, _ in local.list_modified("orgs/acme/")] == ["orgs/acme/ledger/a.json"]
    assert local.remove_stale_temporaries("orgs/acme/", 3600) == 1
    assert not stale.exists() and fresh.exists()  # a young one may be a live writer's


@pytest.mark.parametrize("write", [
    lambda local, tmp: local.put_if_absent("orgs/acme/ledger/b.json", b"{}"),
    lambda local, tmp: local.upload_file("orgs/acme/ledger/b.json", __file__),
], ids=["put_if_absent", "upload_file"])
def test_a_local_disk_failure_is_a_store_error_naming_the_key(tmp_path, write):
    """As S3's failures are: the routes answer it 503 UNAVAILABLE, never as a
    bug. The disk fails here by a file where a directory belongs (modes would
    not stop root, as the tests run in CI)."""
    from core.storage import StoreError
    from core.storage.local import LocalStore

    local = LocalStore(str(tmp_path / "s"))
    local.put_if_absent("orgs/acme/kept.json", b"{}")
    (tmp_path / "s" / "orgs" / "acme" / "ledger").write_bytes(b"not a directory")
    (tmp_path / "in-the-way").write_bytes(b"not a directory")
    with pytest.raises(StoreError) as raised:
        write(local, tmp_path)
    assert type(raised.value) is StoreError and "orgs/acme/" in str(raised.value)


def test_a_local_download_into_a_place_that_cannot_take_it_is_the_callers_os_error(tmp_path):
    """The destination is the caller's disk (a reader's cache, a build's work
    file), not the store's: its failure is not reported as the store's."""
    from core.storage import StoreError
    from core.storage.local import LocalStore

    local = LocalStore(str(tmp_path / "s"))
    local.put_if_absent("orgs/acme/kept.json", b"{}")
    (tmp_path / "in-the-way").write_bytes(b"not a directory")
    with pytest.raises(OSError) as raised:
        local.download_file("orgs/acme/kept.json", str(tmp_path / "in-the-way" / "copy"))
    assert not isinstance(raised.value, StoreError)


@pytest.mark.parametrize("write", ["upload_file", "compare_and_swap"])
def test_a_local_write_the_disk_cannot_hold_leaves_no_partial_temporary(tmp_path, monkeypatch, write):
    """A full disk fails the copy part-way: the partial temporary goes with
    the failure, or each retry would hold more of the space it needs (the
    sweep of stale temporaries waits an hour)."""
    import errno
    import shutil as shutil_module
    from core.storage import StoreError
    from core.storage import local as local_module
    from core.storage.local import LocalStore

    local = LocalStore(str(tmp_path / "s"))
    current = local.put_if_absent("orgs/acme/snapshots/current.json", b"{}")

    def full_disk_copy(source, target, **kw):
        with open(target, "wb") as f:
            f.write(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device", source, None, target)

    def full_disk_write(fd, body):
        os.write(fd, body[:3])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shutil_module, "copyfile", full_disk_copy)
    monkeypatch.setattr(local_module, "_write_all", full_disk_write)
    with pytest.raises((StoreError, OSError)):
        if write == "upload_file":
            local.upload_file("orgs/acme/snapshots/g.sqlite", __file__)
        else:
            local.compare_and_swap("orgs/acme/snapshots/current.json", b'{"generation": 2}', current)
    left = [p.name for p in (tmp_path / "s" / "orgs" / "acme" / "snapshots").iterdir()]
    assert left == ["current.json"]
    assert local.get("orgs/acme/snapshots/current.json").body == b"{}"


@pytest.mark.parametrize("error, whose", [("ENOSPC", "caller"), ("EDQUOT", "caller"), ("EIO", "store")])
def test_a_failed_kernel_side_download_is_the_callers_when_its_disk_is_full_else_the_stores(
        tmp_path, monkeypatch, error, whose):
    """A kernel-side copy names both files in any error, the source first:
    a full destination is the caller's OSError, a failed read the store's."""
    import errno
    import shutil as shutil_module
    from core.storage import StoreError
    from core.storage.local import LocalStore

    local = LocalStore(str(tmp_path / "s"))
    local.put_if_absent("orgs/acme/kept.json", b"{}")

    def failing_copy(source, target, **kw):
        raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)), source, None, target)
    monkeypatch.setattr(shutil_module, "copyfile", failing_copy)
    with pytest.raises(StoreError if whose == "store" else OSError) as raised:
        local.download_file("orgs/acme/kept.json", str(tmp_path / "copy"))
    assert isinstance(raised.value, StoreError) == (whose == "store")


def test_local_put_if_absent_creates_no_named_temporary_on_linux(tmp_path, monkeypatch):
    """On Linux (here, CI, Lambda) a ledger entry is an O_TMPFILE inode
    linked into place: no temporary name is created and unlinked per write."""
    from core.storage.local import LocalStore

    def named(*args, **kwargs):
        raise AssertionError("a named temporary was written")

    local = LocalStore(str(tmp_path / "s"))
    monkeypatch.setattr(local, "_write_temp", named)
    local.put_if_absent("orgs/acme/ledger/a.json", b'{"x":1}')
    assert local.get("orgs/acme/ledger/a.json").body == b'{"x":1}'


def test_local_put_if_absent_falls_back_to_a_named_temporary_when_the_file_system_refuses_o_tmpfile(
        tmp_path, monkeypatch):
    import errno
    import os

    import core.storage.local
    from core.storage.local import LocalStore

    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(core.storage.local, "_UNNAMED", True)
    monkeypatch.setattr(core.storage.local.os, "open", refusing)
    local = LocalStore(str(tmp_path / "s"))
    local.put_if_absent("orgs/acme/ledger/a.json", b"{}")
    with pytest.raises(PreconditionFailed):
        local.put_if_absent("orgs/acme/ledger/a.json", b"{}")
    assert local.get("orgs/acme/ledger/a.json").body == b"{}"
    assert core.storage.local._UNNAMED is False  # asked once per process, not per write


def test_purge_removes_the_key_and_is_quiet_when_absent(store):
    etag = store.put_if_absent("orgs/a/claims/0001.json", b"v1")
    store.compare_and_swap("orgs/a/claims/0001.json", b"v2", etag)
    store.purge("orgs/a/claims/0001.json")
    with pytest.raises(ObjectNotFound):
        store.get("orgs/a/claims/0001.json")
    store.purge("orgs/a/claims/0001.json")  # absent: no error


def test_purge_history_keeps_the_current_version(store):
    etag = store.put_if_absent("orgs/a/ledger/0001.json", b"the text")
    store.compare_and_swap("orgs/a/ledger/0001.json", b"a stub", etag)
    store.purge_history("orgs/a/ledger/0001.json")
    assert store.get("orgs/a/ledger/0001.json").body == b"a stub"


def test_purge_prefix_keeps_only_the_named_keys(store):
    for name in ("0001", "0002", "0003"):
        store.put_if_absent(f"orgs/a/snapshots/{name}.sqlite", name.encode())
    store.put_if_absent("orgs/b/snapshots/0001.sqlite", b"other org")
    store.delete("orgs/a/snapshots/0002.sqlite")
    store.purge_prefix("orgs/a/snapshots/", keep={"orgs/a/snapshots/0003.sqlite"})
    assert list(store.list_keys("orgs/a/snapshots/")) == ["orgs/a/snapshots/0003.sqlite"]
    assert store.get("orgs/b/snapshots/0001.sqlite").body == b"other org"


def test_purge_prefix_spares_every_version_of_the_keys_it_is_told_to(store):
    for name in ("0001", "0002", "0003"):
        store.put_if_absent(f"orgs/a/snapshots/{name}.sqlite", name.encode())
    store.purge_prefix("orgs/a/snapshots/", keep={"orgs/a/snapshots/0001.sqlite"},
                       spare=lambda key: key.rsplit("/", 1)[1] >= "0003")
    assert list(store.list_keys("orgs/a/snapshots/")) == ["orgs/a/snapshots/0001.sqlite",
                                                          "orgs/a/snapshots/0003.sqlite"]


def test_put_if_absent_leaves_no_temporary_name_beside_the_object(store):
    """Whichever way the local store links a body into place (an unnamed
    O_TMPFILE inode, or a named temporary), nothing but the object remains."""
    store.put_if_absent("orgs/a/ledger/0001.json", b"{}")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("orgs/a/ledger/0001.json", b"{}")
    if hasattr(store, "root"):
        import os
        assert os.listdir(os.path.join(store.root, "orgs", "a", "ledger")) == ["0001.json"]
    assert list(store.list_keys("orgs/a/")) == ["orgs/a/ledger/0001.json"]
