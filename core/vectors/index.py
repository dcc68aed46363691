"""The snapshot's ``vec0`` index: built and kept in line with the claims.

Build (``sync_vectors``, called by the rebuild after the lexical snapshot is
complete): every active or disputed claim has one row in ``claims_vec`` with
integer metadata columns ``subject_key`` (organization and subject),
``project_key`` and ``reader_key`` (who may read it, ``core.scope.reader_tag``), each
``scope_key`` of its text, so the KNN filters inside the index. Integers:
vec0 keeps a text longer than 12 bytes outside the chunk and fetched it for
every row it filtered (30 ms of a 50k scan, against 5 ms unfiltered). A
64-bit collision could only cost a KNN place: the scoped hydrate checks
organization, subject, project and visibility again. Beside it,
``claims_signs`` holds each row's scope keys and sign bits in a plain table
indexed by (subject_key, reader_key), so compile's first pass reads only
the bits of the reader keys its caller holds (``core.vectors.signs``); the
two tables are written, emptied and dropped together. Rows
of claims that left compile scope are deleted. Vectors come from
``embed_cache`` (keyed by the sha256 of the prepared statement and the
fingerprint key) first, so a text is embedded once however many generations
it lives through. A fingerprint change drops the index and re-embeds
everything. Neither table is canonical content (the content hash never reads
them). A failing embedder leaves the lexical snapshot publishable:
``meta.vector_status`` says ``error`` and why.
"""

from __future__ import annotations

import hashlib
import json
import struct

import apsw

from core.domain import COMPILABLE_SQL
from core.meta_table import read_meta, write_meta
from core.scope import reader_tag
from core.vectors.embedder import Embedder, EmbedderError, text_sha256

INDEX_LAYOUT = "5"  # claims_vec's and claims_signs' columns; another layout is dropped and rebuilt (from the cache)
EMBED_BATCH = 512  # texts handed to the embedder at once: progress and the cache are written per batch
# a rowid table: WITHOUT ROWID would store 1.5 KB vectors at three times their size
VEC_TABLES_DDL = """
CREATE TABLE IF NOT EXISTS embed_cache(
  text_sha256 TEXT NOT NULL, fingerprint TEXT NOT NULL, vector BLOB NOT NULL,
  PRIMARY KEY(text_sha256, fingerprint));
"""


SIGNS_DDL = """
CREATE TABLE claims_signs(
  rowid INTEGER PRIMARY KEY, subject_key INTEGER NOT NULL, reader_key INTEGER NOT NULL,
  project_key INTEGER NOT NULL, coarse BLOB NOT NULL);
CREATE INDEX claims_signs_reader ON claims_signs(subject_key, reader_key);
"""


def load_sqlite_vec(db: apsw.Connection) -> None:
    import sqlite_vec

    db.enable_load_extension(True)
    try:
        db.load_extension(sqlite_vec.loadable_path())
    finally:
        db.enable_load_extension(False)


def pack_vector(vector: list[float]) -> bytes:
    return struct.pack(f"{len(vector)}f", *vector)


def unpack_vector(blob: bytes) -> tuple[float, ...]:
    return struct.unpack(f"{len(blob) // 4}f", blob)


def coarse_bits(dimensions: int) -> int:
    """The sign-bit column's width: the dimensions rounded up to whole bytes."""
    return -(-dimensions // 8) * 8


def coarse_input(blob: bytes) -> bytes:
    """A float32 vector padded with zeros to ``coarse_bits`` floats, for
    ``vec_quantize_binary`` (one bit per float: 1 when positive)."""
    dims = len(blob) // 4
    return blob + b"\0" * 4 * (coarse_bits(dims) - dims)


def _has_table(db, name):
    return db.execute("SELECT 1 FROM sqlite_master WHERE name=?", (name,)).fetchone() is not None


def scope_key(text: str) -> int:
    """A text as a signed 64-bit integer (blake2b), for vec0's metadata filters."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


def subject_key(org_id: str, subject_id: str) -> int:
    return scope_key(f"{org_id}\0{subject_id}")


class SyncStats:
    def __init__(self):
        self.embedded = 0       # texts sent to the embedder
        self.cached = 0         # vectors taken from embed_cache
        self.removed = 0
        self.error: str | None = None

    def as_dict(self):
        return dict(self.__dict__)


def sync_vectors(db: apsw.Connection, embedder: Embedder, progress=lambda m: None) -> SyncStats:
    """Bring ``claims_vec`` in line with the claims in compile scope."""
    stats = SyncStats()
    try:
        _sync(db, embedder, progress, stats)
    except Exception as exc:  # the lexical snapshot still publishes; compile says vector "error"
        stats.error = f"{type(exc).__name__}: {exc}"[:300]
        with db:
            write_meta(db, vector_status="error", vector_error=stats.error)
        return stats
    with db:
        write_meta(db, vector_status="ok", vector_error="")
    return stats


def _sync(db: apsw.Connection, embedder: Embedder, progress, stats: SyncStats) -> None:
    fp = embedder.fingerprint
    key = fp.key()
    load_sqlite_vec(db)
    with db:
        db.execute(VEC_TABLES_DDL)
        if (read_meta(db, "vector_fingerprint") != key or read_meta(db, "vector_layout") != INDEX_LAYOUT
                or not _has_table(db, "claims_vec") or not _has_table(db, "claims_signs")):
            if _has_table(db, "claims_vec"):
                db.execute("DROP TABLE claims_vec")
            db.execute("DROP TABLE IF EXISTS claims_signs")
            db.execute(SIGNS_DDL)
            # metadata columns only, no partition key: a partition preallocates
            # whole chunks (1024 vectors), so one per subject would bloat the file.
            # ``coarse`` is the embedding's sign bits: compile's first pass
            # (core.vectors.search) scans those, 32x fewer bytes than the floats
            db.execute(f"CREATE VIRTUAL TABLE claims_vec USING vec0(subject_key integer, project_key integer,"
                       f" reader_key integer, embedding float[{fp.dimensions}] distance_metric=cosine,"
                       f" coarse bit[{coarse_bits(fp.dimensions)}])")
            db.execute("DELETE FROM embed_cache WHERE fingerprint != ?", (key,))
            write_meta(db, vector_fingerprint=key, vector_layout=INDEX_LAYOUT, vector_status="building")
        # the calibration applies at query time: recorded on every build, re-embeds nothing
        write_meta(db, vector_calibration=fp.calibration_id(),
                   vector_fingerprint_json=json.dumps(fp.as_dict(), sort_keys=True))
    want = {row[0]: row[1:] for row in db.execute(
        "SELECT rowid, org_id, subject_id, project_id, visibility, workspace_id, owner_id, statement FROM claims"
        f" WHERE status IN {COMPILABLE_SQL}")}
    have = {r[0] for r in db.execute("SELECT rowid FROM claims_vec")}
    gone = sorted(have - want.keys())
    if gone:
        with db:
            db.executemany("DELETE FROM claims_vec WHERE rowid=?", [(r,) for r in gone])
            db.executemany("DELETE FROM claims_signs WHERE rowid=?", [(r,) for r in gone])
        stats.removed = len(gone)
    missing = sorted(want.keys() - have)
    if missing:
        progress(f"vectors: indexing {len(missing)} claims")
    for start in range(0, len(missing), EMBED_BATCH):
        batch = missing[start:start + EMBED_BATCH]
        shas = {r: text_sha256(want[r][-1]) for r in batch}
        distinct = sorted(set(shas.values()))
        found = dict(db.execute(
            f"SELECT text_sha256, vector FROM embed_cache WHERE fingerprint=? AND text_sha256 IN"
            f" ({','.join('?' * len(distinct))})", [key, *distinct]))
        todo = sorted({shas[r] for r in batch if shas[r] not in found})
        texts = {}
        for r in batch:
            texts.setdefault(shas[r], want[r][-1])
        if todo:
            vectors = embedder.embed([texts[s] for s in todo])
            if len(vectors) != len(todo) or any(len(v) != fp.dimensions for v in vectors):
                raise EmbedderError("the embedder returned vectors of the wrong number or dimension")
            stats.embedded += len(todo)
            with db:
                for s, v in zip(todo, vectors):
                    blob = pack_vector(v)
                    found[s] = blob
                    db.execute("INSERT OR REPLACE INTO embed_cache VALUES(?, ?, ?)", (s, key, blob))
        stats.cached += len(batch) - len(todo)
        with db:
            for r in batch:
                org, subject, project, visibility, workspace, owner, _ = want[r]
                blob = found[shas[r]]
                keys = (r, subject_key(org, subject), scope_key(project or ""),
                        scope_key(reader_tag(visibility, workspace, owner)))
                db.execute("INSERT INTO claims_vec(rowid, subject_key, project_key, reader_key, embedding, coarse)"
                           " VALUES(?, ?, ?, ?, ?, vec_quantize_binary(?))", (*keys, blob, coarse_input(blob)))
                db.execute("INSERT INTO claims_signs(rowid, subject_key, project_key, reader_key, coarse)"
                           " VALUES(?, ?, ?, ?, vec_quantize_binary(?))", (*keys, coarse_input(blob)))


def seed_embed_cache(db: apsw.Connection, store, snapshot_key: str, work_dir: str, prefix: str, base: int,
                     progress=lambda m: None) -> int:
    """Copy the embedding cache of a published generation into a snapshot
    being replayed from empty, so a replay re-embeds nothing it already had.
    Only the vectors of statements the replay holds are copied: a vector
    whose claims an erasure took (or that no claim says any more) must not
    come back through the previous generation. Best effort: any failure
    just means more texts to embed."""
    from core.snapshot.workfiles import WorkFile

    # ``prefix`` names the organization (``seed-<org>-``): an erasure waits
    # for its own organization's running builds only (core/snapshot/workfiles.py)
    held = WorkFile(work_dir, prefix, base=base)
    path = held.path
    try:
        store.download_file(snapshot_key, path)
        with db:
            db.execute(VEC_TABLES_DDL)
            db.execute("ATTACH DATABASE ? AS seed", (path,))
        try:
            if db.execute("SELECT 1 FROM seed.sqlite_master WHERE name='embed_cache'").fetchone() is None:
                return 0
            with db:
                db.execute("CREATE TEMP TABLE seed_wanted(text_sha256 TEXT PRIMARY KEY) WITHOUT ROWID")
                db.executemany("INSERT OR IGNORE INTO temp.seed_wanted VALUES(?)",
                               ((text_sha256(statement),) for statement, in
                                db.execute("SELECT DISTINCT statement FROM main.claims").fetchall()))
                db.execute("INSERT OR IGNORE INTO main.embed_cache SELECT text_sha256, fingerprint, vector"
                           " FROM seed.embed_cache WHERE text_sha256 IN (SELECT text_sha256 FROM temp.seed_wanted)")
                db.execute("DROP TABLE temp.seed_wanted")
            copied = db.execute("SELECT count(*) FROM main.embed_cache").fetchone()[0]
            progress(f"vectors: {copied} cached embeddings carried into the replay")
            return copied
        finally:
            db.execute("DETACH DATABASE seed")
    except Exception as exc:
        progress(f"vectors: the previous embedding cache could not be reused ({type(exc).__name__})")
        return 0
    finally:
        held.release()
