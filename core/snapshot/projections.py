"""Projections: every derived column of a claim, recomputed from canonical rows.

What the compile hot path reads precomputed: the reported ``status``
(lifecycle transitions folded by version, ``disputed`` folded in), the
version, the feedback counts, the evidence list with each source's
visibility, whether the claim sits in the FTS index (only compilable
claims do, so others never count in BM25 statistics), and the exact token
count of its item's prefix when every reader sees the item alike.
"""

from __future__ import annotations

import json
from typing import Iterable

import apsw

from core.budget.items import item_fields, item_prefix
from core.budget.tokens import count_tokens_batch
from core.domain import ACTION_STATUS, POSITIVE_OUTCOMES, TERMINAL_STATUSES
from core.lexical import LexicalChanges
from core.lexical.words import index_text
from core.scope import reader_tag


def refresh_projections(db: apsw.Connection, claim_ids: Iterable[str],
                        lexical: LexicalChanges | None = None) -> None:
    """Recompute every derived column of these claims from canonical rows;
    ``lexical`` is told of every row entering or leaving claims_fts. The
    exact token count of each item's prefix (``core.budget.items.item_prefix``)
    is taken in batches of ``PRICE_BATCH``, written with one statement each."""
    pending: list[tuple] = []  # UPDATE parameters, the prefix text where prefix_tokens goes
    for claim_id in sorted(claim_ids):
        row = db.execute("SELECT rowid, statement, indexed, kind, confidence, trust, observer_id, valid_from,"
                         " valid_to, subject_id, visibility, workspace_id, owner_id FROM claims WHERE claim_id=?",
                         (claim_id,)).fetchone()
        if row is None:
            continue  # feedback or a transition for a claim not (yet) in this ledger
        rowid, statement, indexed, kind, confidence, trust, observer_id, valid_from, valid_to, subject_id = row[:10]
        reader = reader_tag(*row[10:])
        version, base_status, superseded_by = 1, "active", None
        for from_version, action, new_claim_id in db.execute(
                "SELECT from_version, action, new_claim_id FROM transitions WHERE claim_id=?"
                " ORDER BY from_version", (claim_id,)):
            if from_version != version or base_status in TERMINAL_STATUSES:
                continue
            version += 1
            base_status = ACTION_STATUS[action]
            superseded_by = new_claim_id if action == "supersede" else None
        evidence = [list(r) for r in db.execute(
            "SELECT s.observation_id, s.relation, o.visibility, o.workspace_id, o.owner_id"
            " FROM claim_sources s LEFT JOIN observations o USING(observation_id)"
            " WHERE s.claim_id=? ORDER BY s.observation_id, s.relation", (claim_id,))]
        disputed = int(any(e[1] == "contradicts" for e in evidence))
        dispute_public = int(any(e[1] == "contradicts" and e[2] == "organization" for e in evidence))
        status = "disputed" if base_status == "active" and disputed else base_status
        total = positive = negative = 0
        for (outcome,) in db.execute("SELECT outcome FROM feedback WHERE claim_id=?", (claim_id,)):
            total += 1
            if outcome in POSITIVE_OUTCOMES:
                positive += 1
            else:
                negative += 1
        should_index = int(status not in TERMINAL_STATUSES)
        prefix = None
        if should_index:
            # the item as a reader who sees all its evidence sees it, counted
            # once here: every reader when the evidence is all organization-
            # visible; else its owner or its workspace, mostly (stored negated:
            # another reader, who sees less, is counted at compile)
            prefix = item_prefix(item_fields(
                claim_id, statement, kind, confidence, trust, status, observer_id, valid_from, valid_to,
                sorted({e[0] for e in evidence})))
            uniform = all(e[2] == "organization" for e in evidence)
        if should_index and not indexed:
            db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (rowid, index_text(statement)))
            if lexical is not None:
                lexical.inserted(rowid, subject_id, reader, statement)
        elif indexed and not should_index:
            db.execute("DELETE FROM claims_fts WHERE rowid=?", (rowid,))
            if lexical is not None:
                lexical.deleted(rowid, subject_id, reader, statement)
        pending.append((base_status, status, version, superseded_by, disputed, dispute_public, total, positive,
                        negative, json.dumps(evidence, separators=(",", ":")), should_index,
                        None if prefix is None else (prefix, uniform), rowid))
        if len(pending) >= PRICE_BATCH:
            _write_projections(db, pending)
            pending = []
    _write_projections(db, pending)


PRICE_BATCH = 4096


def _write_projections(db: apsw.Connection, pending: list[tuple]) -> None:
    if not pending:
        return
    texts = [p[11][0] for p in pending if p[11] is not None]
    counts = iter(count_tokens_batch(texts))
    db.executemany(
        "UPDATE claims SET base_status=?, status=?, version=?, superseded_by=?, disputed=?, dispute_public=?,"
        " feedback_total=?, feedback_positive=?, feedback_negative=?, evidence_json=?, indexed=?,"
        " prefix_tokens=? WHERE rowid=?",
        [p[:11] + (None if p[11] is None else next(counts) * (1 if p[11][1] else -1), p[12]) for p in pending])
