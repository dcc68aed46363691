"""Erasure, as a snapshot applies it: the rows of what an erasure names, gone.

An ``erasure`` ledger entry names its target by hash only
(``core.erasure.records.target_sha256``): a subject, or one observation. Its
application deletes, among records created before the erasure:

- **a subject**: its observations and claims, and with each claim its
  sources, transitions and feedback;
- **an observation**: the observation, every claim that it alone supports
  (as above), and its place in the evidence of the claims it does not alone
  support; their trust is capped again by the strongest supporting evidence
  that remains (their visibility needs nothing: it was never wider than the
  narrowest evidence, and removing evidence only widens that bound).

A claim written after the erasure was asked is kept, but never its citation
of an erased observation (``_unlink``), and it goes if that was all its
support: it cited evidence already being erased, and no claim is served
without evidence.

The erasure is recorded in the ``erasures`` table and stays a standing rule:
a record it names that arrives later (a late entry, or a ledger object
restored from a backup made before the erasure) is never applied again
(``Erasures.enforce``). Rows are deleted with SQLite's ``secure_delete`` on
(the build connection sets it), the FTS5 index is merged afterwards so no
segment keeps a deleted claim's terms, and the file is rewritten whole
(``finish``), so no free page keeps a copy either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import apsw

from core.domain import TRUST_LEVELS, capped_trust
from core.erasure.records import counted_hash, target_sha256
from core.ledger import observations_in
from core.lexical import LexicalChanges
from core.scope import can_read, reader_tag


@dataclass
class Erased:
    """What one erasure removed from the snapshot, by record type; and, as
    ``visible_*``, how many of those its requester could read: the counts
    it is told (a record the caller may not read reaches no count)."""
    observations: int = 0
    claims: int = 0
    feedback: int = 0
    embeddings: int = 0
    visible_observations: int = 0
    visible_claims: int = 0
    visible_embeddings: int = 0
    # statements of erased claims the requester could read (one cached vector may serve several claims)
    read_statements: set = field(default_factory=set, repr=False, compare=False)
    # ``counted_hash`` of each observation and claim counted, so none counts twice
    counted: set = field(default_factory=set, repr=False, compare=False)

    def count_taken(self, records: dict, elsewhere: set) -> None:
        """Count the observations and claims the same erasure took from the
        ledger (``core.erasure.purge.Purged.taken_records``: by hash, (kind,
        readable)) that no deletion of this build counted, here or for
        another erasure (``elsewhere``, which this adds to): a build never
        applies a record whose entry it read already stubbed, by an earlier
        attempt or a build racing it, or listed after it began. Without this
        an erasure of records no generation held yet could read 0."""
        for sha, (kind, readable) in sorted(records.items()):
            if sha in self.counted or sha in elsewhere:
                continue
            self.counted.add(sha)
            elsewhere.add(sha)
            if kind == "observations":
                self.observations += 1
                self.visible_observations += readable
            else:
                self.claims += 1
                self.visible_claims += readable

    def as_counts(self) -> dict:
        return {"observations": self.observations, "claims": self.claims, "feedback": self.feedback,
                "embeddings": self.embeddings,
                "visible": {"observations": self.visible_observations, "claims": self.visible_claims,
                            "embeddings": self.visible_embeddings}}


@dataclass(frozen=True)
class Requester:
    """Who asked for an erasure, as far as reading goes (core.scope.can_read)."""
    principal_id: str
    workspaces: tuple = ()


class Erasures:
    """The organization's erasures as one build applies and enforces them.
    ``requesters``: by erasure id, who asked for each pending one."""

    def __init__(self, db: apsw.Connection, org_id: str, requesters: dict[str, Requester] | None = None):
        self.db = db
        self.org_id = org_id
        self.requesters = requesters or {}
        # by erasure id, the context runs its ledger purge stubbed (this build
        # carries it out): feedback on them goes with them, on any claim
        self.runs: dict[str, set[str]] = {}
        self.requester: Requester | None = None  # of the erasure being applied
        self.standing = [tuple(r) for r in db.execute("SELECT erasure_id, target, target_sha256 FROM erasures")]
        self.applied: dict[str, Erased] = {}  # erasure id -> what applying it removed, this build
        self.erased = Erased()  # the erasure being applied
        self._hashes: dict[tuple[str, str], str] = {}

    def _hash(self, target: str, target_id: str) -> str:
        key = (target, target_id)
        value = self._hashes.get(key)
        if value is None:
            value = self._hashes[key] = target_sha256(self.org_id, target, target_id)
        return value

    # -- the standing rule ----------------------------------------------------

    # -- applying an erasure entry ---------------------------------------------

    def apply(self, entry: dict, touched: set[str], lexical: LexicalChanges) -> None:
        erasure_id, target, sha = entry["erasure_id"], entry["target"], entry["target_sha256"]
        self.db.execute("INSERT OR IGNORE INTO erasures(erasure_id, target, target_sha256) VALUES(?, ?, ?)",
                        (erasure_id, target, sha))
        if (erasure_id, target, sha) not in self.standing:
            self.standing.append((erasure_id, target, sha))
        self._erase(erasure_id, target, sha, touched, lexical)
        for context_id in sorted(self.runs.get(erasure_id, ())):
            self._drop_feedback(context_id, touched)

    def _drop_feedback(self, context_id: str, touched: set[str]) -> None:
        """Feedback on a pack that went, on a claim that stays: the claim's
        utility no longer counts it."""
        for claim_id, in self.db.execute("DELETE FROM feedback WHERE context_id = ? RETURNING claim_id",
                                         (context_id,)).fetchall():
            self.erased.feedback += 1
            touched.add(claim_id)

    def enforce(self, entry: dict, touched: set[str], lexical: LexicalChanges) -> None:
        """An entry just applied holds a record an earlier-recorded erasure
        names (a late entry, a restored backup): erase again what it names."""
        if entry.get("type") == "feedback":
            # written to a pack while its erasure was pending, read by this
            # build before the purge stubbed it
            if any(entry.get("context_id") in runs for runs in self.runs.values()):
                self._drop_feedback(entry["context_id"], touched)
            return
        observations = observations_in(entry)
        claims = list(entry.get("claims", [])) + ([entry["new_claim"]] if entry.get("new_claim") else [])
        for erasure_id, target, sha in list(self.standing):
            limit = erasure_id[len("era_"):]
            named = any(o["observation_id"][len("obs_"):] < limit and self._names(target, sha, o["subject_id"],
                                                                                o["observation_id"])
                        for o in observations)
            # a claim named itself, or one (of any age) citing evidence the erasure took
            named = named or any(
                (c["claim_id"][len("claim_"):] < limit and self._names(target, sha, c["subject_id"], None))
                or any(s["observation_id"][len("obs_"):] < limit
                       and self._names(target, sha, c["subject_id"], s["observation_id"]) for s in c["sources"])
                for c in claims)
            if named:
                self._erase(erasure_id, target, sha, touched, lexical)

    def _names(self, target: str, sha: str, subject_id: str, observation_id: str | None) -> bool:
        if target == "subject":
            return self._hash("subject", subject_id) == sha
        return observation_id is not None and self._hash("observation", observation_id) == sha

    def _erase(self, erasure_id: str, target: str, sha: str, touched: set[str], lexical: LexicalChanges) -> None:
        limit = erasure_id[len("era_"):]
        db = self.db
        self.erased = self.applied.setdefault(erasure_id, Erased())
        self.requester = self.requesters.get(erasure_id)
        if target == "subject":
            subjects = {s for s, in db.execute(
                "SELECT subject_id FROM observations UNION SELECT subject_id FROM claims")}
            matched = [s for s in subjects if self._hash("subject", s) == sha]
            for subject_id in matched:
                for claim_id, in db.execute("SELECT claim_id FROM claims WHERE subject_id = ? AND claim_id < ?",
                                            (subject_id, "claim_" + limit)).fetchall():
                    self._delete_claim(claim_id, lexical)
                self._deleted_observations(
                    "DELETE FROM observations WHERE subject_id = ? AND observation_id < ?"
                    " RETURNING visibility, workspace_id, owner_id, observation_id", (subject_id, "obs_" + limit))
                # a claim about the subject written after the erasure was asked
                # is kept, but not its citations of the erased observations
                for observation_id, in db.execute(
                        "SELECT DISTINCT s.observation_id FROM claim_sources s JOIN claims c USING(claim_id)"
                        " WHERE c.subject_id = ? AND s.observation_id < ?",
                        (subject_id, "obs_" + limit)).fetchall():
                    self._unlink(observation_id, touched, lexical)
            return
        # one observation: it is found by hash among the observations and the sources that cite it
        ids = {o for o, in db.execute("SELECT observation_id FROM observations"
                                      " UNION SELECT observation_id FROM claim_sources")}
        for observation_id in [o for o in ids if o < "obs_" + limit and self._hash("observation", o) == sha]:
            self._deleted_observations(
                "DELETE FROM observations WHERE observation_id = ?"
                " RETURNING visibility, workspace_id, owner_id, observation_id",
                (observation_id,))
            self._unlink(observation_id, touched, lexical)

    def _unlink(self, observation_id: str, touched: set[str], lexical: LexicalChanges) -> None:
        """An erased observation leaves the evidence of every claim citing it,
        whenever the claim was written: a claim it alone supports goes (no
        claim is served without evidence), the others are capped again."""
        db = self.db
        citing = [c for c, in db.execute("SELECT DISTINCT claim_id FROM claim_sources WHERE observation_id = ?",
                                         (observation_id,)).fetchall()]
        for claim_id in citing:
            others = db.execute("SELECT count(*) FROM claim_sources WHERE claim_id = ? AND relation = 'supports'"
                                " AND observation_id != ?", (claim_id, observation_id)).fetchone()[0]
            if others == 0:
                self._delete_claim(claim_id, lexical)
                continue
            db.execute("DELETE FROM claim_sources WHERE claim_id = ? AND observation_id = ?",
                       (claim_id, observation_id))
            self._cap_trust(claim_id)
            touched.add(claim_id)

    def _cap_trust(self, claim_id: str) -> None:
        """A claim's trust never exceeds its strongest remaining supporting evidence."""
        db = self.db
        supports = [t for t, in db.execute(
            "SELECT o.trust FROM claim_sources s JOIN observations o USING(observation_id)"
            " WHERE s.claim_id = ? AND s.relation = 'supports'", (claim_id,))]
        trust, = db.execute("SELECT trust FROM claims WHERE claim_id = ?", (claim_id,)).fetchone()
        capped = capped_trust(trust, supports)
        if capped != trust:
            db.execute("UPDATE claims SET trust = ?, trust_level = ? WHERE claim_id = ?",
                       (capped, TRUST_LEVELS[capped], claim_id))

    def _delete_claim(self, claim_id: str, lexical: LexicalChanges) -> None:
        db = self.db
        row = db.execute("SELECT rowid, subject_id, statement, indexed, visibility, workspace_id, owner_id"
                         " FROM claims WHERE claim_id = ?", (claim_id,)).fetchone()
        if row is None:
            return
        rowid, subject_id, statement, indexed = row[:4]
        visible = self._readable(row[4:])
        if indexed:
            db.execute("DELETE FROM claims_fts WHERE rowid = ?", (rowid,))
            lexical.deleted(rowid, subject_id, reader_tag(*row[4:]), statement)
        # (its vector row goes with the whole vector index: clear_indexes)
        db.execute("DELETE FROM claim_sources WHERE claim_id = ?", (claim_id,))
        db.execute("DELETE FROM transitions WHERE claim_id = ?", (claim_id,))
        self.erased.feedback += self._count("DELETE FROM feedback WHERE claim_id = ? RETURNING 1", (claim_id,))
        db.execute("DELETE FROM claims WHERE rowid = ?", (rowid,))
        self.erased.claims += 1
        self.erased.visible_claims += visible
        self.erased.counted.add(counted_hash(self.org_id, claim_id))
        self._forget_embedding(statement, visible)

    def _forget_embedding(self, statement: str, visible: bool) -> None:
        """Drop a statement's cached vector once no remaining claim says it.
        The requester is told of it if it could read any of the erased
        claims saying it, whichever of them went last."""
        db = self.db
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'embed_cache'").fetchone() is None:
            return
        if visible:
            self.erased.read_statements.add(statement)
        if db.execute("SELECT 1 FROM claims WHERE statement = ? LIMIT 1", (statement,)).fetchone() is not None:
            return
        visible = statement in self.erased.read_statements
        from core.vectors.embedder import text_sha256  # only where vectors were built
        dropped = self._count("DELETE FROM embed_cache WHERE text_sha256 = ? RETURNING 1", (text_sha256(statement),))
        self.erased.embeddings += dropped
        self.erased.visible_embeddings += dropped if visible else 0

    def _deleted_observations(self, sql: str, params) -> None:
        """Run a DELETE … RETURNING visibility, workspace_id, owner_id, observation_id and count its rows."""
        rows = self.db.execute(sql, params).fetchall()
        self.erased.observations += len(rows)
        self.erased.visible_observations += sum(self._readable(r[:3]) for r in rows)
        self.erased.counted.update(counted_hash(self.org_id, r[3]) for r in rows)

    def _readable(self, row) -> bool:
        """Whether the requester of the erasure being applied could read a
        record of this (visibility, workspace_id, owner_id). An erasure
        enforced again on a late record has no requester here: its counts
        were told when it completed."""
        return self.requester is not None and can_read(self.requester, *row)

    def _count(self, sql: str, params) -> int:
        return len(self.db.execute(sql, params).fetchall())


def clear_indexes(db: apsw.Connection) -> None:
    """After an erasure: merge the FTS5 index into one segment (no segment
    keeps a deleted claim's terms) and drop the vector index (vec0 chunks
    keep deleted vectors' bytes, and ``claims_signs`` their sign bits; the
    build's vector sync rebuilds both from
    the embedding cache, embedding nothing). The build rewrites the file
    whole (``VACUUM``) last, so no free page keeps a copy either."""
    with db:
        db.execute("INSERT INTO claims_fts(claims_fts) VALUES('optimize')")
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'claims_vec'").fetchone() is not None:
            from core.vectors.index import load_sqlite_vec  # only where vectors were built
            load_sqlite_vec(db)  # a vec0 table is dropped through its module
            db.execute("DROP TABLE claims_vec")
        db.execute("DROP TABLE IF EXISTS claims_signs")  # the sign bits of the same vectors
