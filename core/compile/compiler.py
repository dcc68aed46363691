"""Context compilation: scope → candidates → hydrate → rank → pack, then record.

``Compiler.compile`` reads as those five steps and the record, one call
each. The steps' rules live where they belong: the scoped SQL in
``retrieval``, what a generation has already taught compile in ``catalog``,
``planning``, ``ranking`` and ``packing`` as pure functions, the ledger
record in ``record``. A vector or model outage degrades the candidate step
to the lexical result and says so; it never fails the request.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from core.budget.items import dumps
from core.budget.tokens import count_tokens
from core.compile import record
from core.compile.catalog import Catalog, ClaimFacts, ItemView, catalog_for
from core.compile.packing import BudgetTooSmall, PackCandidate, assemble, pack
from core.compile.planning import plan_query
from core.compile.ranking import RankInput, Ranked, rank
from core.compile.request import CompileRequest
from core.compile.retrieval import CompileScope, lexical_candidates
from core.domain import INSTRUCTIONS, POLICY_SNAPSHOT
from core.errors import ValidationError
from core.ids import subject_tag
from core.keys import Principal
from core.ledger import Ledger
from core.observe.request_line import note_compile
from core.snapshot.reader import Snapshot, SnapshotReader

log = logging.getLogger("titen")


class ReaderCandidate:
    """A candidate whose item looks different to different readers (some of
    its evidence is not organization-visible, the default for a private
    memory): its view is worked out for this reader, only when the packer
    first asks (``Catalog.view``: the count the build stored when this reader
    sees all the evidence, else a tokenization here). The packer skips most
    candidates on kind alone (three a kind), so a compile builds views for
    the few it reaches, not for all 200."""
    __slots__ = ("facts", "scored", "_catalog", "_scope", "_view")

    def __init__(self, facts: ClaimFacts, scored: Ranked, catalog: Catalog, scope: CompileScope):
        self.facts, self.scored, self._catalog, self._scope = facts, scored, catalog, scope
        self._view: ItemView | None = None

    @property
    def claim_id(self) -> str:
        return self.facts.claim_id

    @property
    def kind(self) -> str:
        return self.facts.kind

    @property
    def view(self) -> ItemView:
        if self._view is None:
            self._view = self._catalog.view(self._scope, self.facts, bool(self.scored.conflict))
        return self._view

    @property
    def prefix_tokens(self) -> int:
        return self.view.prefix_tokens

    @property
    def conflict(self) -> str | None:
        return self.view.conflict_json

    @property
    def conflict_tokens(self) -> int:
        return self.view.conflict_tokens


@dataclass
class CompileOutcome:
    data: dict
    meta: dict
    timings: dict = field(default_factory=dict)
    data_json: str | None = None  # ``dumps(data)``: the bytes whose real count fits the budget


@dataclass
class Candidates:
    """Step 2's answer: lexical matches (rowid → bm25, best first) and
    semantic ones (rowid → similarity), and what the vector path did."""
    bm25: dict[int, float]
    similar: dict[int, float]
    vector_state: str

    @property
    def rowids(self) -> list[int]:
        return list(self.bm25) + [rowid for rowid in self.similar if rowid not in self.bm25]


@dataclass
class Packed:
    data: dict
    data_json: str
    envelope_tokens: int


class Stopwatch:
    """Seconds spent in each step, for ``CompileOutcome.timings``."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str, value=None):
        now = time.perf_counter()
        self.laps[name], self._t = now - self._t, now
        return value


class Compiler:
    def __init__(self, ledger: Ledger, reader: SnapshotReader, vector_state: str = "disabled", vectors=None):
        self.ledger = ledger
        self.reader = reader
        self.vector_state = vector_state
        self.vectors = vectors  # core.vectors.search.VectorSearch when an embedder is configured, else None

    def compile(self, principal: Principal, body: dict) -> CompileOutcome:
        principal.require("context:compile")
        req = CompileRequest.parse(body)
        clock = Stopwatch()
        scope = clock.lap("plan", CompileScope(principal, req.subject_id, req.project_id, req.at))
        snapshot = self.reader.current(principal.org_id)
        catalog = catalog_for(snapshot) if snapshot is not None else None
        with snapshot.lease() if snapshot is not None else nullcontext():  # a connection of its own
            found = clock.lap("candidates", self.candidates(snapshot, scope, req.task))
            facts = clock.lap("hydrate", catalog.hydrate(scope, found.rowids, found.bm25.keys()) if catalog else [])
            ranked = clock.lap("rank", self.rank(facts, found, principal, req.at_s))
            packed = clock.lap("pack", self.pack(catalog, scope, ranked, req))
        meta = clock.lap("record", self.record(principal, req, packed, found, len(facts), snapshot))
        # the request line's counts (core/observe/request_line.py): numbers and states, never the task
        note_compile(candidates=len(facts), items=len(packed.data["items"]),
                     used_tokens=packed.data["budget"]["used_tokens"], max_tokens=req.max_tokens,
                     vector=found.vector_state, generation=meta["generation"],
                     generation_age_seconds=snapshot.age_seconds() if snapshot is not None else None)
        return CompileOutcome(packed.data, meta, clock.laps, packed.data_json)

    # -- 2. candidates ---------------------------------------------------------

    def candidates(self, snapshot: Snapshot | None, scope: CompileScope, task: str) -> Candidates:
        """Lexical matches from the candidate index, and semantic ones when
        vectors are configured (even when nothing matched lexically). The
        task is embedded on the embedder's thread while the lexical step runs."""
        plan = plan_query(task)
        pending, failed = None, None
        if self.vectors is not None and snapshot is not None:
            try:
                pending = self.vectors.begin(snapshot, task)
            except Exception as exc:
                failed = exc
        matches = lexical_candidates(snapshot, scope, plan) if snapshot and plan.match else []
        similar, vector_state = {}, self.vector_state
        if pending is not None or failed is not None:
            similar, vector_state = self._semantic(snapshot, scope, pending, failed)
        return Candidates(dict(matches), similar, vector_state)

    def _semantic(self, snapshot: Snapshot, scope: CompileScope, pending, failed) -> tuple[dict[int, float], str]:
        """(rowid → semantic relevance, vector state). Any failure of the
        embedder or the index — an error, a timeout, a wrong dimension, a
        snapshot built with another fingerprint or calibration — degrades to
        the lexical result: "error"."""
        try:
            if failed is not None:
                raise failed
            return dict(self.vectors.finish(snapshot, scope, pending)), "used"
        except Exception as exc:
            log.warning("vector search degraded to lexical: %s: %s", type(exc).__name__, exc)
            return {}, "error"

    # -- 4. rank ----------------------------------------------------------------

    @staticmethod
    def rank(facts: list[ClaimFacts], found: Candidates, principal: Principal, at_s: float) -> list[Ranked]:
        return rank([RankInput(f, f.disputed_for(principal), found.bm25.get(f.rowid), found.similar.get(f.rowid))
                     for f in facts], at_s)

    # -- 5. pack ----------------------------------------------------------------

    def pack(self, catalog: Catalog | None, scope: CompileScope, ranked: list[Ranked],
             req: CompileRequest) -> Packed:
        """The ranked items that fit, counted exactly (core.compile.packing);
        the final payload is counted again before it is sent."""
        context_hex = record.draw_context_hex(subject_tag(scope.principal.org_id, req.subject_id))
        envelope = {"context_id": f"ctx_{context_hex}", "query": req.task,
                    "scope": {"subject_id": req.subject_id, "project_id": req.project_id},
                    "budget": {"max_tokens": req.max_tokens, "used_tokens": 0},
                    "items": [], "conflicts": [],
                    "policy_snapshot": POLICY_SNAPSHOT, "instructions": INSTRUCTIONS}
        # a shared item with a conflict entry to price: its view, all read in
        # one query (kept for the generation, so counted once)
        shared = [i for i, r in enumerate(ranked) if r.signals.prefix_tokens is not None and r.conflict]
        views: dict[int, ItemView] = dict(zip(shared, catalog.views_of(
            scope, [ranked[i].signals for i in shared], [True] * len(shared)))) if shared else {}
        candidates: list = []
        for i, r in enumerate(ranked):
            f = r.signals  # the ClaimFacts ranked
            if f.prefix_tokens is None:
                candidates.append(ReaderCandidate(f, r, catalog, scope))
            elif i in views:
                view = views[i]
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
        views.update((i, candidates[i].view) for i in result.picked if isinstance(candidates[i], ReaderCandidate))
        unseen = [i for i in result.picked if i not in views]
        if unseen:
            views.update(zip(unseen, catalog.views_of(scope, [ranked[i].signals for i in unseen])))
        picked, charged = list(result.picked), list(result.item_tokens)
        while True:
            items = [dict(views[i].fields, score=ranked[i].score, score_components=ranked[i].components)
                     for i in picked]
            conflicts = [views[i].conflict for i in picked if views[i].conflict]
            data = assemble(envelope, items, conflicts, sum(charged))
            data_json = dumps(data)  # counted here, sent as is (core.api)
            if not picked or count_tokens(data_json) <= req.max_tokens:
                return Packed(data, data_json, result.envelope_tokens)
            # The packer's count is exact (core.compile.packing), so this never
            # runs in practice; it keeps the budget promise even if it were not.
            picked.pop()
            charged.pop()

    # -- record -------------------------------------------------------------------

    def record(self, principal: Principal, req: CompileRequest, packed: Packed, found: Candidates,
               candidates: int, snapshot: Snapshot | None) -> dict:
        """Record the run in the ledger before answering; the answer's ``meta``."""
        degraded = {"semantic": False, "vector": found.vector_state,
                    "model": "enabled" if self.vectors is not None else "disabled"}
        if req.include_checkpoints:
            degraded["checkpoints"] = "unavailable"
        record.record_run(self.ledger, principal, req, packed.data, packed.data_json, degraded, candidates)
        return {"degraded": degraded, "candidates": candidates, "at": req.at,
                "envelope_tokens": packed.envelope_tokens, "generation": snapshot.generation if snapshot else 0}

    # -- stored packs ---------------------------------------------------------------

    def context_run(self, principal: Principal, context_id: str) -> dict:
        return record.context_run(self.ledger, principal, context_id)

    def stored_pack(self, principal: Principal, context_id: str) -> dict:
        return record.stored_pack(self.ledger, principal, context_id)
