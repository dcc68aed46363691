"""Lexical against hybrid on the calibration set, and the sweep that calibrates a model.

    .venv/bin/python -m bench.calibration_eval                        # the configured calibration, end to end
    .venv/bin/python -m bench.calibration_eval --sweep                # floors × ceilings × neighbour counts
    .venv/bin/python -m bench.calibration_eval --embedder hash:256    # any TITEN_EMBEDDER spec

The set (``tests/fixtures/calibration/set.json``, built by
``bench.calibration``) is loaded as one subject's claims — every answer is a
claim, every other answer a distractor — into a fresh local store under
``bench/.data/calibration-<embedder>``, and one rebuild embeds them (its
embed time is printed). Each pair's query is then a task.

**End to end** (the default): each task goes through compile's own steps —
``Compiler.candidates`` (the lexical candidate step and the vector search
with the embedder's calibration), ``Catalog.hydrate`` and ``Compiler.rank``
— once with vectors and once without; the gold claim's place in the ranked
list is its rank. (Packing is left out: it allows three items per kind, and
every claim here is one kind.)

**Sweep** (``--sweep``): the same lexical candidates, and the cosine of the
task with every claim (exact, as ``vec0``'s KNN is), computed once; then for
each floor, ceiling and neighbour count the candidates and their calibrated
semantic relevance are ranked by ``core.compile.ranking.rank`` itself (equal
trust, recency, utility and confidence, as here they are).

Figures (percent of queries):

- **rank-1**: the gold claim ranked first; **MRR@10**: mean of 1/rank, 0
  beyond 10;
- **paraphrase rescue**: of the *paraphrase* queries (no content word of the
  query shares a stem with its answer, by the index's own tokenizer) whose
  answer lexical misses entirely (not a candidate), the share hybrid ranks in
  the top 10;
- **lexical-rank-1 loss**: of the queries lexical answers at rank 1, the
  share hybrid no longer does.

After the grid, ``--sweep`` prints the **bound** on rescue: of the
paraphrases lexical misses, the share whose answer is among the task's k
nearest claims (k = 1, 10, 20, 50), overall and per source, and the same
with the task moved toward its nearest claim (``nearest_bound``).

The issue's acceptance: rank-1 and MRR@10 each +2 points over lexical,
rescue >= 30%, loss <= 2%. Results go to ``bench/results/calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from bench import common

SET_FILE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "calibration" / "set.json"
RESULTS_FILE = common.RESULTS_DIR / "calibration.json"
ORG, SUBJECT = "calib", "user_calibration"
AT = "2030-01-01T00:00:00Z"
TOP = 10
FLOORS = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
CEILINGS = (0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9)
CAPS = (0.9, 0.95, 0.99, 1.0)
KNNS = (10, 20, 50)


def load_set(path=SET_FILE) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["pairs"]


def build_store(pairs: list[dict], spec: str, embedder=None):
    """A fresh store holding every answer as a claim of one subject, rebuilt
    with the embedder; (service, principal, seconds the rebuild took)."""
    from core.config import Settings
    from core.keys import Principal
    from core.service import Service
    from core.writes.importer import import_file

    directory = common.DATA_DIR / f"calibration-{spec.replace(':', '-')}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    ndjson = directory / "import.ndjson"
    with open(ndjson, "w", encoding="utf-8") as f:
        for i, pair in enumerate(pairs):
            body = {"subject_id": SUBJECT, "kind": "user_statement", "content": pair["answer"], "trust": "asserted",
                    "visibility": "organization", "source": {"type": "tool", "ref": pair["id"]},
                    "claim": {"statement": pair["answer"], "kind": "semantic_fact", "confidence": 0.9}}
            f.write(json.dumps(body) + "\n")
    settings = Settings.from_env(data_dir=str(directory), env={"TITEN_SNAPSHOT_TTL": "0", "TITEN_EMBEDDER": spec})
    service = Service(settings, embedder=embedder)
    admin = Principal(ORG, "calibration", "cli", frozenset({"admin", "memory:write", "memory:verify"}), ())
    import_file(service.store, admin, str(ndjson))
    started = time.perf_counter()
    service.rebuild(ORG)
    seconds = time.perf_counter() - started
    reader = Principal(ORG, "calibration", "key", frozenset({"context:compile"}), ())
    return service, reader, seconds


def gold_rowids(snapshot, pairs: list[dict]) -> list[int]:
    by_statement = dict(snapshot.db.execute("SELECT statement, rowid FROM claims"))
    return [by_statement[p["answer"]] for p in pairs]


def paraphrases(snapshot, pairs: list[dict]) -> list[bool]:
    """Per pair: no query term (``plan_query``) shares a stem with the answer,
    by the snapshot's own FTS5 tokenizer (``FTS_TOKENIZER_ARGS``)."""
    from core.compile.planning import plan_query
    from core.lexical.bm25 import FTS_TOKENIZER_ARGS

    import apsw

    tokenizer = snapshot.db.fts5_tokenizer(*FTS_TOKENIZER_ARGS)

    def stems(text: str) -> set[str]:
        return {t[2] for t in tokenizer(text.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None)}

    out = []
    for p in pairs:
        query_stems = stems(" ".join(plan_query(p["query"]).terms))
        out.append(not (query_stems & stems(p["answer"])))
    return out


def rank_of(ranked_rowids: list[int], gold: int) -> int | None:
    try:
        return ranked_rowids.index(gold) + 1
    except ValueError:
        return None


def figures(lexical: list[int | None], hybrid: list[int | None], paraphrase: list[bool],
            sources: list[str] | None = None) -> dict:
    """The four figures; with ``sources`` (each pair's), also per source under
    ``by_source``: man pages and docstrings differ in how far an answer
    restates its query (docs/vectors.md §3)."""
    n = len(lexical)

    def mrr(ranks):
        return sum(1 / r for r in ranks if r is not None and r <= TOP) / n

    missed = [i for i in range(n) if paraphrase[i] and lexical[i] is None]
    rescued = [i for i in missed if hybrid[i] is not None and hybrid[i] <= TOP]
    firsts = [i for i in range(n) if lexical[i] == 1]
    lost = [i for i in firsts if hybrid[i] != 1]
    return {"queries": n, "paraphrase_queries": sum(paraphrase),
            "lexical_rank1": 100 * sum(r == 1 for r in lexical) / n,
            "hybrid_rank1": 100 * sum(r == 1 for r in hybrid) / n,
            "lexical_mrr10": 100 * mrr(lexical), "hybrid_mrr10": 100 * mrr(hybrid),
            "paraphrase_missed_by_lexical": len(missed),
            "paraphrase_rescue": 100 * len(rescued) / max(len(missed), 1),
            "lexical_rank1_loss": 100 * len(lost) / max(len(firsts), 1),
            **({"by_source": {source: figures(*([v[i] for i in range(n) if sources[i] == source]
                                                for v in (lexical, hybrid, paraphrase)))
                              for source in sorted(set(sources))}} if sources else {})}


def passes(f: dict) -> bool:
    return (f["hybrid_rank1"] - f["lexical_rank1"] >= 2 and f["hybrid_mrr10"] - f["lexical_mrr10"] >= 2
            and f["paraphrase_rescue"] >= 30 and f["lexical_rank1_loss"] <= 2)


def best(rows: list[dict]) -> dict:
    """The rule a calibration is chosen by (docs/vectors.md §3): among rows
    losing at most 2% of lexical's rank-1 answers, the highest MRR@10 to a
    tenth of a point; then the highest rescue; then the lowest loss; then
    the smaller knn."""
    allowed = [r for r in rows if r["lexical_rank1_loss"] <= 2]
    return max(allowed, key=lambda r: (round(r["hybrid_mrr10"] - r["lexical_mrr10"], 1), r["paraphrase_rescue"],
                                       -r["lexical_rank1_loss"], -r["knn"]))


def end_to_end(service, principal, pairs, golds) -> tuple[list, list]:
    """(lexical ranks, hybrid ranks) through compile's own steps."""
    from core.compile.catalog import catalog_for
    from core.compile.compiler import Candidates
    from core.compile.retrieval import CompileScope

    compiler = service.compiler
    snapshot = service.reader.current(ORG)
    catalog = catalog_for(snapshot)
    scope = CompileScope(principal, SUBJECT, None, AT)
    at_s = time.mktime(time.strptime(AT, "%Y-%m-%dT%H:%M:%SZ"))
    lexical, hybrid = [], []
    with snapshot.lease():
        for pair, gold in zip(pairs, golds):
            found = compiler.candidates(snapshot, scope, pair["query"])
            assert found.vector_state == "used", found.vector_state
            for out, cands in ((hybrid, found), (lexical, Candidates(found.bm25, {}, "disabled"))):
                facts = catalog.hydrate(scope, cands.rowids, cands.bm25.keys())
                ranked = compiler.rank(facts, cands, principal, at_s)
                out.append(rank_of([r.signals.rowid for r in ranked[:TOP]], gold))
    return lexical, hybrid


def vector_space(service, pairs, embedder) -> tuple:
    """(claim rowids, claim vectors, task vectors, task x claim cosines): the
    snapshot's own vectors, every task embedded once, cosines exact."""
    from core.vectors.index import unpack_vector

    rows = list(service.reader.current(ORG).db.execute("SELECT rowid, embedding FROM claims_vec ORDER BY rowid"))
    rowids = np.array([r for r, _ in rows])
    matrix = np.array([unpack_vector(v) for _, v in rows], dtype=np.float32)
    started = time.perf_counter()
    queries = np.array(embedder.embed([p["query"] for p in pairs]), dtype=np.float32)
    common.log(f"embedded {len(pairs)} queries in {time.perf_counter() - started:.1f} s")
    return rowids, matrix, queries, queries @ matrix.T


BOUND_KS = (1, 10, 20, 50)


def nearest_bound(space, golds: list[int], missed: list[int], expand: float = 0.0) -> dict:
    """Of the ``missed`` tasks (paraphrases lexical misses entirely), the
    percentage whose answer is among the task's k nearest claims, per k in
    ``BOUND_KS``. A paraphrase is rescued only if its answer ranks in the top
    10, which needs it among the 10 nearest: no floor, ceiling, cap or knn can
    rescue more than the k=10 figure. With ``expand``, the task vector is
    first moved toward its nearest claim (``q + expand * nearest``,
    normalized; Rocchio-style feedback): the probe of docs/vectors.md §3."""
    rowids, matrix, queries, cosines = space
    position = {int(r): i for i, r in enumerate(rowids)}
    index = np.array(missed, dtype=int)
    if not len(index):
        return {k: 0.0 for k in BOUND_KS}
    task = queries[index]
    if expand:
        task = task + expand * matrix[np.argmax(cosines[index], axis=1)]
        task = task / np.linalg.norm(task, axis=1, keepdims=True)
    near = task @ matrix.T
    gold = near[np.arange(len(index)), [position[golds[i]] for i in index]]
    place = (near > gold[:, None]).sum(axis=1) + 1
    return {k: float(100 * (place <= k).mean()) for k in BOUND_KS}


def sweep(service, principal, pairs, golds, embedder, floors=FLOORS, ceilings=CEILINGS, caps=CAPS,
          knns=KNNS, space=None) -> list[dict]:
    """Every (floor, ceiling, cap, knn) ranked by ``rank`` on the same candidates."""
    from core.compile.planning import plan_query
    from core.compile.ranking import ClaimSignals, RankInput, rank
    from core.compile.retrieval import CompileScope, lexical_candidates
    from core.vectors.calibration import Calibration

    snapshot = service.reader.current(ORG)
    scope = CompileScope(principal, SUBJECT, None, AT)
    rowids, _, _, cosines = space or vector_space(service, pairs, embedder)
    signals = {int(r): ClaimSignals.of(f"claim_{int(r):08d}", 0.9, 1, 0.0, 0, 0, 0) for r in rowids}
    lexical_sets = [dict(lexical_candidates(snapshot, scope, plan_query(p["query"]))) for p in pairs]
    order = np.argsort(-cosines, axis=1)[:, :max(knns)]
    paraphrase = paraphrases(snapshot, pairs)

    def ranks(calibration: Calibration | None) -> list[int | None]:
        out = []
        for q, gold in enumerate(golds):
            bm25 = lexical_sets[q]
            similar = {}
            if calibration is not None:
                for j in order[q, :calibration.knn]:
                    cos = float(cosines[q, j])
                    if cos >= calibration.floor:
                        similar[int(rowids[j])] = calibration.relevance(cos)
            # the lexical top 10, the gold and the semantic hits decide whether
            # the gold ranks in the top 10 and where (a lexical-only candidate
            # below the lexical top 10 is below each of them): ranking only
            # those keeps the sweep fast and exact
            head = [r for r, _ in zip(bm25, range(TOP))]
            ids = list(dict.fromkeys(head + ([gold] if gold in bm25 else []) + list(similar)))
            ranked = rank([RankInput(signals[r], False, bm25.get(r), similar.get(r)) for r in ids], 0.0)
            out.append(rank_of([int(r.claim_id[6:]) for r in ranked[:TOP]], gold))
        return out

    lexical = ranks(None)
    results = []
    for knn in knns:
        for cap in caps:
            for floor in floors:
                for ceiling in ceilings:
                    if ceiling <= floor:
                        continue
                    f = figures(lexical, ranks(Calibration(floor, ceiling, knn, cap)), paraphrase)
                    results.append({"floor": floor, "ceiling": ceiling, "cap": cap, "knn": knn, **f})
    return results


def report_bounds(service, pairs, golds, space) -> dict:
    """Print and return ``nearest_bound`` for all paraphrases and per source,
    plain and with the task expanded by its nearest claim. A paraphrase shares
    no stem with its answer, so lexical never has the answer as a candidate:
    every paraphrase is one lexical misses."""
    paraphrase = paraphrases(service.reader.current(ORG), pairs)
    missed = [i for i in range(len(pairs)) if paraphrase[i]]
    groups = {"all": missed, **{source: [i for i in missed if pairs[i]["source"] == source]
                                for source in sorted({p["source"] for p in pairs})}}
    out = {}
    for expand in (0.0, 0.5):
        for name, members in groups.items():
            bound = nearest_bound(space, golds, members, expand)
            out[f"{name}:expand={expand}"] = {"missed": len(members), **{str(k): v for k, v in bound.items()}}
            print(f"answers among the task's k nearest claims, of {len(members)} paraphrases lexical misses ({name}"
                  f"{', task moved toward its nearest claim x%s' % expand if expand else ''}): "
                  + ", ".join(f"k={k} {v:.1f}%" for k, v in bound.items()))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibration_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", default="local:all-MiniLM-L6-v2", help="a TITEN_EMBEDDER spec")
    parser.add_argument("--set", default=str(SET_FILE))
    parser.add_argument("--sweep", action="store_true", help="floors x ceilings x neighbour counts")
    parser.add_argument("--out", default=str(RESULTS_FILE))
    args = parser.parse_args(argv)
    pairs = load_set(args.set)
    service, principal, seconds = build_store(pairs, args.embedder)
    common.log(f"{len(pairs)} claims loaded and embedded by the rebuild in {seconds:.1f} s")
    snapshot = service.reader.current(ORG)
    golds = gold_rowids(snapshot, pairs)
    fp = service.embedder.fingerprint
    if args.sweep:
        space = vector_space(service, pairs, service.embedder)
        rows = sweep(service, principal, pairs, golds, service.embedder, space=space)
        head = ("knn", "cap", "floor", "ceiling", "rank-1 lex", "rank-1 hyb", "MRR lex", "MRR hyb", "rescue %",
                "loss %", "ok")
        table = [(r["knn"], r["cap"], r["floor"], r["ceiling"], f"{r['lexical_rank1']:.1f}", f"{r['hybrid_rank1']:.1f}",
                  f"{r['lexical_mrr10']:.1f}", f"{r['hybrid_mrr10']:.1f}", f"{r['paraphrase_rescue']:.1f}",
                  f"{r['lexical_rank1_loss']:.1f}", "yes" if passes(r) else "") for r in rows]
        common.print_table(head, table)
        chosen = best(rows)
        print(f"chosen by the rule (docs/vectors.md §3): floor {chosen['floor']}, ceiling {chosen['ceiling']}, "
              f"cap {chosen['cap']}, knn {chosen['knn']}  (TITEN_EMBED_CALIBRATION={chosen['floor']},"
              f"{chosen['ceiling']},{chosen['knn']},{chosen['cap']})")
        bounds = report_bounds(service, pairs, golds, space)
        result = {"bench": "calibration_sweep", "embedder": args.embedder, "rows": rows, "chosen": chosen,
                  "nearest_bound": bounds}
    else:
        lexical, hybrid = end_to_end(service, principal, pairs, golds)
        f = figures(lexical, hybrid, paraphrases(snapshot, pairs), [p["source"] for p in pairs])
        calibration = fp.calibration
        print(f"embedder {args.embedder}  fingerprint {fp.key()}  calibration {calibration.as_dict()}")
        head = ("", "lexical", "hybrid", "delta")
        table = [("rank-1 %", f"{f['lexical_rank1']:.1f}", f"{f['hybrid_rank1']:.1f}",
                  f"{f['hybrid_rank1'] - f['lexical_rank1']:+.1f}"),
                 ("MRR@10 x100", f"{f['lexical_mrr10']:.1f}", f"{f['hybrid_mrr10']:.1f}",
                  f"{f['hybrid_mrr10'] - f['lexical_mrr10']:+.1f}"),
                 ("paraphrase rescue %", "0", f"{f['paraphrase_rescue']:.1f}",
                  f"of {f['paraphrase_missed_by_lexical']} missed"),
                 ("lexical-rank-1 loss %", "", f"{f['lexical_rank1_loss']:.1f}", "")]
        common.print_table(head, table)
        for source, g in f["by_source"].items():
            print(f"  {source}: {g['queries']} queries, rank-1 {g['lexical_rank1']:.1f} -> {g['hybrid_rank1']:.1f}, "
                  f"MRR@10 {g['lexical_mrr10']:.1f} -> {g['hybrid_mrr10']:.1f}, paraphrase rescue "
                  f"{g['paraphrase_rescue']:.1f}% of {g['paraphrase_missed_by_lexical']} missed, "
                  f"lexical-rank-1 loss {g['lexical_rank1_loss']:.1f}%")
        print(f"queries {f['queries']}, paraphrase queries {f['paraphrase_queries']}; acceptance: "
              f"{'met' if passes(f) else 'NOT met'}")
        result = {"bench": "calibration", "embedder": args.embedder, "calibration": calibration.as_dict(),
                  "embed_seconds": seconds, **f}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    existing = common.read_results(args.out) if os.path.exists(args.out) else {}
    existing[f"{result['bench']}:{args.embedder}"] = {**result, "environment": common.environment()}
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(existing, out, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
