"""The per-generation catalog: what compile has learnt about a snapshot's claims.

A snapshot generation is immutable, so whatever compile works out about a
claim on it — its ranking signals, the item as every reader sees it, the
exact token count of that item — stays true for as long as the generation
serves. The catalog keeps those facts and views, typed and bounded, for one
generation; ``catalog_for`` hands out one catalog per ``Snapshot`` object,
held weakly, so a retired generation's catalog goes with it.

It also owns the reads that fill it: the hydrate step (step 3) sends only
ids through the scoped query for claims it already knows, and reads a
claim's fields the first time; the rows an item view needs are read, in one
scoped query, only for items actually packed. Every read goes through
``core.compile.retrieval``, so the scope predicates apply to each of them.
"""

from __future__ import annotations

import json
import sys
import weakref
from dataclasses import dataclass
from typing import Generic, Iterable, TypeVar

from core.budget.items import dumps, item_fields, item_prefix
from core.budget.tokens import count_tokens
from core.compile.ranking import ClaimSignals
from core.compile.retrieval import CompileScope, hydrate, hydrate_fields, in_scope
from core.keys import Principal
from core.scope import disputed_for, readable_evidence, reported_status
from core.snapshot.reader import Snapshot
from core.snapshot.schema import COL

# what a first hydrate reads of a claim to build its ClaimFacts (in of_fields' order)
FACT_FIELDS = ("rowid", "claim_id", "kind", "confidence", "trust_level", "created_s", "feedback_total",
               "feedback_positive", "feedback_negative", "disputed", "dispute_public", "prefix_tokens")

ITEM_VIEW_CACHE = 50_000  # views kept per generation (a few hundred bytes each)
CLAIM_FACTS_CACHE = 20_000  # facts kept per generation (~400 bytes each, no claim text: at most ~8 MB)

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A dict of at most ``limit`` entries, emptied when a new one would not
    fit: what it holds is derived and cheap to derive again, and clearing
    costs nothing per hit, unlike an LRU's bookkeeping on the hot path."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def __contains__(self, key: K) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def put_all(self, items: Iterable[tuple[K, V]], count: int) -> None:
        """Add ``count`` entries, emptying first if they would not fit."""
        if len(self._items) + count > self.limit:
            self._items.clear()
        self._items.update(items)


@dataclass(slots=True)  # shared per generation, never mutated; ~200 built per compile on a new one
class ClaimFacts(ClaimSignals):
    """What compile reads of a candidate on every request — its ranking
    signals, kind, prefix count and dispute flags — the same for every
    reader of a generation; ranking hands it back as ``Ranked.signals``.
    The row itself is kept only when the claim looks different to different
    readers (some evidence is not organization-visible: ``prefix_tokens`` is
    None), since its view and its dispute are then worked out per reader;
    ``full_tokens`` is then the count the build stored for a reader who sees
    all its evidence (None when it stored none)."""
    rowid: int
    kind: str
    prefix_tokens: int | None
    disputed: bool
    dispute_public: bool
    row: tuple | None
    full_tokens: int | None

    @classmethod
    def of_fields(cls, fields: tuple, row: tuple | None) -> "ClaimFacts":
        """``fields``: the claim's FACT_FIELDS, its stored count negated when
        reader-dependent (core.snapshot.schema.ITEM_COUNTS) or None when
        not to be trusted; ``row``: its full row (CLAIM_FIELDS), needed only
        when the claim is reader-dependent."""
        (rowid, claim_id, kind, confidence, trust_level, created_s, total, positive, negative, disputed,
         dispute_public, stored) = fields
        shared = stored is not None and stored >= 0
        return cls.of(claim_id, confidence, trust_level, created_s, total, positive, negative, rowid,
                      sys.intern(kind),  # six kinds: one string each, not one per cached claim
                      stored if shared else None, bool(disputed), bool(dispute_public),
                      None if shared else row, -stored if stored is not None and stored < 0 else None)

    def disputed_for(self, principal: Principal) -> bool:
        """``core.scope.disputed_for``: the evidence list is only read when
        there is contradicting evidence another reader may not see (then the
        row is kept)."""
        if self.dispute_public or not self.disputed:
            return self.dispute_public
        return disputed_for(principal, self.disputed, False, self.row[COL["evidence_json"]])


@dataclass(frozen=True)
class ItemView:
    fields: dict                 # the item's documented fields, evidence_ids last, no score
    prefix_tokens: int           # the real count of its serialized prefix (core.budget.items.item_prefix)
    conflict: dict | None
    conflict_json: str | None
    conflict_tokens: int = 0

    @classmethod
    def build(cls, row: tuple, evidence: list[tuple[str, str]], disputed: bool,
              prefix_tokens: int | None = None) -> "ItemView":
        """``prefix_tokens``: the prefix's count stored at build, when this
        reader sees the item as the build counted it (all its evidence);
        else it is counted here."""
        claim_id = row[COL["claim_id"]]
        fields = item_fields(claim_id, row[COL["statement"]], row[COL["kind"]], row[COL["confidence"]],
                             row[COL["trust"]], reported_status(row[COL["status"]], disputed),
                             row[COL["observer_id"]], row[COL["valid_from"]], row[COL["valid_to"]],
                             sorted({o for o, _ in evidence}))
        conflict = None
        if disputed:
            conflict = {"claim_id": claim_id, "reason": "contradicting_evidence",
                        "evidence_ids": sorted({o for o, r in evidence if r in ("supports", "contradicts")})}
        conflict_json = dumps(conflict) if conflict else None
        if prefix_tokens is None:
            prefix_tokens = count_tokens(item_prefix(fields))
        return cls(fields, prefix_tokens, conflict, conflict_json,
                   count_tokens(conflict_json) if conflict_json else 0)


class Catalog:
    """One generation's facts and views, and the scoped reads that fill them."""

    def __init__(self, snapshot: Snapshot):
        # weakly: the registry holds catalogs by their snapshot, weakly too
        self._snapshot = weakref.ref(snapshot)
        self.facts: Bounded[int, ClaimFacts] = Bounded(CLAIM_FACTS_CACHE)   # by rowid
        self.views: Bounded[str, ItemView] = Bounded(ITEM_VIEW_CACHE)       # by claim id
        # a reader-dependent item by what its reader sees of it: readers who
        # see the same evidence (its owner, every reader of its workspace)
        # share one view, and its count is taken once a generation
        self.reader_views: Bounded[tuple, ItemView] = Bounded(ITEM_VIEW_CACHE)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot()

    def hydrate(self, scope: CompileScope, rowids: list[int], admitted=frozenset()) -> list[ClaimFacts]:
        """Step 3: the facts of the candidates the scope admits. A claim this
        generation has served before sends only its id through the scoped
        query (``in_scope``) — unless it is in ``admitted``, the ids a scoped
        query of this request already returned (the lexical candidate
        step's). A new one has its FACT_FIELDS read (and its whole row only
        if it looks different to different readers). Item text is read when
        packed (``views``)."""
        snapshot = self.snapshot
        held = {rowid: f for rowid in rowids if (f := self.facts.get(rowid)) is not None}
        facts = [f for rowid, f in held.items() if rowid in admitted]
        unchecked = [rowid for rowid in held if rowid not in admitted]
        if unchecked:
            facts += [held[rowid] for rowid in in_scope(snapshot, scope, unchecked)]
        if len(held) < len(rowids):
            found = hydrate_fields(snapshot, scope, [rowid for rowid in rowids if rowid not in held], FACT_FIELDS)
            if not snapshot.item_tokens_trusted:
                # counted with another tokenizer (or none): every item is priced here
                found = [fields[:-1] + (None,) for fields in found]
            per_reader = [f[0] for f in found if f[-1] is None or f[-1] < 0]  # not shared by every reader
            rows = {row[COL["rowid"]]: row for row in hydrate(snapshot, scope, per_reader)} if per_reader else {}
            new = [ClaimFacts.of_fields(fields, rows.get(fields[0])) for fields in found]
            self.facts.put_all(((f.rowid, f) for f in new), len(new))
            facts += new
        return facts

    def view(self, scope: CompileScope, facts: ClaimFacts, disputed: bool, row: tuple | None = None) -> ItemView:
        """The item as this reader sees it, minus its score. A claim whose
        evidence is all organization-visible looks the same to every reader,
        so its view (with the count of its serialized prefix) is built once
        per generation and kept; its row (``row``, or read here) comes
        through the same scoped query."""
        if facts.row is not None:  # evidence not all organization-visible: per reader
            stored = json.loads(facts.row[COL["evidence_json"]])
            evidence = readable_evidence(scope.principal, stored)
            seen = (facts.claim_id, disputed, tuple(evidence))
            view = self.reader_views.get(seen)
            if view is None:
                # a reader who sees all the evidence (its owner, its workspace)
                # sees the item the build counted; one who sees less is counted here
                full = facts.full_tokens if len(evidence) == len(stored) else None
                view = ItemView.build(facts.row, evidence, disputed, full)
                self.reader_views.put_all([(seen, view)], 1)
            return view
        view = self.views.get(facts.claim_id)
        if view is None:
            if row is None:
                (row,) = hydrate(self.snapshot, scope, [facts.rowid])
            evidence = json.loads(row[COL["evidence_json"]])
            view = ItemView.build(row, [(e[0], e[1]) for e in evidence], disputed, facts.prefix_tokens)
            self.views.put_all([(facts.claim_id, view)], 1)
        return view

    def views_of(self, scope: CompileScope, picked: list[ClaimFacts],
                 disputed: list[bool] | None = None) -> list[ItemView]:
        """The views of ``picked`` (``disputed``: each as this reader sees it,
        else none disputed), reading the rows still missing in one scoped
        query: a compile with many disputed candidates read them one query
        each."""
        wanted = [f.rowid for f in picked if f.row is None and f.claim_id not in self.views]
        rows = {row[COL["rowid"]]: row for row in hydrate(self.snapshot, scope, wanted)} if wanted else {}
        flags = disputed if disputed is not None else [False] * len(picked)
        return [self.view(scope, f, d, rows.get(f.rowid)) for f, d in zip(picked, flags)]


_CATALOGS: "weakref.WeakKeyDictionary[Snapshot, Catalog]" = weakref.WeakKeyDictionary()


def catalog_for(snapshot: Snapshot) -> Catalog:
    """The catalog of this generation (made on first use)."""
    catalog = _CATALOGS.get(snapshot)
    if catalog is None:
        catalog = _CATALOGS.setdefault(snapshot, Catalog(snapshot))
    return catalog
