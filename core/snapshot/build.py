"""Building one organization's next generation: previous file + new ledger entries.

previous snapshot + ledger entries after its watermark → a new SQLite file
→ published (``core.snapshot.publish``) under a new generation: as the
pages it changed (a delta, ``core.snapshot.delta``: the work file runs in
WAL mode from the previous generation, and the WAL's frames name those
pages, ``core.snapshot.wal``) or whole, as ``core.snapshot.delta_policy``
decides. The rules this module enforces:

- **No lost writes under clock skew.** Listing restarts ``skew_seconds``
  behind the watermark, and entries already applied inside that window are
  skipped (the ``applied`` table), so an entry from a lagging clock is
  applied late but applied, and applying the same ledger twice changes
  nothing.
- **Order-independent folding** (``core.snapshot.apply``): an incremental
  build and a from-scratch replay (``from_scratch=True``) reach the same
  canonical content; both report its hash (``core.snapshot.content_hash``).
- **Never built on what cannot be trusted.** A previous generation that is
  missing, fails its sha256, has another schema or counted item tokens with
  another tokenizer is not extended: the ledger is replayed, and ``notes``
  say why.
- **Nothing new, nothing published**: a build that applied no entry keeps
  the published generation (unless its vector index is not this embedder's).
- **Erasures are carried out whole** (core/erasure/work.py,
  core/snapshot/erase.py): a build that meets an ``erasure`` entry first
  purges the ledger (with the previous generation open, which says where
  the records are), then deletes the rows with ``secure_delete`` on, merges
  the FTS index, rebuilds the vector index from its cache, rewrites the file
  whole (``VACUUM``), publishes it as the only generation kept — every older
  one, with every stored version, is purged, so no rollback can bring the
  records back — and only then marks the erasures complete.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

import apsw

from core.errors import Unavailable
from core.lexical.words import WORDS_ID
from core.ids import uuid7_floor_hex, uuid7_ms
from core.instants import canonical, now_utc, parse_instant
from core.layout import RUN_SUFFIX, entry_hex_of, ledger_prefix
from core.ledger import MOVED, DamagedEntry, Ledger
from core.lexical import LexicalChanges, update_lexical_index
from core.meta_table import read_meta, write_meta
from core.erasure.work import ErasureWork
from core.snapshot import content_hash, delta, erase, housekeeping, wal, workfiles
from core.snapshot.apply import MalformedEntry, apply_entry
from core.snapshot.erase import Erasures
from core.snapshot.keep import KeptGeneration
from core.snapshot.pointer import read_pointer
from core.snapshot.projections import refresh_projections
from core.snapshot.chain import ChainBroken, fetch_whole
from core.snapshot.delta_policy import DeltaPolicy
from core.snapshot.pointer import full_of
from core.snapshot.publish import publish, publish_delta
from core.snapshot.schema import DDL, ITEM_COUNTS, LATER_INDEXES, SCHEMA_VERSION
from core.snapshot.workfiles import WorkFile
from core.storage import Store

DEFAULT_SKEW_SECONDS = 600
DEFAULT_KEEP_BYTES = 1 << 30


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
    # when the oldest ledger entry this build applied was stored (UUIDv7 ms;
    # None: none applied): the rebuild's freshness lag is publish − this
    oldest_applied_ms: int | None = None
    # what was uploaded: the whole file, or (a delta generation) the delta
    published_bytes: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _pragmas(db: apsw.Connection, *pragmas: str) -> None:
    """Run each pragma to completion (one ``execute`` of several stops at the
    first that returns a row, until that row is read)."""
    for pragma in pragmas:
        db.execute(f"PRAGMA {pragma}").fetchall()


def file_meta(path: str, key: str) -> str | None:
    """One value of a snapshot file's meta table (None if absent or unreadable)."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return read_meta(db, key)
    finally:
        db.close()


class SnapshotBuilder:
    def __init__(self, store: Store, org_id: str, *, work_dir: str | None = None,
                 skew_seconds: int = DEFAULT_SKEW_SECONDS,
                 progress: Callable[[str], None] | None = None,
                 before_publish: Callable[[], None] | None = None,
                 embedder=None, keep_bytes: int | None = None, delta_policy: DeltaPolicy | None = None,
                 after_publish: Callable[[], None] | None = None, readers_ttl: float = 0.0,
                 reader_cache_dir: str | None = None):
        self.store = store
        # called the moment a generation is published, before an erasure it
        # carried out is marked complete (``titen serve`` rings its servers'
        # bell here); the bell reaches only this process's servers, and other
        # readers learn of a generation at their next pointer check, so an
        # erasure is marked complete no sooner than ``readers_ttl`` seconds
        # after the publish either way: by then every reader that answers a
        # request has checked (docs/architecture.md §9)
        self.after_publish = after_publish
        self.readers_ttl = readers_ttl
        self.reader_cache_dir = reader_cache_dir  # where dead servers' generations may lie (workfiles)
        self.embedder = embedder  # None: no vector index (and nothing vector-related imported)
        self.vector_stats = None  # core.vectors.index.SyncStats of the last build, when vectors are on
        self.org_id = org_id
        self.ledger = Ledger(store)
        self.work_dir = work_dir or os.path.join(tempfile.gettempdir(), "titen-build")
        self.skew_ms = int(skew_seconds * 1000)
        self.progress = progress or (lambda message: None)
        self.before_publish = before_publish  # a test seam: a crash just before the swap
        # the published file stays in work_dir for the next build (0: never)
        self.kept = KeptGeneration(self.work_dir, org_id, DEFAULT_KEEP_BYTES if keep_bytes is None else keep_bytes,
                                   self.progress)
        self.lexical_stats: dict | None = None  # what the last build did to the candidate index
        self.housekeeping: dict | None = None  # what the last build's sweep removed (core/snapshot/housekeeping.py)
        self.look_for_stranded = False  # this build also looks for stranded erasures (ErasureWork.stranded)
        self.notes: list[str] = []  # why the last build did not start from the published generation
        self.erasure_work = ErasureWork(store, org_id, self.skew_ms, self.progress)
        self.erasures: Erasures | None = None  # the erasures the last build applied and enforced
        self.oldest_applied_ms: int | None = None  # the last build's oldest applied entry (RebuildResult)
        # when a generation is published as a delta, and when whole (core/snapshot/delta_policy.py)
        self.delta_policy = delta_policy or DeltaPolicy.from_env()
        self.base = None  # the page digests of the generation the work file started as (None: no delta)
        self.delta_stats: dict | None = None  # the last build's delta: pages, bytes, published or not

    def rebuild(self, *, from_scratch: bool = False, force: bool = False) -> RebuildResult:
        started = time.monotonic()
        # on the sweep's cadence, also look for erasures whose request stopped short
        self.look_for_stranded = housekeeping.due(self.store, self.org_id)
        if self.look_for_stranded:
            self.housekeeping = housekeeping.sweep(self.store, self.org_id)
            if any(self.housekeeping.values()):
                self.progress(f"{self.org_id}: housekeeping removed "
                              + ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in self.housekeeping.items()))
        self.notes = []
        self.oldest_applied_ms = None
        self.unfinished = {}  # erasures the published generation carried out that stay pending
        self.carried_now = False  # this build carried a pending erasure out
        self.erased_rows = False  # ... which found something to erase
        pointer, etag = read_pointer(self.store, self.org_id)
        os.makedirs(self.work_dir, exist_ok=True)
        if pointer is not None and pointer.get("erasures"):
            # a build that published an erasure and stopped before marking it
            # complete; this one finishes it — or, when a copy of what it
            # erased may still be on this machine, leaves it pending for a
            # later build and goes on with its own work
            try:
                self.erasure_work.recover(pointer, before_complete=lambda: self._before_complete(
                    pointer["generation"], published_at=pointer.get("published_at")))
            except (OSError, Unavailable) as exc:
                # a generation this build publishes names them again, so the
                # next build still knows to finish them
                self.unfinished = {erasure_id: erased for erasure_id, erased in pointer["erasures"].items()
                                   if self.erasure_work.carries(erasure_id)}
                self.notes.append(f"an erasure published in generation {pointer['generation']} stays pending: "
                                  f"{exc}")
                self.progress(f"{self.org_id}: {self.notes[-1]}")
        try:
            self._sweep_work_files()
        except OSError as exc:  # never fails a build; an erasure's is checked again (strictly) before complete
            self.progress(f"{self.org_id}: work files of earlier builds not removed: {exc}")
        held = WorkFile(self.work_dir, f"build-{self.org_id}-", base=pointer["generation"] if pointer else 0)
        work = held.path
        self.base = None
        self.delta_stats = None
        try:
            db = self._open_work(work, None if from_scratch else pointer)
            written: set[int] = set()
            try:
                built = self._build(db, pointer, from_scratch, force)
                untouched = db.total_changes() == 0
                if self.base is not None:  # every page the build changed is a frame of the WAL
                    written, _ = wal.written_pages(work + "-wal")
                    _pragmas(db, "wal_checkpoint(TRUNCATE)", "journal_mode=DELETE")
            finally:
                db.close()
            size = os.path.getsize(work)
            if built is None:  # nothing new: the published generation stands
                if untouched and self.base is not None and not written:
                    # still the published file but for the header page, which
                    # entering and leaving WAL mode rewrote: put it back, keep it
                    with open(work, "r+b") as f:
                        f.write(self._base_page1)
                    _, digests = delta.encode(work, {1}, size // self.base.page_size, self.base,
                                              generation=pointer["generation"], base_generation=pointer["generation"])
                    if digests.digest() == pointer.get("digest"):
                        self.kept.keep(work, pointer["generation"], digests, size)
                return RebuildResult(self.org_id, pointer["generation"], False, 0, pointer["content_hash"],
                                     pointer["claim_count"], pointer["bytes"], time.monotonic() - started,
                                     pointer.get("snapshot_key"), tuple(self.notes))
            generation, applied, fields = built
            erased = fields.get("erasures")
            published = None
            if self.base is not None and not erased and pointer.get("digest") == self.base.digest():
                raw, digests = delta.encode(work, written | {1}, size // self.base.page_size, self.base,
                                            generation=generation, base_generation=pointer["generation"])
                why_whole = self.delta_policy.whole_file_because(pointer, len(raw), size)
                self.delta_stats = {"pages": len(written | {1}), "bytes": len(raw), "published": not why_whole}
                if why_whole:
                    self.progress(f"{self.org_id}: generation {generation} published whole: {why_whole}")
                else:
                    published = publish_delta(self.store, self.org_id, raw, digests, size, generation, pointer,
                                              etag, fields, self.progress, self.before_publish)
            if published is None:
                published = publish(self.store, self.org_id, work, size, generation, pointer, etag, fields,
                                    self.progress, self.before_publish,
                                    only_generation=self.carried_now and self.erased_rows)
            published_at = time.monotonic()
            if self.after_publish is not None:
                self.after_publish()
            self.kept.keep(work, generation, published.digests, size)
            # (erasures only named again, ``unfinished``, wait for a later
            # build: this one already waited for the running build in vain)
            if self.carried_now and self.erasure_work.completes(erased):
                # no work file of a killed or a running build keeps what was
                # just erased: a failure here fails the build, and a later
                # build completes it (``recover``)
                self._before_complete(generation, own=held, since=published_at)
                self.erasure_work.complete(erased)
            return RebuildResult(self.org_id, generation, True, applied, fields["content_hash"],
                                 fields["claim_count"], size, time.monotonic() - started, published.key,
                                 tuple(self.notes), oldest_applied_ms=self.oldest_applied_ms,
                                 published_bytes=published.uploaded_bytes)
        finally:
            held.release()

    def _sweep_work_files(self) -> None:
        removed = workfiles.sweep(self.work_dir)
        if removed:
            self.progress(f"{self.org_id}: removed {removed} work files left by a build that did not finish")

    def _before_complete(self, generation: int, own: WorkFile | None = None, since: float | None = None,
                         published_at: str | None = None) -> None:
        """Before an erasure carried out by ``generation`` is marked complete:
        no work file of a dead or running build and no dead server's cache
        holds a generation from before it (core/snapshot/workfiles.py), and
        every reader has had its chance to see it (``readers_ttl``), counted
        from ``since`` (this process's clock) or ``published_at`` (the
        pointer's, for a generation an earlier build published)."""
        removed = workfiles.drain(self.work_dir, self.org_id, generation, own=own, progress=self.progress)
        if removed:
            self.progress(f"{self.org_id}: removed {removed} work files left by a build that did not finish")
        if self.after_publish is not None and since is None:
            self.after_publish()  # a generation another process published: no bell rang for it
        if self.readers_ttl > 0:
            if since is not None:
                left = self.readers_ttl - (time.monotonic() - since)
            else:
                # another machine's clock: never more than one TTL, whatever it says
                age = (now_utc() - parse_instant(published_at)).total_seconds() if published_at else 0.0
                left = min(self.readers_ttl, self.readers_ttl - age)
            if left > 0:
                self.progress(f"{self.org_id}: waiting {left:.1f} s for readers to load generation {generation} "
                              "before the erasure is marked complete")
                time.sleep(left)
        # after the wait: a server that died during it is swept too
        if self.reader_cache_dir is not None:
            gone, stuck = workfiles.remove_dead_server_dirs(self.reader_cache_dir)
            if gone:
                self.progress(f"{self.org_id}: removed the snapshot caches of {gone} servers that are gone")
            if stuck:
                raise Unavailable(f"{self.org_id}: the snapshot cache of a server that is gone could not be "
                                  f"removed ({', '.join(stuck)}), so the erasure stays pending; the next "
                                  "rebuild completes it")

    def _build(self, db: apsw.Connection, pointer: dict | None, from_scratch: bool,
               force: bool) -> tuple[int, int, dict] | None:
        """Apply what is new and finish the file: (generation, entries
        applied, the pointer fields of what it holds), or None when there is
        nothing to publish."""
        # an incremental build keeps the content sums and the candidate
        # index current as it goes; a build from empty computes both once
        # at the end
        sums = content_hash.decode(read_meta(db, content_hash.META_KEY))
        row_digests = content_hash.RowDigests(db, sums) if sums is not None else None
        lexical = LexicalChanges(record=self._has_lexical_index(db))
        # recorded in the pointer: every entry stored before this instant is
        # in the generation (core/rebuild/queue.py, core/rebuild/backlog.py)
        listed_at = canonical(now_utc())
        applied = self._apply_new_entries(db, lexical, from_empty=from_scratch or pointer is None)
        if row_digests is not None:
            row_digests.close()
            sums = row_digests.sums
        if self.erasures.applied:
            # no FTS segment keeps a deleted claim's terms, no vec0 chunk its vector
            erase.clear_indexes(db)
        # (a pointer from before watermarks were published is republished once)
        if (pointer is not None and applied == 0 and not from_scratch and not force
                and self._vectors_current(pointer) and "watermark" in pointer):
            return None
        generation = (pointer["generation"] if pointer else 0) + 1
        with db:
            # a generation built before one of them gains it, in the first
            # generation built from it (not before: a build that publishes
            # nothing must leave its kept copy as published)
            db.execute(LATER_INDEXES)
        self.progress(f"{self.org_id}: updating the candidate index")
        with db:
            # after the last change to claims_fts
            self.lexical_stats = update_lexical_index(db, lexical, self.progress)
        if sums is None:
            self.progress(f"{self.org_id}: hashing content")
            sums = content_hash.scan(db)
        digest = content_hash.digest(sums)
        claim_count = db.execute("SELECT count(*) FROM claims").fetchone()[0]
        fields = {"content_hash": digest, "claim_count": claim_count}
        if self.embedder is not None:
            # outside the content hash: derived, and a failure here still
            # publishes the lexical snapshot (meta says why)
            from core.vectors.index import seed_embed_cache, sync_vectors
            if pointer is not None and read_meta(db, "vector_fingerprint") is None:
                # a replay from empty: reuse the previous generation's embeddings
                seed_embed_cache(db, self.store, full_of(pointer)["snapshot_key"], self.work_dir,
                                 f"seed-{self.org_id}-", pointer["generation"], self.progress)
            self.vector_stats = sync_vectors(db, self.embedder, self.progress)
            fields["vector"] = self._vector_record("error" if self.vector_stats.error else "ok")
        elif read_meta(db, "vector_status") is not None:
            # an index carried over from a build with an embedder misses this
            # build's claims: no reader may trust it as complete
            write_meta(db, vector_status="stale", vector_error="built without an embedder")
        write_meta(db, generation=generation, content_hash=digest, built_at=canonical(now_utc()),
                   claim_count=claim_count, **{content_hash.META_KEY: content_hash.encode(sums)})
        db.execute("PRAGMA optimize")
        if self.erasures.applied:
            self.progress(f"{self.org_id}: rewriting the file whole after erasures")
            db.execute("VACUUM")  # no free page keeps a deleted row
            # only the erasures this build carries out: a replay from empty
            # applies every completed one again, and the generations published
            # since hold nothing those erased, so they stay (publish deletes
            # every other generation of a build that records erasures)
            # each record once, whichever erasure's deletion counted it
            deleted = set().union(*(erased.counted for erased in self.erasures.applied.values()))
            for erasure_id, erased in self.erasures.applied.items():
                if self.erasure_work.carries(erasure_id):
                    erased.count_taken(self.erasure_work.taken_records(erasure_id), deleted)
            carried = {erasure_id: {**erased.as_counts(), "purged": self.erasure_work.taken(erasure_id)}
                       for erasure_id, erased in self.erasures.applied.items()
                       if self.erasure_work.carries(erasure_id) and erasure_id not in self.unfinished}
            if carried:
                fields["erasures"] = carried
                self.carried_now = True
                # One that found nothing, in the snapshot or the ledger, in this
                # attempt or an earlier one (a subject with no records), leaves
                # the older generations, the rollback points, as they are: none
                # holds anything it names, since a record leaves a snapshot
                # only by an erasure, which purged them, and one not yet in
                # the snapshot would be in the ledger.
                self.erased_rows = any(
                    self.erasure_work.found_anything(e)
                    or sum(self.erasures.applied[e].as_counts()[k] for k in ("observations", "claims", "feedback",
                                                                             "embeddings"))
                    for e in carried)
        if self.unfinished:
            # still pending from the generation before: named again with what
            # that generation recorded, so a later build finishes them
            fields["erasures"] = {**self.unfinished, **fields.get("erasures", {})}
        # the last ledger entry applied, and when the ledger was listed:
        # enough to tell, without the snapshot, whether anything is new
        fields.update(watermark=read_meta(db, "watermark") or "", ledger_listed_at=listed_at)
        return generation, applied, fields

    # -- the starting point ----------------------------------------------------

    def _open_work(self, work: str, pointer: dict | None) -> apsw.Connection:
        """The work file: the published generation (kept locally, or fetched
        whole and brought forward by its deltas), or an empty one. When it
        starts as a published generation, ``self.base`` holds that
        generation's page digests and the file runs in WAL mode, so the
        pages the build changes can be published as a delta."""
        base = None
        if pointer is not None:
            base = self.kept.take(work, pointer)
            if base is not None:
                self.progress(f"{self.org_id}: starting from generation {pointer['generation']}, kept locally")
            else:
                try:
                    base = fetch_whole(self.store, pointer, work)
                except ChainBroken as exc:
                    # A missing or damaged previous generation is never built upon: replay.
                    self._replay_because(f"previous generation {pointer['generation']} {exc}")
                    pointer = None
                    if os.path.exists(work):
                        os.unlink(work)
        if pointer is not None and file_meta(work, "schema_version") != str(SCHEMA_VERSION):
            # Built by another version of the schema: its tables cannot
            # be extended in place, but the ledger can always be replayed.
            self._replay_because(f"previous generation {pointer['generation']} has another schema")
            os.unlink(work)
            pointer = None
        if pointer is not None and file_meta(work, "item_tokenizer") != ITEM_COUNTS:
            # Its stored item counts were made with another tokenizer, or
            # count other items: every claim is priced again, from the ledger.
            self._replay_because(f"previous generation {pointer['generation']} counted tokens with "
                                 "another tokenizer or of other items")
            os.unlink(work)
            pointer = None
        if pointer is not None and file_meta(work, "index_words") != WORDS_ID:
            # Its claims_fts holds words made by other rules or another
            # stemmer: an incremental edit would tokenize other words than
            # it holds (and leave erased ones behind), so replay.
            self._replay_because(f"previous generation {pointer['generation']} indexed words with other rules")
            os.unlink(work)
            pointer = None
        if pointer is not None:  # as published: entering WAL mode rewrites the header page
            with open(work, "rb") as f:
                self._base_page1 = f.read(base.page_size)
        db = apsw.Connection(work)
        if pointer is None:
            _pragmas(db, "journal_mode=OFF", "synchronous=OFF", "cache_size=-65536")
            with db:
                db.execute(DDL)
                write_meta(db, org_id=self.org_id, schema_version=SCHEMA_VERSION, watermark="",
                           item_tokenizer=ITEM_COUNTS, index_words=WORDS_ID)
        else:
            # the base file stays as published until the checkpoint: every
            # change is a WAL frame (core/snapshot/wal.py); the WAL index in
            # this process's memory, no -shm file
            _pragmas(db, "locking_mode=EXCLUSIVE", "journal_mode=WAL", "wal_autocheckpoint=0", "synchronous=OFF",
                     "cache_size=-65536")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                raise RuntimeError("the work file did not enter WAL mode: its changed pages cannot be captured")
            self.base = base
        return db

    def _replay_because(self, why: str) -> None:
        note = f"{why}: built from the ledger"
        self.notes.append(note)
        self.progress(f"{self.org_id}: {note}")

    @staticmethod
    def _has_lexical_index(db: apsw.Connection) -> bool:
        return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'lex_stats'").fetchone() is not None

    # -- the new entries --------------------------------------------------------

    def _apply_new_entries(self, db: apsw.Connection, lexical: LexicalChanges, from_empty: bool) -> int:
        watermark = read_meta(db, "watermark") or ""
        start_after = None
        if watermark:
            floor = uuid7_floor_hex(uuid7_ms(watermark) - self.skew_ms)
            start_after = ledger_prefix(self.org_id) + floor
        # the entries of the window applied already, read in one query (a
        # lookup per listed key cost a bulk load a query per entry per build)
        applied_before = {k for k, in db.execute("SELECT entry_key FROM applied WHERE entry_key > ?",
                                                  (start_after or "",))}
        keys = [k for k in self.ledger.keys_after(self.org_id, start_after)
                if not k.endswith(RUN_SUFFIX) and k not in applied_before]
        if self.look_for_stranded:
            keys = sorted(keys + self.erasure_work.stranded(db, keys))
        self.erasures = Erasures(db, self.org_id)
        if not keys:
            return 0
        self.progress(f"{self.org_id}: applying {len(keys)} ledger entries")
        with ThreadPoolExecutor(max_workers=8) as pool:
            entries = list(pool.map(self.ledger.read_raw, keys))
        if any(entry.get("type") == "erasure" for entry in entries) and self.erasure_work.pending():
            # the previous generation (not yet changed) says where the records are
            self.erasure_work.purge(None if from_empty else db)
            self.erasures.requesters = self.erasure_work.requesters()
            self.erasures.runs = self.erasure_work.runs()
            db.execute("PRAGMA secure_delete = ON")  # deleted rows are overwritten, not just unlinked
        touched: set[str] = set()
        applied = 0
        last_report = time.monotonic()
        with db:
            for key, entry in zip(keys, entries):
                try:
                    apply_entry(db, entry, touched, self.erasures, lexical)
                except MalformedEntry as exc:  # the transaction rolls back: nothing of this build lands
                    raise DamagedEntry(f"ledger entry {key} is damaged ({exc}): restore it, e.g. from the bucket's "
                                       "previous version of the object, and run the rebuild again") from None
                db.execute("INSERT INTO applied(entry_key) VALUES(?)", (key,))
                applied += 1
                if self.oldest_applied_ms is None and entry.get("type") != MOVED:
                    # keys are listed oldest first; a moved stub's id is when its
                    # write began, not when the ledger accepted it
                    self.oldest_applied_ms = uuid7_ms(entry_hex_of(key))
                if time.monotonic() - last_report > 2:
                    last_report = time.monotonic()
                    self.progress(f"{self.org_id}: applied {applied}/{len(keys)} entries")
            self.progress(f"{self.org_id}: refreshing projections of {len(touched)} claims")
            refresh_projections(db, touched, lexical)
            new_watermark = max(watermark, max(entry_hex_of(k) for k in keys))
            prune_before = ledger_prefix(self.org_id) + uuid7_floor_hex(uuid7_ms(new_watermark) - self.skew_ms)
            db.execute("DELETE FROM applied WHERE entry_key < ?", (prune_before,))
            write_meta(db, watermark=new_watermark)
        return applied

    # -- the vector index ---------------------------------------------------------

    def _vectors_current(self, pointer: dict) -> bool:
        """Whether the published generation already has this embedder's
        complete vector index (else a rebuild with no new entries still runs)."""
        if self.embedder is None:
            return True
        return pointer.get("vector") == self._vector_record("ok")

    def _vector_record(self, status: str) -> dict:
        from core.vectors.index import INDEX_LAYOUT
        fingerprint = self.embedder.fingerprint
        return {"fingerprint": fingerprint.key(), "calibration": fingerprint.calibration_id(), "layout": INDEX_LAYOUT,
                "status": status}
