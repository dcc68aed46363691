"""A write completed long after its id was minted still reaches the next
snapshot (core/ledger.py "late entries"): a retry taking over an
Idempotency-Key, a re-run finishing a killed import, the next writer
finishing a claim's pending transition.

Each test makes the rebuild's watermark pass the late id first (skew window
0 s, later writes rebuilt) — the case a plain write under the old id loses."""

import json

import pytest

import core.ledger
from core.writes.importer import import_file
from core.keys import Principal
from core.snapshot.build import SnapshotBuilder
from core.storage import StoreError

OBSERVATION = {"subject_id": "user_rama", "kind": "tool_result", "content": "Canary passed.",
               "source": {"type": "tool", "ref": "canary#1"}, "visibility": "organization",
               "claim": {"statement": "The canary gates the rollout.", "kind": "procedural", "confidence": 0.9}}


@pytest.fixture
def late(monkeypatch):
    """Every id older than 0 s is late, and rebuilds read no skew window."""
    monkeypatch.setattr(core.ledger, "LATE_AFTER_SECONDS", 0)


def build(store, tmp_path, from_scratch=False):
    return SnapshotBuilder(store, "acme", work_dir=str(tmp_path / "w"), skew_seconds=0).rebuild(
        from_scratch=from_scratch)


def fail_next_ledger_put(store, monkeypatch):
    real = store.put_if_absent
    state = {"armed": True}

    def put_if_absent(key, body):
        if "/ledger/" in key and state["armed"]:
            state["armed"] = False
            raise StoreError("injected: died before the ledger entry")
        return real(key, body)

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)


def test_a_keyed_write_completed_after_the_watermark_passed_its_id_is_in_the_next_snapshot(
        api, tmp_path, monkeypatch, late):
    key = api.key()
    store = api.service.store
    fail_next_ledger_put(store, monkeypatch)
    assert api.post("/v1/observations", OBSERVATION, {**key, "Idempotency-Key": "k"}).status_code == 503
    api.observe(key, content="A later write.")
    assert build(store, tmp_path).claim_count == 0  # the later write has no claim; the watermark is past
    stored = api.post("/v1/observations", OBSERVATION, {**key, "Idempotency-Key": "k"})
    assert stored.status_code == 201
    result = build(store, tmp_path)
    assert result.claim_count == 1
    assert build(store, tmp_path, from_scratch=True).content_hash == result.content_hash
    replay = api.post("/v1/observations", OBSERVATION, {**key, "Idempotency-Key": "k"}).json()
    assert replay["meta"]["idempotent_replay"] is True and replay["data"] == stored.json()["data"]
    # the observation is still found by its id, at once
    cite = {"subject_id": "user_rama", "claims": [{"statement": "Canaries first.", "kind": "procedural",
            "confidence": 0.8, "sources": [{"observation_id": stored.json()["data"]["observation_id"],
                                            "relation": "supports"}]}]}
    assert api.post("/v1/consolidations", cite, key).status_code == 201


def test_a_pending_transition_completed_late_is_in_the_next_snapshot(api, tmp_path, monkeypatch, late):
    key = api.key()
    store = api.service.store
    claim_id = api.observe(key, claim=OBSERVATION["claim"])["claim_id"]
    build(store, tmp_path)
    fail_next_ledger_put(store, monkeypatch)
    assert api.post(f"/v1/claims/{claim_id}/revoke", {"expected_version": 1}, key).status_code == 503
    api.observe(key, content="A later write.")
    build(store, tmp_path)
    # the next writer on the claim completes the pending entry, then finds the version moved on
    assert api.post(f"/v1/claims/{claim_id}/revoke", {"expected_version": 1}, key).status_code == 409
    build(store, tmp_path)
    evidence = api.get(f"/v1/claims/{claim_id}/evidence", key).json()["data"]["claim"]
    assert evidence["status"] == "revoked" and evidence["version"] == 2


def test_an_import_group_completed_late_is_in_the_next_snapshot(tmp_path, monkeypatch, late):
    from core.storage.local import LocalStore
    store = LocalStore(str(tmp_path / "s"))
    principal = Principal("acme", "importer", "cli", frozenset({"admin"}), ())
    src = tmp_path / "in.ndjson"
    src.write_text("".join(json.dumps({**OBSERVATION, "content": f"line {i}",
                                       "claim": {**OBSERVATION["claim"], "statement": f"fact {i}"}}) + "\n"
                           for i in range(250)))
    real = store.put_if_absent
    calls = {"n": 0}

    class Killed(BaseException):
        pass

    def put_if_absent(key, body):
        if "/ledger/" in key:
            calls["n"] += 1
            if calls["n"] == 2:
                raise Killed()
        return real(key, body)

    with monkeypatch.context() as m:
        m.setattr(store, "put_if_absent", put_if_absent)
        with pytest.raises(Killed):
            import_file(store, principal, str(src), batch_size=100)
    import_file(store, principal, str(_one_line(tmp_path)), batch_size=100)  # a later write, rebuilt first
    build(store, tmp_path)
    import_file(store, principal, str(src), batch_size=500)
    result = build(store, tmp_path)
    assert result.claim_count == 251
    assert build(store, tmp_path, from_scratch=True).content_hash == result.content_hash


def _one_line(tmp_path):
    path = tmp_path / "one.ndjson"
    path.write_text(json.dumps({**OBSERVATION, "claim": {**OBSERVATION["claim"], "statement": "other"}}) + "\n")
    return path
