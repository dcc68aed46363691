"""The compile hot path's SQL keeps its query plans: no table scans.

A small organization is imported and published through the real code path
(``core.writes.importer.import_file`` → ledger →
``core.snapshot.build.SnapshotBuilder``, which also runs ``PRAGMA optimize``),
and the published file is opened the way the serving side opens it
(``core.snapshot.reader.open_readonly``). The candidate
step (``lexical_candidates``: the postings of ``core.lexical``), the bare FTS5
candidate query (``fts_candidates``) and hydrate then run for real with an
apsw exec tracer that records every statement and its bindings; each recorded
statement is then ``EXPLAIN QUERY PLAN``-ed with those same bindings. So the
plans checked are those of the SQL the code actually sends, not of a copy.

What must hold:

- ``claims`` is reached by its INTEGER PRIMARY KEY (rowid), never scanned and
  never through ``claims_scope`` or another index (the scope predicates are
  filters on the few candidate rows, not a way in);
- ``claims_fts`` is entered through its virtual-table index with a MATCH
  constraint (FTS5's ``idxStr`` holds ``M``), not a full-table scan;
- ``lex_postings`` is looked up by its primary key ``(subject_id, reader, term)``,
  never scanned; ``lex_stats`` and the FTS5 averages record by their keys.
"""

from __future__ import annotations

import json
import re

import apsw
import pytest

from core.writes.importer import import_file
from core.instants import canonical, now_utc
from core.keys import Principal
from core.compile.planning import plan_query
from core.snapshot.build import SnapshotBuilder
from core.snapshot.pointer import read_pointer
from core.compile.retrieval import CompileScope, fts_candidates, hydrate, lexical_candidates
from core.lexical import query as lexical_query
from core.snapshot.reader import Snapshot, open_readonly
from core.storage.local import LocalStore

ORG = "acme"
SUBJECTS = ("alice", "bob", "carol")
WORDS = ("deploy", "friday", "rollback", "database", "migration", "smoke", "test", "canary", "latency",
         "budget", "incident", "review", "schema", "backup", "cache", "queue", "alert", "release")
TASKS = ("can we deploy on friday", "database migration rollback plan", "smoke test the canary release",
         "why did the cache alert fire")


# "even": three subjects of 200 claims. "skewed": alice holds 3,000 claims and
# 150 other subjects 2 each; the statistics PRAGMA optimize writes then price
# a subject at a few rows, and the scope index looked cheaper than the rowid
# for alice's candidates: hydrate walked her whole index (8 ms a query at 50k)
SHAPES = {"even": (600, lambda i: SUBJECTS[i % len(SUBJECTS)]),
          "skewed": (3300, lambda i: "alice" if i < 3000 else f"subject_{i % 150}")}


def _line(i: int, subject_of=lambda i: SUBJECTS[i % len(SUBJECTS)]) -> dict:
    words = [WORDS[(i * 7 + k * k) % len(WORDS)] for k in range(3 + i % 9)]
    statement = " ".join(words).capitalize() + "."
    project = "p1" if i % 4 == 0 else None
    body = {"subject_id": subject_of(i), "kind": "user_statement", "content": statement,
            "trust": "asserted", "visibility": "organization", "source": {"type": "tool", "ref": f"t#{i}"},
            "claim": {"statement": statement, "kind": "semantic_fact", "confidence": 0.9}}
    if project:
        body["project_id"] = project
    return body


@pytest.fixture(scope="module", params=list(SHAPES))
def snapshot(request, tmp_path_factory):
    count, subject_of = SHAPES[request.param]
    root = tmp_path_factory.mktemp("plan")
    store = LocalStore(str(root / "store"))
    ndjson = root / "import.ndjson"
    ndjson.write_text("".join(json.dumps(_line(i, subject_of)) + "\n" for i in range(count)))
    importer = Principal(ORG, "importer", "cli", frozenset({"admin", "memory:write", "memory:verify"}), ())
    import_file(store, importer, str(ndjson), batch_size=100)
    result = SnapshotBuilder(store, ORG, work_dir=str(root / "work")).rebuild()
    assert result.claim_count == count
    pointer, _ = read_pointer(store, ORG)
    path = str(root / "serving.sqlite")
    store.download_file(pointer["snapshot_key"], path)
    db = open_readonly(path)
    yield Snapshot(ORG, pointer["generation"], pointer, path, db, "")
    db.close()


SCOPES = {
    "organization": Principal(ORG, "reader", "k1", frozenset({"context:compile"}), ()),
    "with-workspaces": Principal(ORG, "reader", "k2", frozenset({"context:compile"}), ("w1", "w2")),
}


def _scope(name: str, project: str | None) -> CompileScope:
    return CompileScope(SCOPES[name], "alice", project, canonical(now_utc()))


SCOPE_CASES = [("organization", None), ("with-workspaces", None), ("organization", "p1")]


def _traced(db: apsw.Connection, run) -> list[tuple[str, tuple]]:
    """(sql, bindings) of every statement ``run()`` executes on ``db``."""
    seen: list[tuple[str, tuple]] = []

    def tracer(cursor, sql, bindings):
        seen.append((sql, tuple(bindings) if bindings is not None else ()))
        return True

    db.exec_trace = tracer
    try:
        run()
    finally:
        db.exec_trace = None
    return seen


def _plan(db: apsw.Connection, sql: str, bindings: tuple) -> list[str]:
    """The EXPLAIN QUERY PLAN detail lines of one statement."""
    return [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, bindings)]


def _claims_access(plan: list[str]) -> list[str]:
    return [line for line in plan if re.search(r"\b(SCAN|SEARCH) (claims|c)\b", line)]


def assert_claims_by_rowid(plan: list[str], sql: str) -> None:
    access = _claims_access(plan)
    assert access, f"claims is not read at all?\nSQL: {sql}\nplan: {plan}"
    for line in access:
        assert not line.startswith("SCAN"), f"claims is scanned: {line!r}\nSQL: {sql}\nplan: {plan}"
        assert "USING INTEGER PRIMARY KEY (rowid=?)" in line, (
            f"claims is not reached by its rowid: {line!r}\nSQL: {sql}\nplan: {plan}")


def assert_fts_match_index(plan: list[str], sql: str) -> None:
    fts = [line for line in plan if "claims_fts" in line]
    assert len(fts) == 1, f"expected one claims_fts access\nSQL: {sql}\nplan: {plan}"
    m = re.search(r"VIRTUAL TABLE INDEX (\d+):(\S*)", fts[0])
    assert m, f"claims_fts is not read through its virtual-table index: {fts[0]!r}"
    assert "M" in m.group(2), f"the FTS5 index is used without its MATCH constraint: {fts[0]!r}\nplan: {plan}"


def _statements(seen, pattern: str) -> list[tuple[str, tuple]]:
    return [(sql, b) for sql, b in seen if re.search(pattern, sql)]


# -- the bare FTS5 candidate query ------------------------------------------------------

@pytest.mark.parametrize("scope_name,project", SCOPE_CASES)
def test_fts_candidate_query_enters_by_match_and_reaches_claims_by_rowid(snapshot, scope_name, project):
    scope = _scope(scope_name, project)
    where, params = scope.where()
    match = plan_query(TASKS[0]).match
    seen = _traced(snapshot.db, lambda: fts_candidates(snapshot.db, where, params, match))
    (sql, bindings), = _statements(seen, r"MATCH")
    plan = _plan(snapshot.db, sql, bindings)
    assert_fts_match_index(plan, sql)
    assert_claims_by_rowid(plan, sql)
    assert not any("claims_scope" in line for line in plan), plan


def test_fts_candidate_query_returns_rows_here(snapshot):
    """Guard the guard: the plans above are of a query that finds things."""
    where, params = _scope("organization", None).where()
    assert fts_candidates(snapshot.db, where, params, plan_query(TASKS[0]).match)


# -- hydrate ----------------------------------------------------------------------------

# With a literal ``c.rowid IN (?, ?, ...)`` list SQLite priced a range of the
# ``claims_scope`` index lower when a subject holds about as many claims as
# there are candidates; hydrate binds the ids as one ``carray`` to keep rowid
# lookups in every scope.
HYDRATE_CASES = SCOPE_CASES


@pytest.mark.parametrize("scope_name,project", HYDRATE_CASES)
def test_hydrate_reads_claims_by_rowid_not_by_scope_index(snapshot, scope_name, project):
    scope = _scope(scope_name, project)
    where, params = scope.where()
    rowids = [r for r, _ in fts_candidates(snapshot.db, where, params, plan_query(TASKS[1]).match)]
    assert len(rowids) > 5
    seen = _traced(snapshot.db, lambda: hydrate(snapshot, scope, rowids))
    (sql, bindings), = _statements(seen, r"FROM claims c (NOT INDEXED )?WHERE c\.rowid IN carray")
    plan = _plan(snapshot.db, sql, bindings)
    assert_claims_by_rowid(plan, sql)
    assert not any("claims_scope" in line for line in plan), plan


# -- the candidate step: core.lexical postings ----------------------------------------------

@pytest.mark.parametrize("scope_name,project", SCOPE_CASES)
def test_candidate_step_answers_from_postings(snapshot, scope_name, project):
    """The postings path runs here (not the FTS5 fallback), or the plan tests
    below would check nothing."""
    scope = _scope(scope_name, project)
    where, params = scope.where()
    for task in TASKS:
        plan = plan_query(task)
        _unpriced(snapshot)
        seen = _traced(snapshot.db, lambda: lexical_candidates(snapshot, scope, plan))
        assert _statements(seen, r"\blex_postings\b"), f"no postings lookup for {task!r}: {seen}"
        assert not _statements(seen, r"MATCH"), f"{task!r} fell back to the FTS5 query"
        assert lexical_candidates(snapshot, scope, plan) == fts_candidates(snapshot.db, where, params, plan.match)


def _unpriced(snapshot) -> None:
    """Forget the lists this connection priced, so the next query reads them."""
    lexical_query._STATES.pop(snapshot.db, None)


def test_postings_are_looked_up_by_primary_key(snapshot):
    scope = _scope("organization", None)
    for task in TASKS:
        plan = plan_query(task)
        _unpriced(snapshot)
        seen = _traced(snapshot.db, lambda: lexical_candidates(snapshot, scope, plan))
        for sql, bindings in _statements(seen, r"\blex_postings\b"):
            lines = _plan(snapshot.db, sql, bindings)
            access = [line for line in lines if "lex_postings" in line]
            assert access and all(line.startswith("SEARCH lex_postings USING PRIMARY KEY (subject_id=? AND reader=? AND term=?)")
                                  for line in access), f"lex_postings not by its key\nSQL: {sql}\nplan: {lines}"
        for sql, bindings in _statements(seen, r"FROM lex_terms"):
            lines = _plan(snapshot.db, sql, bindings)
            assert all(line.startswith("SEARCH lex_terms USING PRIMARY KEY (term=?)") for line in lines
                       if "lex_terms" in line), f"lex_terms not by its key\nSQL: {sql}\nplan: {lines}"


def test_candidate_scope_checks_reach_claims_by_rowid(snapshot):
    """core.lexical's per-candidate scope check (rowid IN carray(?) AND scope)."""
    checked = 0
    for scope_name, project in SCOPE_CASES:
        scope = _scope(scope_name, project)
        for task in TASKS:
            plan = plan_query(task)
            seen = _traced(snapshot.db, lambda: lexical_candidates(snapshot, scope, plan))
            for sql, bindings in _statements(seen, r"FROM claims c (NOT INDEXED )?WHERE"):
                lines = _plan(snapshot.db, sql, bindings)
                assert_claims_by_rowid(lines, sql)
                assert not any("claims_scope" in line for line in lines), lines
                checked += 1
    assert checked, "no scope check ran: the test exercised nothing"


def test_postings_statistics_are_read_by_key(tmp_path, snapshot):
    """lex_stats and the FTS5 averages record (read once per connection)."""
    db = open_readonly(snapshot.path)  # a new connection: its lexical state is built on first use
    try:
        fresh = Snapshot(ORG, snapshot.generation, snapshot.pointer, snapshot.path, db, "")
        scope = _scope("organization", None)
        seen = _traced(db, lambda: lexical_candidates(fresh, scope, plan_query(TASKS[0])))
        stats = _statements(seen, r"FROM lex_stats")
        averages = _statements(seen, r"FROM claims_fts_data")
        assert stats and averages, seen
        for sql, bindings in stats + averages:
            lines = _plan(db, sql, bindings)
            assert lines and all(line.startswith("SEARCH") and "INTEGER PRIMARY KEY (rowid=?)" in line
                                 for line in lines), f"not a key lookup\nSQL: {sql}\nplan: {lines}"
    finally:
        db.close()


# -- few or none in scope ----------------------------------------------------------------

SPARSE_SCOPES = {
    "a-project-with-no-claims": lambda: CompileScope(SCOPES["organization"], "alice", "p_none",
                                                     canonical(now_utc())),
    "an-instant-before-every-claim": lambda: CompileScope(SCOPES["organization"], "alice", None,
                                                          "1971-01-01T00:00:00.000000Z"),
}


@pytest.mark.parametrize("name", list(SPARSE_SCOPES))
def test_when_no_match_is_in_scope_the_candidates_are_still_exactly_the_fts5_querys(snapshot, name):
    scope = SPARSE_SCOPES[name]()
    where, params = scope.where()
    for task in TASKS:
        plan = plan_query(task)
        assert lexical_candidates(snapshot, scope, plan) == fts_candidates(snapshot.db, where, params, plan.match) == []
