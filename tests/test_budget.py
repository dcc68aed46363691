"""The token budget through HTTP, on real translated text, counted with cl100k_base.

The fixture (tests/fixtures/multilingual_descriptions.json) holds the same 18
Debian package descriptions in 9 languages, as Debian's translators wrote
them. Each language is one subject with 3 claims of each of the 6 kinds, so
a compile at 32000 returns every candidate in rank order: the test can then
check, for every smaller budget, that each candidate left out really did
not fit by the real count (within the 8-token seam allowance), and that the
answer never passes its budget.
"""

import json
import os
import re

import pytest

from core.domain import CLAIM_KINDS
from core.budget.items import dumps
from core.budget.tokens import count_tokens

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "multilingual_descriptions.json")
LANGUAGES = ["de", "es", "fr", "it", "pl", "pt", "ru", "ja", "zh_CN"]
BUDGETS = [150, 200, 300, 450, 700, 1000, 1500, 2000, 3000]  # the task here needs ~140 for the envelope
SEAM_ALLOWANCE = 8


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    from core.config import Settings
    from core.service import Service
    from tests.conftest import Api

    api = Api(Service(Settings.from_env(data_dir=str(tmp_path_factory.mktemp("ml")),
                                        env={"TITEN_SNAPSHOT_TTL": "0"})))
    key = api.key()
    with open(FIXTURE, encoding="utf-8") as f:
        fixture = json.load(f)
    tasks = {}
    for lang in LANGUAGES:
        entries = fixture[lang]
        assert len(entries) == 3 * len(CLAIM_KINDS)
        for i, entry in enumerate(entries):
            api.observe(key, subject_id=f"subj_{lang}", kind="imported_source", content=entry["text"],
                        source={"type": "import", "ref": f"ddtp:{lang}:{entry['package']}"},
                        claim={"statement": f"{entry['package']}: {entry['text']}",
                               "kind": CLAIM_KINDS[i % len(CLAIM_KINDS)], "confidence": 0.9})
        tasks[lang] = " ".join(e["package"] for e in entries[:12])
    api.rebuild(key)
    return api, key, tasks


def compile_(api, key, lang, task, budget):
    r = api.post("/v1/context/compile", {"subject_id": f"subj_{lang}", "task": task, "max_tokens": budget}, key)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def with_item(data, everything, claim_id):
    """``data`` with one more candidate inserted at its rank, and its conflict."""
    order = [i["claim_id"] for i in everything["items"]]
    items = sorted(data["items"] + [i for i in everything["items"] if i["claim_id"] == claim_id],
                   key=lambda i: order.index(i["claim_id"]))
    conflicts = [c for i in items for c in everything["conflicts"] if c["claim_id"] == i["claim_id"]]
    used = sum(count_tokens(dumps(i)) for i in items)
    return dict(data, items=items, conflicts=conflicts, budget=dict(data["budget"], used_tokens=used))


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_pack_fits_its_budget_by_the_real_count(multilingual, lang):
    api, key, tasks = multilingual
    for budget in BUDGETS:
        data = compile_(api, key, lang, tasks[lang], budget)
        assert count_tokens(dumps(data)) <= budget, (lang, budget)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_candidate_is_left_out_only_when_it_does_not_fit_by_the_real_count(multilingual, lang):
    api, key, tasks = multilingual
    everything = compile_(api, key, lang, tasks[lang], 32000)
    assert len(everything["items"]) >= 10  # the task matches most of the subject's claims
    for budget in BUDGETS:
        data = compile_(api, key, lang, tasks[lang], budget)
        packed = {i["claim_id"] for i in data["items"]}
        assert [i["claim_id"] for i in everything["items"] if i["claim_id"] in packed] == \
            [i["claim_id"] for i in data["items"]]  # the same ranking, whole items in rank order
        for item in everything["items"]:
            if item["claim_id"] not in packed:  # no kind is ever full here: 3 claims of each
                grown = with_item(data, everything, item["claim_id"])
                assert count_tokens(dumps(grown)) > budget - SEAM_ALLOWANCE, (lang, budget, item["claim_id"])


@pytest.mark.parametrize("lang", LANGUAGES)
def test_used_tokens_is_the_real_count_of_the_packed_items(multilingual, lang):
    api, key, tasks = multilingual
    for budget in (700, 2000):
        data = compile_(api, key, lang, tasks[lang], budget)
        assert data["items"]
        assert data["budget"]["used_tokens"] == sum(count_tokens(dumps(i)) for i in data["items"])


def test_an_empty_pack_uses_zero_tokens(multilingual):
    api, key, _ = multilingual
    data = compile_(api, key, "de", "zzzzqqq nothing matches this", 128)
    assert data["items"] == [] and data["budget"]["used_tokens"] == 0


@pytest.mark.parametrize("task", ["quarterly access review", "deploy", "rotate the signing key before the audit",
                                  "prepare the quarterly access review for the production team"])
def test_the_documented_minimum_of_128_compiles_a_short_english_task(api, task):
    assert len(task) <= 60
    key = api.key()
    api.observe(key, claim={"statement": "Access reviews are quarterly.", "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    r = api.compile(key, task, max_tokens=128)
    assert r.status_code == 200, r.text
    assert count_tokens(dumps(r.json()["data"])) <= 128


def test_a_budget_too_small_for_the_envelope_names_the_exact_smallest_one_that_compiles(api):
    key = api.key()
    task = "Summarise every decision about the payment service's rollout, " * 12
    r = api.compile(key, task, max_tokens=128)
    assert r.status_code == 400
    body = r.json()
    assert body["error"]["code"] == "VALIDATION_ERROR"
    needed = int(re.search(r"smallest budget that would is (\d+)", body["error"]["message"]).group(1))
    assert needed > 128
    ok = api.compile(key, task, max_tokens=needed)
    assert ok.status_code == 200, ok.text
    assert count_tokens(dumps(ok.json()["data"])) <= needed
    assert api.compile(key, task, max_tokens=needed - 1).status_code == 400


@pytest.mark.parametrize("ids", [{"subject_id": "u" * 128}, {"subject_id": "u" * 128, "project_id": "p" * 128}])
def test_a_long_id_is_echoed_so_its_smallest_budget_is_named_and_compiles(api, ids):
    # api.md §8.6: the envelope echoes the ids too, so 128 need not hold a one-letter task
    key = api.key()
    r = api.compile(key, "x", max_tokens=128, **ids)
    assert r.status_code == 400, r.text
    needed = int(re.search(r"smallest budget that would is (\d+)", r.json()["error"]["message"]).group(1))
    ok = api.compile(key, "x", max_tokens=needed, **ids)
    assert ok.status_code == 200, ok.text
    assert count_tokens(dumps(ok.json()["data"])) <= needed
    assert api.compile(key, "x", max_tokens=needed - 1, **ids).status_code == 400


def test_query_is_the_task_string_and_the_stored_pack_omits_it(api):
    key = api.key()
    api.observe(key, claim={"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                            "confidence": 0.9})
    api.rebuild(key)
    data = api.compile(key, "deploy the checkout service safely").json()["data"]
    assert data["query"] == "deploy the checkout service safely"
    stored = api.get(f"/v1/context/{data['context_id']}", key).json()["data"]
    assert "query" not in stored


def test_every_context_id_costs_15_to_22_tokens(api):
    """The envelope is priced with its id at 22, so the pack never depends
    on which id was drawn, and at most 7 tokens go unspent for it."""
    key = api.key()
    counts = {count_tokens(api.compile(key, "deploy", max_tokens=128).json()["data"]["context_id"])
              for _ in range(40)}
    assert counts <= set(range(15, 23)) and len(counts) > 1


def test_counts_stored_with_another_tokenizer_are_never_trusted_and_the_next_build_replays(api, monkeypatch):
    import core.snapshot.build
    import core.snapshot.projections
    from core.snapshot.schema import ITEM_COUNTS

    key = api.key()
    for i in range(12):
        api.observe(key, claim={"statement": f"Rollout step {i}: canary first, then ten percent, then everyone "
                                             "once the error budget holds.", "kind": CLAIM_KINDS[i % 6],
                                "confidence": 0.9})
    # a snapshot built by a process whose tokenizer counted every prefix as 1 token
    monkeypatch.setattr(core.snapshot.build, "ITEM_COUNTS", "other_tokenizer:0")
    monkeypatch.setattr(core.snapshot.projections, "count_tokens_batch", lambda texts: [1] * len(texts))
    api.rebuild(key)
    assert api.service.reader.current("acme").meta["item_tokenizer"] == "other_tokenizer:0"
    data = api.compile(key, "rollout canary error budget", max_tokens=400).json()["data"]
    assert data["items"]
    assert count_tokens(dumps(data)) <= 400
    assert data["budget"]["used_tokens"] == sum(count_tokens(dumps(i)) for i in data["items"])
    monkeypatch.undo()
    messages = []
    api.service.builder_progress = messages.append
    api.observe(key, claim={"statement": "One more rollout rule.", "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    assert api.service.reader.current("acme").meta["item_tokenizer"] == ITEM_COUNTS
