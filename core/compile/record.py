"""The record of a compile: its run in the ledger, before the answer.

Every run is recorded before answering (docs/api.md §9.8) — the task's
sha256, never the task — so feedback can be checked against the pack at
once, and the stored pack can be served back to the principal that compiled
it, and only to them, through a key with at least the compiling key's
workspaces: anyone else, like an unknown id, gets 404.
"""

from __future__ import annotations

import hashlib

from core.budget.items import dumps
from core.budget.tokens import count_tokens
from core.compile.packing import CONTEXT_ID_MIN_TOKENS, CONTEXT_ID_TOKENS
from core.compile.request import CompileRequest
from core.errors import NotFound
from core.ids import entry_hex, parse_id, tagged
from core.keys import Principal
from core.layout import RUN_SUFFIX
from core.ledger import Ledger


def draw_context_hex(tag: str) -> str:
    """A ledger entry id for a context run whose ``ctx_…`` id costs 15 to
    ``CONTEXT_ID_TOKENS`` tokens (core.compile.packing prices the envelope at
    that) and carries the subject's ``tag`` (core.ids.subject_tag: an erasure
    of the subject finds its runs by name). Draws are bounded: should 64 all
    miss (never seen), the cheapest id no dearer than the price is taken,
    else a new one is drawn until one is."""
    best = None
    for _ in range(64):
        hex_ = tagged(entry_hex(), tag)
        cost = count_tokens("ctx_" + hex_)
        if CONTEXT_ID_MIN_TOKENS <= cost <= CONTEXT_ID_TOKENS:
            return hex_
        if cost <= CONTEXT_ID_TOKENS and (best is None or cost > best[0]):
            best = (cost, hex_)
    if best is not None:
        return best[1]
    while True:
        hex_ = tagged(entry_hex(), tag)
        if count_tokens("ctx_" + hex_) <= CONTEXT_ID_TOKENS:
            return hex_


def stored_pack_json(data: dict, data_json: str) -> str:
    """``dumps`` of the pack as stored — ``data`` without ``query`` — cut
    out of ``data_json`` (``dumps(data)``), where ``query`` comes right after
    ``context_id``, rather than encoded a second time."""
    head = '{"context_id":' + dumps(data["context_id"]) + ","
    query = '"query":' + dumps(data["query"]) + ","
    if list(data)[:2] == ["context_id", "query"] and data_json.startswith(head + query):
        return head + data_json[len(head) + len(query):]
    return dumps({k: v for k, v in data.items() if k != "query"})


def record_run(ledger: Ledger, principal: Principal, req: CompileRequest, data: dict, data_json: str,
               degraded: dict, candidates: int) -> None:
    """Store the run under the context id's own entry id (``ctx_<hex>``)."""
    ledger.append(principal.org_id, "context_run", {
        "context_id": data["context_id"], "key_id": principal.key_id,
        "task_sha256": hashlib.sha256(req.task.encode()).hexdigest(),
        "scope": {**data["scope"], "at": req.at, "workspaces": list(principal.workspaces)},
        "budget": data["budget"], "degraded": degraded, "candidates": candidates,
        "items": [{"claim_id": i["claim_id"], "score": i["score"],
                   "score_components": i["score_components"]} for i in data["items"]]},
        actor=principal.principal_id, entry_hex=data["context_id"][len("ctx_"):], suffix=RUN_SUFFIX,
        serialized={"pack": stored_pack_json(data, data_json)})


def context_run(ledger: Ledger, principal: Principal, context_id: str) -> dict:
    """The stored run, for its own principal only, through a key holding at
    least the workspaces of the key that compiled it (a pack may hold team
    claims of those workspaces); anything else is 404."""
    hex_ = parse_id(context_id, "ctx")
    entry = ledger.read(principal.org_id, hex_, RUN_SUFFIX) if hex_ else None
    if (entry is None or entry.get("type") != "context_run" or entry.get("actor") != principal.principal_id
            or entry.get("context_id") != context_id
            or not set(entry.get("scope", {}).get("workspaces", ())) <= set(principal.workspaces)):
        raise NotFound(f"context {context_id} not found")
    return entry


def stored_pack(ledger: Ledger, principal: Principal, context_id: str) -> dict:
    """``GET /v1/context/{id}``: the compile's ``data`` without ``query``, plus ``created_at``."""
    principal.require("context:compile")
    entry = context_run(ledger, principal, context_id)
    return {**entry["pack"], "created_at": entry["recorded_at"]}
