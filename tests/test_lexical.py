"""core.lexical.top_candidates equals the FTS5 candidate query, exactly.

Random small corpora (Zipf-ish vocabulary with stemming and diacritic
variants, several subjects/projects/visibilities, validity windows, terminal
claims deleted from the contentless index) in real SQLite, random scopes and
random task texts: same rowids, same order, bit-identical bm25.
"""

import random
import re

import apsw
import pytest

from core import lexical
from core.lexical import query
from core.keys import Principal
from core.compile.planning import plan_query
from core.compile.retrieval import CompileScope, fts_candidates, fts_candidates_sql
from core.scope import can_read, reader_tag, reader_tags
from core.snapshot.schema import DDL
from tests.snapshot_rows import insert_claim

WORDS = ["deploy", "deploys", "deploying", "deployment", "cafe", "café", "CAFÉ", "naïve", "naive", "smoke",
         "test", "tests", "rollback", "db", "migration", "migrations", "alpha", "beta", "gamma", "delta",
         "the", "of", "and", "to", "is", "x1", "2024", "über", "uber", "run", "running", "ran"]
SUBJECTS = ["s1", "s2", "s3"]
PROJECTS = [None, "p1", "p2"]
WORKSPACES = ["w1", "w2"]
PRINCIPALS = ["u1", "u2"]
STATUSES = ["active"] * 6 + ["disputed", "superseded", "expired", "revoked"]
TIMES = ["2026-01-01T00:00:00.000000Z", "2026-02-01T00:00:00.000000Z", "2026-03-01T00:00:00.000000Z",
         "2026-04-01T00:00:00.000000Z"]


def _statement(rng: random.Random) -> str:
    n = rng.randint(1, 14)
    # Zipf-ish: low indexes far more frequent
    words = [WORDS[min(int(rng.paretovariate(0.8)) - 1, len(WORDS) - 1)] for _ in range(n)]
    if rng.random() < 0.1:
        words.append("unique" + str(rng.randrange(1000)))
    return " ".join(words) + rng.choice([".", "!", "", ", and more."])


def _corpus(rng: random.Random, n: int) -> apsw.Connection:
    db = apsw.Connection(":memory:")
    db.execute(DDL)
    with db:
        for i in range(n):
            status = rng.choice(STATUSES)
            indexed = int(status in ("active", "disputed"))
            vis = rng.choice(["organization", "organization", "team", "private"])
            valid_from = rng.choice(TIMES[:3])
            valid_to = rng.choice([None, None, TIMES[2], TIMES[3]])
            statement = _statement(rng)
            # keyword arguments are evaluated in order: the rng draws as it always did
            rowid = insert_claim(
                db, f"clm_{rng.getrandbits(40):010x}_{i}", statement, org_id="org",
                subject_id=rng.choice(SUBJECTS), project_id=rng.choice(PROJECTS),
                workspace_id=rng.choice(WORKSPACES) if vis == "team" else None, visibility=vis,
                owner_id=rng.choice(PRINCIPALS), kind="semantic_fact", confidence=0.9, trust="observed",
                trust_level=1, valid_from=valid_from, valid_to=valid_to, created_at=TIMES[0], created_s=0.0,
                entry_id="e", base_status=status if status != "disputed" else "active", status=status,
                indexed=indexed)
            # as the builder does: every claim enters the index, terminal ones leave it again
            db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (rowid, statement))
            if not indexed:
                db.execute("DELETE FROM claims_fts WHERE rowid = ?", (rowid,))
    return db


def _scope(rng: random.Random) -> CompileScope:
    workspaces = tuple(w for w in WORKSPACES if rng.random() < 0.5)
    principal = Principal("org", rng.choice(PRINCIPALS), "key", frozenset({"context:compile"}), workspaces)
    return CompileScope(principal, rng.choice(SUBJECTS), rng.choice(PROJECTS), rng.choice(TIMES))


def _task(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS + ["nothing", "unique" + str(rng.randrange(1000))])
                    for _ in range(rng.randint(1, 8)))


def _answers_as_fts5(db, rng, *, tries: int, k: int) -> int:
    """Random scopes and tasks: the candidate index answers exactly as the
    FTS5 query (rows and bm25); how many tasks were checked."""
    checked = 0
    for _ in range(tries):
        scope = _scope(rng)
        plan = plan_query(_task(rng))
        if not plan.match:
            continue
        where, params = scope.where()
        expected = fts_candidates(db, where, params, plan.match, k)
        assert lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms,
                                      k, scope.narrowers()) == expected
        checked += 1
    return checked


@pytest.mark.parametrize("seed", range(12))
def test_equals_fts5_query(seed):
    rng = random.Random(seed)
    db = _corpus(rng, rng.choice([5, 40, 300, 1500]))
    with db:
        lexical.build_lexical_index(db)
    checked = 0
    for _ in range(60):
        scope = _scope(rng)
        plan = plan_query(_task(rng))
        if not plan.match:
            continue
        k = rng.choice([1, 3, 10, 50, 200])
        where, params = scope.where()
        expected = fts_candidates(db, where, params, plan.match, k)
        # the project's rows listed through its index, or every match checked: the same answer
        for narrow in (None, scope.narrowers()):
            got = lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params,
                                         plan.terms, k, narrow)
            if got is None:  # this platform's FTS5 sums this many phrases its own way: FTS5 answers
                assert not lexical.phrase_count_exact(len(plan.terms))
                continue
            assert [r for r, _ in got] == [r for r, _ in expected], (plan.terms, k)
            assert [s for _, s in got] == [s for _, s in expected]  # bit for bit
        checked += 1
    assert checked > 30


def _one_subject(rng: random.Random, n: int, row) -> apsw.Connection:
    """``n`` organization-visible claims of subject s1, all holding "deploy";
    ``row(i)`` gives claim i's project and validity window."""
    db = apsw.Connection(":memory:")
    db.execute(DDL)
    with db:
        for i in range(n):
            project_id, valid_from, valid_to = row(i)
            insert_claim(db, f"clm_{i:06d}", _statement(rng) + " deploy", org_id="org", subject_id="s1",
                         project_id=project_id, workspace_id=None, visibility="organization", owner_id="u1",
                         kind="semantic_fact", confidence=0.9, trust="observed", trust_level=1,
                         valid_from=valid_from, valid_to=valid_to, created_at=TIMES[0], created_s=0.0,
                         entry_id="e", base_status="active", status="active", indexed=1)
        db.execute("INSERT INTO claims_fts(rowid, statement) SELECT rowid, statement FROM claims")
        lexical.build_lexical_index(db)
    return db


def _listings(monkeypatch) -> list:
    listed = []
    original = query._Scope.take
    monkeypatch.setattr(query._Scope, "take", lambda self, rows: (listed.append(self), original(self, rows))[1])
    return listed


U1 = Principal("org", "u1", "key", frozenset({"context:compile"}), ())


def _both_ways(db: apsw.Connection, scope: CompileScope, task: str = "deploy smoke") -> tuple[list, list]:
    """(the FTS5 candidate query's answer, the candidate index's with the scope's narrowers)."""
    plan = plan_query(task)
    where, params = scope.where()
    return (fts_candidates(db, where, params, plan.match, 200),
            lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms,
                                   200, scope.narrowers()))


def test_a_rare_project_is_answered_from_its_listed_rows_exactly_as_fts5(monkeypatch):
    # one project among many: its few rows are listed through the claims_scope index
    # instead of checking nearly every match of the subject by rowid
    db = _one_subject(random.Random(7), 2000,
                      lambda i: ("rare" if i % 97 == 0 else f"p{i % 40}", TIMES[0], None))
    listed = _listings(monkeypatch)
    scope = CompileScope(U1, "s1", "rare", TIMES[1])
    expected, got = _both_ways(db, scope)
    assert len(expected) == 21 and got == expected
    assert len(listed) == 1  # every match decided by one listing


# (valid_from, valid_to) of claim i, the task's `at`, and how many claims are valid then
FEW_VALID_AT = {
    "at before nearly all of the subject's memory":
        (lambda i: (TIMES[0] if i % 97 == 0 else TIMES[2], None), TIMES[1], 21),
    "a subject whose claims have nearly all lapsed":
        (lambda i: (TIMES[0], None if i % 97 == 0 else TIMES[1]), TIMES[2], 21),
}


@pytest.mark.parametrize("case", FEW_VALID_AT)
def test_few_rows_valid_at_the_tasks_time_are_answered_from_their_listing_exactly_as_fts5(monkeypatch, case):
    # the rows valid at `at` are listed through the claims_valid index instead
    # of checking every match of the subject by rowid (120 ms at 50k)
    window, at, valid = FEW_VALID_AT[case]
    db = _one_subject(random.Random(7), 2000, lambda i: (None, *window(i)))
    listed = _listings(monkeypatch)
    scope = CompileScope(U1, "s1", None, at)
    expected, got = _both_ways(db, scope)
    assert len(expected) == valid and got == expected
    assert len(listed) == 1


def test_a_subject_with_a_third_of_its_claims_lapsed_is_answered_by_checks_not_by_listing(monkeypatch):
    # a few more rowid checks find the k valid matches; listing the two thirds
    # still valid (and counting them) would read far more (208 against 13 ms at 50k)
    db = _one_subject(random.Random(7), 2000, lambda i: (None, TIMES[0], TIMES[1] if i % 3 == 0 else None))
    listed = _listings(monkeypatch)
    scope = CompileScope(U1, "s1", None, TIMES[2])
    expected, got = _both_ways(db, scope)
    assert len(expected) == 200 and got == expected
    assert listed == []


def test_the_reference_fts5_query_runs_its_match_once_as_the_outer_loop():
    """Not a walk of the subject's rows through a scope index with a MATCH per
    row (claims_valid invited that plan: 0.8 s a query on 7,500 claims)."""
    db = _one_subject(random.Random(7), 200, lambda i: (None, TIMES[0], None))
    where, params = CompileScope(U1, "s1", None, TIMES[2]).where()
    plan = [detail for *_, detail in db.execute("EXPLAIN QUERY PLAN " + fts_candidates_sql(where, 200),
                                                 ['"deploy"', *params])]
    assert plan[0].startswith("SCAN claims_fts VIRTUAL TABLE") and "rowid=?" in plan[1], plan


def test_a_snapshot_built_before_claims_valid_checks_every_match_and_answers_the_same(monkeypatch):
    # a generation built before the index was added (LATER_INDEXES) lacks it:
    # the listing through it is passed over, never an error
    window, at, valid = FEW_VALID_AT["at before nearly all of the subject's memory"]
    db = _one_subject(random.Random(7), 2000, lambda i: (None, *window(i)))
    db.execute("DROP INDEX claims_valid")
    listed = _listings(monkeypatch)
    scope = CompileScope(U1, "s1", None, at)
    expected, got = _both_ways(db, scope)
    assert len(expected) == valid and got == expected
    assert listed == []


def test_repeated_and_stemmed_terms_count_per_phrase():
    rng = random.Random(99)
    db = _corpus(rng, 400)
    with db:
        lexical.build_lexical_index(db)
    scope = CompileScope(Principal("org", "u1", "key", frozenset(), ("w1", "w2")), "s1", None, TIMES[3])
    where, params = scope.where()
    for terms in (("deploy", "deploys", "deploying"), ("cafe", "café"), ("smoke", "smoke")):
        match = " OR ".join(f'"{t}"' for t in terms)
        expected = fts_candidates(db, where, params, match, 20)
        assert lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, terms, 20) == expected


@pytest.mark.parametrize("seed", range(4))
def test_a_callers_lists_hold_only_claims_the_caller_may_read(seed):
    """DESIGN: a record the caller may not read never reaches timing-visible
    work. The lists a compile reads are its readers' (core.scope.reader_tags):
    another principal's private claims and other workspaces' team claims are
    in lists it never opens, so their number costs it nothing."""
    rng = random.Random(seed)
    db = _corpus(rng, 300)
    with db:
        lexical.build_lexical_index(db)
    state = lexical.query._state(db)
    who = {rowid: (vis, ws, owner) for rowid, vis, ws, owner in
           db.execute("SELECT rowid, visibility, workspace_id, owner_id FROM claims")}
    tokens = [term for term, in db.execute("SELECT term FROM lex_terms")]
    hidden_somewhere = False
    for _ in range(10):
        scope = _scope(rng)
        lists = lexical.query._lists(db, state, scope.subject_id, reader_tags(scope.principal), tokens)
        read = {int(r) for rowids, *_ in lists.values() for r in rowids}
        assert read and all(can_read(scope.principal, *who[r]) for r in read)
        hidden_somewhere |= any(not can_read(scope.principal, *who[r]) for r in who)
    assert hidden_somewhere  # the corpus holds claims these callers may not read


def test_falls_back_when_it_cannot_answer_exactly():
    rng = random.Random(7)
    db = _corpus(rng, 50)
    scope = CompileScope(Principal("org", "u1", "key", frozenset(), ()), "s1", None, TIMES[3])
    where, params = scope.where()
    # no lex tables
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy",)) is None
    with db:
        lexical.build_lexical_index(db)
    fresh = lambda: lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy",))  # noqa: E731
    lexical.query._STATES.clear()
    assert fresh() is not None
    # a term FTS5 splits into a phrase of two tokens
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("foo-bar",)) is None
    # the index changed after the lex tables were built: stale, not used
    db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(999999, 'deploy')")
    lexical.query._STATES.clear()
    assert fresh() is None


def test_empty_index():
    db = apsw.Connection(":memory:")
    db.execute(DDL)
    with db:
        lexical.build_lexical_index(db)
    scope = CompileScope(Principal("org", "u1", "key", frozenset(), ()), "s1", None, TIMES[3])
    where, params = scope.where()
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy",)) == []


# -- the incremental build -------------------------------------------------------

def _lex_tables(db: apsw.Connection) -> tuple[list, list, list]:
    """What the index holds, whatever its blocks: the statistics, every
    (subject, reader, term) list's rowids and (tf, D) inputs joined across its
    blocks, and every term's df."""
    lists: dict = {}
    for subject_id, reader, term, first, n, rowids, tfdl in db.execute(
            "SELECT subject_id, reader, term, first_rowid, n, rowids, tfdl FROM lex_postings"
            " ORDER BY subject_id, reader, term, first_rowid"):
        assert n * 8 == len(tfdl) and n > 0
        rows, inputs = lists.setdefault((subject_id, reader, term), (bytearray(), bytearray()))
        rows += rowids
        inputs += tfdl
    return (db.execute("SELECT * FROM lex_stats").fetchall(),
            sorted((key, bytes(r), bytes(t)) for key, (r, t) in lists.items()),
            db.execute("SELECT term, df FROM lex_terms ORDER BY term").fetchall())


def _change_index(db: apsw.Connection, rng: random.Random, changes: lexical.LexicalChanges, n: int) -> None:
    """As the builder does: new claims enter the index, others leave it."""
    indexed = db.execute("SELECT rowid, subject_id, statement, visibility, workspace_id, owner_id FROM claims"
                         " WHERE indexed = 1").fetchall()
    for rowid, subject_id, statement, *who in rng.sample(indexed, min(len(indexed), n // 3)):
        db.execute("DELETE FROM claims_fts WHERE rowid = ?", (rowid,))
        db.execute("UPDATE claims SET indexed = 0, status = 'revoked' WHERE rowid = ?", (rowid,))
        changes.deleted(rowid, subject_id, reader_tag(*who), statement)
    for i in range(n):
        statement = _statement(rng)
        subject_id = rng.choice(SUBJECTS + ["s4"])  # s4: lists that do not exist yet
        vis = rng.choice(["organization", "team", "private"])  # lists of every kind of reader
        workspace_id = "w1" if vis == "team" else None
        rowid = insert_claim(db, f"clm_new_{rng.getrandbits(40):010x}_{i}", statement, org_id="org",
                             subject_id=subject_id, visibility=vis, workspace_id=workspace_id, owner_id="u1",
                             kind="semantic_fact", confidence=0.9, trust="observed", trust_level=1,
                             valid_from=TIMES[0], created_at=TIMES[0], created_s=0, indexed=1)
        db.execute("INSERT INTO claims_fts(rowid, statement) VALUES(?, ?)", (rowid, statement))
        changes.inserted(rowid, subject_id, reader_tag(vis, workspace_id, "u1"), statement)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("blocks", [None, (3, 2)])
def test_the_incremental_build_writes_the_tables_the_whole_build_writes(seed, blocks, monkeypatch):
    if blocks:  # tiny blocks: every edit splits, empties, re-keys or appends to one
        monkeypatch.setattr(lexical.build, "BLOCK_POSTINGS", blocks[0])
        monkeypatch.setattr(lexical.build, "TAIL_POSTINGS", blocks[1])
    rng = random.Random(seed)
    db = _corpus(rng, rng.choice([0, 30, 400]))
    with db:
        lexical.build_lexical_index(db)
    for _ in range(3):
        changes = lexical.LexicalChanges()
        with db:
            _change_index(db, rng, changes, rng.choice([1, 5, 60]))
        with db:  # FTS5 writes its statistics out at commit
            stats = lexical.update_lexical_index(db, changes)
        assert stats["mode"] == "incremental"
        incremental = _lex_tables(db)
        with db:
            lexical.build_lexical_index(db)
        assert incremental == _lex_tables(db)  # every byte: statistics, rowids, inputs, df


def test_the_incremental_build_answers_as_the_fts5_query():
    rng = random.Random(5)
    db = _corpus(rng, 300)
    with db:
        lexical.build_lexical_index(db)
        changes = lexical.LexicalChanges()
        _change_index(db, rng, changes, 40)
    with db:
        lexical.update_lexical_index(db, changes)
    scope = CompileScope(Principal("org", "u1", "key", frozenset(), ("w1", "w2")), "s4", None, TIMES[3])
    where, params = scope.where()
    lexical.query._STATES.clear()
    for terms in (("deploy",), ("smoke", "test", "the"), ("alpha", "naive")):
        match = " OR ".join(f'"{t}"' for t in terms)
        expected = fts_candidates(db, where, params, match, 10)
        assert expected
        assert lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, terms, 10) == expected


def test_changes_that_do_not_account_for_the_index_rebuild_it_whole():
    rng = random.Random(3)
    db = _corpus(rng, 100)
    with db:
        lexical.build_lexical_index(db)
        changes = lexical.LexicalChanges()
        _change_index(db, rng, changes, 10)
    changes.rows.pop()  # a change the builder failed to report
    with db:
        stats = lexical.update_lexical_index(db, changes)
    assert stats["mode"] == "whole"
    incremental = _lex_tables(db)
    with db:
        lexical.build_lexical_index(db)
    assert incremental == _lex_tables(db)


def test_tiny_blocks_answer_as_the_fts5_query(monkeypatch):
    monkeypatch.setattr(lexical.build, "BLOCK_POSTINGS", 4)
    monkeypatch.setattr(lexical.build, "TAIL_POSTINGS", 3)
    rng = random.Random(7)
    db = _corpus(rng, 300)
    with db:
        lexical.build_lexical_index(db)
    for _ in range(3):
        changes = lexical.LexicalChanges()
        with db:
            _change_index(db, rng, changes, 30)
        with db:
            lexical.update_lexical_index(db, changes)
    assert db.execute("SELECT count(*) FROM lex_postings WHERE n < 4").fetchone()[0] > 10
    lexical.query._STATES.clear()
    assert _answers_as_fts5(db, rng, tries=40, k=20) > 20


def test_an_index_of_another_version_is_rebuilt_whole(monkeypatch):
    rng = random.Random(4)
    db = _corpus(rng, 50)
    with db:
        lexical.build_lexical_index(db)
        db.execute("UPDATE lex_stats SET version = version - 1")
        stats = lexical.update_lexical_index(db, lexical.LexicalChanges())
    assert stats["mode"] == "whole"
    assert db.execute("SELECT version FROM lex_stats").fetchone()[0] == lexical.LEX_VERSION


# -- the platform probe --------------------------------------------------------

def test_the_probe_picks_the_model_matching_this_platforms_fts5(monkeypatch):
    import math
    # this platform's own FTS5 first: every probed count has a model (x86_64
    # builds sum plainly; aarch64 builds fuse the odd last phrase)
    here = lexical.probe._probe_modes()
    assert set(here) == set(range(1, lexical.PROBE_MAX_PHRASES + 1)), here
    real = lexical.query._top_candidates

    def platform_with_fused_odd_sums(db, subject_id, readers, where, params, terms, k, fused_last=False):
        # stand-in for a platform whose FTS5 fuses odd sums: the fused model
        # answers as its FTS5 does, the plain model misses by an ulp on odd
        # counts. "As its FTS5 does" is this platform's FTS5, i.e. the model
        # the probe found here.
        got = real(db, subject_id, readers, where, params, terms, k, fused_last=here[len(terms)] == "fused")
        if got and len(terms) % 2 == 1 and len(terms) > 1 and not fused_last:
            return [(rowid, math.nextafter(bm25, 0.0)) for rowid, bm25 in got]
        return got

    monkeypatch.setattr(lexical.query, "_top_candidates", platform_with_fused_odd_sums)
    modes = lexical.probe._probe_modes()
    assert modes == {1: "plain", 2: "plain", 3: "fused", 4: "plain", 5: "fused", 6: "plain", 7: "fused",
                     8: "plain", 9: "fused"}
    monkeypatch.setattr(lexical.probe, "_modes", modes)
    assert (lexical.phrase_count_mode(10), lexical.phrase_count_mode(11)) == ("plain", "fused")


def test_a_phrase_count_no_model_matches_is_answered_by_fts5(monkeypatch):
    rng = random.Random(11)
    db = _corpus(rng, 200)
    with db:
        lexical.build_lexical_index(db)
    monkeypatch.setattr(lexical.probe, "_modes", {1: "plain", 2: "plain", 4: "plain", 6: "plain", 8: "plain"})
    scope = CompileScope(Principal("org", "u1", "key", frozenset(), ("w1", "w2")), "s1", None, TIMES[3])
    where, params = scope.where()
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy", "smoke", "test"), 10) is None
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy", "smoke"), 10) is not None
    assert lexical.top_candidates(db, "s1", reader_tags(scope.principal), where, params, ("deploy",) * 11, 10) is None  # beyond the probe


def _fused_model(db, where, params, terms, k):
    """A fused FTS5, written out: each phrase's contribution rounded and summed
    in order, the odd last one added by fma(ratio, idf, sum) with one rounding."""
    from fractions import Fraction
    n_rows, n_tokens = db.execute("SELECT n_rows, n_tokens FROM lex_stats").fetchone()
    avgdl = float(n_tokens) / float(n_rows)
    match = " OR ".join(f'"{t}"' for t in terms)
    rows = fts_candidates(db, where, params, match, 10**6)  # every in-scope match
    tokenizer = db.fts5_tokenizer(*lexical.FTS_TOKENIZER_ARGS)
    toks = [tokenizer(t.encode(), apsw.FTS5_TOKENIZE_QUERY, None, include_offsets=False,
                      include_colocated=False)[0] for t in terms]
    docs = {}
    for rowid, statement in db.execute("SELECT rowid, statement FROM claims WHERE indexed = 1"):
        doc = tokenizer(statement.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None, include_offsets=False,
                        include_colocated=False)
        docs[rowid] = doc
    df = {t: sum(1 for d in docs.values() if t in d) for t in set(toks)}
    out = []
    claim_id = dict(db.execute("SELECT rowid, claim_id FROM claims"))
    for rowid, _ in rows:
        doc, score = docs[rowid], 0.0
        for i, t in enumerate(toks):
            tf = doc.count(t)
            idf = lexical.idf_for(n_rows, df[t])
            if i == len(toks) - 1 and len(toks) % 2 == 1 and len(toks) > 1:
                ratio = (tf * (lexical.K1 + 1.0)) / (tf + lexical.K1 * (1 - lexical.B + lexical.B * len(doc) / avgdl))
                score = float(Fraction(ratio) * Fraction(idf) + Fraction(score))
            elif tf:
                score += lexical.contribution(idf, float(tf), float(len(doc)), avgdl)
        out.append((-1.0 * score, claim_id[rowid], rowid))
    return [(rowid, bm25) for bm25, _, rowid in sorted(out)[:k]]


@pytest.mark.parametrize("seed", range(6))
def test_the_fused_model_answers_as_a_fused_fts5_would(seed):
    rng = random.Random(100 + seed)
    db = _corpus(rng, rng.choice([60, 400, 1200]))
    with db:
        lexical.build_lexical_index(db)
    checked = 0
    for _ in range(25):
        scope = _scope(rng)
        plan = plan_query(_task(rng))
        if not plan.terms:
            continue
        k = rng.choice([1, 5, 20, 200])
        where, params = scope.where()
        got = lexical.query._top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms, k,
                                              fused_last=True)
        if got is None:  # a term FTS5 splits into several tokens
            continue
        assert got == _fused_model(db, where, params, plan.terms, k), (plan.terms, k)
        checked += 1
    assert checked > 10


# -- the libm the contributions were priced with --------------------------------

class _OtherLibm:
    """A C library whose log() is an ulp above this one's: what a snapshot
    built on another platform (an operator's laptop) may have been priced with."""

    def __getattr__(self, name):
        import math
        return getattr(math, name)

    @staticmethod
    def log(x):
        import math
        return math.nextafter(math.log(x), math.inf)


def _built_elsewhere(monkeypatch, db) -> str:
    """Build db's lex tables as the other platform would; return its fingerprint."""
    lexical.phrase_count_mode(1)  # this platform's probe, before log() changes
    with monkeypatch.context() as other:
        other.setattr(lexical.bm25, "math", _OtherLibm())
        other.setattr(lexical.libm, "math", _OtherLibm())
        other.setattr(lexical.libm, "_fingerprint", None)
        with db:
            lexical.build_lexical_index(db)
        fingerprint = lexical.platform_fingerprint()
    lexical.query._STATES.clear()
    return fingerprint


def test_the_fingerprint_of_the_building_platform_is_recorded():
    db = _corpus(random.Random(21), 30)
    with db:
        lexical.build_lexical_index(db)
    recorded = lexical.recorded_fingerprint(db)
    assert recorded == lexical.platform_fingerprint() and lexical.priced_here(recorded)
    machine, _, digest = recorded.partition(" log:")
    assert machine and len(digest) == 16
    assert not lexical.priced_here(None)  # a build that did not say


def test_an_index_built_under_another_libm_answers_as_this_platforms_fts5(monkeypatch):
    """Contributions are priced when queried, with the log() of the process
    serving (the one its FTS5 calls), so where the index was built does not
    matter."""
    rng = random.Random(23)
    db = _corpus(rng, 600)
    forged = _built_elsewhere(monkeypatch, db)
    assert forged != lexical.platform_fingerprint() and lexical.recorded_fingerprint(db) == forged
    assert _answers_as_fts5(db, rng, tries=60, k=50) > 30


def test_pricing_with_another_libm_would_be_wrong_here(monkeypatch):
    """The test above has teeth: the same lists priced with the other log()
    answer differently from this platform's FTS5."""
    rng = random.Random(23)
    db = _corpus(rng, 600)
    with db:
        lexical.build_lexical_index(db)
    lexical.phrase_count_mode(1)
    served = []
    for _ in range(60):
        scope = _scope(rng)
        plan = plan_query(_task(rng))
        if not plan.match:
            continue
        where, params = scope.where()
        expected = fts_candidates(db, where, params, plan.match, 50)
        with monkeypatch.context() as other:
            other.setattr(lexical.bm25, "math", _OtherLibm())
            lexical.query._STATES.clear()
            served.append((lexical.top_candidates(db, scope.subject_id, reader_tags(scope.principal), where, params, plan.terms, 50), expected))
        lexical.query._STATES.clear()
    assert sum(got is not None and got != expected for got, expected in served) > 10


STATEMENTS = ["Deploy smoke must pass before release.", "Smoke tests run on every deploy.",
              "Rollback the deploy when the smoke test fails.", "The migration runs before the deploy.",
              "Deploying on Friday needs two approvals.", "Release notes list every migration.",
              "A failed migration blocks the release.", "Smoke test the canary first.",
              "The cafe deploy pipeline is naive about migrations.", "Run the smoke test twice after a rollback."]
TASKS = ["deploy smoke", "release migration rollback", "smoke test canary deploy friday",
         "naive cafe pipeline", "migration", "two approvals release notes smoke"]


def _answer(response) -> list:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    return [(i["claim_id"], i["score"], i["score_components"]) for i in data["items"]] + [data["conflicts"]]


def test_a_compile_over_a_snapshot_built_elsewhere_answers_as_the_fts5_query(api, monkeypatch):
    from core.compile import retrieval
    key = api.key()
    for statement in STATEMENTS:
        api.observe(key, content=statement, claim={"statement": statement, "kind": "procedural",
                                                   "confidence": 0.9})
    lexical.phrase_count_mode(1)  # this platform's probe, before log() changes
    with monkeypatch.context() as other:  # an operator's rebuild, on a machine with another libm
        other.setattr(lexical.bm25, "math", _OtherLibm())
        other.setattr(lexical.libm, "math", _OtherLibm())
        other.setattr(lexical.libm, "_fingerprint", None)
        api.rebuild(key)
        forged = lexical.platform_fingerprint()
    lexical.query._STATES.clear()
    served = []
    real_top = retrieval.top_candidates

    def spy(db, *args, **kwargs):
        assert lexical.recorded_fingerprint(db) == forged  # the snapshot says where it was built
        got = real_top(db, *args, **kwargs)
        served.append(got is not None)
        return got

    monkeypatch.setattr(retrieval, "top_candidates", spy)
    answers = [_answer(api.compile(key, task)) for task in TASKS]
    assert served == [True] * len(TASKS)  # the candidate index answers, priced here
    monkeypatch.setattr(retrieval, "top_candidates", lambda *args, **kwargs: None)  # the FTS5 query path
    assert [_answer(api.compile(key, task)) for task in TASKS] == answers
    assert any(len(a) > 2 for a in answers)


def test_a_generation_built_elsewhere_needs_no_rebuild_here(api, monkeypatch):
    key = api.key()
    for statement in STATEMENTS[:4]:
        api.observe(key, content=statement, claim={"statement": statement, "kind": "procedural",
                                                   "confidence": 0.9})
    lexical.phrase_count_mode(1)
    with monkeypatch.context() as other:
        other.setattr(lexical.bm25, "math", _OtherLibm())
        other.setattr(lexical.libm, "math", _OtherLibm())
        other.setattr(lexical.libm, "_fingerprint", None)
        api.rebuild(key)
    assert not api.service.builder("acme").rebuild().published  # nothing new: nothing stored is priced


# -- infra/check-arm64.sh's platform part ---------------------------------------

def test_the_arm64_check_runs_here_and_finds_the_candidate_index_equal_to_fts5(tmp_path):
    """infra/arm64_check.py is what infra/check-arm64.sh runs inside an arm64
    root; here it runs on this platform, so a change to the candidate index's
    API or layout that breaks the checker fails here first."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    cross = tmp_path / "cross.sqlite"
    outputs = []
    for args in ([], ["--build-cross", str(cross)], ["--check-cross", str(cross)]):
        done = subprocess.run([sys.executable, "-m", "infra.arm64_check", "--queries", "40", *args], cwd=root,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert re.search(r"^compare: .*: 0 mismatches", outputs[0], re.M), outputs[0]
    assert re.search(r"queries, \d+ answered from the stored lists, 0 mismatches against FTS5 here", outputs[2]), \
        outputs[2]
