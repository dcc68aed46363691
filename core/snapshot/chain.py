"""Getting a generation's file from the store: its whole file, then its deltas.

A pointer (or a history entry) names a whole file and the deltas after it
(``core.snapshot.pointer``). ``fetch_whole`` downloads the whole file,
checks its sha256, and applies every delta, each checked by page digest
(``core.snapshot.delta``). ``steps_after`` says which deltas a holder of
some generation still needs — none when it holds the one named, None when
what it holds is not on the chain — and ``advance`` applies them to a copy
it made. Both raise ``ChainBroken`` on anything missing or not as named;
the caller then takes the other road (a reader: the whole file; a build:
the ledger), never a file that did not verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.snapshot import delta
from core.snapshot.pages import PageDigests, hash_file
from core.snapshot.pointer import deltas_of, full_of
from core.storage import ObjectNotFound, Store


class ChainBroken(Exception):
    """A whole file or delta the chain names is missing or not as named.
    Its text reads after "generation <n> " (e.g. "fails its sha256")."""


@dataclass
class Fetched:
    """What getting a generation cost: bytes downloaded, deltas applied."""
    downloaded: int = 0
    deltas: int = 0
    notes: list[str] = field(default_factory=list)


def steps_after(record: dict, digest: str | None) -> list[dict] | None:
    """The deltas taking the file whose page digest is ``digest`` to the
    generation ``record`` names, oldest first; None when that file is on no
    step of the chain (another chain, or nothing held)."""
    if digest is None:
        return None
    if digest == record.get("digest"):
        return []
    steps = deltas_of(record)
    if digest == full_of(record).get("digest"):
        return steps
    for i, step in enumerate(steps):
        if step["digest"] == digest:
            return steps[i + 1:]
    return None


def advance(store: Store, steps: list[dict], path: str, digests: PageDigests, fetched: Fetched) -> PageDigests:
    """Apply ``steps`` in place to the file at ``path`` (page digests
    ``digests``): the new digests, or ``ChainBroken``."""
    for step in steps:
        try:
            raw = store.get(step["key"]).body
        except ObjectNotFound:
            raise ChainBroken(f"cannot be made: the delta of generation {step['generation']} is missing "
                              "from the store") from None
        fetched.downloaded += len(raw)
        try:
            digests = delta.apply(raw, path, digests, expect_digest=step["digest"])
        except delta.DeltaRefused as exc:
            raise ChainBroken(f"cannot be made: the delta of generation {step['generation']} was refused "
                              f"({exc})") from None
        fetched.deltas += 1
    return digests


def fetch_whole(store: Store, record: dict, path: str, fetched: Fetched | None = None) -> PageDigests:
    """Download the whole file ``record`` starts from into ``path``, verify
    it, and apply its deltas: the generation's page digests."""
    fetched = fetched if fetched is not None else Fetched()
    full = full_of(record)
    whose = "" if full["generation"] == record["generation"] else \
        f"cannot be made: the file of generation {full['generation']} "
    try:
        store.download_file(full["snapshot_key"], path)
    except ObjectNotFound:
        raise ChainBroken(f"{whose}is missing from the store") from None
    try:
        sha, digests = hash_file(path)
    except ValueError:  # not even a SQLite header
        raise ChainBroken(f"{whose}fails its sha256: it is not a SQLite file") from None
    fetched.downloaded += digests.page_count * digests.page_size
    if sha != full["sha256"]:
        raise ChainBroken(f"{whose}fails its sha256")
    if full.get("digest") and full["digest"] != digests.digest():
        raise ChainBroken(f"{whose}does not have its recorded page digest")
    digests = advance(store, deltas_of(record), path, digests, fetched)
    if record.get("digest") and digests.digest() != record["digest"]:
        raise ChainBroken("does not have its recorded page digest")
    return digests
