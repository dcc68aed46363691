"""Where everything lives in the store: the one map of its key space.

Every durable object titen writes has its key built here, so a reader of
the code (or an operator listing a bucket) finds the whole layout in one
place. Keys are '/'-separated and sort the way their listings need:
ledger entries by UUIDv7 (time order), generations by a fixed-width
number (``SNAPSHOT_NUMBER_WIDTH`` digits), import blocks by a fixed-width
block number.

    keys/<sha256 of the key>.json              an API key's record (core/keys.py)
    keys/by-id/<key_id>.json                   -> the key's hash, to revoke by id
    organizations/<org>                        the organization exists (the rebuild lists these)
    orgs/<org>/ledger/<uuid7 hex>.json         one accepted write (core/ledger.py)
    orgs/<org>/ledger/<uuid7 hex>.run.json     a context run, or feedback on a whole pack
    orgs/<org>/claims/<claim hex>.json         a claim's lifecycle head (core/writes/transitions.py)
    orgs/<org>/idempotency/<sha256>.json       an Idempotency-Key record (core/writes/idempotency.py)
    orgs/<org>/imports/<file sha256>/<block>   an import block's claim marker (core/writes/importer.py)
    orgs/<org>/snapshots/<generation>-<rand>.sqlite   a generation published whole
    orgs/<org>/snapshots/<generation>-<rand>.delta    a generation published as the pages it changed
    orgs/<org>/snapshots/current.json          the pointer: the generation served now
    orgs/<org>/runs-listed.json                how far the schedule found only context runs (core/rebuild/backlog.py)
    orgs/<org>/erasures/<erasure hex>.json     an erasure's status (core/erasure/records.py)
"""

from __future__ import annotations

import hashlib

SNAPSHOT_NUMBER_WIDTH = 12
RUN_SUFFIX = ".run.json"
ENTRY_SUFFIX = ".json"
ORGANIZATIONS_PREFIX = "organizations/"
# records under idempotency/ answer retries for this long; the rebuild's
# housekeeping deletes older ones (core/snapshot/housekeeping.py)
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


def org_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/"


def organization_key(org_id: str) -> str:
    return f"{ORGANIZATIONS_PREFIX}{org_id}"


def ledger_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/ledger/"


def entry_key(org_id: str, entry_hex: str, suffix: str = ENTRY_SUFFIX) -> str:
    """Context runs (and feedback on a whole pack) take ``RUN_SUFFIX``: still
    ledger entries in key order, but the rebuild can pass them over by name,
    since no snapshot needs them — so an organization that only compiles is
    never republished."""
    return f"{ledger_prefix(org_id)}{entry_hex}{suffix}"


def entry_hex_of(key: str) -> str:
    """The entry id in a ledger key (its 32 hex digits)."""
    return key.rsplit("/", 1)[1][:32]


def claim_head_key(org_id: str, claim_hex: str) -> str:
    return f"{claim_heads_prefix(org_id)}{claim_hex}.json"


def claim_heads_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/claims/"


def idempotency_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/idempotency/"


def idempotency_key(org_id: str, principal_id: str, route: str, key: str) -> str:
    """The hash covers the principal, the route and the caller's key: one
    key names one request per principal and route."""
    name = hashlib.sha256("\n".join((principal_id, route, key)).encode()).hexdigest()
    return f"{idempotency_prefix(org_id)}{name}.json"


def import_markers_prefix(org_id: str, file_sha: str) -> str:
    return f"orgs/{org_id}/imports/{file_sha}/"


def snapshots_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/snapshots/"


def pointer_key(org_id: str) -> str:
    return f"{snapshots_prefix(org_id)}current.json"


def runs_listed_key(org_id: str) -> str:
    return f"orgs/{org_id}/runs-listed.json"


def snapshot_key(org_id: str, generation: int, token: str) -> str:
    """A generation's file: its number first, so keys sort by generation;
    ``token`` keeps two racing builds of one number apart."""
    return f"{snapshots_prefix(org_id)}{generation:0{SNAPSHOT_NUMBER_WIDTH}d}-{token}.sqlite"


def delta_key(org_id: str, generation: int, token: str) -> str:
    """A generation published as a delta (core/snapshot/delta.py): numbered
    like the files, so it is listed, kept and deleted with them."""
    return f"{snapshots_prefix(org_id)}{generation:0{SNAPSHOT_NUMBER_WIDTH}d}-{token}.delta"


def snapshot_generation(key: str) -> int | None:
    """The generation number a snapshot key names (None: not a generation file)."""
    name = key.rsplit("/", 1)[1]
    head = name[:SNAPSHOT_NUMBER_WIDTH]
    return int(head) if head.isdigit() and len(head) == SNAPSHOT_NUMBER_WIDTH else None


def erasures_prefix(org_id: str) -> str:
    return f"orgs/{org_id}/erasures/"


def erasure_key(org_id: str, erasure_hex: str) -> str:
    return f"{erasures_prefix(org_id)}{erasure_hex}.json"


def api_key_record(key_hash: str) -> str:
    return f"keys/{key_hash}.json"


def api_key_by_id(key_id: str) -> str:
    return f"keys/by-id/{key_id}.json"
