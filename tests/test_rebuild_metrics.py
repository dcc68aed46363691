"""The rebuild function's metrics (core/rebuild/runner.py, core/observe/metrics.py).

Freshness lag is how long the oldest ledger entry a build applied had been
stored when its generation was published (ledger keys are UUIDv7: their
first 48 bits are the millisecond the ledger accepted the entry). An entry
"stored two minutes ago" is written by a writer whose clock is two minutes
behind, which is what it looks like to the rebuild.
"""

import json
import time

import pytest

from core.config import Settings
from core.ids import uuid7_ms
from core.layout import entry_hex_of
from core.rebuild.runner import RebuildFailed, RebuildRunner
from core.service import Service
from emf_spec import assert_emf, metric_values

REBUILD = frozenset({("Service", "rebuild")})


@pytest.fixture
def service(tmp_path):
    return Service(Settings.from_env(data_dir=str(tmp_path / "titen"), env={
        "TITEN_SNAPSHOT_TTL": "0", "TITEN_METRICS": "emf", "TITEN_METRICS_NAMESPACE": "titen/test"}))


@pytest.fixture
def principal(service):
    created = service.keys.create("acme", "alice", ["memory:write", "admin"], [])
    return service.keys.authenticate("Bearer " + created["api_key"])


def observe(service, principal, content: str) -> str:
    """Write one observation; its ledger key."""
    before = set(service.store.list_keys("orgs/acme/ledger/"))
    service.write(principal, "POST /v1/observations", {}, {
        "subject_id": "user_rama", "kind": "tool_result", "content": content,
        "source": {"type": "tool", "ref": "smoke#1"}})
    (key,) = set(service.store.list_keys("orgs/acme/ledger/")) - before
    return key


def observe_behind(service, principal, content: str, seconds: float, monkeypatch) -> str:
    """An observation from another writer process, whose clock is ``seconds`` behind."""
    import core.ids
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() - seconds)
        m.setattr(core.ids, "_last", [0, 0])  # that process's own monotonic id guard
        return observe(service, principal, content)


def rebuild(service, capsys) -> tuple[dict, list[dict], float, float]:
    """(the organization's rebuild line, the EMF documents, seconds before, after)
    of a direct invoke for acme."""
    capsys.readouterr()
    before = time.time()
    try:
        RebuildRunner(service).handle({"org_id": "acme"})
    except RebuildFailed:  # the invocation fails after writing the line
        pass
    after = time.time()
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    (line,) = [x for x in out if x.get("event") == "rebuild"]
    docs = [x for x in out if "_aws" in x]
    for doc in docs:
        assert_emf(doc)
    return line, docs, before, after


def stored_at(key: str) -> float:
    return uuid7_ms(entry_hex_of(key)) / 1000


def test_freshness_lag_is_the_age_of_the_oldest_entry_the_build_applied(service, principal, capsys, monkeypatch):
    oldest = observe_behind(service, principal, "Smoke returned 200.", 120, monkeypatch)
    observe(service, principal, "Canary passed.")
    line, docs, before, after = rebuild(service, capsys)
    (lag,) = metric_values(docs)[("FreshnessLag", REBUILD)]
    assert line["entries_applied"] == 2 and line["freshness_lag_seconds"] == lag
    assert before - stored_at(oldest) - 0.002 <= lag <= after - stored_at(oldest) + 0.002
    assert lag > 100  # the old entry's age, not the new one's


def test_freshness_lag_counts_only_the_entries_this_build_applied(service, principal, capsys, monkeypatch):
    observe_behind(service, principal, "Smoke returned 200.", 120, monkeypatch)
    rebuild(service, capsys)
    newest = observe(service, principal, "Canary passed.")
    line, docs, before, after = rebuild(service, capsys)
    (lag,) = metric_values(docs)[("FreshnessLag", REBUILD)]
    assert line["entries_applied"] == 1
    assert before - stored_at(newest) - 0.002 <= lag <= after - stored_at(newest) + 0.002 < 100


def test_a_late_writes_moved_stub_is_not_taken_for_the_oldest_entry(service, principal, capsys):
    from core.ids import uuid7_hex
    # a write completed long after its id was minted: stored under a fresh key behind a stub at its id
    minted_long_ago = uuid7_hex(int((time.time() - 300) * 1000))[:28] + "0000"
    service.ledger.append("acme", "feedback", {"context_id": "ctx_" + "0" * 32, "outcome": "useful"},
                          actor="alice", entry_hex=minted_long_ago)
    line, docs, before, after = rebuild(service, capsys)
    assert line["published"] is True
    assert 0 <= metric_values(docs)[("FreshnessLag", REBUILD)][0] < 60


def test_a_published_build_writes_its_seconds_entries_and_bytes(service, principal, capsys):
    observe(service, principal, "Smoke returned 200.")
    line, docs, _, _ = rebuild(service, capsys)
    found = metric_values(docs)
    assert found[("RebuildSeconds", REBUILD)] == [line["seconds"]]
    assert found[("EntriesApplied", REBUILD)] == [1]
    assert found[("BytesPublished", REBUILD)] == [line["bytes"]] and line["bytes"] > 0
    assert {d["Namespace"] for doc in docs for d in doc["_aws"]["CloudWatchMetrics"]} == {"titen/test"}


def test_a_build_with_nothing_new_writes_no_metrics(service, principal, capsys):
    observe(service, principal, "Smoke returned 200.")
    rebuild(service, capsys)
    line, docs, _, _ = rebuild(service, capsys)
    assert line["status"] == "unchanged" and "freshness_lag_seconds" not in line and docs == []


def test_a_failed_rebuild_is_counted(service, principal, capsys, monkeypatch):
    observe(service, principal, "Smoke returned 200.")

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(service, "builder", broken)
    line, docs, _, _ = rebuild(service, capsys)
    assert line["status"] == "failed"
    assert metric_values(docs) == {("RebuildFailures", REBUILD): [1]}
