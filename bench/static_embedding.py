"""A static-embedding model (the model2vec recipe) against MiniLM, on the calibration set.

    .venv/bin/python -m bench.static_embedding          # distil, sweep, and compare latency

No PyPI package ships a model2vec ("potion") model without a download at
run time (docs/vectors.md §6), so this bench makes one the way model2vec
does, from the model already shipped: every WordPiece token of
all-MiniLM-L6-v2's vocabulary is run through the model alone
(``[CLS] token [SEP]``) and its output at the token's position kept — a
30,522 × 384 table — then centred and reduced to 256 principal components
(model2vec's PCA step). A text's vector is the mean of its tokens' rows,
L2-normalized: no transformer at query time. (model2vec also weights tokens
by frequency and its "potion" models are further trained; this is the
untrained core of the recipe.)

It then measures, on ``tests/fixtures/calibration/set.json``, what
``bench.calibration_eval`` measures for MiniLM: the sweep of floor, ceiling,
cap and knn (best row by the rule of docs/vectors.md §3), and the per-query
embedding latency of both models (p50/p95/p99 over the 3,000 queries, one
at a time). The table is kept in ``bench/.data/static-minilm.npy``; nothing
of it ships.
"""

from __future__ import annotations

import time

import numpy as np

from bench import common
from bench import calibration_eval as ev

TABLE = common.DATA_DIR / "static-minilm.npy"


def distil() -> np.ndarray:
    from core.vectors.minilm import LocalOnnxEmbedder

    if TABLE.exists():
        return np.load(TABLE)
    model = LocalOnnxEmbedder()
    model.load()
    vocab = model._tokenizer.get_vocab_size()
    cls_id, sep_id = model._tokenizer.token_to_id("[CLS]"), model._tokenizer.token_to_id("[SEP]")
    rows = np.zeros((vocab, 384), dtype=np.float32)
    started = time.perf_counter()
    for start in range(0, vocab, 1024):
        ids = np.array([[cls_id, t, sep_id] for t in range(start, min(start + 1024, vocab))], dtype=np.int64)
        hidden = model._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                           "token_type_ids": np.zeros_like(ids)})[0]
        rows[start:start + len(ids)] = hidden[:, 1, :]
    common.log(f"distilled {vocab} token rows in {time.perf_counter() - started:.1f} s")
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    np.save(TABLE, rows)
    return rows


def post_process(rows: np.ndarray, dims: int = 256) -> np.ndarray:
    """model2vec's PCA step: centre the rows (the shared direction every
    token output carries would otherwise dominate every mean) and keep the
    ``dims`` principal components."""
    centred = rows - rows.mean(axis=0)
    _, _, vt = np.linalg.svd(centred[::3], full_matrices=False)  # every third row: enough for the axes
    return (centred @ vt[:dims].T).astype(np.float32)


class StaticEmbedder:
    """Mean of the distilled token rows (the tokenizer of the shipped model)."""

    def __init__(self, table: np.ndarray):
        from core.vectors.calibration import Calibration
        from core.vectors.embedder import Fingerprint
        from core.vectors.minilm import LocalOnnxEmbedder

        self.table = table
        self.tokenizer = LocalOnnxEmbedder()
        self.tokenizer.load()
        self.fingerprint = Fingerprint("static", "minilm-distilled-token-mean", "1", table.shape[1],
                                       Calibration(0.2, 0.55, 10, 0.99))

    def embed(self, texts: list[str]) -> list[list[float]]:
        from core.vectors.embedder import prepare

        out = []
        for encoding in self.tokenizer._tokenizer.encode_batch([prepare(t) for t in texts]):
            ids = encoding.ids[1:-1] or encoding.ids
            vector = self.table[ids].mean(axis=0)
            out.append((vector / max(float(np.linalg.norm(vector)), 1e-12)).tolist())
        return out


def latency(embedder, queries: list[str]) -> dict:
    embedder.embed(queries[:20])
    samples = []
    for q in queries:
        t0 = time.perf_counter()
        embedder.embed([q])
        samples.append(time.perf_counter() - t0)
    return common.summary_ms(samples)


def main() -> int:
    from core.vectors.minilm import LocalOnnxEmbedder

    pairs = ev.load_set()
    queries = [p["query"] for p in pairs]
    static = StaticEmbedder(post_process(distil()))
    minilm = LocalOnnxEmbedder()
    lat = {"static": latency(static, queries), "minilm": latency(minilm, queries)}
    service, principal, seconds = ev.build_store(pairs, "static:minilm-distilled", embedder=static)
    common.log(f"static: 3000 claims embedded by the rebuild in {seconds:.1f} s")
    golds = ev.gold_rowids(service.reader.current(ev.ORG), pairs)
    chosen = ev.best(ev.sweep(service, principal, pairs, golds, static))
    head = ("model", "query embed p50 ms", "p95 ms", "p99 ms", "best: floor", "ceiling", "cap", "knn",
            "rank-1", "MRR@10", "rescue %", "loss %")
    rows = [("static (distilled)", f"{lat['static']['p50_ms']:.3f}", f"{lat['static']['p95_ms']:.3f}",
             f"{lat['static']['p99_ms']:.3f}", chosen["floor"], chosen["ceiling"], chosen["cap"], chosen["knn"],
             f"{chosen['hybrid_rank1'] - chosen['lexical_rank1']:+.1f}",
             f"{chosen['hybrid_mrr10'] - chosen['lexical_mrr10']:+.1f}", f"{chosen['paraphrase_rescue']:.1f}",
             f"{chosen['lexical_rank1_loss']:.1f}"),
            ("all-MiniLM-L6-v2 int8", f"{lat['minilm']['p50_ms']:.3f}", f"{lat['minilm']['p95_ms']:.3f}",
             f"{lat['minilm']['p99_ms']:.3f}", "(docs/vectors.md §3)", "", "", "", "", "", "", "")]
    common.print_table(head, rows)
    print(f"load average {tuple(round(x, 2) for x in common.loadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
