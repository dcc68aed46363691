"""The schedule's question, "does this organization need a rebuild?"
(core/rebuild/backlog.py), on every store backend: decided from the
pointer and a listing past its watermark, at a cost that does not grow with
the context runs an organization that only compiles keeps adding."""

import json
import secrets
import time

import pytest

from core.ids import uuid7_ms
from core.layout import ledger_prefix, pointer_key, runs_listed_key
from core.rebuild import backlog as backlog_module
from core.rebuild.backlog import backlog

ORG = "acme"
HOUR_MS = 3600 * 1000


def entry_hex(ms: int) -> str:
    return f"{ms:012x}7{secrets.token_hex(10)[:19]}"


def write_entry(store, ms: int, suffix: str) -> str:
    hex32 = entry_hex(ms)
    store.put_if_absent(f"{ledger_prefix(ORG)}{hex32}{suffix}", b"{}")
    return hex32


@pytest.fixture
def published(store, monkeypatch):
    """An organization whose generation applied one write an hour and a half
    ago, with small list pages so the rule shows at a small scale."""
    monkeypatch.setattr(backlog_module, "PAGE_SIZE", 10)
    now = int(time.time() * 1000)
    watermark = write_entry(store, now - 90 * 60 * 1000, ".json")
    store.put_if_absent(pointer_key(ORG), json.dumps({"generation": 1, "watermark": watermark}).encode())
    return store, now


def listed(store, monkeypatch) -> list[int]:
    """Count the keys each listing of the ledger yields (the real store's)."""
    counts = []
    inner = store.list_keys

    def counting(prefix, *args, **kw):
        counts.append(0)
        for key in inner(prefix, *args, **kw):
            counts[-1] += 1
            yield key

    monkeypatch.setattr(store, "list_keys", counting)
    return counts


def runs(store, first_ms: int, n: int) -> None:
    for i in range(n):
        write_entry(store, first_ms + i, ".run.json")


def test_an_organization_with_only_context_runs_since_its_generation_is_not_due(published, monkeypatch):
    store, now = published
    runs(store, now - HOUR_MS, 25)
    assert not backlog(store, ORG).due


def test_a_write_after_many_context_runs_makes_it_due(published):
    store, now = published
    runs(store, now - HOUR_MS, 25)
    write_entry(store, now - HOUR_MS + 30, ".json")
    found = backlog(store, ORG)
    assert found.due and "is not applied" in found.reason


def test_a_pass_lists_the_runs_since_the_last_pass_not_every_run_since_the_last_write(published, monkeypatch):
    store, now = published
    runs(store, now - HOUR_MS, 45)
    counts = listed(store, monkeypatch)
    assert not backlog(store, ORG).due
    assert sum(counts) == 45  # the first pass reads them all, and marks where it got to
    runs(store, now - HOUR_MS + 1000, 3)
    counts.clear()
    assert not backlog(store, ORG).due
    assert sum(counts) == 10 + 3  # one page from the watermark, then only what came after the mark
    write_entry(store, now - HOUR_MS + 2000, ".json")
    assert backlog(store, ORG).due  # past the mark, a write is still seen


def test_the_mark_never_passes_a_run_of_the_skew_window(published):
    store, now = published
    runs(store, now - 60 * 1000, 25)  # a minute old: inside the 10-minute window
    assert not backlog(store, ORG, skew_seconds=600).due
    assert not list(store.list_keys(runs_listed_key(ORG)))
    assert not backlog(store, ORG, skew_seconds=30).due  # outside a 30 s window: marked
    mark = json.loads(store.get(runs_listed_key(ORG)).body)["listed_through"]
    assert uuid7_ms(mark.rsplit("/", 1)[1][:32]) == now - 60 * 1000 + 24


def test_a_write_behind_the_mark_is_seen_once_the_watermark_passes_it(published, monkeypatch):
    """The mark only skips keys a pass found to be runs; once a rebuild
    moves the watermark past it, listing starts from the watermark again."""
    store, now = published
    runs(store, now - HOUR_MS, 25)
    assert not backlog(store, ORG).due
    later = write_entry(store, now - 30 * 60 * 1000, ".json")  # newer than every run
    assert backlog(store, ORG).due
    pointer = json.loads(store.get(pointer_key(ORG)).body)
    obj = store.get(pointer_key(ORG))
    store.compare_and_swap(pointer_key(ORG), json.dumps({**pointer, "watermark": later}).encode(), obj.etag)
    assert not backlog(store, ORG).due


def test_after_a_rollback_the_mark_hides_no_write(published):
    """A rollback moves the watermark back; the mark, set against the later
    watermark, must not skip the writes between them."""
    store, now = published
    pointer = json.loads(store.get(pointer_key(ORG)).body)
    runs(store, now - 80 * 60 * 1000, 10)  # a page of runs after the old watermark
    behind = write_entry(store, now - 70 * 60 * 1000, ".json")  # then a write (applied by generation 2)
    runs(store, now - HOUR_MS, 25)
    obj = store.get(pointer_key(ORG))
    store.compare_and_swap(pointer_key(ORG), json.dumps({**pointer, "generation": 2, "watermark": behind}).encode(),
                           obj.etag)
    assert not backlog(store, ORG).due  # marks the runs after generation 2's watermark
    assert store.get(runs_listed_key(ORG))
    obj = store.get(pointer_key(ORG))  # rolled back to generation 1: its watermark is before the write
    store.compare_and_swap(pointer_key(ORG), json.dumps(pointer).encode(), obj.etag)
    assert backlog(store, ORG).due


@pytest.mark.parametrize("listed_through", ["zzz", {"a": 1}, "orgs/other/ledger/ffffffffffff7000000000000000000.run.json"])
def test_a_mark_that_names_no_run_of_this_ledger_is_not_used(published, listed_through):
    store, now = published
    runs(store, now - HOUR_MS, 25)
    write_entry(store, now - HOUR_MS + 30, ".json")
    watermark = json.loads(store.get(pointer_key(ORG)).body)["watermark"]
    store.put_if_absent(runs_listed_key(ORG), json.dumps({"listed_through": listed_through,
                                                          "watermark": watermark}).encode())
    assert backlog(store, ORG).due
