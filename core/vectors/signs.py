"""The first KNN pass: sign bits of a subject's claim vectors, held per generation.

sqlite-vec's PyPI build scans without SIMD and keeps its top k at a cost
that grows with k: on 50k claims the float KNN (k 10) took 28–55 ms and a
bit KNN wide enough to re-score (k 500) 64 ms. The bits themselves are
small (48 bytes a claim for 384 dimensions), so a generation reads each
subject's once from ``claims_vec``, with the embedding cache's rowid of each
statement's vector (so the exact pass reads each by rowid: one B-tree
descent, in rowid order, where a lookup by statement hash took two and
twice the time) — 0.07 s at 10k claims, about 0.4 s at 50k, on the first
semantic compile of that subject on that generation; a generation never
changes — and compares them with the task's in numpy: XOR, popcount, a
partial sort — a few milliseconds at 50k.

Held like ``core.compile.catalog``: per ``Snapshot`` object, weakly, so a
retired generation's bits go with it; bounded by the snapshot's own claim
count. Scope filters (project, reader, and the validity window at the compile's
``at``) are masks over the same rows, so what the caller may not read, and
what is not valid at ``at``, never takes a place in the shortlist: a
hundred near claims valid only next year must not push the one valid claim
out of the ``knn`` nearest. (Status needs no mask: only claims compile may
read are indexed.)
"""

from __future__ import annotations

import threading
import weakref
from array import array

import apsw
import numpy as np

from core.vectors.embedder import text_digest


def _microseconds(instants: list, missing: int) -> np.ndarray:
    """Canonical instants ("2026-12-07T12:18:31.337000Z") as microseconds
    since the epoch; ``missing`` where there is none (an open end, or a claim
    that is gone: valid from the end of time, so at no instant)."""
    out = np.full(len(instants), missing, dtype=np.int64)
    present = [i for i, v in enumerate(instants) if v is not None]
    if present:
        out[present] = np.array([instants[i].rstrip("Z") for i in present], dtype="datetime64[us]").view(np.int64)
    return out


class SubjectSigns:
    """One subject's claims on one generation: rowids, scope keys, validity and sign bits."""

    # instants held as microseconds (int64): compared on every compile, where
    # fixed-width text took 0.4 ms at 50k claims and integers 0.02 ms
    OPEN_END = np.iinfo(np.int64).max

    def __init__(self, rows: list[tuple], cached: list[int], windows: list[tuple[str, str | None]]):
        """``rows``: (rowid, project_key, reader_key, coarse); ``cached``: the
        embedding cache's rowid of each row's vector, in the same order (-1
        when the cache has none); ``windows``: each row's (valid_from,
        valid_to) as canonical instants (valid_to None when open)."""
        self.rowids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        self.cached = np.array(cached, dtype=np.int64)
        self.project_keys = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        self.reader_keys = np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows))
        self.valid_from = _microseconds([w[0] for w in windows], self.OPEN_END)
        self.valid_to = _microseconds([w[1] for w in windows], self.OPEN_END)
        width = len(rows[0][3]) if rows else 8
        # compared 8 bytes at a time when the width allows (384 bits: 6 words)
        self.word = np.uint64 if width % 8 == 0 else np.uint8
        words = width // np.dtype(self.word).itemsize
        self.codes = np.frombuffer(b"".join(r[3] for r in rows), dtype=self.word).reshape(len(rows), words)

    def shortlist(self, code: bytes, size: int, readers: list[int],
                  project_key: int | None, at: str) -> list[tuple[int, int]]:
        """(rowid, embedding cache rowid or -1) of the ``size`` claims nearest by
        Hamming distance that the reader keys (and the project, when given)
        admit and that are valid at ``at`` (a canonical instant); ties by rowid."""
        if len(self.rowids) == 0:
            return []
        allowed = np.isin(self.reader_keys, np.array(readers, dtype=np.int64))
        when = _microseconds([at], self.OPEN_END)[0]
        allowed &= (self.valid_from <= when) & (self.valid_to > when)
        if project_key is not None:
            allowed &= self.project_keys == project_key
        query = np.frombuffer(code, dtype=self.word)
        if allowed.all():  # the usual case: no copy of the codes
            index = np.arange(len(self.rowids))
            distance = np.bitwise_count(self.codes ^ query).sum(axis=1, dtype=np.int32)
        else:
            index = np.flatnonzero(allowed)
            if index.size == 0:
                return []
            distance = np.bitwise_count(self.codes[index] ^ query).sum(axis=1, dtype=np.int32)
        if index.size > size:
            keep = np.argpartition(distance, size - 1)[:size]
            index, distance = index[keep], distance[keep]
        chosen = index[np.lexsort((self.rowids[index], distance))]
        return list(zip(self.rowids[chosen].tolist(), self.cached[chosen].tolist()))


class SignCache:
    """``SubjectSigns`` per snapshot generation and subject key, read on first use."""

    def __init__(self):
        self._by_snapshot: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def subject(self, snapshot, db, subject_key: int, fingerprint_key: str) -> SubjectSigns:
        with self._lock:
            held = self._by_snapshot.setdefault(snapshot, {})
            signs = held.get(subject_key)
        if signs is None:  # two readers may both read it: the same rows, either wins
            rows = db.execute("SELECT rowid, project_key, reader_key, coarse FROM claims_vec WHERE subject_key = ?",
                              (subject_key,)).fetchall()
            claims = {r[0]: r[1:] for r in db.execute(
                "SELECT rowid, statement, valid_from, valid_to FROM claims WHERE rowid IN carray(?)",
                (apsw.carray(array("q", [r[0] for r in rows])),))} if rows else {}
            # a row whose claim is gone has no cached vector to find (any
            # digest misses) and is valid at no instant
            gone = ("", None, None)
            hexes = [text_digest(claims.get(r[0], gone)[0]).hex() for r in rows]
            where = dict(db.execute("SELECT text_sha256, rowid FROM embed_cache WHERE fingerprint = ?"
                                    " AND text_sha256 IN carray(?)", (fingerprint_key, apsw.carray(tuple(set(hexes))))
                                    )) if rows else {}
            signs = SubjectSigns(rows, [where.get(h, -1) for h in hexes],
                                 [claims.get(r[0], gone)[1:] for r in rows])
            with self._lock:
                held[subject_key] = signs
        return signs
