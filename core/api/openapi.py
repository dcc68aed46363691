"""``GET /openapi.json``: the OpenAPI 3.1 document of every route (docs/api.md).

Request bodies are ``core.bodies`` records turned into JSON Schema, the
very specs ``core.validation.Fields`` enforces, so the document and the
validator cannot drift. Answers are described here (the routes build them
in code); every route lists the error envelope under each status it can
answer. The schemathesis run in tests/test_openapi.py holds the server to
this document: no 5xx, no answer outside it, no request it forbids accepted.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from core.bodies import (BATCH, BODY_VALUE, COMPILE, CONSOLIDATION, FEEDBACK, OBSERVATION, SUPERSEDE, TRANSITION,
                         identifier)
from core.domain import (CLAIM_KINDS, CLAIM_STATUSES, FEEDBACK_OUTCOMES, INSTRUCTIONS, OBSERVATION_KINDS,
                         POLICY_SNAPSHOT, RELATIONS, TRUST_LEVELS, VISIBILITY_RANK)
from core.errors import TitenError
from core.writes.idempotency import HEADER as IDEMPOTENCY_HEADER, _KEY as IDEMPOTENCY_KEY
from core.api.mcp import PROTOCOL_VERSIONS
from core.budget.items import dumps

VERSION = "0.1.0"
# status -> code, from the one error hierarchy (core/errors.py)
ERROR_CODES = {cls.status: cls.code for cls in TitenError.__subclasses__()}


def _s(type_: str | list, **kw) -> dict:
    return {"type": type_, **kw}


STR, NSTR, INT, NUM = _s("string"), _s(["string", "null"]), _s("integer"), _s("number")


def _obj(props: dict, required: tuple | None = None, **kw) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props if required is None else required), **kw}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "Error": _obj({
        "error": _obj({"code": _s("string", enum=sorted(set(ERROR_CODES.values()))),
                       "message": _s("string", description="what was wrong, in words")}),
        "meta": _obj({"request_id": _s("string", pattern="^req_[0-9a-f]{32}$")}),
    }, description="the error envelope: every failure of every /v1 route, /healthz, /readyz",
        examples=[{"error": {"code": "VALIDATION_ERROR", "message": "max_tokens must be between 128 and 32000; "
                                                                    "got 5"},
                   "meta": {"request_id": "req_01a23bdfd4e172baa25d5a27b61bd7ca"}}]),
    "Meta": _obj({"request_id": _s("string", pattern="^req_[0-9a-f]{32}$")}),
    "Observation": OBSERVATION.schema(),
    "ObservationBatch": BATCH.schema(),
    "BodyValue": BODY_VALUE,
    "Consolidation": CONSOLIDATION.schema(),
    "Transition": TRANSITION.schema(),
    "Supersede": SUPERSEDE.schema(),
    "Compile": COMPILE.schema(),
    "Feedback": FEEDBACK.schema(),
    "ObservationWritten": _obj({
        "observation_id": STR, "claim_id": NSTR, "subject_id": STR, "project_id": NSTR,
        "trust": _s("string", enum=list(TRUST_LEVELS)), "visibility": _s("string", enum=list(VISIBILITY_RANK)),
        "created_at": STR}),
    "BatchWritten": _obj({"results": _s("array", items={"oneOf": [
        _obj({"index": INT, "data": ref("ObservationWritten")}),
        _obj({"index": INT, "error": _obj({"code": STR, "message": STR})})]})}),
    "ConsolidationWritten": _obj({"claim_ids": _s("array", items=STR), "model_used": _s("boolean", const=False)}),
    "Superseded": _obj({"claim_id": STR, "superseded": STR}),
    "Retired": _obj({"claim_id": STR, "status": _s("string", enum=["revoked", "expired"]), "version": INT}),
    "Evidence": _obj({
        "claim": _obj({"claim_id": STR, "claim": STR, "kind": _s("string", enum=list(CLAIM_KINDS)),
                       "confidence": NUM, "trust": _s("string", enum=list(TRUST_LEVELS)),
                       "status": _s("string", enum=list(CLAIM_STATUSES)), "version": INT, "subject_id": STR,
                       "project_id": NSTR, "visibility": _s("string", enum=list(VISIBILITY_RANK)),
                       "observer_id": NSTR, "valid_from": STR, "valid_to": NSTR, "created_at": STR,
                       "superseded_by": NSTR}),
        "evidence": _s("array", items=_obj({
            "observation_id": STR, "subject_id": STR, "project_id": NSTR, "workspace_id": NSTR,
            "visibility": _s("string", enum=list(VISIBILITY_RANK)), "kind": _s("string", enum=list(OBSERVATION_KINDS)),
            "content": STR, "trust": _s("string", enum=list(TRUST_LEVELS)), "occurred_at": NSTR, "created_at": STR,
            "source": _obj({"type": STR, "ref": STR, "id": STR}, ("type", "ref")),
            "relation": _s("string", enum=list(RELATIONS))})),
    }),
    "PackItem": _obj({
        "claim_id": STR, "claim": STR, "kind": _s("string", enum=list(CLAIM_KINDS)), "confidence": NUM,
        "trust": _s("string", enum=list(TRUST_LEVELS)), "status": _s("string", enum=["active", "disputed"]),
        "observer_id": NSTR, "valid_from": STR, "valid_to": NSTR, "evidence_ids": _s("array", items=STR),
        "score": NUM,
        "score_components": _obj({n: NUM for n in ("relevance", "trust", "recency", "utility", "conflict")})}),
    "Pack": _obj({
        "context_id": _s("string", pattern="^ctx_[0-9a-f]{32}$"),
        "scope": _obj({"subject_id": STR, "project_id": NSTR}),
        "budget": _obj({"max_tokens": INT, "used_tokens": INT}),
        "items": _s("array", items=ref("PackItem")),
        "conflicts": _s("array", items=_obj({"claim_id": STR, "reason": _s("string", const="contradicting_evidence"),
                                              "evidence_ids": _s("array", items=STR)})),
        "policy_snapshot": _s("string", const=POLICY_SNAPSHOT),
        "instructions": _s("string", const=INSTRUCTIONS),
    }),
    "FeedbackRecorded": _obj({"feedback_id": STR, "context_id": STR, "claim_id": NSTR,
                              "outcome": _s("string", enum=list(FEEDBACK_OUTCOMES)), "recorded_at": STR}),
    "ErasureAsked": _obj({"erasure_id": _s("string", pattern="^era_[0-9a-f]{32}$"), "subject_id": STR,
                          "observation_id": STR, "status": _s("string", const="pending")},
                         ("erasure_id", "status")),
    "Erasure": _obj({"erasure_id": _s("string", pattern="^era_[0-9a-f]{32}$"),
                     "target": _s("string", enum=["subject", "observation"]), "target_sha256": STR,
                     "status": _s("string", enum=["pending", "complete"]), "requested_at": STR,
                     "completed_at": NSTR,
                     "counts": {"type": ["object", "null"], "properties": {
                         n: INT for n in ("observations", "claims", "context_runs", "feedback", "embeddings")}}},
                    ("erasure_id", "target", "target_sha256", "status", "requested_at", "completed_at",
                     "counts")),
    "Rebuilt": _obj({"generation": INT, "published": _s("boolean"), "entries_applied": INT, "content_hash": STR,
                     "claim_count": _s(["integer", "null"],
                                       description="claims the key may read in the generation now served; null "
                                                   "if this process cannot serve it"),
                     "snapshot_bytes": INT, "seconds": NUM, "notes": _s("array", items=STR)}),
    "Ready": _obj({"status": _s("string", enum=["ready", "not_ready"]), "generation": INT,
                   "generation_age_seconds": _s(["number", "null"]),
                   "claim_count": _s(["integer", "null"],
                                     description="claims the key may read; null without a key or while not_ready"),
                   "vector": _s("string", enum=["disabled", "enabled", "error"]), "organizations": INT,
                   "last_refresh_error": NSTR, "last_eviction": NSTR, "last_delta_fallback": NSTR,
                   "reason": _s("string", description="why not_ready"), "vector_error": STR},
                  ("status", "generation", "generation_age_seconds", "claim_count", "vector", "organizations",
                   "last_refresh_error")),
    "JsonRpcMessage": _obj({"jsonrpc": _s("string", const="2.0"), "id": _s(["string", "integer"]),
                            "method": STR,
                            # null is taken as {}: a client that writes absent params as null is served
                            "params": _s(["object", "null"])}, ("jsonrpc", "method"),
                           description="one JSON-RPC 2.0 message; no id: a notification (202, no body)"),
    "JsonRpcAnswer": _obj({"jsonrpc": _s("string", const="2.0"), "id": _s(["string", "integer", "null"]),
                           "result": _s("object"),
                           "error": _obj({"code": INT, "message": STR, "data": _s("object")}, ("code", "message"))},
                          ("jsonrpc", "id")),
}
# The pack as compiled: the stored pack's fields plus ``query``, the task as sent.
QUERY = _s("string", description="the task as sent")
SCHEMAS["CompiledPack"] = {**SCHEMAS["Pack"], "properties": {**SCHEMAS["Pack"]["properties"], "query": QUERY},
                           "required": SCHEMAS["Pack"]["required"] + ["query"]}
SCHEMAS["StoredPack"] = {**SCHEMAS["Pack"], "properties": {**SCHEMAS["Pack"]["properties"], "created_at": STR},
                         "required": SCHEMAS["Pack"]["required"] + ["created_at"]}
del SCHEMAS["Pack"]  # the two packs' common part, which no answer is on its own

EXAMPLES = {
    "Observation": {"subject_id": "user_rama", "kind": "tool_result", "content": "Production smoke returned 200.",
                    "source": {"type": "tool", "ref": "deploy_456#smoke"}, "visibility": "organization",
                    "claim": {"statement": "Deploy smoke must pass before release.", "kind": "procedural",
                              "confidence": 0.95}},
    "Consolidation": {"subject_id": "user_rama", "claims": [
        {"statement": "Releases wait for a green smoke run.", "kind": "procedural", "confidence": 0.9,
         "sources": [{"observation_id": "obs_01a23bdfd4b2714cadb4e01337ad0000", "relation": "supports"}]}]},
    "Transition": {"expected_version": 1, "reason": "superseded by the new runbook"},
    "Supersede": {"expected_version": 1, "statement": "Deploy smoke and canary must pass before release.",
                  "confidence": 0.9},
    "ObservationBatch": {"items": [
        {"subject_id": "user_rama", "kind": "user_statement", "content": "I deploy on Fridays.",
         "source": {"type": "chat", "ref": "conv_1#4"}},
        {"subject_id": "user_rama", "kind": "decision", "content": "Freeze deploys during the sale.",
         "source": {"type": "doc", "ref": "runbook#freeze"}, "visibility": "organization"}]},
    "Compile": {"subject_id": "user_rama", "task": "deploy the checkout service safely", "max_tokens": 1200},
    "Feedback": {"outcome": "useful", "claim_id": "claim_01a23bdfd4b2714cadb4e01337ad0001"},
}


def _answer(status: int, schema: dict, description: str, meta: dict | None = None) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _obj({
        "data": schema, "meta": meta or ref("Meta")})}}}


EDGE_400 = ("VALIDATION_ERROR (the error envelope): under titen serve, also a request its HTTP parser cannot "
            "accept, whatever the route (docs/api.md §4, the edge)")


def _errors(*statuses: int) -> dict:
    # every route can answer the edge's 400, a body or none
    return {str(s): {"description": EDGE_400 if s == 400 else f"{ERROR_CODES[s]} (the error envelope)",
                     "content": {"application/json": {"schema": ref("Error")}}}
            for s in sorted({400, *statuses})}


def _path_id(name: str, prefix: str) -> dict:
    return {"name": name, "in": "path", "required": True,
            "description": f"{prefix}_<32 hex>; an unknown id and one the caller may not read both answer 404",
            "schema": STR}


def _op(op_id: str, summary: str, scope: str | None, ok: int, data: dict, errors: tuple, *,
        body: str | None = None, params: list | None = None, meta: dict | None = None,
        auth: str = "required") -> dict:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary,
                          "responses": {str(ok): _answer(ok, data, "success", meta), **_errors(*errors)}}
    if scope:
        op["description"] = f"Needs the `{scope}` scope."
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": ref(body), "examples": {"example": {"value": EXAMPLES[body]}}}}}
    op["security"] = {"required": [{"bearer": []}], "none": [], "optional": [{}, {"bearer": []}]}[auth]
    return op


def _readyz() -> dict:
    op = _op("readyz", "snapshot generation, age, claim count, vector state (a key narrows it to its "
                       "organization)", None, 200, ref("Ready"), (401, 500), auth="optional")
    report = _answer(503, ref("Ready"), "")["content"]["application/json"]["schema"]
    op["responses"]["503"] = {
        "description": "not_ready: the success shape with status not_ready and a reason (a published generation "
                       "cannot be served); or the error envelope, UNAVAILABLE, when the store failed while the "
                       "key was read",
        "content": {"application/json": {"schema": {"oneOf": [report, ref("Error")]}}}}
    return op


WRITE_META = _obj({"request_id": STR, "idempotent_replay": _s("boolean", description="true: this answer replays "
                                                                  "the first one for this Idempotency-Key")},
                  ("request_id",))
IDEMPOTENCY = {"name": IDEMPOTENCY_HEADER, "in": "header", "required": False,
               "schema": _s("string", pattern=IDEMPOTENCY_KEY.pattern),
               "description": "1-255 visible ASCII characters. The same key with the same body within 24 hours "
                              "replays the first answer and stores nothing; with another body it is 409"}


def _write(op_id: str, summary: str, scope: str, ok: int, data: dict, body: str,
           params: list | None = None, *, names_records: bool = True) -> dict:
    """``names_records``: the body or the path names a record that may be
    unknown (404); an observation names none."""
    errors = WRITE_ERRORS if names_records else tuple(s for s in WRITE_ERRORS if s != 404)
    return _op(op_id, summary, scope, ok, data, errors, body=body, params=[*(params or []), IDEMPOTENCY],
               meta=WRITE_META)


WRITE_ERRORS = (400, 401, 403, 404, 408, 409, 413, 500, 503)


@lru_cache(maxsize=1)
def document_json() -> str:
    return dumps(document())


@lru_cache(maxsize=1)
def document() -> dict:
    generation_meta = _obj({"request_id": _s("string"), "generation": INT})
    compile_meta = _obj({"request_id": STR, "generation": INT, "candidates": INT, "at": STR,
                         "envelope_tokens": INT,
                         "degraded": _obj({"semantic": _s("boolean"), "vector": _s("string", enum=["disabled", "used", "error"]),
                                           "model": _s("string", enum=["disabled", "enabled"]),
                                           "checkpoints": _s("string", const="unavailable")},
                                          ("semantic", "vector", "model"))},
                        ("request_id", "degraded", "candidates"))
    claim_id = [_path_id("claim_id", "claim")]
    context_id = [_path_id("context_id", "ctx")]
    paths = {
        "/healthz": {"get": _op("healthz", "liveness", None, 200, _obj({"status": _s("string", const="ok")}), (500,),
                                auth="none")},
        "/readyz": {"get": _readyz()},
        "/v1/observations": {"post": _write("createObservation", "append one piece of evidence, optionally "
                                                                 "with the claim it supports", "memory:write", 201,
                                            ref("ObservationWritten"), "Observation", names_records=False)},
        "/v1/observations/batch": {"post": _write("createObservationBatch", "append up to 100 observations in "
                                                                            "one ledger entry, a result per index",
                                                  "memory:write", 201, ref("BatchWritten"), "ObservationBatch",
                                                  names_records=False)},
        "/v1/consolidations": {"post": _write("createConsolidation", "append 1-50 caller-written claims citing "
                                                                     "their evidence", "memory:write", 201,
                                              ref("ConsolidationWritten"), "Consolidation")},
        "/v1/claims/{claim_id}/supersede": {"post": _write("supersedeClaim", "replace a claim by a new one",
                                                           "memory:write", 201, ref("Superseded"), "Supersede",
                                                           claim_id)},
        "/v1/claims/{claim_id}/revoke": {"post": _write("revokeClaim", "retire a claim as revoked",
                                                        "memory:write", 200, ref("Retired"), "Transition",
                                                        claim_id)},
        "/v1/claims/{claim_id}/expire": {"post": _write("expireClaim", "retire a claim as expired",
                                                        "memory:write", 200, ref("Retired"), "Transition",
                                                        claim_id)},
        "/v1/claims/{claim_id}/evidence": {"get": _op("claimEvidence", "a claim and the sources the caller may "
                                                                       "read", "context:compile", 200,
                                                      ref("Evidence"), (401, 403, 404, 500, 503), params=claim_id,
                                                      meta=generation_meta)},
        "/v1/context/compile": {"post": _op("compileContext", "scope, rank and pack claims for one subject, task "
                                                              "and token budget", "context:compile", 200,
                                            ref("CompiledPack"), (400, 401, 403, 408, 413, 500, 503), body="Compile",
                                            meta=compile_meta)},
        "/v1/context/{context_id}": {"get": _op("storedContext", "a stored pack (only its compiler may read it)",
                                                "context:compile", 200, ref("StoredPack"),
                                                (401, 403, 404, 500, 503), params=context_id)},
        "/v1/context/{context_id}/feedback": {"post": _write("contextFeedback", "feedback on a pack or one of "
                                                                                "its claims", "context:feedback",
                                                             201, ref("FeedbackRecorded"), "Feedback",
                                                             context_id)},
        "/v1/subjects/{subject_id}": {"delete": _op(
            "eraseSubject", "erase everything about a subject in the caller's organization, from every copy "
            "(202: carried out by the next rebuild)", "memory:erase", 202, ref("ErasureAsked"),
            (400, 401, 403, 500, 503), params=[{"name": "subject_id", "in": "path", "required": True,
                                               "schema": identifier().schema(False)}])},
        "/v1/observations/{observation_id}": {"delete": _op(
            "eraseObservation", "erase one observation and the claims it alone supports (202)", "memory:erase",
            202, ref("ErasureAsked"), (401, 403, 404, 500, 503), params=[_path_id("observation_id", "obs")])},
        "/v1/erasures/{erasure_id}": {"get": _op(
            "erasureStatus", "how far an erasure got: pending or complete, with counts per record type of what "
            "the requester could read (its requester only)",
            "memory:erase", 200, ref("Erasure"), (401, 403, 404, 500, 503),
            params=[_path_id("erasure_id", "era")])},
        "/v1/admin/rebuild": {"post": _op("adminRebuild", "rebuild the caller's organization now and serve it",
                                          "admin", 200, ref("Rebuilt"), (401, 403, 409, 500, 503))},
        "/mcp": {"post": {
            "operationId": "mcp", "summary": "MCP Streamable HTTP, stateless, JSON answers (GET is 405)",
            "description": "One JSON-RPC message per POST: initialize, notifications, ping, tools/list, "
                           "tools/call (titen_remember, titen_consolidate, titen_compile, titen_feedback, "
                           "titen_evidence, titen_forget). Tool failures are results with isError: true carrying the "
                           "envelope's {code, message}. Protocol versions: " + ", ".join(PROTOCOL_VERSIONS) + ".",
            "parameters": [{"name": "MCP-Protocol-Version", "in": "header", "required": False,
                            "schema": {"type": "string", "enum": list(PROTOCOL_VERSIONS)},
                            "description": "the negotiated version (after initialize); unsupported: 400"}],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": ref("JsonRpcMessage"),
                "examples": {"tools/list": {"value": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}}}}}},
            "responses": {
                "200": {"description": "the JSON-RPC answer (result, or a method-level error)",
                        "content": {"application/json": {"schema": ref("JsonRpcAnswer")}}},
                "202": {"description": "a notification or a response, accepted; no body"},
                **{str(s): {"description": d, "content": {"application/json": {"schema": (
                    {"oneOf": [ref("JsonRpcAnswer"), ref("Error")]} if s == 400 else ref("JsonRpcAnswer"))}}}
                   for s, d in ((400, "malformed JSON-RPC or an unsupported MCP-Protocol-Version (or, under "
                                      "titen serve, a request its HTTP parser cannot accept: the error envelope)"),
                                (401, "no valid key (error.data.code UNAUTHENTICATED)"),
                                (408, "the body did not arrive within TITEN_BODY_TIMEOUT (10 s)"),
                                (413, "body over 1 MiB"), (500, "internal error"),
                                (503, "the store is unavailable"))}},
            "security": [{"bearer": []}]}},
        "/openapi.json": {"get": {"operationId": "openapi", "summary": "this document", "security": [],
                                  "responses": {"200": {"description": "OpenAPI 3.1",
                                                        "content": {"application/json": {"schema": _s("object")}}},
                                                **_errors(500)}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "titen-lambda", "version": VERSION,
                 "description": "Context compilation for AI agents: evidence-backed claims, scoped, ranked and "
                                "packed to a token budget. Reference: docs/api.md. Request bodies are the "
                                "validator's own field specs; text must be well-formed Unicode without control "
                                "characters other than tab and line feed, and bodies are at most 1 MiB. Every answer "
                                "carries an x-request-id header equal to meta.request_id (the envelope's), and "
                                "cache-control: no-store (this document: no-cache)."},
        "paths": paths,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "an API key: titen_sk_…"}}},
    }
