"""The quick-start data set: a small, realistic memory for one subject.

Loaded through the same write path as the API (so it is validated and lands
in the ledger like any write), once per store: a second ``titen demo`` only
mints a fresh key.
"""

from __future__ import annotations

from core.keys import Principal
from core.layout import ledger_prefix

DEMO_ORG = "demo"
DEMO_SUBJECT = "user_rama"

OBSERVATIONS = [
    ("tool_result", "verified", "Production smoke test returned 200 on all endpoints.", "deploy_456#smoke",
     ("Deploy smoke tests must pass before a release is promoted.", "procedural", 0.95)),
    ("user_statement", "asserted", "Rama: I prefer release notes as a short bulleted list.", "chat_12#m4",
     ("Rama prefers release notes as a short bulleted list.", "preference", 0.9)),
    ("decision", "asserted", "Team decided to deploy on Tuesdays and Thursdays only.", "meeting_2026_11_03",
     ("Deploys happen on Tuesdays and Thursdays only.", "decision", 0.85)),
    ("tool_result", "asserted", "Rollback of release 4.2 completed in 3 minutes via blue-green switch.",
     "deploy_441#rollback", ("A rollback uses the blue-green switch and takes about 3 minutes.", "procedural", 0.8)),
    ("user_statement", "asserted", "Rama owns the payments service and its on-call rotation.", "chat_15#m1",
     ("Rama owns the payments service and is on its on-call rotation.", "relationship", 0.9)),
    ("imported_source", "asserted", "Runbook: database migrations run before the application deploy.",
     "wiki/runbook#migrations", ("Database migrations run before the application deploy.", "procedural", 0.85)),
    ("system_event", "asserted", "Incident INC-311: deploy on Friday caused a payments outage.", "pager/INC-311",
     ("A Friday deploy caused payments incident INC-311.", "episodic_event", 0.9)),
    ("user_statement", "asserted", "Rama: staging uses the eu-west-1 region.", "chat_18#m2",
     ("Staging runs in the eu-west-1 region.", "semantic_fact", 0.75)),
]


def load_demo(service, principal: Principal) -> int:
    """Write the demo memory unless the organization already has a ledger."""
    if next(iter(service.store.list_keys(ledger_prefix(principal.org_id))), None) is not None:
        return 0
    written = 0
    ids = []
    for kind, trust, content, ref, (statement, claim_kind, confidence) in OBSERVATIONS:
        result = service.writes.record_observation(principal, {
            "subject_id": DEMO_SUBJECT, "kind": kind, "content": content, "trust": trust,
            "visibility": "organization", "source": {"type": "tool", "ref": ref},
            "claim": {"statement": statement, "kind": claim_kind, "confidence": confidence}})
        ids.append(result["observation_id"])
        written += 1
    # A contradiction: an earlier note claims Friday deploys are fine.
    note = service.writes.record_observation(principal, {
        "subject_id": DEMO_SUBJECT, "kind": "user_statement", "visibility": "organization",
        "content": "Old wiki: deploys are fine on any weekday including Friday.",
        "source": {"type": "document", "ref": "wiki/old-deploy-policy"}})
    service.writes.record_consolidation(principal, {
        "subject_id": DEMO_SUBJECT, "claims": [{
            "statement": "Deploys are allowed on any weekday, Friday included.", "kind": "decision",
            "confidence": 0.6, "sources": [
                {"observation_id": note["observation_id"], "relation": "supports"},
                {"observation_id": ids[6], "relation": "contradicts"}]}]})
    return written + 1
