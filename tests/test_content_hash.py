"""The content hash: over exactly the canonical columns, the same whether
kept row by row or computed from every row."""

import apsw
import pytest

from core.snapshot import content_hash
from core.snapshot.schema import DDL
from tests.snapshot_rows import insert_claim

# columns that are caches of canonical ones or bookkeeping of the build
NOT_CANONICAL = {"claims": {"rowid", "trust_level", "created_s", "entry_id"}, "transitions": {"entry_id"}}


def _db() -> apsw.Connection:
    db = apsw.Connection(":memory:")
    db.execute(DDL)
    return db


@pytest.mark.parametrize("table", sorted(content_hash.CANONICAL_COLUMNS))
def test_every_column_of_a_canonical_table_is_hashed_unless_declared_derived(table):
    columns = [row[1] for row in _db().execute(f"PRAGMA table_info({table})")]
    expected = [c for c in columns if c not in NOT_CANONICAL.get(table, set())]
    assert sorted(content_hash.CANONICAL_COLUMNS[table]) == sorted(expected)


def _claim(db, claim_id, statement):
    insert_claim(db, claim_id, statement, org_id="o", subject_id="s", owner_id="u", confidence=0.5,
                 valid_from="t", created_at="t", created_s=0)


def test_sums_kept_row_by_row_equal_the_sums_of_the_rows():
    db = _db()
    _claim(db, "c1", "one")
    digests = content_hash.RowDigests(db, content_hash.scan(db))
    _claim(db, "c2", "two")
    db.execute("UPDATE claims SET status = 'revoked' WHERE claim_id = 'c1'")
    db.execute("INSERT INTO feedback(context_id, claim_id, feedback_id, outcome) VALUES('x', 'c2', 'f1', 'useful')"
               " ON CONFLICT(context_id, claim_id) DO UPDATE SET outcome = excluded.outcome")
    db.execute("INSERT INTO feedback(context_id, claim_id, feedback_id, outcome) VALUES('x', 'c2', 'f2', 'wrong')"
               " ON CONFLICT(context_id, claim_id) DO UPDATE SET outcome = excluded.outcome")
    db.execute("DELETE FROM claims WHERE claim_id = 'c2'")
    digests.close()
    assert digests.sums == content_hash.scan(db)
    _claim(db, "c3", "three")  # triggers gone: no longer tracked
    assert digests.sums != content_hash.scan(db)


def test_the_hash_does_not_depend_on_insertion_order():
    a, b = _db(), _db()
    for claim_id in ("c1", "c2", "c3"):
        _claim(a, claim_id, claim_id)
    for claim_id in ("c3", "c1", "c2"):
        _claim(b, claim_id, claim_id)
    assert content_hash.digest(content_hash.scan(a)) == content_hash.digest(content_hash.scan(b))


def test_the_hash_changes_with_any_canonical_field_and_not_with_derived_ones():
    db = _db()
    _claim(db, "c1", "one")
    before = content_hash.digest(content_hash.scan(db))
    db.execute("UPDATE claims SET created_s = 99")
    assert content_hash.digest(content_hash.scan(db)) == before
    db.execute("UPDATE claims SET feedback_total = 1")
    assert content_hash.digest(content_hash.scan(db)) != before


@pytest.mark.parametrize("stored", [None, "", "not json", '{"claims": "zz"}', '{"claims": "00"}'])
def test_unreadable_stored_sums_are_recomputed_not_trusted(stored):
    assert content_hash.decode(stored) is None
