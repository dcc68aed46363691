"""The erasures one rebuild carries out: find them, purge the ledger, finish.

A build (core/snapshot/build.py) asks ``pending()`` before it applies new
entries, purges the ledger with the previous generation open (``purge``:
it says where the targets' records are), applies the ``erasure`` entries
like any other (core/snapshot/erase.py deletes the rows), publishes a
generation with no older one kept, and only then marks the erasures
``complete`` with their counts. A build that fails before publishing leaves
them ``pending``: the next one does the work again (every step is
idempotent).
"""

from __future__ import annotations

import time
from typing import Callable

import apsw

from core.erasure import records
from core.erasure.purge import LedgerPurge, Purged, Target
from core.snapshot.erase import Requester
from core.snapshot.publish import purge_older_generations
from core.ids import uuid7_ms
from core.layout import RUN_SUFFIX, entry_key, erasure_key
from core.ledger import Ledger, encode
from core.instants import canonical, now_utc
from core.storage import PreconditionFailed, Store


def target_of(record: dict) -> Target:
    """The target of an erasure's status object (its id only while pending)."""
    return Target(record["erasure_id"], record["target"], record["org_id"], record["target_sha256"],
                  target_id=record.get("pending_target"), subject_tag=record.get("subject_tag"),
                  reader=record.get("requested_by"), workspaces=tuple(record.get("requested_workspaces") or ()))


def requester_of(record: dict) -> Requester:
    """Who asked, as far as reading goes: the counts it is told are of what it could read."""
    return Requester(record["requested_by"], tuple(record.get("requested_workspaces") or ()))


def told_counts(erased: dict, taken: dict) -> dict:
    """The counts ``GET /v1/erasures/{id}`` shows: of the records erased,
    those its requester could read (docs/api.md §6: a record the caller may not
    read reaches no count). The ledger's ``erasure_complete`` entry keeps
    the totals, for operators. ``taken``: the ledger purge's counts
    (``Purged.taken``)."""
    visible = erased.get("visible") or {}
    return {"observations": visible.get("observations", 0), "claims": visible.get("claims", 0),
            "embeddings": visible.get("embeddings", 0), "context_runs": taken.get("visible_context_runs", 0),
            "feedback": taken.get("visible_feedback", 0)}


class ErasureWork:
    def __init__(self, store: Store, org_id: str, skew_ms: int,
                 progress: Callable[[str], None] = lambda message: None):
        self.store = store
        self.org_id = org_id
        self.skew_ms = skew_ms
        self.progress = progress
        self.targets: list[tuple[dict, Target]] = []
        self.purged: dict[str, Purged] = {}  # erasure id -> what its ledger purge removed
        self.stored_at: dict[str, str] = {}  # erasure id -> key ``pending`` just stored its entry under
        self.ledger_purge: LedgerPurge | None = None  # this build's, for the packs compiled meanwhile

    def pending(self) -> list[dict]:
        """The organization's pending erasures, each with its ledger entry
        stored (an interrupted request may have stored only its status)."""
        pending = records.pending(self.store, self.org_id)
        ledger = Ledger(self.store)
        self.stored_at = {}
        for record in pending:
            hex_ = record["erasure_id"][len("era_"):]
            entry = {"entry_id": hex_, "type": "erasure", "org_id": self.org_id, "actor": record["requested_by"],
                     "recorded_at": record["requested_at"], "erasure_id": record["erasure_id"],
                     "target": record["target"], "target_sha256": record["target_sha256"]}
            try:
                self.stored_at[record["erasure_id"]] = ledger.store_entry(self.org_id, hex_, encode(entry))
            except PreconditionFailed:
                pass  # stored with the request, as it should be
        self.targets = [(r, target_of(r)) for r in pending]
        return pending

    def stranded(self, db: apsw.Connection, listed: list[str], min_age_ms: int = 60_000) -> list[str]:
        """Ledger keys of pending erasures a build would never meet: the
        request stored its status but its ``erasure`` entry did not land
        (the request answered 503), so no new entry names it. Each such
        entry is stored now (``pending``) and its key returned for the build
        to apply. Requests younger than ``min_age_ms`` are left to finish."""
        try:
            applied = {e for e, in db.execute("SELECT erasure_id FROM erasures")}
        except apsw.SQLError:  # a work file not built yet
            applied = set()
        now_ms = int(time.time() * 1000)
        listed_set = set(listed)
        stranded = [r for r in records.pending(self.store, self.org_id)
                    if r["erasure_id"] not in applied
                    and entry_key(self.org_id, r["erasure_id"][len("era_"):]) not in listed_set
                    and now_ms - uuid7_ms(r["erasure_id"][len("era_"):]) > min_age_ms]
        if not stranded:
            return []
        self.pending()
        # where each entry landed: a request over a minute old is a late
        # entry, stored under a fresh key behind a moved stub at its own,
        # which the build would pass over (core/ledger.py)
        return [self.stored_at.get(r["erasure_id"], entry_key(self.org_id, r["erasure_id"][len("era_"):]))
                for r in stranded]

    def requesters(self) -> dict[str, Requester]:
        """By erasure id, who asked for each pending erasure."""
        return {record["erasure_id"]: requester_of(record) for record, _ in self.targets}

    def purge(self, db: apsw.Connection | None) -> None:
        """Carry every pending erasure out in the ledger; ``db``: the
        previous generation (None when the build starts from empty)."""
        purge = self.ledger_purge = LedgerPurge(self.store, self.org_id, self.skew_ms, self.progress)
        for record, target in self.targets:
            self.progress(f"{self.org_id}: erasure {record['erasure_id']}: purging the ledger")
            self.purged[record["erasure_id"]] = purge.carry_out(target, db)

    def runs(self) -> dict[str, set[str]]:
        """By erasure id, the context runs its ledger purge stubbed."""
        return {record["erasure_id"]: set(target.runs) for record, target in self.targets}

    def found_anything(self, erasure_id: str) -> bool:
        """Whether this build's ledger purge of ``erasure_id`` found anything it names."""
        purged = self.purged.get(erasure_id)
        return purged is not None and purged.found_anything()

    def taken(self, erasure_id: str) -> dict:
        """The ledger purge's counts of one erasure this build carried out
        (``Purged.taken``); empty when it carried out none."""
        purged = self.purged.get(erasure_id)
        return purged.taken() if purged is not None else {}

    def taken_records(self, erasure_id: str) -> dict:
        """The observations and claims ``erasure_id`` took from the ledger,
        in this build or an earlier attempt (``Purged.taken_records``)."""
        purged = self.purged.get(erasure_id)
        return purged.taken_records if purged is not None else {}

    def carries(self, erasure_id: str) -> bool:
        """Whether ``erasure_id`` is pending, so this build carries it out
        (an erasure complete before it is only applied again by a replay)."""
        return any(record["erasure_id"] == erasure_id for record, _ in self.targets)

    def completes(self, erased: dict[str, dict] | None) -> bool:
        """Whether ``complete(erased)`` would mark a pending erasure complete
        (a replay from empty lists every erasure it enforced again; only a
        pending one needs the build to wait for copies: core/snapshot/workfiles.py).
        ``erased`` is None when the build carried no erasure out (a pending
        one whose entry it did not list waits for the next build)."""
        return bool(erased) and any(record["erasure_id"] in erased for record, _ in self.targets)

    def complete(self, erased: dict[str, dict]) -> list[dict]:
        """Mark every pending erasure complete (after the generation without
        their records was published) and append its content-free outcome to
        the ledger. ``erased``: by erasure id, what the build removed from
        the snapshot (core.snapshot.erase.Erased.as_counts)."""
        done = []
        completed_at = canonical(now_utc())
        ledger = Ledger(self.store)
        if self.ledger_purge is not None:
            # packs compiled from the generation before while this build ran
            self.ledger_purge.sweep_late([(target, self.purged[record["erasure_id"]])
                                          for record, target in self.targets
                                          if record["erasure_id"] in erased and record["erasure_id"] in self.purged])
        for record, target in self.targets:
            erasure_id = record["erasure_id"]
            if erasure_id not in erased:
                continue  # its entry was not applied by this build (the next one applies it)
            # the pointer records the purge's counts (``taken``) with the generation,
            # so a later build finishing this erasure (``recover``) tells the same
            taken = self.taken(erasure_id) or erased[erasure_id].get("purged") or {}
            totals = {**erased.get(erasure_id, {}), "context_runs": taken.get("context_runs", 0),
                      "feedback": taken.get("feedback", 0)}
            finished = records.complete(self.store, self.org_id, record,
                                        told_counts(erased.get(erasure_id, {}), taken), completed_at)
            # under the suffix no snapshot needs: the outcome is for people, not for builds
            ledger.append(self.org_id, "erasure_complete", {
                "erasure_id": erasure_id, "target_sha256": record["target_sha256"],
                "counts": {k: totals.get(k, 0) for k in records.COUNTED}, "told_counts": finished["counts"],
                "completed_at": completed_at},
                actor="rebuild", suffix=RUN_SUFFIX)
            done.append(finished)
        return done

    def recover(self, pointer: dict, before_complete: Callable[[], None] = lambda: None) -> None:
        """Finish the erasures the published generation carried out (its
        pointer records them) when the build that published it stopped
        short: every version of older generations is purged again (the
        purge after the swap may have failed), each status object's older
        versions too (the pending one named the target), and those still
        pending are marked complete with the counts the pointer records.
        Every step is idempotent; this runs until the next publication."""
        erased = pointer["erasures"]
        for erasure_id in erased:
            self.store.purge_history(erasure_key(self.org_id, erasure_id[len("era_"):]))
        still = [r for r in records.pending(self.store, self.org_id) if r["erasure_id"] in erased]
        if still:
            # (only then: once complete, a later build's upload may be on its way)
            purge_older_generations(self.store, self.org_id, pointer)
            # pending until complete: if the wait fails, this build still
            # carries them (core/snapshot/build.py names them again)
            self.targets = [(r, target_of(r)) for r in still]
            before_complete()  # (the build's work files: core/snapshot/workfiles.py, ``drain``)
            # The build that published stopped before its late sweep (or in
            # it): packs compiled from the older generation meanwhile may
            # hold what it erased. The ledger purge again, over the whole
            # ledger (what is done is known by its stubs and counted as
            # before), stubs them, whenever they were compiled.
            purge = LedgerPurge(self.store, self.org_id, self.skew_ms, self.progress)
            for record, target in self.targets:
                self.progress(f"{self.org_id}: erasure {record['erasure_id']}: purging the ledger again")
                self.purged[record["erasure_id"]] = purge.carry_out(target, None)
            self.complete(erased)
            self.targets = []  # complete now: this build carries none of them out again


def reapply(store: Store, org_id: str, progress: Callable[[str], None] = lambda message: None) -> dict:
    """Carry every completed erasure of the organization out in the ledger
    again, by hash alone (no completed erasure keeps the id it erased):
    what an operator runs after restoring ledger objects from a backup made
    before an erasure. The served generation needs nothing: the next build
    enforces every erasure on whatever it applies (core/snapshot/erase.py)."""
    purge = LedgerPurge(store, org_id, 0, progress)
    done = {}
    for record in records.completed(store, org_id):
        purged = purge.carry_out(target_of(record), None)
        done[record["erasure_id"]] = {"entries_stubbed": purged.entries_stubbed,
                                      "entries_rewritten": purged.entries_rewritten,
                                      "context_runs": purged.context_runs, "claim_heads": purged.claim_heads}
    return {"org_id": org_id, "erasures": done}
