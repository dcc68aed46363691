"""Liveness: ``/healthz`` answers while a large rebuild runs, because route work
runs on the thread pool, never on the event loop (docs/architecture.md, "HTTP and
errors"). Against the real ``titen serve`` on loopback. How fast it answers is
the benchmark's to say (``python -m bench.liveness``: the target is p99 <= 50 ms
at 50k claims); this test asserts no duration, only that answers keep coming
while the rebuild runs: a rebuild on the event loop would hold every one of
them until it ended, a handful at most."""

from bench.liveness import measure

CLAIMS = 5000


def test_healthz_answers_while_an_admin_rebuild_of_5000_claims_runs(tmp_path):
    result = measure(CLAIMS, str(tmp_path / "titen"))
    rebuild = result["rebuild"]
    assert rebuild["status"] == 200 and rebuild["body"]["data"]["claim_count"] == CLAIMS
    samples = result["samples"]
    assert len(samples) >= 20  # answered, one after another, before the rebuild answered
    assert result["failures"] == 0


def test_concurrent_compiles_and_writes_on_one_organization_never_fail(tmp_path):
    """Off the event loop, requests run in threads: one organization's snapshot
    connection is used by one at a time (apsw raises ThreadingViolationError
    otherwise; found by bench/soak.py)."""
    import json
    import threading

    from bench.common import Served, create_key, import_corpus
    from bench.liveness import ORG, SCOPES

    data_dir = str(tmp_path / "titen")
    key = create_key(data_dir, ORG, SCOPES, principal="ops")
    import_corpus(data_dir, 300, ORG)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    statuses = []
    with Served(data_dir) as served:
        def client(n):
            conn = served.connection()
            for i in range(15):
                if i % 3 == 0:
                    body = {"subject_id": "user_bench", "kind": "tool_result", "content": f"w{n}-{i}",
                            "source": {"type": "tool", "ref": "t"}, "visibility": "organization",
                            "claim": {"statement": f"writer {n} fact {i}", "kind": "semantic_fact",
                                      "confidence": 0.8}}
                    conn.request("POST", "/v1/observations", json.dumps(body), headers)
                else:
                    conn.request("POST", "/v1/context/compile", json.dumps(
                        {"subject_id": "user_bench", "task": "release train deploy", "max_tokens": 1200}), headers)
                resp = conn.getresponse()
                resp.read()
                statuses.append(resp.status)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log = served.log()
    assert len(statuses) == 8 * 15
    assert set(statuses) <= {200, 201}, sorted(set(statuses))
    assert "ThreadingViolationError" not in log and "Traceback" not in log
