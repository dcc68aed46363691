"""The platform part of infra/check-arm64.sh (it runs anywhere; the script
runs it inside the arm64 root):

- probe: the model the candidate step uses for 1..16 phrases on this
  platform's FTS5 ("plain", "fused", or "FTS5" when neither matched and the
  FTS5 query answers; core.lexical.probe.phrase_count_mode);
- compare: random queries of 1..16 phrases over random corpora (the corpora
  of tests/test_lexical.py), the candidate step (core.lexical.top_candidates)
  against the FTS5 candidate query (core.compile.retrieval.fts_candidates):
  same rows, same order, bit-identical bm25;
- fingerprint: this platform's libm fingerprint (core.lexical.libm);
- cross (when given a file ``--build-cross`` wrote on another platform, the
  host): how many of the lists priced there differ from this platform's
  pricing, whether the candidate step trusts them, and that every query
  still equals this platform's FTS5.

It prints one summary line per part ("probe ...", "compare ...",
"fingerprint ...", "cross ...") and exits 1 on any fallback to FTS5 or any
mismatch.

    python -m infra.arm64_check [--queries 400] [--seed 13] [--check-cross FILE]
    python -m infra.arm64_check --build-cross FILE      # on the other platform

Run it from the repository root, as a module (``-m``: the root, the working
directory, is then first on ``sys.path``), with an interpreter that has the
project's dependencies: it imports ``core`` from the checkout, and
``tests.test_lexical`` and ``bench.common``, which are not installed
packages. Both callers in infra/check-arm64.sh do so (the host's ``.venv``,
and the arm64 root's venv in its copy of the checkout).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import apsw

from core import lexical
from core.compile.planning import FUNCTION_WORDS, plan_query
from core.compile.retrieval import fts_candidates
from core.scope import reader_tags
from tests.snapshot_rows import insert_claim
from tests.test_lexical import WORDS, _corpus, _scope

MAX_PHRASES = 16


def probe() -> bool:
    modes = {n: lexical.phrase_count_mode(n) or "FTS5" for n in range(1, MAX_PHRASES + 1)}
    by_mode: dict[str, list[int]] = {}
    for n, mode in modes.items():
        by_mode.setdefault(mode, []).append(n)
    print("probe modes (phrases -> model):", " ".join(f"{n}:{m}" for n, m in modes.items()))
    print("probe summary:", "; ".join(f"{m} for {','.join(map(str, ns))}" for m, ns in by_mode.items()),
          f"(probed 1..{lexical.PROBE_MAX_PHRASES}, the rest by parity)")
    fallbacks = by_mode.get("FTS5", [])
    print(f"probe fallbacks: {len(fallbacks)}", "" if not fallbacks else f"for {fallbacks}")
    return not fallbacks


def _task(rng: random.Random, vocabulary: list[str]) -> str:
    return " ".join(rng.sample(vocabulary, rng.randint(1, MAX_PHRASES)))


def compare(queries: int, seed: int) -> bool:
    rng = random.Random(seed)
    vocabulary = sorted({w.casefold() for w in WORDS} - FUNCTION_WORDS)
    vocabulary += [f"unique{i}" for i in rng.sample(range(1000), 8)]
    done = mismatches = fallbacks = rows = 0
    phrases: Counter = Counter()
    started = time.monotonic()
    corpus_round = 0
    while done < queries:
        db = _corpus(rng, rng.choice([300, 1500]))
        with db:
            lexical.build_lexical_index(db)
        corpus_round += 1
        for _ in range(min(100, queries - done)):
            plan = plan_query(_task(rng, vocabulary))
            scope = _scope(rng)
            where, params = scope.where()
            k = rng.choice([1, 10, 50, 200])
            expected = fts_candidates(db, where, params, plan.match, k)
            got = lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms, k)
            done += 1
            phrases[len(plan.terms)] += 1
            rows += len(expected)
            if got is None:
                fallbacks += 1
                print(f"compare FALLBACK: {len(plan.terms)} phrases {plan.terms}")
            elif got != expected:  # rowids, order and bm25, bit for bit
                mismatches += 1
                print(f"compare MISMATCH: {plan.terms} k={k}\n  fts5: {expected[:5]}\n  here: {got[:5]}")
        db.close()
    spread = " ".join(f"{n}:{phrases[n]}" for n in sorted(phrases))
    print(f"compare: {done} random queries ({corpus_round} corpora, {rows} candidate rows, phrases {spread}):"
          f" {mismatches} mismatches, {fallbacks} fallbacks to FTS5, {time.monotonic() - started:.1f}s")
    return mismatches == 0 and fallbacks == 0


CROSS_SEED = 1913


def _bench_claims(db: apsw.Connection, n: int) -> None:
    """n claims of the bench's reference corpus (a Zipf vocabulary of
    thousands of words: many distinct document frequencies, so many distinct
    log() inputs), spread over the test corpus's subjects and projects."""
    from bench.common import generate
    with db:
        for i, claim in enumerate(generate(n)):
            rowid = insert_claim(db, f"clm_bench_{i:06d}", claim["statement"], org_id="org",
                                 subject_id=("s1", "s2", "s3")[i % 3], project_id=(None, "p1", "p2")[i // 3 % 3],
                                 visibility="organization", owner_id="u1", kind="semantic_fact", confidence=0.9,
                                 trust="observed", trust_level=1, valid_from="2026-01-01T00:00:00.000000Z",
                                 created_at="2026-01-01T00:00:00.000000Z", created_s=0, entry_id="e", indexed=1)
            db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (rowid, claim["statement"]))


def build_cross(path: str) -> None:
    """A corpus and its lex tables, priced on this platform, in a file."""
    db = _corpus(random.Random(CROSS_SEED), 1500)
    _bench_claims(db, 6000)
    with db:
        lexical.build_lexical_index(db)
    out = apsw.Connection(path)
    with out.backup("main", db, "main") as backup:
        backup.step()
    out.close()
    print("cross: built", path, "under", lexical.platform_fingerprint())


def check_cross(path: str, queries: int) -> bool:
    """The file built elsewhere, served here: never an answer that differs
    from this platform's FTS5."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    recorded = lexical.recorded_fingerprint(db)
    # what this platform would have stored: the same index, priced here
    local = Path(path).with_suffix(".here.sqlite")
    shutil.copyfile(path, local)
    here = apsw.Connection(str(local))
    with here:
        lexical.build_lexical_index(here)
    blocks = "SELECT subject_id, reader, term, first_rowid, rowids, tfdl FROM lex_postings"
    theirs = {tuple(key): (r, tf) for *key, r, tf in db.execute(blocks)}
    ours = {tuple(key): (r, tf) for *key, r, tf in here.execute(blocks)}
    differ = sum(1 for key in ours if theirs.get(key) != ours[key])
    here.close()
    local.unlink()
    rng = random.Random(CROSS_SEED + 1)
    vocabulary = sorted({w.casefold() for w in WORDS} - FUNCTION_WORDS)
    from bench.common import load_workload
    tasks = load_workload()["tasks"]
    served = mismatches = 0
    for i in range(queries):
        plan = plan_query(tasks[i % len(tasks)] if i % 2 else _task(rng, vocabulary))
        scope = _scope(rng)
        where, params = scope.where()
        expected = fts_candidates(db, where, params, plan.match, 50)
        fast = lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params,
                                      plan.terms, 50)
        served += fast is not None
        got = fast if fast is not None else expected  # as core.compile.retrieval.lexical_candidates does
        mismatches += got != expected
    same = lexical.priced_here(recorded)
    print(f"cross: index priced under {recorded!r}, served under {lexical.platform_fingerprint()!r}"
          f" (fingerprints {'equal' if same else 'differ'}): {differ} of {len(ours)} lists priced differently here;"
          f" {queries} queries, {served} answered from the stored lists, {mismatches} mismatches against FTS5 here")
    db.close()
    ok = mismatches == 0 and (same or served == 0)
    if same and differ:
        print("cross: FAILED: equal fingerprints, yet the lists differ (the fingerprint missed a libm difference)")
        ok = False
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.arm64_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--build-cross", metavar="FILE", help="write a priced index for --check-cross, and stop")
    parser.add_argument("--check-cross", metavar="FILE", help="serve an index --build-cross wrote elsewhere")
    args = parser.parse_args()
    if args.build_cross:
        build_cross(args.build_cross)
        return 0
    print("fingerprint:", lexical.platform_fingerprint())
    ok = probe()
    ok = compare(args.queries, args.seed) and ok
    if args.check_cross:
        ok = check_cross(args.check_cross, 200) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
