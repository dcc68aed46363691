"""titen's metrics: every name, its unit, its dimensions, and what records it.

One table for the whole service, so docs/operations.md, the template's
alarms and dashboard (``tests/test_template.py`` checks them against
``ALARMED`` and ``CATALOGUE``) and the code name the same series.

| part | metric | unit | dimensions | recorded |
| --- | --- | --- | --- | --- |
| API | Requests, Latency | Count, Milliseconds | Service, Route | every request (the route template) |
| API | Errors | Count | Service, Code | every error answer, by its code (MCP tool errors too) |
| API | CompileLatency, Candidates, PackItems, BudgetUse, VectorUsed, VectorErrors | ms, Count, Count, Percent, Count, Count | Service | every request that compiled (HTTP or MCP) |
| readers | GenerationAge | Seconds | Service | every compile: how old the generation that answered is |
| readers | RefreshFailures | Count | Service | a request whose snapshot refresh failed (the old generation kept serving) |
| rebuild | RebuildSeconds, EntriesApplied, BytesPublished, FreshnessLag | Seconds, Count, Bytes, Seconds | Service | every build that published |
| rebuild | RebuildFailures | Count | Service | every organization whose rebuild line says ``failed`` |

``Service`` is ``api`` or ``rebuild``. An organization named in
``TITEN_METRICS_ORGS`` gets every group again with an ``Organization``
dimension (core.observe.emf). The metrics are built from the request line
and the rebuild line, never from a request body: what a caller wrote cannot
reach them.
"""

from __future__ import annotations

from core.observe.emf import Group, Metric

API, REBUILD = "api", "rebuild"  # the Service dimension
UNMATCHED = "unmatched"  # the Route of a request no route matched (404)

REQUESTS = Metric("Requests", "Count")
LATENCY = Metric("Latency", "Milliseconds")
ERRORS = Metric("Errors", "Count")
COMPILE_LATENCY = Metric("CompileLatency", "Milliseconds")
CANDIDATES = Metric("Candidates", "Count")
PACK_ITEMS = Metric("PackItems", "Count")
BUDGET_USE = Metric("BudgetUse", "Percent")
VECTOR_USED = Metric("VectorUsed", "Count")
VECTOR_ERRORS = Metric("VectorErrors", "Count")
GENERATION_AGE = Metric("GenerationAge", "Seconds")
REFRESH_FAILURES = Metric("RefreshFailures", "Count")
REBUILD_SECONDS = Metric("RebuildSeconds", "Seconds")
ENTRIES_APPLIED = Metric("EntriesApplied", "Count")
BYTES_PUBLISHED = Metric("BytesPublished", "Bytes")
FRESHNESS_LAG = Metric("FreshnessLag", "Seconds")
REBUILD_FAILURES = Metric("RebuildFailures", "Count")

# name -> (metric, its dimension keys besides an opted-in Organization)
CATALOGUE = {m.name: (m, dims) for m, dims in [
    (REQUESTS, ("Service", "Route")), (LATENCY, ("Service", "Route")), (ERRORS, ("Service", "Code")),
    *((m, ("Service",)) for m in (COMPILE_LATENCY, CANDIDATES, PACK_ITEMS, BUDGET_USE, VECTOR_USED,
                                  VECTOR_ERRORS, GENERATION_AGE, REFRESH_FAILURES, REBUILD_SECONDS,
                                  ENTRIES_APPLIED, BYTES_PUBLISHED, FRESHNESS_LAG, REBUILD_FAILURES)),
]}

# The series the template alarms on, with their Service (the alarm's dimension).
ALARMED = {COMPILE_LATENCY.name: API, FRESHNESS_LAG.name: REBUILD, REBUILD_FAILURES.name: REBUILD}


def request_groups(line: dict) -> list[Group]:
    """The API's metrics of one request, from its request line
    (core.observe.request_line)."""
    groups = [Group({"Service": API, "Route": line.get("route") or UNMATCHED},
                    {REQUESTS: 1, LATENCY: line["latency_ms"]})]
    if line.get("code"):
        groups.append(Group({"Service": API, "Code": line["code"]}, {ERRORS: 1}))
    if "candidates" in line:  # the request compiled
        max_tokens = line.get("max_tokens") or 0
        groups.append(Group({"Service": API}, {
            COMPILE_LATENCY: line["latency_ms"], CANDIDATES: line["candidates"], PACK_ITEMS: line["items"],
            BUDGET_USE: round(100.0 * line["used_tokens"] / max_tokens, 2) if max_tokens else None,
            VECTOR_USED: int(line.get("vector") == "used"), VECTOR_ERRORS: int(line.get("vector") == "error"),
            GENERATION_AGE: line.get("generation_age_seconds")}))
    if line.get("refresh_failures"):
        groups.append(Group({"Service": API}, {REFRESH_FAILURES: line["refresh_failures"]}))
    return groups


def build_groups(line: dict) -> list[Group]:
    """A rebuild that published (core.rebuild.runner's line for one build)."""
    if not line.get("published"):
        return []
    return [Group({"Service": REBUILD}, {
        REBUILD_SECONDS: line.get("seconds"), ENTRIES_APPLIED: line.get("entries_applied"),
        BYTES_PUBLISHED: line.get("bytes"), FRESHNESS_LAG: line.get("freshness_lag_seconds")})]


def failure_groups(line: dict) -> list[Group]:
    """An organization's rebuild line that says ``failed`` (retried by SQS,
    or failing the scheduled invocation)."""
    if line.get("status") != "failed":
        return []
    return [Group({"Service": REBUILD}, {REBUILD_FAILURES: 1})]
