"""The snapshot's SQLite schema: canonical tables, FTS5 index, projections.

A snapshot is one SQLite file per organization and generation. Canonical
tables (claims, observations, claim_sources, transitions, feedback) hold
what the ledger says; the rest is derived and precomputed so the compile hot
path does no per-request aggregation: a claim row carries its reported
``status`` (``disputed`` folded in), ``version``, feedback counts, creation
time in epoch seconds and its evidence list.

FTS5 tokenizer (``core.lexical.FTS_TOKENIZER``): ``porter unicode61
remove_diacritics 2 categories 'L* N* Co M*'`` — Unicode word
splitting (letters, digits and combining marks make words), case folding, diacritics folded (``café`` matches ``cafe``) and
Porter stemming (``deploys`` matches ``deploy``). The index is contentless
(the statement text lives once, in ``claims``) and holds only claims whose
status can still be compiled (active, disputed); superseded, expired and
revoked claims are deleted from it, so they never count in BM25 statistics.
"""

from core.budget.tokens import TOKENIZER_ID
from core.lexical import FTS_DDL

# Bump on any change to DDL (its comments aside), or to what a table holds (6: claims_fts holds
# statements with CJK runs as bigrams and Cyrillic, Greek and Arabic words
# stemmed, core.lexical.words): older snapshots are then replayed, never
# served. An index added to LATER_INDEXES is the one exception: every build
# creates it where it is missing, and compile uses it only where it exists.
SCHEMA_VERSION = 6

# Indexes added after SCHEMA_VERSION 6, as statements that create them where
# missing: the first build that publishes from an older generation adds them, so a
# release adding one serves the older generations as they are.
# claims_valid: compile lists the subject's rows valid at a time through it
# when they are few (a task ``at`` before the subject's memory, a subject
# whose claims have mostly lapsed), instead of checking every match by rowid
# (core.lexical.query, CompileScope.narrowers).
LATER_INDEXES = """
CREATE INDEX IF NOT EXISTS claims_valid ON claims(subject_id, valid_from, valid_to);
"""

# What the stored item counts (claims.prefix_tokens) are, recorded as the
# snapshot's ``item_tokenizer``: the tokenizer, and since "all-evidence"
# every compilable item counted as a reader who sees all its evidence sees
# it, negated when other readers may see less. A snapshot recorded with
# another value is replayed by the next build, and meanwhile served with
# every item counted at compile: so is one of these by code that predates
# them, which would otherwise read a negated count as a count.
ITEM_COUNTS = f"{TOKENIZER_ID};all-evidence"

DDL = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;

CREATE TABLE claims(
  rowid INTEGER PRIMARY KEY,
  claim_id TEXT NOT NULL UNIQUE,
  org_id TEXT NOT NULL,
  subject_id TEXT NOT NULL,
  project_id TEXT,
  workspace_id TEXT,
  visibility TEXT NOT NULL,
  owner_id TEXT NOT NULL,
  statement TEXT NOT NULL,
  kind TEXT NOT NULL,
  confidence REAL NOT NULL,
  trust TEXT NOT NULL,
  trust_level INTEGER NOT NULL,
  observer_id TEXT,
  valid_from TEXT NOT NULL,
  valid_to TEXT,
  created_at TEXT NOT NULL,
  created_s REAL NOT NULL,
  entry_id TEXT NOT NULL,
  -- projections (recomputed for every claim an applied entry touches)
  base_status TEXT NOT NULL DEFAULT 'active',
  status TEXT NOT NULL DEFAULT 'active',
  version INTEGER NOT NULL DEFAULT 1,
  superseded_by TEXT,
  disputed INTEGER NOT NULL DEFAULT 0,
  -- disputed by evidence every reader of the organization can see, so the
  -- common case needs no per-caller look at the evidence list
  dispute_public INTEGER NOT NULL DEFAULT 0,
  feedback_total INTEGER NOT NULL DEFAULT 0,
  feedback_positive INTEGER NOT NULL DEFAULT 0,
  feedback_negative INTEGER NOT NULL DEFAULT 0,
  evidence_json TEXT NOT NULL DEFAULT '[]',
  -- the real count of the item's serialized prefix (every field but the
  -- score) as a reader who sees all its evidence sees it: negated when
  -- reader-dependent (ITEM_COUNTS); NULL when not compilable
  prefix_tokens INTEGER,
  indexed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX claims_scope ON claims(subject_id, status, project_id);

CREATE TABLE observations(
  observation_id TEXT PRIMARY KEY,
  org_id TEXT NOT NULL,
  subject_id TEXT NOT NULL,
  project_id TEXT,
  workspace_id TEXT,
  visibility TEXT NOT NULL,
  owner_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  content TEXT NOT NULL,
  source_json TEXT NOT NULL,
  trust TEXT NOT NULL,
  occurred_at TEXT,
  created_at TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE claim_sources(
  claim_id TEXT NOT NULL,
  observation_id TEXT NOT NULL,
  relation TEXT NOT NULL,
  PRIMARY KEY(claim_id, observation_id, relation)
) WITHOUT ROWID;
CREATE INDEX claim_sources_by_observation ON claim_sources(observation_id);

CREATE TABLE transitions(
  claim_id TEXT NOT NULL,
  from_version INTEGER NOT NULL,
  action TEXT NOT NULL,
  entry_id TEXT NOT NULL,
  recorded_at TEXT NOT NULL,
  reason TEXT,
  new_claim_id TEXT,
  PRIMARY KEY(claim_id, from_version)
) WITHOUT ROWID;

CREATE TABLE feedback(
  context_id TEXT NOT NULL,
  claim_id TEXT NOT NULL,
  feedback_id TEXT NOT NULL,
  outcome TEXT NOT NULL,
  PRIMARY KEY(context_id, claim_id)
) WITHOUT ROWID;
CREATE INDEX feedback_by_claim ON feedback(claim_id);

-- bookkeeping, not canonical content: entries applied inside the skew
-- window (pruned behind it), import batches and imported lines already applied
CREATE TABLE applied(entry_key TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE import_batches(batch_key TEXT PRIMARY KEY, entry_id TEXT NOT NULL) WITHOUT ROWID;
-- every imported line applied, by identity (file sha256 : line number)
CREATE TABLE import_lines(line_key TEXT PRIMARY KEY, entry_id TEXT NOT NULL) WITHOUT ROWID;
-- every erasure applied: a standing rule for records arriving later (core/snapshot/erase.py)
CREATE TABLE erasures(erasure_id TEXT PRIMARY KEY, target TEXT NOT NULL, target_sha256 TEXT NOT NULL)
  WITHOUT ROWID;
""" + FTS_DDL + LATER_INDEXES

# The canonical columns the content hash covers: core/snapshot/content_hash.py.

# A claim row as the read paths select it (``COL``: a field's index in it).
CLAIM_FIELDS = ("rowid", "claim_id", "subject_id", "project_id", "workspace_id", "visibility", "owner_id",
                "statement", "kind", "confidence", "trust", "trust_level", "observer_id", "valid_from",
                "valid_to", "created_at", "created_s", "status", "version", "disputed", "dispute_public",
                "feedback_total", "feedback_positive", "feedback_negative", "evidence_json", "prefix_tokens")
CLAIM_COLUMNS = ", ".join(CLAIM_FIELDS)
COL = {name: i for i, name in enumerate(CLAIM_FIELDS)}
