"""The libm a snapshot's candidate index was built with: a record, no longer a gate.

Every step of a bm25 contribution is IEEE arithmetic, the same everywhere,
but log(); FTS5 calls the log() of the machine serving the query. Postings
used to store contributions priced at build time, so a snapshot built on
one platform (an operator's x86_64 laptop) and served on another (arm64
Lambda) was exact only if both libms agreed. Postings now keep only (tf, D)
and the reader prices them with its own log() (``core.lexical.query``), so
the builder's fingerprint, still recorded in the snapshot's meta table
under LIBM_META_KEY, only says where a generation was built.
"""

from __future__ import annotations

import hashlib
import math
import platform
import struct

import apsw

from core.meta_table import read_meta

LIBM_META_KEY = "lexical_libm"
_fingerprint: str | None = None


def _log_inputs() -> list[float]:
    """The fingerprint's fixed inputs, made without libm (exact operations
    only): idf arguments (N - df + 0.5) / (df + 0.5) over index sizes 1..10^7
    and their document frequencies, and 2048 doubles spread over 2^-12..2^28."""
    xs = []
    n = 1
    while n <= 10**7:
        df = 1
        while df <= n:
            xs.append((n - df + 0.5) / (df + 0.5))
            df = df * 3 // 2 + 1
        n = n * 5 // 4 + 1
    state = 0x9E3779B97F4A7C15
    for _ in range(2048):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        xs.append(math.ldexp(1.0 + (state >> 12) / 2**52, (state % 41) - 12))
    return xs


def platform_fingerprint() -> str:
    """This process's libm, as '<machine> log:<digest>': the digest (the first
    16 hex digits of the sha256 of the exact bits of math.log on the fixed
    inputs) is what is compared; the machine name is for the reader of a
    report."""
    global _fingerprint
    if _fingerprint is None:
        xs = _log_inputs()
        bits = struct.pack(f"<{len(xs)}d", *map(math.log, xs))
        _fingerprint = f"{platform.machine()} log:{hashlib.sha256(bits).hexdigest()[:16]}"
    return _fingerprint


def priced_here(recorded: str | None) -> bool:
    """Whether contributions priced under the ``recorded`` fingerprint equal
    this platform's (None: not recorded, so unknown)."""
    return recorded is not None and recorded.rpartition(" log:")[2] == platform_fingerprint().rpartition(" log:")[2]


def recorded_fingerprint(db: apsw.Connection) -> str | None:
    return read_meta(db, LIBM_META_KEY)
