"""When a generation is published as a delta, and when as a whole file.

A delta only pays while it is small next to the file, and every reader
that starts cold (or falls off the chain) downloads the chain's whole file
and then every delta after it. So a chain is compacted — the next
generation published whole — when any of these holds:

- the file is smaller than ``min_file_bytes``: a whole small file costs
  little, and a chain of them only adds objects;
- the chain already holds ``max_deltas`` deltas (K);
- its deltas, this one included, add up to more than ``max_ratio`` of the
  file (X): past that a cold reader downloads too much beside the file.

An erasure always publishes whole (core/snapshot/build.py). Settings come
from the environment (``TITEN_DELTA_MIN_BYTES``, ``TITEN_DELTA_MAX``,
``TITEN_DELTA_MAX_RATIO``) or the defaults below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.snapshot.pointer import deltas_of

DEFAULT_MIN_FILE_BYTES = 8 << 20
DEFAULT_MAX_DELTAS = 32
DEFAULT_MAX_RATIO = 0.25


@dataclass(frozen=True)
class DeltaPolicy:
    min_file_bytes: int = DEFAULT_MIN_FILE_BYTES
    max_deltas: int = DEFAULT_MAX_DELTAS
    max_ratio: float = DEFAULT_MAX_RATIO

    @classmethod
    def from_env(cls) -> "DeltaPolicy":
        env = os.environ
        return cls(int(env.get("TITEN_DELTA_MIN_BYTES", DEFAULT_MIN_FILE_BYTES)),
                   int(env.get("TITEN_DELTA_MAX", DEFAULT_MAX_DELTAS)),
                   float(env.get("TITEN_DELTA_MAX_RATIO", DEFAULT_MAX_RATIO)))

    def whole_file_because(self, pointer: dict, delta_bytes: int, file_bytes: int) -> str | None:
        """Why the next generation (a delta of ``delta_bytes`` onto the
        pointer's chain, making a file of ``file_bytes``) is published whole;
        None when it is published as the delta."""
        chain = deltas_of(pointer)
        if file_bytes < self.min_file_bytes:
            return f"the file ({file_bytes} bytes) is under {self.min_file_bytes} bytes"
        if len(chain) >= self.max_deltas:
            return f"the chain holds {len(chain)} deltas already (at most {self.max_deltas})"
        total = delta_bytes + sum(int(step["bytes"]) for step in chain)
        if total > self.max_ratio * file_bytes:
            return (f"the chain's deltas would add up to {total} bytes, over {self.max_ratio:.0%} of the "
                    f"file's {file_bytes}")
        return None
