"""Compile's semantic candidate step: embed the task, KNN in the snapshot's index.

Embed the task under a timeout, KNN the calibration's ``knn`` nearest among
what the caller may read in its org, subject and project, drop hits at or
below the calibrated floor and turn each cosine into semantic relevance
(``core.vectors.calibration``): absolute, never relative to the other hits.

The KNN runs in two passes. First the ``SHORTLIST`` × ``knn`` nearest by
Hamming distance between sign bits, among the claims the caller may read in
its subject and project (``core.vectors.signs``: in numpy, over the sign
bits of the caller's reader keys, read once per generation from
``claims_signs``); then
the exact cosine of each, from the embedding cache (read by the cache's
rowid, held with the bits: a vec0 lookup by rowid reads a whole 1024-vector
chunk); the
``knn`` best by cosine are the hits. Cosines stay exact, so the calibration
applies as measured; a neighbour whose sign bits are far while its cosine is
near can be missed (recall of the 20 nearest with a 1,000-claim shortlist:
0.99 at 10k claims, 0.96 at 50k; docs/vectors.md §5).
Ids are then hydrated through the same scoped query as lexical ones
(``core.compile.retrieval``), so visibility, status and validity apply again.
"""

from __future__ import annotations

import logging
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import apsw
import numpy as np

from core.scope import reader_tags
from core.vectors.embedder import Embedder, EmbedderError, Fingerprint
from core.vectors.index import INDEX_LAYOUT, coarse_input, pack_vector, scope_key, subject_key
from core.vectors.signs import SignCache
from core.vectors.signs import shortlist as nearest_signs

SHORTLIST = 50  # the first pass keeps this many times ``knn`` claims for the exact pass


def _warm(load) -> None:
    try:
        load()
    except Exception as exc:  # the first compile meets it again and answers lexically
        logging.getLogger("titen").warning("loading the embedder failed: %s: %s", type(exc).__name__, exc)


class VectorSearch:
    """Step 2's semantic half, for one configured embedder."""

    def __init__(self, embedder: Embedder, timeout_s: float = 2.0):
        self.embedder = embedder
        self.fingerprint: Fingerprint = embedder.fingerprint
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="embed")
        self._signs = SignCache()

    def warm(self) -> None:
        """Start loading a local model in the background. A serving process
        calls it at start, so the load (and, once per machine, the model's
        derivation: seconds) is not inside the first compile's timeout; a
        short CLI command never pays it (the pool's thread is joined at exit)."""
        load = getattr(self.embedder, "load", None)
        if load is not None:
            self._pool.submit(_warm, load)

    def problem(self, snapshot) -> str | None:
        """Why this snapshot's vectors cannot serve this embedder, or None."""
        meta = snapshot.meta
        if meta.get("vector_fingerprint") is None:
            return "the snapshot has no vector index (rebuild with the embedder configured)"
        if meta.get("vector_fingerprint") != self.fingerprint.key():
            return (f"the snapshot's vectors have fingerprint {meta.get('vector_fingerprint')}, the configured "
                    f"embedder {self.fingerprint.key()}; a rebuild re-embeds")
        if meta.get("vector_layout") != INDEX_LAYOUT:
            return "the snapshot's vector index has another layout; a rebuild recreates it from the cache"
        if meta.get("vector_calibration") != self.fingerprint.calibration_id():
            return (f"the snapshot's vectors were recorded with calibration {meta.get('vector_calibration')}, "
                    f"the configured embedder's is {self.fingerprint.calibration_id()}; a rebuild records it"
                    f" (nothing is re-embedded)")
        if meta.get("vector_status") != "ok":
            return f"the snapshot's vector index is incomplete: {meta.get('vector_error') or meta.get('vector_status')}"
        return None

    def begin(self, snapshot, task: str) -> Future:
        """Start embedding the task (so the lexical step runs meanwhile);
        raises at once when this snapshot's vectors cannot serve."""
        problem = self.problem(snapshot)
        if problem:
            raise EmbedderError(problem)
        return self._pool.submit(self.embedder.embed, [task])

    def embedded(self, pending: Future) -> list[float]:
        """The task's vector, waiting at most the timeout since ``finish`` began."""
        try:
            vectors = pending.result(timeout=self.timeout_s)
        except FutureTimeout:
            pending.cancel()
            raise EmbedderError(f"embedding the task took longer than {self.timeout_s * 1000:.0f} ms") from None
        if len(vectors) != 1 or len(vectors[0]) != self.fingerprint.dimensions:
            raise EmbedderError("the embedder returned a vector of the wrong dimension")
        return vectors[0]

    def finish(self, snapshot, scope, pending: Future) -> list[tuple[int, float]]:
        """(rowid, semantic relevance in (0, 1]) of the nearest claims in the
        caller's org, subject and project above the calibrated floor, best
        first. Raises on any failure; the caller degrades to the lexical result."""
        vector = self.embedded(pending)
        calibration = self.fingerprint.calibration
        hits = []
        for rowid, cosine in self.nearest(snapshot, scope, vector):
            relevance = calibration.relevance(cosine)
            if relevance > 0.0:
                hits.append((rowid, relevance))
        return hits

    def search(self, snapshot, scope, task: str) -> list[tuple[int, float]]:
        """``begin`` then ``finish``: the semantic hits of one task."""
        return self.finish(snapshot, scope, self.begin(snapshot, task))

    def nearest(self, snapshot, scope, vector: list[float]) -> list[tuple[int, float]]:
        """(rowid, cosine) of the calibration's ``knn`` nearest claims the
        caller may read in its org, subject and project, best first (ties by
        rowid): sign bits first, then the exact cosine of the shortlist."""
        # org, subject, project, visibility and validity at ``at`` filter the
        # shortlist, so what the caller may not read never takes one of its
        # places (only compilable statuses are indexed), and only the bits of
        # the caller's reader keys are read; the scoped hydrate applies every
        # predicate again
        readers = [scope_key(tag) for tag in reader_tags(scope.principal)]
        knn = self.fingerprint.calibration.knn
        blob = pack_vector(vector)
        db = snapshot.db
        key = self.fingerprint.key()
        groups = self._signs.readable(snapshot, db, subject_key(scope.principal.org_id, scope.subject_id), readers,
                                      key)
        code = db.execute("SELECT vec_quantize_binary(?)", (coarse_input(blob),)).fetchone()[0]  # the index's bits
        shortlist = nearest_signs(groups, code, SHORTLIST * knn,
                                  scope_key(scope.project_id) if scope.project_id is not None else None, scope.at)
        if not shortlist:
            return []
        wanted = sorted({at for _, at in shortlist if at >= 0})  # in rowid order: one pass down the table
        cached = dict(db.execute("SELECT rowid, vector FROM embed_cache WHERE rowid IN carray(?)",
                                 (apsw.carray(array("q", wanted)),))) if wanted else {}
        stored = []
        for rowid, at in shortlist:
            found = cached.get(at)
            if found is None:  # never so after a sync; the index's own copy, slower
                found = db.execute("SELECT embedding FROM claims_vec WHERE rowid = ?", (rowid,)).fetchone()[0]
            stored.append(found)
        matrix = np.frombuffer(b"".join(stored), dtype=np.float32).reshape(len(stored), -1)
        cosines = matrix @ np.frombuffer(blob, dtype=np.float32)
        rowids = [rowid for rowid, _ in shortlist]
        order = np.lexsort((np.array(rowids), -cosines))[:knn]
        return [(rowids[i], float(cosines[i])) for i in order.tolist()]

