"""titen_client against a live ``titen serve``: one test per route, the error path, retries.

Retries are provoked by a small relay between the client and the real
server (``Relay``): it can answer 503 itself, or pass a request on and cut
the connection before the answer, and it records the headers of every
attempt, so the tests see what the client sent and what the server stored.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from core.storage import open_store
from core.config import Settings
from test_mcp import serve
from titen_client import Titen, TitenError, TitenUnavailable

ROOT = Path(__file__).resolve().parent.parent
OBSERVATION = {"subject_id": "user_rama", "kind": "tool_result", "content": "Production smoke returned 200.",
               "source": {"type": "tool", "ref": "deploy_456#smoke"}, "visibility": "organization"}
CLAIM = {"statement": "Deploy smoke checks must pass before a release is promoted.", "kind": "procedural",
         "confidence": 0.9}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One ``titen serve`` for this module: each test reads only what it wrote or counts a difference."""
    tmp = tmp_path_factory.mktemp("client")
    for url, keys in serve(tmp):
        yield url, keys, str(tmp / "titen")


@pytest.fixture
def titen(served):
    url, keys, _ = served
    return Titen(url, keys["all"], backoff=0.01)


def test_healthz(titen):
    assert titen.healthz() == {"status": "ok"}
    assert titen.last_meta["request_id"].startswith("req_")


def test_readyz_reports_the_generation(titen):
    before = titen.readyz()["generation"]
    titen.observe(**OBSERVATION, claim=CLAIM)
    assert titen.rebuild()["generation"] == before + 1
    assert titen.readyz()["generation"] == before + 1


def test_observe_returns_the_ids(titen):
    written = titen.observe(**OBSERVATION, claim=CLAIM)
    assert written["observation_id"].startswith("obs_") and written["claim_id"].startswith("claim_")


def test_observe_batch_stores_the_valid_items_and_reports_the_others(titen):
    out = titen.observe_batch([OBSERVATION, {**OBSERVATION, "kind": "nope"}])
    assert [sorted(r) for r in out["results"]] == [["data", "index"], ["error", "index"]]
    assert out["results"][1]["error"]["code"] == "VALIDATION_ERROR"


def test_consolidate_cites_an_observation(titen):
    obs = titen.observe(**OBSERVATION)
    out = titen.consolidate("user_rama", [{**CLAIM, "sources": [{"observation_id": obs["observation_id"],
                                                                 "relation": "supports"}]}])
    assert out["model_used"] is False and len(out["claim_ids"]) == 1


@pytest.fixture
def subject():
    """A subject of the test's own: the server is shared by the module."""
    return f"user_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def claim_id(titen, subject):
    claim_id = titen.observe(**{**OBSERVATION, "subject_id": subject}, claim=CLAIM)["claim_id"]
    titen.rebuild()
    return claim_id


def test_supersede_replaces_the_claim(titen, claim_id):
    out = titen.supersede(claim_id, 1, "Smoke and canary must pass before a release.")
    assert out["superseded"] == claim_id and out["claim_id"] != claim_id


def test_revoke(titen, claim_id):
    assert titen.revoke(claim_id, 1, "wrong") == {"claim_id": claim_id, "status": "revoked", "version": 2}


def test_expire(titen, claim_id):
    assert titen.expire(claim_id, 1)["status"] == "expired"


def test_evidence(titen, claim_id):
    out = titen.evidence(claim_id)
    assert out["claim"]["claim_id"] == claim_id and [e["relation"] for e in out["evidence"]] == ["supports"]
    assert titen.last_meta["generation"] >= 1


def test_compile_returns_the_claim(titen, subject, claim_id):
    pack = titen.compile(subject, "can we promote the release? smoke checks", max_tokens=1200)
    assert [i["claim_id"] for i in pack["items"]] == [claim_id]
    assert titen.last_meta["degraded"]["vector"] == "disabled"


def test_context_is_the_stored_pack(titen, subject, claim_id):
    pack = titen.compile(subject, "smoke checks", max_tokens=1200)
    assert titen.context(pack["context_id"])["items"] == pack["items"]


def test_feedback(titen, subject, claim_id):
    pack = titen.compile(subject, "smoke checks", max_tokens=1200)
    out = titen.feedback(pack["context_id"], "useful", claim_id=claim_id)
    assert out["outcome"] == "useful" and out["claim_id"] == claim_id


def test_rebuild(titen):
    assert set(titen.rebuild()) >= {"generation", "published", "content_hash"}


@pytest.fixture
def eraser(served):
    url, keys, _ = served
    return Titen(url, keys["erase"], backoff=0.01)


def test_erase_subject_is_pending_then_complete_with_counts(titen, eraser, subject, claim_id):
    asked = eraser.erase_subject(subject)
    assert asked == {"erasure_id": asked["erasure_id"], "subject_id": subject, "status": "pending"}
    titen.rebuild()
    done = eraser.erasure(asked["erasure_id"])
    assert done["status"] == "complete" and done["counts"]["claims"] == 1
    assert titen.compile(subject, "smoke checks", max_tokens=1200)["items"] == []


def test_erase_observation_takes_the_claim_it_alone_supports(titen, eraser, subject):
    written = titen.observe(**{**OBSERVATION, "subject_id": subject}, claim=CLAIM)
    asked = eraser.erase_observation(written["observation_id"])
    assert asked["observation_id"] == written["observation_id"] and asked["status"] == "pending"
    titen.rebuild()
    assert eraser.erasure(asked["erasure_id"])["status"] == "complete"
    with pytest.raises(TitenError) as caught:
        titen.evidence(written["claim_id"])
    assert caught.value.code == "NOT_FOUND"


def test_an_error_answer_raises_with_code_status_and_request_id(titen):
    with pytest.raises(TitenError) as caught:
        titen.evidence("claim_" + "0" * 32)
    assert caught.value.code == "NOT_FOUND" and caught.value.status == 404
    assert caught.value.request_id.startswith("req_")
    assert caught.value.message == "claim claim_00000000000000000000000000000000 not found"


def test_a_validation_error_raises(titen):
    with pytest.raises(TitenError) as caught:
        titen.compile("user_rama", "x", max_tokens=5)
    assert caught.value.code == "VALIDATION_ERROR" and caught.value.status == 400


def test_openapi_returns_the_document_whole(titen):
    document = titen.openapi()
    assert document["openapi"].startswith("3.1") and "/v1/context/compile" in document["paths"]


def test_readyz_not_ready_raises_unavailable_carrying_the_report(served, tmp_path):
    """An organization whose only generation fails its checksum: /readyz is a
    503 whose body says why, and the client hands that body over."""
    from core.keys import KeyRing
    url, _, data_dir = served
    key = KeyRing(open_store(Settings.from_env(data_dir=data_dir).store_url)).create(
        "damaged", "dana", ["context:compile"], [])["api_key"]
    lines = tmp_path / "one.ndjson"
    lines.write_text(json.dumps({**OBSERVATION, "claim": CLAIM}) + "\n")
    subprocess.run([str(Path(sys.executable).with_name("titen")), "import", str(lines), "--org", "damaged",
                    "--data-dir", data_dir, "--rebuild"], check=True, capture_output=True)
    (snapshot,) = Path(data_dir, "orgs", "damaged", "snapshots").glob("*.sqlite")
    raw = bytearray(snapshot.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(raw))
    r = Relay(url, [])
    try:
        with pytest.raises(TitenUnavailable) as caught:
            Titen(r.url, key, backoff=0.01).readyz()
    finally:
        r.close()
    assert len(r.seen) == 1  # a report is an answer, for a probe to read at once, not retried
    assert caught.value.status == 503 and caught.value.data["status"] == "not_ready"
    assert caught.value.message == caught.value.data["reason"] and "sha256" in caught.value.message


def test_a_wrong_key_raises_unauthenticated(served):
    url, _, _ = served
    with pytest.raises(TitenError) as caught:
        Titen(url, "titen_sk_" + "A" * 43).compile("user_rama", "x", max_tokens=200)
    assert caught.value.code == "UNAUTHENTICATED" and caught.value.status == 401


# -- retries through a relay -------------------------------------------------------

class Relay:
    """Between the client and the server: ``plan`` says, per attempt, "503"
    or "500" (answer it here), "gateway 503" (or 502, 504: answer as API
    Gateway does, with its own body), "redirect URL" (a 302 there), "cut"
    (pass it on, then close without answering) or "pass"; ``seen`` keeps
    every attempt's method, path and headers."""

    def __init__(self, upstream: str, plan: list[str]):
        self.upstream, self.plan, self.seen = upstream, list(plan), []
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                relay.seen.append((self.command, self.path, dict(self.headers)))
                step = relay.plan.pop(0) if relay.plan else "pass"
                if step.startswith("redirect "):
                    self.send_response(302)
                    self.send_header("location", step.split(" ", 1)[1])
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if step.startswith("gateway "):
                    raw = b'{"message":"Service Unavailable"}'
                    self.send_response(int(step.split(" ", 1)[1]))
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                if step in ("503", "500"):
                    code = "UNAVAILABLE" if step == "503" else "INTERNAL"
                    raw = json.dumps({"error": {"code": code, "message": "relay says retry"},
                                      "meta": {"request_id": "req_" + "0" * 32}}).encode()
                    self.send_response(int(step))
                    self.send_header("content-type", "application/json")
                    self.send_header("retry-after", "0")
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                request = urllib.request.Request(relay.upstream + self.path, data=body or None,
                                                 method=self.command, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, raw, ctype = response.status, response.read(), response.headers["content-type"]
                except urllib.error.HTTPError as exc:
                    status, raw, ctype = exc.code, exc.read(), exc.headers["content-type"]
                if step == "cut":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def relay(served):
    url, _, _ = served
    made = []

    def make(plan):
        made.append(Relay(url, plan))
        return made[-1]
    yield make
    for r in made:
        r.close()


def _ledger(served_store):
    return sorted(served_store.list_keys("orgs/acme/ledger/"))


@pytest.fixture
def store(served):
    return open_store(Settings.from_env(data_dir=served[2]).store_url)


def test_a_503_is_retried_with_the_same_idempotency_key_and_the_write_stored_once(served, relay, store):
    url, keys, _ = served
    r = relay(["503", "503"])
    before = _ledger(store)
    written = Titen(r.url, keys["all"], backoff=0.01).observe(**OBSERVATION)
    assert written["observation_id"].startswith("obs_")
    assert len(r.seen) == 3
    idempotency_keys = {h.get("Idempotency-Key") or h.get("idempotency-key") for _, _, h in r.seen}
    assert len(idempotency_keys) == 1 and None not in idempotency_keys
    assert len(_ledger(store)) == len(before) + 1


def test_a_500_on_a_write_is_retried_with_the_same_idempotency_key_and_stored_once(served, relay, store):
    """docs/api.md §12: a 500's outcome is unknown, so a keyed write is sent again."""
    url, keys, _ = served
    r = relay(["500"])
    before = _ledger(store)
    Titen(r.url, keys["all"], backoff=0.01).observe(**OBSERVATION)
    assert len(r.seen) == 2
    assert len({h.get("Idempotency-Key") or h.get("idempotency-key") for _, _, h in r.seen}) == 1
    assert len(_ledger(store)) == len(before) + 1


def test_a_500_on_a_read_is_not_retried(served, relay):
    url, keys, _ = served
    r = relay(["500"])
    with pytest.raises(TitenError) as caught:
        Titen(r.url, keys["all"], backoff=0.01).compile("user_rama", "deploy", max_tokens=1200)
    assert caught.value.code == "INTERNAL" and len(r.seen) == 1


def test_a_write_whose_answer_was_lost_is_retried_and_stored_once(served, relay, store):
    """The server stores the first attempt, the relay cuts its answer: the
    retry carries the same key, so the server replays instead of storing again."""
    url, keys, _ = served
    r = relay(["cut"])
    before = _ledger(store)
    client = Titen(r.url, keys["all"], backoff=0.01)
    written = client.observe(**OBSERVATION)
    assert len(r.seen) == 2
    sent = [{k.lower(): v for k, v in h.items()}["idempotency-key"] for _, _, h in r.seen]
    assert sent[0] == sent[1]
    assert client.last_meta.get("idempotent_replay") is True
    new = set(_ledger(store)) - set(before)
    assert len(new) == 1  # one entry, and it is the one the replayed answer names
    assert written["observation_id"][4:32] in new.pop()


def test_every_write_has_its_own_idempotency_key_and_reads_have_none(served, relay):
    url, keys, _ = served
    r = relay([])
    client = Titen(r.url, keys["all"])
    client.observe(**OBSERVATION)
    client.observe(**OBSERVATION)
    client.compile("user_rama", "smoke", max_tokens=1200)
    sent = [{k.lower(): v for k, v in h.items()}.get("idempotency-key") for _, _, h in r.seen]
    assert sent[0] and sent[1] and sent[0] != sent[1] and sent[2] is None


def test_a_caller_may_choose_the_idempotency_key(served, relay):
    url, keys, _ = served
    r = relay([])
    Titen(r.url, keys["all"]).observe(**OBSERVATION, idempotency_key="import-line-17")
    assert {k.lower(): v for k, v in r.seen[0][2].items()}["idempotency-key"] == "import-line-17"


def test_a_cut_connection_is_retried(served, relay):
    url, keys, _ = served
    r = relay(["cut"])
    pack = Titen(r.url, keys["all"], backoff=0.01).compile("user_rama", "smoke", max_tokens=1200)
    assert pack["context_id"].startswith("ctx_") and len(r.seen) == 2


def test_when_every_retry_fails_the_error_is_unavailable(served, relay):
    url, keys, _ = served
    r = relay(["503"] * 5)
    with pytest.raises(TitenUnavailable) as caught:
        Titen(r.url, keys["all"], retries=2, backoff=0.01).compile("user_rama", "smoke", max_tokens=1200)
    assert caught.value.code == "UNAVAILABLE" and caught.value.status == 503 and len(r.seen) == 3


def test_a_gateways_503_without_the_envelope_is_retried_then_unavailable(served, relay):
    """API Gateway answers a throttled or cold Lambda with its own 503 body:
    catching TitenUnavailable must catch that too (docs/api.md §15)."""
    url, keys, _ = served
    r = relay(["gateway 503"] * 5)
    with pytest.raises(TitenUnavailable) as caught:
        Titen(r.url, keys["all"], retries=2, backoff=0.01).observe(**OBSERVATION)
    assert caught.value.code == "UNAVAILABLE" and caught.value.status == 503 and len(r.seen) == 3


def test_a_gateways_503_then_an_answer_is_the_answer(served, relay):
    url, keys, _ = served
    r = relay(["gateway 503"])
    pack = Titen(r.url, keys["all"], backoff=0.01).compile("user_rama", "smoke", max_tokens=1200)
    assert pack["context_id"].startswith("ctx_") and len(r.seen) == 2


def test_a_server_that_is_not_there_is_unavailable_after_the_retries():
    with pytest.raises(TitenUnavailable) as caught:
        Titen("http://127.0.0.1:9", "k", retries=1, backoff=0.01, timeout=2).healthz()
    assert caught.value.code == "UNAVAILABLE" and caught.value.status is None


def test_the_client_imports_without_the_servers_dependencies():
    blocked = ["core", "handler", "starlette", "apsw", "boto3", "mangum", "numpy", "uvicorn", "httpx2", "mcp"]
    probe = (
        "import sys, importlib.abc\n"
        f"BLOCKED = {blocked!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in BLOCKED: raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import titen_client\n"
        "titen_client.Titen('http://example.invalid', 'k')\n"
        "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in BLOCKED))\n")
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_redirect_is_an_error_and_the_key_never_goes_where_it_points(served, relay, store):
    # urllib followed it: the key went to the other host, and the write became a GET
    url, keys, _ = served
    elsewhere = relay([])
    r = relay([f"redirect {elsewhere.url}/stolen"])
    before = _ledger(store)
    with pytest.raises(TitenError) as caught:
        Titen(r.url, keys["all"], backoff=0.01).observe(**OBSERVATION)
    assert caught.value.code == "REDIRECT" and caught.value.status == 302
    assert elsewhere.seen == [] and len(r.seen) == 1 and _ledger(store) == before


@pytest.mark.parametrize("status", [502, 504])
def test_a_gateways_502_or_504_on_a_write_is_retried_and_stored_once(served, relay, store, status):
    url, keys, _ = served
    r = relay([f"gateway {status}"])
    before = _ledger(store)
    written = Titen(r.url, keys["all"], backoff=0.01).observe(**OBSERVATION)
    assert written["observation_id"].startswith("obs_") and len(r.seen) == 2
    assert len(_ledger(store)) == len(before) + 1


def test_a_write_whose_outcome_stayed_unknown_can_be_sent_again_with_the_key_the_error_carries(served, relay,
                                                                                                store):
    url, keys, _ = served
    r = relay(["cut", "cut"])  # stored on the first attempt, the answer lost twice
    before = _ledger(store)
    with pytest.raises(TitenUnavailable) as caught:
        Titen(r.url, keys["all"], retries=1, backoff=0.01).observe(**OBSERVATION)
    assert caught.value.idempotency_key == r.seen[0][2]["Idempotency-Key"]
    later = Titen(url, keys["all"])
    later.observe(**OBSERVATION, idempotency_key=caught.value.idempotency_key)
    assert later.last_meta["idempotent_replay"] is True
    assert len(_ledger(store)) == len(before) + 1


@pytest.mark.parametrize("key", ["ключ", "a\r\nb", "a b", "", "x" * 256])
def test_an_idempotency_key_the_header_cannot_carry_is_refused_before_sending(served, relay, key):
    url, keys, _ = served
    r = relay([])
    with pytest.raises(TitenError) as caught:
        Titen(r.url, keys["all"]).observe(**OBSERVATION, idempotency_key=key)
    assert caught.value.code == "VALIDATION_ERROR" and caught.value.status is None and r.seen == []


def test_text_utf8_cannot_carry_reaches_the_server_and_gets_its_400(served):
    url, keys, _ = served
    with pytest.raises(TitenError) as caught:
        Titen(url, keys["all"]).observe(**{**OBSERVATION, "content": "lone \ud800 surrogate"})
    assert caught.value.code == "VALIDATION_ERROR" and caught.value.status == 400


def test_a_batch_item_that_is_not_an_object_is_that_items_error(served):
    url, keys, _ = served
    results = Titen(url, keys["all"]).observe_batch([OBSERVATION, "not an object"])["results"]
    assert "data" in results[0] and results[1]["error"]["code"] == "VALIDATION_ERROR"


def test_last_meta_never_holds_an_earlier_calls_meta(served):
    url, keys, _ = served
    titen = Titen(url, keys["all"])
    titen.readyz()
    assert titen.last_meta["request_id"].startswith("req_")
    titen.openapi()
    assert titen.last_meta == {}
    titen.readyz()
    titen.url, titen.retries = "http://127.0.0.1:9", 0  # nothing listens: no answer, so no meta
    with pytest.raises(TitenUnavailable):
        titen.healthz()
    assert titen.last_meta == {}
