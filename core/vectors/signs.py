"""The first KNN pass: sign bits of the claim vectors a caller may read, held per generation.

sqlite-vec's PyPI build scans without SIMD and keeps its top k at a cost
that grows with k: on 50k claims the float KNN (k 10) took 28–55 ms and a
bit KNN wide enough to re-score (k 500) 64 ms. The bits themselves are
small (48 bytes a claim for 384 dimensions), so a generation reads them
once and compares them with the task's in numpy: XOR, popcount, a partial
sort — a few milliseconds at 50k.

**Read by reader, never by subject alone.** The bits live beside the vec0
index in a plain table, ``claims_signs``, indexed by (subject, reader key)
(``core.vectors.index``). A *group* is one subject's claims of one reader
key (``org``, a workspace, one principal's private claims): its rowids,
project keys, validity windows, bits and the embedding cache's rowid of
each claim's vector (so the exact pass reads each by rowid: one B-tree
descent, in rowid order). A compile loads only the groups of the reader
keys its caller holds, once per generation and server process. So a claim
the caller may not read costs that caller nothing, not even time: the
first semantic compile of a subject used to read every claim of it from
the vec0 table, and 20,000 private claims of another principal made it
about 100 ms slower (docs/api.md §9.3: what the caller may not read costs it
no work, so not even time).

Held like ``core.compile.catalog``: per ``Snapshot`` object, weakly, so a
retired generation's bits go with it; the groups are disjoint, so what is
held is bounded by the snapshot's own claim count. Within a group the
project and the validity window at the compile's ``at`` are masks, so what
is not valid at ``at`` never takes a place in the shortlist either: a
hundred near claims valid only next year must not push the one valid claim
out of the ``knn`` nearest. (Status needs no mask: only claims compile may
read are indexed.)
"""

from __future__ import annotations

import threading
import weakref

import apsw
import numpy as np

from core.vectors.embedder import text_digest

# instants held as microseconds (int64): compared on every compile, where
# fixed-width text took 0.4 ms at 50k claims and integers 0.02 ms
OPEN_END = np.iinfo(np.int64).max


def microseconds(instants: list, missing: int = OPEN_END) -> np.ndarray:
    """Canonical instants ("2026-12-07T12:18:31.337000Z") as microseconds
    since the epoch; ``missing`` where there is none (an open end)."""
    out = np.full(len(instants), missing, dtype=np.int64)
    present = [i for i, v in enumerate(instants) if v is not None]
    if present:
        out[present] = np.array([instants[i].rstrip("Z") for i in present], dtype="datetime64[us]").view(np.int64)
    return out


class ReaderSigns:
    """One subject's claims of one reader key on one generation."""

    def __init__(self, rows: list[tuple], cached: list[int]):
        """``rows``: (rowid, project_key, coarse, valid_from, valid_to) in
        rowid order; ``cached``: the embedding cache's rowid of each row's
        vector, in the same order (-1 when the cache has none)."""
        self.rowids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        self.cached = np.array(cached, dtype=np.int64)
        self.project_keys = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        self.valid_from = microseconds([r[3] for r in rows])
        self.valid_to = microseconds([r[4] for r in rows])
        width = len(rows[0][2]) if rows else 8
        # compared 8 bytes at a time when the width allows (384 bits: 6 words)
        self.word = np.uint64 if width % 8 == 0 else np.uint8
        words = width // np.dtype(self.word).itemsize
        self.codes = np.frombuffer(b"".join(r[2] for r in rows), dtype=self.word).reshape(len(rows), words)

    def distances(self, code: bytes, project_key: int | None, at: int) -> tuple[np.ndarray, np.ndarray]:
        """(row indexes, Hamming distances) of the rows in the project (when
        given) and valid at ``at`` (microseconds)."""
        allowed = (self.valid_from <= at) & (self.valid_to > at)
        if project_key is not None:
            allowed &= self.project_keys == project_key
        query = np.frombuffer(code, dtype=self.word)
        if allowed.all():  # the usual case: no copy of the codes
            return np.arange(len(self.rowids)), np.bitwise_count(self.codes ^ query).sum(axis=1, dtype=np.int32)
        index = np.flatnonzero(allowed)
        return index, np.bitwise_count(self.codes[index] ^ query).sum(axis=1, dtype=np.int32)


def shortlist(groups: list[ReaderSigns], code: bytes, size: int, project_key: int | None,
              at: str) -> list[tuple[int, int]]:
    """(rowid, embedding cache rowid or -1) of the ``size`` claims of
    ``groups`` nearest by Hamming distance, in the project (when given) and
    valid at ``at`` (a canonical instant); ties by rowid."""
    when = int(microseconds([at])[0])
    rowids, cached, distance = [], [], []
    for group in groups:
        if len(group.rowids) == 0:
            continue
        index, d = group.distances(code, project_key, when)
        if index.size > size:  # no more than ``size`` of one group can be among the nearest
            keep = np.argpartition(d, size - 1)[:size]
            index, d = index[keep], d[keep]
        rowids.append(group.rowids[index])
        cached.append(group.cached[index])
        distance.append(d)
    if not rowids:
        return []
    rowids, cached, distance = np.concatenate(rowids), np.concatenate(cached), np.concatenate(distance)
    if rowids.size > size:
        keep = np.argpartition(distance, size - 1)[:size]
        rowids, cached, distance = rowids[keep], cached[keep], distance[keep]
    chosen = np.lexsort((rowids, distance))
    return list(zip(rowids[chosen].tolist(), cached[chosen].tolist()))


class SignCache:
    """``ReaderSigns`` per snapshot generation, subject key and reader key, read on first use."""

    def __init__(self):
        self._by_snapshot: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def readable(self, snapshot, db, subject_key: int, reader_keys: list[int],
                 fingerprint_key: str) -> list[ReaderSigns]:
        """The groups of ``subject_key`` that ``reader_keys`` may read."""
        groups = []
        for reader_key in reader_keys:
            with self._lock:
                held = self._by_snapshot.setdefault(snapshot, {})
                group = held.get((subject_key, reader_key))
            if group is None:  # two readers may both read it: the same rows, either wins
                group = self._read(db, subject_key, reader_key, fingerprint_key)
                with self._lock:
                    held[(subject_key, reader_key)] = group
            groups.append(group)
        return groups

    @staticmethod
    def _read(db, subject_key: int, reader_key: int, fingerprint_key: str) -> ReaderSigns:
        # the index's (subject_key, reader_key) range, joined to its claims by rowid:
        # no row of another reader key is read
        rows = db.execute("SELECT s.rowid, s.project_key, s.coarse, c.valid_from, c.valid_to, c.statement"
                          " FROM claims_signs AS s JOIN claims AS c ON c.rowid = s.rowid"
                          " WHERE s.subject_key = ? AND s.reader_key = ? ORDER BY s.rowid",
                          (subject_key, reader_key)).fetchall()
        hexes = [text_digest(r[5]).hex() for r in rows]
        where = dict(db.execute("SELECT text_sha256, rowid FROM embed_cache WHERE fingerprint = ?"
                                " AND text_sha256 IN carray(?)", (fingerprint_key, apsw.carray(tuple(set(hexes))))
                                )) if rows else {}
        return ReaderSigns(rows, [where.get(h, -1) for h in hexes])

