"""Bulk import: NDJSON observation bodies (each optionally with its ``claim``)
stored exactly once, however often and however the import is interrupted.

Each line has the shape of a ``POST /v1/observations`` body. The whole file
is validated before anything is written, so a bad line changes nothing.

The rule it enforces: **a line of a file is stored in at most one ledger
entry, and a re-run stores every line not stored yet** — whatever
``--batch-size`` each run uses, wherever a run was killed, and while another
run imports the same file. How:

- A line's identity is its content: the file's sha256 and the line's number
  in it (``<sha256>:<line>``), never its position in a batch.
- The unit of claiming is a *block* of ``BLOCK_LINES`` consecutive lines,
  the same for every run. Before writing, a run claims a *group* of blocks
  (enough for one ``--batch-size``) with one put-if-absent marker per block,
  ``orgs/<org>/imports/<sha256>/<block>``, naming the group's entry id. A
  block already claimed by another group is left to that group.
- The group's lines are then written in entries of at most ``--batch-size``
  lines, under entry ids derived from the group's (``_part_hex``), so every
  id (entry, observation, claim) of a group is fixed by its markers.
- A re-run lists the markers. A group whose entries are missing (its run was
  killed after claiming) is *taken over*: the run completes the group's
  claims and writes its missing entries under the same ids. Put-if-absent
  lets exactly one writer of each entry land, so a taker racing the original
  writer stores nothing twice.
- The rebuild refuses a line it already applied (``import_lines``), so even
  a ledger holding one line twice could never put twins in a snapshot.
- A line is stored only as it was validated: the file is read twice (to
  validate it whole, then to store it by byte offsets), so each line's
  sha256 is kept from the first read and checked at the second. A file
  changed in between stops the import, naming the line, instead of storing
  text no validation saw. A file that cannot be read twice (a pipe) is
  refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from array import array
from typing import Callable, Iterator

from core.errors import TitenError, ValidationError
from core.ids import entry_hex, minted_at, record_hex
from core.instants import canonical, now_utc
from core.keys import Principal
from core.layout import import_markers_prefix, ledger_prefix
from core.ledger import Ledger
from core.storage import ObjectNotFound, PreconditionFailed, Store
from core.validation import parse_json_body
from core.writes.records import build_observation

BLOCK_LINES = 100
MAX_BATCH_SIZE = 10_000  # two record ids per line within one entry id's 16 bits


def _lines(path: str) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, bytes) of every non-blank line."""
    with open(path, "rb") as f:
        offset = 0
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, offset, line
            offset += len(line)


def _part_hex(group_hex: str, part: int) -> str:
    """The entry id of a group's ``part``-th entry: the group's id with the
    part number in place of 16 random bits, so it keeps the group's time
    order and the group's entries share one listing prefix."""
    return f"{group_hex[:24]}{part:04x}0000"


class FileChanged(ValidationError):
    """The file no longer holds the line that was validated."""


class _Import:
    def __init__(self, store: Store, principal: Principal, path: str, file_sha: str,
                 numbers: array, offsets: array, batch_size: int, line_hashes: bytes):
        self.store, self.principal, self.path, self.file_sha = store, principal, path, file_sha
        self.numbers, self.offsets, self.batch_size = numbers, offsets, batch_size
        self.line_hashes = line_hashes  # sha256 of each validated line, 32 bytes each, in order
        self.ledger = Ledger(store)
        self.org_id = principal.org_id
        self.blocks = (len(numbers) + BLOCK_LINES - 1) // BLOCK_LINES
        self.written = self.taken_over = 0

    def marker(self, block: int) -> str:
        return f"{import_markers_prefix(self.org_id, self.file_sha)}{block:08d}"

    def read_marker(self, block: int) -> dict | None:
        try:
            return json.loads(self.store.get(self.marker(block)).body)
        except ObjectNotFound:
            return None

    def claim(self, group_hex: str, intended: list[int], batch_size: int) -> list[int]:
        """Claim each intended block for the group; the blocks it holds (its
        own claims and those a taker made for it), in order."""
        body = json.dumps({"entry_id": group_hex, "blocks": intended, "batch_size": batch_size,
                           "principal_id": self.principal.principal_id,
                           "claimed_at": canonical(now_utc())}).encode()
        held = []
        for block in intended:
            try:
                self.store.put_if_absent(self.marker(block), body)
                held.append(block)
            except PreconditionFailed:
                other = self.read_marker(block)
                if other is not None and other["entry_id"] == group_hex:
                    held.append(block)
        return held

    def present(self, group_hex: str) -> set[str]:
        """The entry ids of the group already in the ledger (one listing)."""
        return {k.rsplit("/", 1)[1][:32] for k in self.store.list_keys(ledger_prefix(self.org_id) + group_hex[:24])}

    def write_group(self, group_hex: str, held: list[int], batch_size: int, present: set[str],
                    principal: Principal | None = None) -> int:
        """Write the group's entries not in ``present``; returns how many.
        ``principal``: the writer the group's markers name (a taker writes
        the very records the killed run would have)."""
        principal = principal or self.principal
        indexes = [i for b in held for i in range(b * BLOCK_LINES, min((b + 1) * BLOCK_LINES, len(self.numbers)))]
        created_at = minted_at(group_hex)
        written = 0
        with open(self.path, "rb") as f:
            for part, start in enumerate(range(0, len(indexes), batch_size)):
                hex_ = _part_hex(group_hex, part)
                if hex_ in present:
                    continue
                observations, claims, lines = [], [], []
                for pos, i in enumerate(indexes[start:start + batch_size]):
                    f.seek(self.offsets[i])
                    line = f.readline()
                    if hashlib.sha256(line).digest() != self.line_hashes[32 * i:32 * i + 32]:
                        raise FileChanged(
                            f"{self.path}:{self.numbers[i]}: the file changed since it was validated; the lines "
                            "stored so far are the file's as it was validated. Import the file as it is now "
                            "(validated again, as another import), or restore it and run this import again")
                    obs, obs_claims = build_observation(
                        principal, json.loads(line), f"obs_{record_hex(hex_, 2 * pos + 1)}",
                        f"claim_{record_hex(hex_, 2 * pos + 2)}", created_at)
                    observations.append(obs)
                    claims.extend(obs_claims)
                    lines.append(self.numbers[i])
                try:
                    self.ledger.append(self.org_id, "batch", {
                        "import": {"file_sha256": self.file_sha, "group": group_hex, "lines": lines},
                        "observations": observations, "claims": claims},
                        actor=principal.principal_id, entry_hex=hex_)
                    written += 1
                except PreconditionFailed:
                    pass  # a taker (or the original run) stored this very entry first
        return written

    def group_complete(self, group_hex: str, held: list[int], batch_size: int, present: set[str]) -> bool:
        lines = sum(min((b + 1) * BLOCK_LINES, len(self.numbers)) - b * BLOCK_LINES for b in held)
        parts = (lines + batch_size - 1) // batch_size
        return all(_part_hex(group_hex, p) in present for p in range(parts))

    def take_over(self, progress: Callable[[str], None]) -> set[int]:
        """Complete the groups earlier runs claimed; returns the claimed blocks."""
        prefix = import_markers_prefix(self.org_id, self.file_sha)
        claimed = {int(k[len(prefix):]) for k in self.store.list_keys(prefix) if k[len(prefix):].isdigit()}
        groups: dict[str, dict] = {}
        for block in sorted(claimed):
            marker = self.read_marker(block)
            if marker is not None:
                groups.setdefault(marker["entry_id"], marker)
        for group_hex, marker in groups.items():
            # the intended blocks a killed run never got to are claimed for
            # its group now, so every writer of the group agrees on its lines
            held = self.claim(group_hex, marker["blocks"], marker["batch_size"])
            claimed.update(marker["blocks"])
            present = self.present(group_hex)
            if held and not self.group_complete(group_hex, held, marker["batch_size"], present):
                writer = dataclasses.replace(self.principal, principal_id=marker["principal_id"])
                self.written += self.write_group(group_hex, held, marker["batch_size"], present, writer)
                self.taken_over += 1
                progress(f"completed the entries of an interrupted run (blocks {held[0]}-{held[-1]})")
        return claimed

    def run(self, progress: Callable[[str], None]) -> None:
        claimed = self.take_over(progress)
        per_group = max(1, -(-self.batch_size // BLOCK_LINES))
        free = [b for b in range(self.blocks) if b not in claimed]
        started, last = time.monotonic(), 0.0
        done = 0
        while free:
            intended = [free[0]]
            while len(intended) < per_group and len(intended) < len(free) and free[len(intended)] == intended[-1] + 1:
                intended.append(free[len(intended)])
            free = free[len(intended):]
            group_hex = entry_hex()
            held = self.claim(group_hex, intended, self.batch_size)
            if held:  # ids minted just now: none of its entries can exist unless a taker wrote them
                self.written += self.write_group(group_hex, held, self.batch_size, set())
            done += len(intended)
            if time.monotonic() - last > 1:
                last = time.monotonic()
                lines = min(done * BLOCK_LINES, len(self.numbers))
                progress(f"imported {lines}/{len(self.numbers)} lines "
                         f"({lines / max(time.monotonic() - started, 1e-9):,.0f}/s)")


NAMED_BAD_LINES = 20  # a file's bad lines named in the refusal; the rest are counted


def check_rereadable(path: str) -> None:
    """``ValidationError`` for a file that cannot be read twice (a pipe);
    the OSError of one that cannot be read at all."""
    with open(path, "rb") as f:  # a missing or unreadable file: the OSError, one line from the CLI
        rereadable = f.seekable()
    if not rereadable:
        raise ValidationError(f"{path} cannot be read twice (a pipe or a terminal): the import validates the "
                              "whole file before it stores a line, then reads it again; save it to a file first")


def import_file(store: Store, principal: Principal, path: str, *, batch_size: int = 500,
                progress: Callable[[str], None] | None = None) -> dict:
    progress = progress or (lambda message: None)
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError(f"--batch-size must be between 1 and {MAX_BATCH_SIZE}; got {batch_size}")
    check_rereadable(path)
    digest = hashlib.sha256()
    numbers, offsets = array("q"), array("q")
    line_hashes = bytearray()
    probe = "0" * 28 + "0000"
    bad: list[str] = []
    bad_count = 0
    for number, offset, line in _lines(path):
        digest.update(line)
        try:
            build_observation(principal, parse_json_body(line), "obs_" + probe,
                              "claim_" + record_hex(probe, 1), "2000-01-01T00:00:00.000000Z")
        except TitenError as exc:  # a bad field, a line over 1 MiB, a workspace not granted
            # the whole file is read, so one run names every line to fix
            bad_count += 1
            if len(bad) < NAMED_BAD_LINES:
                bad.append(f"{path}:{number}: {exc.message}")
            continue
        numbers.append(number)
        offsets.append(offset)
        line_hashes += hashlib.sha256(line).digest()
    if bad_count:
        more = f"\n… and {bad_count - len(bad)} more" if bad_count > len(bad) else ""
        raise ValidationError(f"{path}: {bad_count} bad line{'s' if bad_count > 1 else ''}; nothing was imported\n"
                              + "\n".join(bad) + more)
    # the line numbers are part of each line's identity, so they enter the hash too
    digest.update(numbers.tobytes())
    file_sha = digest.hexdigest()
    total = len(numbers)
    progress(f"validated {total} lines; importing in batches of {batch_size}")
    job = _Import(store, principal, path, file_sha, numbers, offsets, batch_size, bytes(line_hashes))
    if total:
        Ledger(store).register_organization(principal.org_id)
        job.run(progress)
    progress(f"imported {total}/{total} lines: {job.written} batches written "
             f"({job.taken_over} interrupted runs completed); every line is stored once")
    return {"lines": total, "batches_written": job.written, "runs_completed": job.taken_over,
            "file_sha256": file_sha}


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
