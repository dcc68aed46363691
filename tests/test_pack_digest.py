"""Packs are byte-identical across optimisations: a fixed corpus, a fixed
``at``, fixed ids, and a pinned digest of every pack.

If a change moves this digest, it changed what agents receive: that is a
behaviour change to justify (and re-pin), never a side effect of making
compile faster. The candidate step is also checked against the reference
FTS5 query on every task.
"""

import hashlib
import random

import pytest

from core.config import Settings
from core.ids import record_hex
from core.ledger import encode
from core.layout import entry_key
from core.budget.items import dumps
from core.compile.planning import plan_query
from core.compile.retrieval import CompileScope, fts_candidates, lexical_candidates
from core.service import Service

AT = "2027-03-01T00:00:00Z"
KINDS = ("semantic_fact", "episodic_event", "preference", "procedural", "decision", "relationship")
PINNED = "2c7c4a0e482526fd408a1c1577163326b6b7daec6ec93b43e86bdf37b62e4111"


def corpus(n=600, seed=20260817):
    rng = random.Random(seed)
    vocab = [f"{rng.choice('bcdfgklmnprstvz')}{rng.choice('aeiou')}{rng.choice('lnrst')}"
             f"{rng.choice(['ment', 'ing', 'able', 'ly', 'ness', 'er'])}{i}" for i in range(400)]
    weights = [1 / (r + 1) for r in range(len(vocab))]
    fillers = ["the", "a", "of", "to", "should", "before", "after", "must", "is", "with"]
    for i in range(n):
        words = [rng.choice(fillers) if rng.random() < 0.3 else rng.choices(vocab, weights)[0]
                 for _ in range(rng.randint(8, 30))]
        yield i, " ".join(words).capitalize() + ".", KINDS[rng.randrange(6)], round(0.6 + 0.4 * rng.random(), 3), \
            rng.choice(["asserted", "verified", "unverified"]), vocab, weights


def build(tmp_path):
    service = Service(Settings.from_env(data_dir=str(tmp_path), env={"TITEN_SNAPSHOT_TTL": "0"}))
    key = service.keys.create("digest", "alice", ["context:compile", "admin"], [])
    principal = service.keys.authenticate("Bearer " + key["api_key"])
    rows = list(corpus())
    base_ms = 1_790_000_000_000  # 2026-09-21: fixed creation times, so recency is fixed too
    for batch in range(0, len(rows), 100):
        ms = base_ms + batch * 86_400_000 // 10
        hex_ = f"{ms:012x}7000{batch:012x}0000"
        created = f"2026-09-{21 + batch // 100:02d}T00:00:00.000000Z"
        observations, claims = [], []
        for j, (i, statement, kind, confidence, trust, _, _) in enumerate(rows[batch:batch + 100]):
            obs_id, claim_id = f"obs_{record_hex(hex_, 2 * j + 1)}", f"claim_{record_hex(hex_, 2 * j + 2)}"
            observations.append({"observation_id": obs_id, "org_id": "digest", "subject_id": "s", "project_id": None,
                                 "workspace_id": None, "visibility": "organization", "owner_id": "alice",
                                 "kind": "user_statement", "content": statement, "source": {"type": "tool", "ref": f"d#{i}"},
                                 "trust": trust, "occurred_at": None, "created_at": created})
            sources = [{"observation_id": obs_id, "relation": "supports"}]
            if i % 17 == 0 and j:
                sources.append({"observation_id": observations[j - 1]["observation_id"], "relation": "contradicts"})
            claims.append({"claim_id": claim_id, "org_id": "digest", "owner_id": "alice", "subject_id": "s",
                           "project_id": None, "visibility": "organization", "workspace_id": None,
                           "statement": statement, "kind": kind, "confidence": confidence, "trust": trust,
                           "observer_id": None, "valid_from": created, "valid_to": None, "created_at": created,
                           "sources": sources})
        entry = {"entry_id": hex_, "type": "batch", "org_id": "digest", "actor": "alice", "recorded_at": created,
                 "batch_key": f"digest:{batch}", "observations": observations, "claims": claims}
        service.store.put_if_absent(entry_key("digest", hex_), encode(entry))
    service.rebuild("digest")
    return service, principal, rows[0][5], rows[0][6]


def tasks(vocab, weights, n=60):
    rng = random.Random(7)
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(2, 9)) + ["the", "before"]) for _ in range(n)]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    return build(tmp_path_factory.mktemp("digest"))


def packs(service, principal, task_list):
    out = []
    for task in task_list:
        for budget in (300, 1200):
            data = service.compiler.compile(principal, {"subject_id": "s", "task": task, "max_tokens": budget,
                                                        "at": AT}).data
            out.append({k: v for k, v in data.items() if k != "context_id"})
    return out


def test_the_candidate_step_equals_the_fts5_reference_on_every_task(fixed):
    service, principal, vocab, weights = fixed
    snapshot = service.reader.current("digest")
    scope = CompileScope(principal, "s", None, "2027-03-01T00:00:00.000000Z")
    where, params = scope.where()
    for task in tasks(vocab, weights):
        plan = plan_query(task)
        assert lexical_candidates(snapshot, scope, plan) == fts_candidates(snapshot.db, where, params, plan.match)


def test_packs_match_the_pinned_digest(fixed):
    service, principal, vocab, weights = fixed
    result = packs(service, principal, tasks(vocab, weights))
    assert sum(len(p["items"]) for p in result) > 200 and any(p["conflicts"] for p in result)
    digest = hashlib.sha256("\n".join(dumps(p) for p in result).encode()).hexdigest()
    assert digest == PINNED
