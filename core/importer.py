"""Bulk import: NDJSON observation bodies (each optionally with its ``claim``)
batched into ledger entries.

Each line has the shape of a ``POST /v1/observations`` body. The whole file
is validated before anything is written, so a bad line changes nothing. The
file is cut into batches of ``batch_size`` lines; each batch becomes one
ledger entry keyed ``<file sha256>:<batch number>``, and a marker object
(``orgs/<org>/imports/<sha256>/<batch>``) is written after it. A re-run skips
batches with a marker, and the rebuild applies each batch key once, so
re-running an interrupted or finished import never duplicates data.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Callable, Iterator

from core.errors import ValidationError
from core.ids import entry_hex, record_hex
from core.instants import canonical, from_ms
from core.keys import Principal
from core.ledger import Ledger
from core.store import ObjectNotFound, PreconditionFailed, Store
from core.validation import parse_json_body
from core.writes import Writes


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line


def import_file(store: Store, principal: Principal, path: str, *, batch_size: int = 500,
                progress: Callable[[str], None] | None = None) -> dict:
    progress = progress or (lambda message: None)
    ledger = Ledger(store)
    digest = hashlib.sha256()
    total = 0
    probe = "0" * 28 + "0000"
    for number, line in _lines(path):
        digest.update(line)
        try:
            Writes.build_observation(principal, parse_json_body(line), "obs_" + probe,
                                     "claim_" + record_hex(probe, 1), "2000-01-01T00:00:00.000000Z")
        except ValidationError as exc:
            raise ValidationError(f"{path}:{number}: {exc.message}") from None
        total += 1
    file_sha = digest.hexdigest()
    progress(f"validated {total} lines; importing in batches of {batch_size}")
    written = skipped = done = 0
    started = time.monotonic()
    batch: list[bytes] = []
    batch_no = 0

    def flush():
        nonlocal written, skipped, batch_no
        batch_no += 1
        marker = f"orgs/{principal.org_id}/imports/{file_sha}/{batch_no:08d}"
        try:
            store.get(marker)
            skipped += 1
            return
        except ObjectNotFound:
            pass
        hex_ = entry_hex()
        created_at = canonical(from_ms(int(hex_[:12], 16)))
        observations, claims = [], []
        for i, line in enumerate(batch):
            obs, obs_claims = Writes.build_observation(
                principal, json.loads(line), f"obs_{record_hex(hex_, 2 * i + 1)}",
                f"claim_{record_hex(hex_, 2 * i + 2)}", created_at)
            observations.append(obs)
            claims.extend(obs_claims)
        ledger.append(principal.org_id, "batch", {"batch_key": f"{file_sha}:{batch_no}",
                                                  "observations": observations, "claims": claims},
                      actor=principal.principal_id, entry_hex=hex_)
        try:
            store.put_if_absent(marker, hex_.encode())
        except PreconditionFailed:
            pass
        written += 1

    last = 0.0
    for _, line in _lines(path):
        batch.append(line)
        done += 1
        if len(batch) == batch_size:
            flush()
            batch = []
        if time.monotonic() - last > 1:
            last = time.monotonic()
            rate = done / max(time.monotonic() - started, 1e-9)
            progress(f"imported {done}/{total} lines ({rate:,.0f}/s)")
    if batch:
        flush()
    if total:
        ledger.register_organization(principal.org_id)
    progress(f"imported {done}/{total} lines: {written} batches written, {skipped} already present")
    return {"lines": total, "batches_written": written, "batches_skipped": skipped, "file_sha256": file_sha}


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
