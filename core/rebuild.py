"""Snapshot build and publication for one organization.

previous snapshot + ledger entries after its watermark → a new SQLite file →
uploaded under a new generation with its sha256 → ``current.json`` swapped by
compare-and-swap on the ETag it was read with. Rules this module enforces:

- **No lost writes under clock skew.** Listing restarts ``skew_seconds``
  behind the watermark, and entries already applied inside that window are
  skipped (the ``applied`` table), so an entry from a lagging clock is applied
  late but applied, and applying the same ledger twice changes nothing.
- **Order-independent folding.** Lifecycle transitions are folded by claim
  version and feedback by feedback id, never by arrival, so an incremental
  build and a from-scratch replay (``from_scratch=True``) reach the same
  canonical content; both report its hash.
- **Single publisher.** Two rebuilds racing both upload (under distinct keys)
  but only one compare-and-swap of the pointer succeeds; the loser deletes
  its upload. A crash before the swap leaves the previous generation serving.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import apsw

from core.domain import POSITIVE_OUTCOMES, TRUST_LEVELS
from core.ids import uuid7_floor_hex, uuid7_ms
from core.instants import canonical, now_utc, parse_instant
from core import content_hash, housekeeping
from core.lexical import LexicalChanges, priced_here, recorded_fingerprint, update_lexical_index
from core.packing import item_fields, item_prefix
from core.tokens import TOKENIZER_ID, count_tokens_batch
from core.ledger import RUN_SUFFIX, Ledger, ledger_prefix
from core.snapshot_schema import DDL, SCHEMA_VERSION
from core.store import ObjectNotFound, PreconditionFailed, Store

DEFAULT_SKEW_SECONDS = 600
KEEP_GENERATIONS = 5
DEFAULT_KEEP_BYTES = 1 << 30
TERMINAL = ("superseded", "expired", "revoked")


class RebuildConflict(Exception):
    """Another rebuild published first; this one's upload was withdrawn."""


@dataclass
class RebuildResult:
    org_id: str
    generation: int
    published: bool
    entries_applied: int
    content_hash: str
    claim_count: int
    snapshot_bytes: int
    seconds: float
    snapshot_key: str | None
    # what the build started from when that was not the published generation
    # (e.g. "previous generation 8 fails its sha256: built from the ledger")
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


def _boot_id() -> str | None:
    """This boot of the machine (Linux); None elsewhere, where kept files are
    then never trusted."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pointer_key(org_id: str) -> str:
    return f"orgs/{org_id}/snapshots/current.json"


def read_pointer(store: Store, org_id: str) -> tuple[dict | None, str | None]:
    try:
        obj = store.get(pointer_key(org_id))
    except ObjectNotFound:
        return None, None
    return json.loads(obj.body), obj.etag


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def snapshot_meta(path: str, key: str) -> str | None:
    """One value of a snapshot file's meta table (None if absent or unreadable)."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None
    except apsw.SQLError:
        return None
    finally:
        db.close()


def snapshot_schema_version(path: str) -> int | None:
    value = snapshot_meta(path, "schema_version")
    return int(value) if value is not None else None


class SnapshotBuilder:
    def __init__(self, store: Store, org_id: str, *, work_dir: str | None = None,
                 skew_seconds: int = DEFAULT_SKEW_SECONDS,
                 progress: Callable[[str], None] | None = None,
                 before_publish: Callable[[], None] | None = None,
                 embedder=None, keep_bytes: int | None = None):
        self.store = store
        self.embedder = embedder  # None: no vector index (and nothing vector-related imported)
        self.vector_stats = None  # core.vectors.SyncStats of the last build, when vectors are on
        self.org_id = org_id
        self.ledger = Ledger(store)
        self.work_dir = work_dir or tempfile.gettempdir()
        self.skew_ms = int(skew_seconds * 1000)
        self.progress = progress or (lambda message: None)
        self.before_publish = before_publish  # a test seam: a crash just before the swap
        # the published file stays in work_dir for the next build (0: never)
        self.keep_bytes = DEFAULT_KEEP_BYTES if keep_bytes is None else keep_bytes
        self.lexical_stats: dict | None = None  # what the last build did to the candidate index
        self.housekeeping: dict | None = None  # what the last build's sweep removed (core/housekeeping.py)
        self.notes: list[str] = []  # why the last build did not start from the published generation

    # -- public --------------------------------------------------------------

    def rebuild(self, *, from_scratch: bool = False, force: bool = False) -> RebuildResult:
        started = time.monotonic()
        if housekeeping.due(self.store, self.org_id):
            self.housekeeping = housekeeping.sweep(self.store, self.org_id)
        self.notes = []
        pointer, etag = read_pointer(self.store, self.org_id)
        os.makedirs(self.work_dir, exist_ok=True)
        work = os.path.join(self.work_dir, f"build-{self.org_id}-{secrets.token_hex(6)}.sqlite")
        try:
            db = self._open_work(work, None if from_scratch else pointer)
            try:
                # an incremental build keeps the content sums and the
                # candidate index current as it goes; a build from empty
                # computes both once at the end
                sums = content_hash.decode(self._meta(db, content_hash.META_KEY))
                row_digests = content_hash.RowDigests(db, sums) if sums is not None else None
                lexical = LexicalChanges(record=self._has_lexical_index(db))
                # recorded in the pointer: every entry stored before this
                # instant is in the generation (core/rebuild_queue.py, core/backlog.py)
                listed_at = canonical(now_utc())
                applied = self._apply_new_entries(db, lexical)
                if row_digests is not None:
                    row_digests.close()
                    sums = row_digests.sums
                # (a generation whose candidate index another libm priced is
                # priced again here even with nothing new: core.lexical; a
                # pointer from before watermarks were published is republished once)
                if (pointer is not None and applied == 0 and not from_scratch and not force
                        and self._vectors_current(pointer) and priced_here(recorded_fingerprint(db))
                        and "watermark" in pointer):
                    if db.total_changes() == 0:
                        # untouched: still exactly the published file, so keep it
                        db.close()
                        self._keep(work, pointer["snapshot_key"], pointer["sha256"], os.path.getsize(work))
                    return RebuildResult(self.org_id, pointer["generation"], False, 0,
                                         pointer["content_hash"], pointer["claim_count"],
                                         pointer["bytes"], time.monotonic() - started,
                                         pointer["snapshot_key"], tuple(self.notes))
                generation = (pointer["generation"] if pointer else 0) + 1
                self.progress(f"{self.org_id}: updating the candidate index")
                with db:
                    # after the last change to claims_fts
                    self.lexical_stats = update_lexical_index(db, lexical, self.progress)
                if sums is None:
                    self.progress(f"{self.org_id}: hashing content")
                    sums = content_hash.scan(db)
                digest = content_hash.digest(sums)
                claim_count = db.execute("SELECT count(*) FROM claims").fetchone()[0]
                vector = None
                if self.embedder is not None:
                    # outside the content hash: derived, and a failure here
                    # still publishes the lexical snapshot (meta says why)
                    from core.vectors import seed_embed_cache, sync_vectors
                    if pointer is not None and self._meta(db, "vector_fingerprint") is None:
                        # a replay from empty: reuse the previous generation's embeddings
                        seed_embed_cache(db, self.store, pointer["snapshot_key"], self.work_dir, self.progress)
                    self.vector_stats = sync_vectors(db, self.embedder, self.progress)
                    vector = self._vector_record("error" if self.vector_stats.error else "ok")
                elif self._meta(db, "vector_status") is not None:
                    # an index carried over from a build with an embedder misses
                    # this build's claims: no reader may trust it as complete
                    self._set_meta(db, vector_status="stale", vector_error="built without an embedder")
                self._set_meta(db, generation=generation, content_hash=digest,
                               built_at=canonical(now_utc()), claim_count=claim_count,
                               **{content_hash.META_KEY: content_hash.encode(sums)})
                db.execute("PRAGMA optimize")
                ledger = {"watermark": self._meta(db, "watermark") or "", "ledger_listed_at": listed_at}
            finally:
                db.close()
            key, size, sha = self._publish(work, generation, digest, claim_count, pointer, etag, vector,
                                           ledger)
            self._keep(work, key, sha, size)
            return RebuildResult(self.org_id, generation, True, applied, digest, claim_count, size,
                                 time.monotonic() - started, key, tuple(self.notes))
        finally:
            for suffix in ("", "-journal", "-wal", "-shm"):
                try:
                    os.unlink(work + suffix)
                except FileNotFoundError:
                    pass

    # -- the previous generation, kept in the work directory ------------------

    def _kept_paths(self) -> tuple[str, str]:
        base = os.path.join(self.work_dir, f"kept-{self.org_id}")
        return base + ".sqlite", base + ".json"

    def _keep(self, work: str, key: str, sha: str, size: int) -> None:
        """Keep the file just published as the next build's starting point,
        so an incremental build does not download and verify it again.
        Older kept files (other organizations) go first when the budget
        ``keep_bytes`` would be exceeded. Never raises: the generation is
        published already, and a file not kept only costs a download."""
        try:
            self._keep_file(work, key, sha, size)
        except OSError as exc:
            self.progress(f"{self.org_id}: {key} not kept locally: {exc}")

    def _keep_file(self, work: str, key: str, sha: str, size: int) -> None:
        path, record = self._kept_paths()
        for stale in (record, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        if size > self.keep_bytes:
            return
        others = []
        for name in os.listdir(self.work_dir):
            other = os.path.join(self.work_dir, name)
            if name.startswith("kept-") and name.endswith(".sqlite") and other != path:
                with contextlib.suppress(FileNotFoundError):  # another build took or dropped it
                    st = os.stat(other)
                    others.append((st.st_mtime, st.st_size, other))
        total = size + sum(n for _, n, _ in others)
        for _, n, other in sorted(others):
            if total <= self.keep_bytes:
                break
            total -= n
            for stale in (other[:-len(".sqlite")] + ".json", other):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
        os.replace(work, path)
        with open(record, "w") as f:
            json.dump({"snapshot_key": key, "sha256": sha, "bytes": size, "boot_id": _boot_id()}, f)

    def _take_kept(self, work: str, pointer: dict) -> bool:
        """Move the kept file into place as the work file when it is exactly
        the generation the pointer names (same key, sha256 and size) and the
        machine has not restarted since it was kept: the file is written
        without fsync, so after a crash or power loss it may be torn."""
        path, record = self._kept_paths()
        try:
            with open(record) as f:
                kept = json.load(f)
            os.unlink(record)  # taken at most once: the work file is changed in place
            st = os.stat(path)
        except (FileNotFoundError, ValueError):
            return False
        # st_nlink: a hard-linked copy (cp -al of the work directory) is not
        # ours to change in place
        if (kept.get("snapshot_key") != pointer["snapshot_key"] or kept.get("sha256") != pointer["sha256"]
                or st.st_size != kept.get("bytes") or st.st_nlink != 1
                or kept.get("boot_id") is None or kept.get("boot_id") != _boot_id()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return False
        try:
            os.replace(path, work)
        except FileNotFoundError:  # evicted meanwhile by another organization's build
            return False
        return True

    # -- build ---------------------------------------------------------------

    def _open_work(self, work: str, pointer: dict | None) -> apsw.Connection:
        if pointer is not None:
            if self._take_kept(work, pointer):
                self.progress(f"{self.org_id}: starting from generation {pointer['generation']}, kept locally")
            else:
                try:
                    self.store.download_file(pointer["snapshot_key"], work)
                except ObjectNotFound:
                    # A missing previous generation: replay (docs/architecture.md).
                    self._replay_because(f"previous generation {pointer['generation']} is missing from the store")
                    pointer = None
                if pointer is not None and file_sha256(work) != pointer["sha256"]:
                    # A damaged previous generation is never built upon: replay.
                    self._replay_because(f"previous generation {pointer['generation']} fails its sha256")
                    os.unlink(work)
                    pointer = None
        if pointer is not None and snapshot_schema_version(work) != SCHEMA_VERSION:
            # Built by another version of the schema: its tables cannot
            # be extended in place, but the ledger can always be replayed.
            self._replay_because(f"previous generation {pointer['generation']} has another schema")
            os.unlink(work)
            pointer = None
        if pointer is not None and snapshot_meta(work, "item_tokenizer") != TOKENIZER_ID:
            # Its stored item counts were made with another tokenizer: every
            # claim is priced again, from the ledger.
            self._replay_because(f"previous generation {pointer['generation']} counted tokens with "
                                 "another tokenizer")
            os.unlink(work)
            pointer = None
        db = apsw.Connection(work)
        db.execute("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-65536")
        if pointer is None:
            with db:
                db.execute(DDL)
                self._set_meta(db, org_id=self.org_id, schema_version=SCHEMA_VERSION, watermark="",
                               item_tokenizer=TOKENIZER_ID)
        return db

    def _replay_because(self, why: str) -> None:
        note = f"{why}: built from the ledger"
        self.notes.append(note)
        self.progress(f"{self.org_id}: {note}")

    @staticmethod
    def _set_meta(db: apsw.Connection, **values) -> None:
        db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
                       [(k, str(v)) for k, v in values.items()])

    @staticmethod
    def _meta(db: apsw.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    @staticmethod
    def _has_lexical_index(db: apsw.Connection) -> bool:
        return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'lex_stats'").fetchone() is not None

    def _apply_new_entries(self, db: apsw.Connection, lexical: LexicalChanges) -> int:
        watermark = self._meta(db, "watermark") or ""
        start_after = None
        if watermark:
            floor = uuid7_floor_hex(uuid7_ms(watermark) - self.skew_ms)
            start_after = ledger_prefix(self.org_id) + floor
        keys = [k for k in self.ledger.keys_after(self.org_id, start_after)
                if not k.endswith(RUN_SUFFIX)
                and not db.execute("SELECT 1 FROM applied WHERE entry_key=?", (k,)).fetchone()]
        if not keys:
            return 0
        self.progress(f"{self.org_id}: applying {len(keys)} ledger entries")
        touched: set[str] = set()
        applied = 0
        last_report = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool, db:
            for key, entry in zip(keys, pool.map(self.ledger.read_raw, keys)):
                apply_entry(db, entry, touched)
                db.execute("INSERT INTO applied(entry_key) VALUES(?)", (key,))
                applied += 1
                if time.monotonic() - last_report > 2:
                    last_report = time.monotonic()
                    self.progress(f"{self.org_id}: applied {applied}/{len(keys)} entries")
            self.progress(f"{self.org_id}: refreshing projections of {len(touched)} claims")
            refresh_projections(db, touched, lexical)
            new_watermark = max(watermark, max(k.rsplit("/", 1)[1][:32] for k in keys))
            prune_before = ledger_prefix(self.org_id) + uuid7_floor_hex(uuid7_ms(new_watermark) - self.skew_ms)
            db.execute("DELETE FROM applied WHERE entry_key < ?", (prune_before,))
            self._set_meta(db, watermark=new_watermark)
        return applied

    # -- publish -------------------------------------------------------------

    def _vectors_current(self, pointer: dict) -> bool:
        """Whether the published generation already has this embedder's
        complete vector index (else a rebuild with no new entries still runs)."""
        if self.embedder is None:
            return True
        return pointer.get("vector") == self._vector_record("ok")

    def _vector_record(self, status: str) -> dict:
        from core.vectors import INDEX_LAYOUT
        return {"fingerprint": self.embedder.fingerprint.key(), "layout": INDEX_LAYOUT, "status": status}

    def _publish(self, work: str, generation: int, digest: str, claim_count: int,
                 pointer: dict | None, etag: str | None, vector: dict | None = None,
                 ledger: dict | None = None) -> tuple[str, int, str]:
        size = os.path.getsize(work)
        key = f"orgs/{self.org_id}/snapshots/{generation:012d}-{secrets.token_hex(4)}.sqlite"
        self.progress(f"{self.org_id}: uploading generation {generation} ({size} bytes)")
        with ThreadPoolExecutor(max_workers=1) as pool:  # hashing beside the upload: both only read the file
            sha = pool.submit(file_sha256, work)
            self.store.upload_file(key, work)
            sha = sha.result()
        history = ([{"generation": generation, "snapshot_key": key, "sha256": sha}]
                   + (pointer.get("history", []) if pointer else []))[:KEEP_GENERATIONS]
        record = {"org_id": self.org_id, "generation": generation, "snapshot_key": key,
                  "sha256": sha, "bytes": size, "content_hash": digest, "claim_count": claim_count,
                  "published_at": canonical(now_utc()), "history": history}
        if vector is not None:
            record["vector"] = vector
        if ledger is not None:
            # the last ledger entry applied, and when the ledger was listed:
            # enough to tell, without the snapshot, whether anything is new
            record.update(ledger)
        body = json.dumps(record, indent=1).encode()
        try:
            if self.before_publish:
                self.before_publish()
            if etag is None:
                self.store.put_if_absent(pointer_key(self.org_id), body)
            else:
                self.store.compare_and_swap(pointer_key(self.org_id), body, etag)
        except PreconditionFailed:
            self.store.delete(key)
            raise RebuildConflict(f"{self.org_id}: another rebuild published first") from None
        except BaseException:
            self.store.delete(key)
            raise
        self._retire_old_generations(generation, {h["snapshot_key"] for h in history})
        return key, size, sha

    def _retire_old_generations(self, generation: int, keep: set[str]) -> None:
        prefix = f"orgs/{self.org_id}/snapshots/"
        for key in self.store.list_keys(prefix):
            name = key[len(prefix):]
            if key in keep or not name[:12].isdigit():
                continue
            if int(name[:12]) <= generation:
                self.store.delete(key)


# -- applying entries (pure SQL over the work database) ------------------------

def apply_entry(db: apsw.Connection, entry: dict, touched: set[str]) -> None:
    kind = entry["type"]
    if kind == "observation":
        _insert_observation(db, entry["observation"])
        for claim in entry.get("claims", []):
            _insert_claim(db, claim, entry, touched)
        touched.update(_claims_citing(db, [entry["observation"]["observation_id"]]))
    elif kind == "consolidation":
        for claim in entry["claims"]:
            _insert_claim(db, claim, entry, touched)
    elif kind == "batch":
        observations, claims = entry["observations"], entry["claims"]
        if "import" in entry:
            # a line of an imported file is applied once, whichever entry
            # brings it (core/importer.py keeps the ledger free of twins too)
            file_sha = entry["import"]["file_sha256"]
            fresh = set()
            for obs, line in zip(observations, entry["import"]["lines"]):
                if db.execute("INSERT OR IGNORE INTO import_lines(line_key, entry_id) VALUES(?, ?) RETURNING 1",
                              (f"{file_sha}:{line}", entry["entry_id"])).fetchone() is not None:
                    fresh.add(obs["observation_id"])
            observations = [o for o in observations if o["observation_id"] in fresh]
            claims = [c for c in claims if c["sources"][0]["observation_id"] in fresh]
        elif "batch_key" in entry:  # the import format before line identities
            batch_key = entry["batch_key"]
            row = db.execute("SELECT entry_id FROM import_batches WHERE batch_key=?", (batch_key,)).fetchone()
            if row is not None and row[0] <= entry["entry_id"]:
                return  # a re-run of an import: the earlier entry already holds this batch
            db.execute("INSERT OR REPLACE INTO import_batches(batch_key, entry_id) VALUES(?, ?)",
                       (batch_key, entry["entry_id"]))
        for obs in observations:
            _insert_observation(db, obs)
        for claim in claims:
            _insert_claim(db, claim, entry, touched)
    elif kind == "transition":
        db.execute(
            "INSERT INTO transitions(claim_id, from_version, action, entry_id, recorded_at, reason, new_claim_id)"
            " VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(claim_id, from_version) DO UPDATE SET"
            " action=excluded.action, entry_id=excluded.entry_id, recorded_at=excluded.recorded_at,"
            " reason=excluded.reason, new_claim_id=excluded.new_claim_id"
            " WHERE excluded.entry_id < transitions.entry_id",
            (entry["claim_id"], entry["expected_version"], entry["action"], entry["entry_id"],
             entry["recorded_at"], entry.get("reason"),
             entry["new_claim"]["claim_id"] if entry.get("new_claim") else None))
        touched.add(entry["claim_id"])
        if entry.get("new_claim"):
            _insert_claim(db, entry["new_claim"], entry, touched)
    elif kind == "feedback":
        if entry.get("claim_id"):
            db.execute(
                "INSERT INTO feedback(context_id, claim_id, feedback_id, outcome) VALUES(?, ?, ?, ?)"
                " ON CONFLICT(context_id, claim_id) DO UPDATE SET feedback_id=excluded.feedback_id,"
                " outcome=excluded.outcome WHERE excluded.feedback_id > feedback.feedback_id",
                (entry["context_id"], entry["claim_id"], entry["feedback_id"], entry["outcome"]))
            touched.add(entry["claim_id"])
    # context runs live in the ledger only: feedback reads them from there.


def _insert_observation(db: apsw.Connection, obs: dict) -> None:
    db.execute(
        "INSERT OR IGNORE INTO observations(observation_id, org_id, subject_id, project_id, workspace_id,"
        " visibility, owner_id, kind, content, source_json, trust, occurred_at, created_at)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (obs["observation_id"], obs["org_id"], obs["subject_id"], obs.get("project_id"),
         obs.get("workspace_id"), obs["visibility"], obs["owner_id"], obs["kind"], obs["content"],
         json.dumps(obs["source"], sort_keys=True, separators=(",", ":"), ensure_ascii=False),
         obs["trust"], obs.get("occurred_at"), obs["created_at"]))


def _insert_claim(db: apsw.Connection, claim: dict, entry: dict, touched: set[str]) -> None:
    created_at = claim["created_at"]
    cursor = db.execute(
        "INSERT OR IGNORE INTO claims(claim_id, org_id, subject_id, project_id, workspace_id, visibility,"
        " owner_id, statement, kind, confidence, trust, trust_level, observer_id, valid_from, valid_to,"
        " created_at, created_s, entry_id) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING rowid",
        (claim["claim_id"], claim["org_id"], claim["subject_id"], claim.get("project_id"),
         claim.get("workspace_id"), claim["visibility"], claim["owner_id"], claim["statement"],
         claim["kind"], claim["confidence"], claim["trust"], TRUST_LEVELS[claim["trust"]],
         claim.get("observer_id"), claim["valid_from"], claim.get("valid_to"), created_at,
         parse_instant(created_at).timestamp(), entry["entry_id"]))
    if cursor.fetchone() is None:
        return
    db.executemany("INSERT OR IGNORE INTO claim_sources(claim_id, observation_id, relation) VALUES(?, ?, ?)",
                   [(claim["claim_id"], s["observation_id"], s["relation"]) for s in claim["sources"]])
    touched.add(claim["claim_id"])


def _claims_citing(db: apsw.Connection, observation_ids: list[str]) -> list[str]:
    marks = ",".join("?" * len(observation_ids))
    return [r[0] for r in db.execute(
        f"SELECT DISTINCT claim_id FROM claim_sources WHERE observation_id IN ({marks})", observation_ids)]


def refresh_projections(db: apsw.Connection, claim_ids: Iterable[str],
                        lexical: LexicalChanges | None = None) -> None:
    """Recompute every derived column of these claims from canonical rows;
    ``lexical`` is told of every row entering or leaving claims_fts. The
    exact token count of each item's prefix (``core.packing.item_prefix``)
    is taken in batches of ``PRICE_BATCH``, written with one statement each."""
    pending: list[tuple] = []  # UPDATE parameters, the prefix text where prefix_tokens goes
    for claim_id in sorted(claim_ids):
        row = db.execute("SELECT rowid, statement, indexed, kind, confidence, trust, observer_id, valid_from,"
                         " valid_to, subject_id FROM claims WHERE claim_id=?", (claim_id,)).fetchone()
        if row is None:
            continue  # feedback or a transition for a claim not (yet) in this ledger
        rowid, statement, indexed, kind, confidence, trust, observer_id, valid_from, valid_to, subject_id = row
        version, base_status, superseded_by = 1, "active", None
        for from_version, action, new_claim_id in db.execute(
                "SELECT from_version, action, new_claim_id FROM transitions WHERE claim_id=?"
                " ORDER BY from_version", (claim_id,)):
            if from_version != version or base_status in TERMINAL:
                continue
            version += 1
            base_status = {"supersede": "superseded", "revoke": "revoked", "expire": "expired"}[action]
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
        should_index = int(status not in TERMINAL)
        prefix = None
        if should_index and all(e[2] == "organization" for e in evidence):
            # every reader sees this item alike: count its prefix once, here
            prefix = item_prefix(item_fields(
                claim_id, statement, kind, confidence, trust, status, observer_id, valid_from, valid_to,
                sorted({e[0] for e in evidence})))
        if should_index and not indexed:
            db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (rowid, statement))
            if lexical is not None:
                lexical.inserted(rowid, subject_id, statement)
        elif indexed and not should_index:
            db.execute("DELETE FROM claims_fts WHERE rowid=?", (rowid,))
            if lexical is not None:
                lexical.deleted(rowid, subject_id, statement)
        pending.append((base_status, status, version, superseded_by, disputed, dispute_public, total, positive,
                        negative, json.dumps(evidence, separators=(",", ":")), should_index, prefix, rowid))
        if len(pending) >= PRICE_BATCH:
            _write_projections(db, pending)
            pending = []
    _write_projections(db, pending)


PRICE_BATCH = 4096


def _write_projections(db: apsw.Connection, pending: list[tuple]) -> None:
    if not pending:
        return
    texts = [p[11] for p in pending if p[11] is not None]
    counts = iter(count_tokens_batch(texts))
    db.executemany(
        "UPDATE claims SET base_status=?, status=?, version=?, superseded_by=?, disputed=?, dispute_public=?,"
        " feedback_total=?, feedback_positive=?, feedback_negative=?, evidence_json=?, indexed=?,"
        " prefix_tokens=? WHERE rowid=?",
        [p[:11] + (None if p[11] is None else next(counts), p[12]) for p in pending])




def rollback(store: Store, org_id: str, generation: int) -> dict:
    """Serve a kept older generation again, as a new generation number.

    Readers pick it up like any new generation. The ledger stays canonical:
    the next rebuild starts from the rolled-back file and re-applies every
    entry after its watermark, so rollback is for a bad *build* — pause the
    rebuild schedule while the cause is fixed (docs/operations.md).
    """
    pointer, etag = read_pointer(store, org_id)
    if pointer is None:
        raise ValueError(f"{org_id} has no published snapshot")
    target = next((h for h in pointer.get("history", []) if h["generation"] == generation), None)
    if target is None:
        kept = ", ".join(str(h["generation"]) for h in pointer.get("history", []))
        raise ValueError(f"generation {generation} is not kept; kept generations: {kept}")
    work = os.path.join(tempfile.gettempdir(), f"rollback-{secrets.token_hex(6)}.sqlite")
    try:
        store.download_file(target["snapshot_key"], work)
        size = os.path.getsize(work)
        if file_sha256(work) != target["sha256"]:
            raise ValueError(f"generation {generation} fails its sha256 check; not rolled back")
        db = apsw.Connection(work, flags=apsw.SQLITE_OPEN_READONLY)
        digest = db.execute("SELECT value FROM meta WHERE key='content_hash'").fetchone()[0]
        claims = int(db.execute("SELECT value FROM meta WHERE key='claim_count'").fetchone()[0])
        watermark = (db.execute("SELECT value FROM meta WHERE key='watermark'").fetchone() or ("",))[0]
        db.close()
    finally:
        if os.path.exists(work):
            os.unlink(work)
    new_generation = pointer["generation"] + 1
    history = ([{"generation": new_generation, "snapshot_key": target["snapshot_key"], "sha256": target["sha256"]}]
               + pointer.get("history", []))[:KEEP_GENERATIONS + 1]
    record = {"org_id": org_id, "generation": new_generation, "snapshot_key": target["snapshot_key"],
              "sha256": target["sha256"], "bytes": size, "content_hash": digest,
              "claim_count": claims, "published_at": canonical(now_utc()), "rolled_back_to": generation,
              "watermark": watermark,
              "history": history}
    store.compare_and_swap(pointer_key(org_id), json.dumps(record, indent=1).encode(), etag)
    return {"org_id": org_id, "generation": new_generation, "serving": generation}
