"""Context compilation: scope → candidates → hydrate → rank → pack, then record.

This module wires the five named steps together; the steps themselves live
where their rule lives (``retrieval`` for the scoped SQL, ``planning``,
``ranking`` and ``packing`` as pure functions). It also records every run in
the ledger *before* answering (docs/api.md §9.8) — the task's sha256, never
the task — so feedback can be checked against the pack at once, and serves
stored packs back to the principal that compiled them.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

from core.bodies import COMPILE
from core.domain import INSTRUCTIONS, POLICY_SNAPSHOT
from core.errors import NotFound, ValidationError
from core.ids import entry_hex, parse_id
from core.instants import canonical, now_utc
from core.keys import Principal
from core.ledger import RUN_SUFFIX, Ledger
from core.packing import (CONTEXT_ID_MIN_TOKENS, CONTEXT_ID_TOKENS, BudgetTooSmall, PackCandidate, assemble, dumps, item_fields,
                           item_prefix, pack)
from core.planning import plan_query
from core.ranking import ClaimSignals, RankInput, rank
from core.retrieval import (COL, CompileScope, disputed_for, hydrate, hydrate_fields, in_scope,
                            lexical_candidates, readable_evidence)
from core.snapshot import SnapshotReader
from core.tokens import count_tokens
from core.validation import Fields

def draw_context_hex() -> str:
    """A ledger entry id for a context run whose ``ctx_…`` id costs 15 to
    ``CONTEXT_ID_TOKENS`` tokens (core.packing prices the envelope at that).
    Draws are bounded: should 64 all miss (never seen), the cheapest id no
    dearer than the price is taken, else a new one is drawn until one is."""
    best = None
    for _ in range(64):
        hex_ = entry_hex()
        cost = count_tokens("ctx_" + hex_)
        if CONTEXT_ID_MIN_TOKENS <= cost <= CONTEXT_ID_TOKENS:
            return hex_
        if cost <= CONTEXT_ID_TOKENS and (best is None or cost > best[0]):
            best = (cost, hex_)
    if best is not None:
        return best[1]
    while True:
        hex_ = entry_hex()
        if count_tokens("ctx_" + hex_) <= CONTEXT_ID_TOKENS:
            return hex_


@dataclass
class CompileRequest:
    subject_id: str
    task: str
    max_tokens: int
    project_id: str | None
    include_checkpoints: bool
    at: str
    at_s: float

    @classmethod
    def parse(cls, body: dict) -> "CompileRequest":
        f = Fields(body, "body", COMPILE)
        subject_id = f.take("subject_id")
        task = f.take("task")
        max_tokens = f.take("max_tokens")
        project_id = f.take("project_id")
        include_checkpoints = f.take("include_checkpoints")
        at = f.take("at") or now_utc()
        return cls(subject_id, task, max_tokens, project_id, include_checkpoints, canonical(at), at.timestamp())


# what a first hydrate reads of a claim to build its ClaimFacts (in of_fields' order)
FACT_FIELDS = ("rowid", "claim_id", "kind", "confidence", "trust_level", "created_s", "feedback_total",
               "feedback_positive", "feedback_negative", "disputed", "dispute_public", "prefix_tokens")

ITEM_VIEW_CACHE = 50_000  # views kept per generation (a few hundred bytes each)
CLAIM_FACTS_CACHE = 20_000  # facts kept per generation (~400 bytes each, no claim text: at most ~8 MB)


@dataclass(slots=True)  # shared per generation, never mutated; ~200 built per compile on a new one
class ClaimFacts(ClaimSignals):
    """What compile reads of a candidate on every request — its ranking
    signals, kind, prefix estimate and dispute flags — the same for every
    reader of a generation. Kept per generation (``Snapshot.claim_facts``)
    once its row has been hydrated, so later requests only send the id
    through the scoped query; ranking hands it back as ``Ranked.signals``.
    The row itself is kept only when the claim looks different to different
    readers (some evidence is not organization-visible: ``prefix_tokens`` is
    None), since its view and its dispute are then worked out per reader."""
    rowid: int
    kind: str
    prefix_tokens: int | None
    disputed: bool
    dispute_public: bool
    row: tuple | None

    @classmethod
    def of_fields(cls, fields: tuple, row: tuple | None) -> "ClaimFacts":
        """``fields``: the claim's FACT_FIELDS; ``row``: its full row
        (CLAIM_FIELDS), needed only when ``prefix_tokens`` is None."""
        (rowid, claim_id, kind, confidence, trust_level, created_s, total, positive, negative, disputed,
         dispute_public, prefix_tokens) = fields
        return cls.of(claim_id, confidence, trust_level, created_s, total, positive, negative, rowid,
                      sys.intern(kind),  # six kinds: one string each, not one per cached claim
                      prefix_tokens, bool(disputed), bool(dispute_public), row if prefix_tokens is None else None)

    def disputed_for(self, principal: Principal) -> bool:
        """``retrieval.disputed_for``: contradicting evidence another reader
        may not see is only looked at when there is some (then the row is kept)."""
        if self.dispute_public:
            return True
        return self.disputed and disputed_for(principal, self.row)


@dataclass(frozen=True)
class ItemView:
    fields: dict                 # the item's documented fields, evidence_ids last, no score
    prefix_tokens: int           # the real count of its serialized prefix (core.packing.item_prefix)
    conflict: dict | None
    conflict_json: str | None
    conflict_tokens: int = 0

    @classmethod
    def build(cls, row: tuple, evidence: list[tuple[str, str]], disputed: bool,
              prefix_tokens: int | None = None) -> "ItemView":
        """``prefix_tokens``: the prefix's count stored at build, when this
        reader sees the item as every reader does (else it is counted here)."""
        status = row[COL["status"]]
        if status == "disputed" and not disputed:
            status = "active"  # contradicted only by evidence this reader may not see
        claim_id = row[COL["claim_id"]]
        fields = item_fields(claim_id, row[COL["statement"]], row[COL["kind"]], row[COL["confidence"]],
                             row[COL["trust"]], status, row[COL["observer_id"]], row[COL["valid_from"]],
                             row[COL["valid_to"]], sorted({o for o, _ in evidence}))
        conflict = None
        if disputed:
            conflict = {"claim_id": claim_id, "reason": "contradicting_evidence",
                        "evidence_ids": sorted({o for o, r in evidence if r in ("supports", "contradicts")})}
        conflict_json = dumps(conflict) if conflict else None
        if prefix_tokens is None:
            prefix_tokens = count_tokens(item_prefix(fields))
        return cls(fields, prefix_tokens, conflict, conflict_json,
                   count_tokens(conflict_json) if conflict_json else 0)


def stored_pack_json(data: dict, data_json: str) -> str:
    """``dumps`` of the pack as stored — ``data`` without ``query`` — cut
    out of ``data_json`` (``dumps(data)``), where ``query`` comes right after
    ``context_id``, rather than encoded a second time."""
    head = '{"context_id":' + dumps(data["context_id"]) + ","
    query = '"query":' + dumps(data["query"]) + ","
    if list(data)[:2] == ["context_id", "query"] and data_json.startswith(head + query):
        return head + data_json[len(head) + len(query):]
    return dumps({k: v for k, v in data.items() if k != "query"})


@dataclass
class CompileOutcome:
    data: dict
    meta: dict
    timings: dict = field(default_factory=dict)
    data_json: str | None = None  # ``dumps(data)``: the bytes whose real count fits the budget


class Compiler:
    def __init__(self, ledger: Ledger, reader: SnapshotReader, vector_state: str = "disabled", vectors=None):
        self.ledger = ledger
        self.reader = reader
        self.vector_state = vector_state
        self.vectors = vectors  # core.vectors.VectorSearch when an embedder is configured, else None

    def compile(self, principal: Principal, body: dict) -> CompileOutcome:
        principal.require("context:compile")
        req = CompileRequest.parse(body)
        # one reader of this organization's snapshot at a time, whoever calls
        # (HTTP, MCP, CLI): see SnapshotReader.serving_lock
        with self.reader.serving_lock(principal.org_id):
            return self._compile(principal, req)

    def _compile(self, principal: Principal, req: CompileRequest) -> CompileOutcome:
        t = time.perf_counter()
        timings = {}

        def lap(name):
            nonlocal t
            now = time.perf_counter()
            timings[name] = now - t
            t = now

        # 1. scope
        scope = CompileScope(principal, req.subject_id, req.project_id, req.at)
        plan = plan_query(req.task)
        lap("plan")
        snapshot = self.reader.current(principal.org_id)
        # 2. candidates
        matches = lexical_candidates(snapshot, scope, plan) if snapshot and plan.match else []
        vector_state = self.vector_state
        similar: dict[int, float] = {}
        if self.vectors is not None and snapshot is not None:
            similar, vector_state = self._semantic(snapshot, scope, req.task)
        lap("candidates")
        # 3. hydrate: semantic ids through the same scoped query as lexical ones
        bm25 = dict(matches)
        rowids = [rowid for rowid, _ in matches] + [rowid for rowid in similar if rowid not in bm25]
        # the candidate step's own query applied the scope to its matches
        facts = self._hydrate(snapshot, scope, rowids, admitted=bm25.keys()) if rowids else []
        lap("hydrate")
        # 4. rank
        ranked = rank([RankInput(f, f.disputed_for(principal), bm25.get(f.rowid), similar.get(f.rowid))
                       for f in facts], req.at_s)
        lap("rank")
        # 5. pack
        context_hex = draw_context_hex()
        context_id = f"ctx_{context_hex}"
        envelope = {"context_id": context_id, "query": req.task,
                    "scope": {"subject_id": req.subject_id, "project_id": req.project_id},
                    "budget": {"max_tokens": req.max_tokens, "used_tokens": 0},
                    "items": [], "conflicts": [],
                    "policy_snapshot": POLICY_SNAPSHOT, "instructions": INSTRUCTIONS}
        views: dict[int, ItemView] = {}
        candidates = []
        for i, r in enumerate(ranked):
            f = r.signals  # the ClaimFacts ranked
            if f.prefix_tokens is None or r.conflict:
                # reader-dependent, or a conflict entry to price: the full view
                views[i] = view = self._view(snapshot, scope, f, bool(r.conflict))
                candidates.append(PackCandidate(f.claim_id, f.kind, view.prefix_tokens, r, view.conflict_json,
                                                view.conflict_tokens))
            else:
                candidates.append(PackCandidate(f.claim_id, f.kind, f.prefix_tokens, r))
        try:
            result = pack(candidates, envelope, req.max_tokens)
        except BudgetTooSmall as exc:
            raise ValidationError(
                f"max_tokens {req.max_tokens} cannot hold even the empty response envelope (which echoes "
                f"the task); the smallest budget that would is {exc.needed}") from None
        picked = list(result.picked)
        charged = list(result.item_tokens)
        unseen = [ranked[i].signals for i in picked if i not in views]
        rows = self._rows_to_view(snapshot, scope, unseen)
        for i in picked:
            if i not in views:
                views[i] = self._view(snapshot, scope, ranked[i].signals, False, rows.get(ranked[i].signals.rowid))
        while True:
            items = [dict(views[i].fields, score=ranked[i].score, score_components=ranked[i].components)
                     for i in picked]
            conflicts = [views[i].conflict for i in picked if views[i].conflict]
            data = assemble(envelope, items, conflicts, sum(charged))
            data_json = dumps(data)  # counted here, sent as is (core.http)
            if not picked or count_tokens(data_json) <= req.max_tokens:
                break
            # The packer's count is exact (core.packing), so this never runs
            # in practice; it keeps the budget promise even if it were not.
            picked.pop()
            charged.pop()
        lap("pack")
        degraded = {"semantic": False, "vector": vector_state,
                    "model": "enabled" if self.vectors is not None else "disabled"}
        if req.include_checkpoints:
            degraded["checkpoints"] = "unavailable"
        meta = {"degraded": degraded, "candidates": len(facts), "at": req.at,
                "envelope_tokens": result.envelope_tokens, "generation": snapshot.generation if snapshot else 0}
        # record the run before answering
        self.ledger.append(principal.org_id, "context_run", {
            "context_id": context_id, "key_id": principal.key_id,
            "task_sha256": hashlib.sha256(req.task.encode()).hexdigest(),
            "scope": {**data["scope"], "at": req.at, "workspaces": list(principal.workspaces)},
            "budget": data["budget"], "degraded": degraded, "candidates": len(facts),
            "items": [{"claim_id": i["claim_id"], "score": i["score"],
                       "score_components": i["score_components"]} for i in data["items"]]},
            actor=principal.principal_id, entry_hex=context_hex, suffix=RUN_SUFFIX,
            serialized={"pack": stored_pack_json(data, data_json)})
        lap("record")
        return CompileOutcome(data, meta, timings, data_json)

    def _semantic(self, snapshot, scope: CompileScope, task: str) -> tuple[dict[int, float], str]:
        """(rowid → similarity, vector state). Any failure of the embedder or
        the index — an error, a timeout, a wrong dimension, a snapshot built
        with another fingerprint — degrades to the lexical result: "error"."""
        try:
            return dict(self.vectors.search(snapshot, scope, task)), "used"
        except Exception as exc:
            import logging
            logging.getLogger("titen").warning("vector search degraded to lexical: %s: %s",
                                               type(exc).__name__, exc)
            return {}, "error"

    @staticmethod
    def _hydrate(snapshot, scope: CompileScope, rowids: list[int], admitted=frozenset()) -> list[ClaimFacts]:
        """Step 3: the facts of the candidates the scope admits. The first
        time its generation serves a claim, the scoped query reads its
        FACT_FIELDS (and its whole row only if the claim looks different to
        different readers); after that only its id goes through the scoped
        query (``in_scope``) — unless it is in ``admitted``, the ids a scoped
        query of this request already returned (the lexical candidate step's).
        The text a pack needs is read when packed."""
        known = snapshot.claim_facts
        held = {rowid: f for rowid in rowids if (f := known.get(rowid)) is not None}
        facts = [f for rowid, f in held.items() if rowid in admitted]
        unchecked = [rowid for rowid in held if rowid not in admitted]
        if unchecked:
            facts += [held[rowid] for rowid in in_scope(snapshot, scope, unchecked)]
        if len(held) < len(rowids):
            found = hydrate_fields(snapshot, scope, [rowid for rowid in rowids if rowid not in held], FACT_FIELDS)
            if not snapshot.item_tokens_trusted:
                # counted with another tokenizer (or none): every item is priced here
                found = [fields[:-1] + (None,) for fields in found]
            per_reader = [f[0] for f in found if f[-1] is None]  # prefix_tokens None
            rows = {row[COL["rowid"]]: row for row in hydrate(snapshot, scope, per_reader)} if per_reader else {}
            if len(known) + len(found) > CLAIM_FACTS_CACHE:
                known.clear()
            for fields in found:
                f = known[fields[0]] = ClaimFacts.of_fields(fields, rows.get(fields[0]))
                facts.append(f)
        return facts

    @staticmethod
    def _rows_to_view(snapshot, scope: CompileScope, facts: list[ClaimFacts]) -> dict[int, tuple]:
        """The rows ``_view`` will need for these claims, in one scoped query:
        those with no row kept and no view built yet on this generation."""
        rowids = [f.rowid for f in facts if f.row is None and f.claim_id not in snapshot.item_views]
        return {row[COL["rowid"]]: row for row in hydrate(snapshot, scope, rowids)} if rowids else {}

    @staticmethod
    def _view(snapshot, scope: CompileScope, facts: ClaimFacts, disputed: bool, row: tuple | None = None) -> "ItemView":
        """The item as this reader sees it, minus its score. A claim whose
        evidence is all organization-visible looks the same to every reader,
        so its view (and the estimate of its serialized prefix) is built once
        per generation and kept on the snapshot; its row (``row``, or read
        here) comes through the same scoped query."""
        claim_id = facts.claim_id
        if facts.row is not None:  # evidence not all organization-visible: per reader
            principal = scope.principal
            return ItemView.build(facts.row, readable_evidence(principal, facts.row[COL["evidence_json"]]),
                                  disputed)
        view = snapshot.item_views.get(claim_id)
        if view is None:
            if row is None:
                (row,) = hydrate(snapshot, scope, [facts.rowid])
            evidence = json.loads(row[COL["evidence_json"]])
            view = ItemView.build(row, [(e[0], e[1]) for e in evidence], disputed, facts.prefix_tokens)
            if len(snapshot.item_views) >= ITEM_VIEW_CACHE:
                snapshot.item_views.clear()
            snapshot.item_views[claim_id] = view
        return view

    # -- stored packs ------------------------------------------------------------

    def context_run(self, principal: Principal, context_id: str) -> dict:
        """The stored run, for its own principal only; anything else is 404."""
        hex_ = parse_id(context_id, "ctx")
        entry = self.ledger.read(principal.org_id, hex_, RUN_SUFFIX) if hex_ else None
        if (entry is None or entry.get("type") != "context_run" or entry.get("actor") != principal.principal_id
                or entry.get("context_id") != context_id):
            raise NotFound(f"context {context_id} not found")
        return entry

    def stored_pack(self, principal: Principal, context_id: str) -> dict:
        principal.require("context:compile")
        entry = self.context_run(principal, context_id)
        return {**entry["pack"], "created_at": entry["recorded_at"]}
