"""The pages a build wrote, read from its write-ahead log.

The incremental build runs its work file in WAL mode with automatic
checkpoints off, so until it checkpoints, every page it changed is a frame
of the WAL and the database file itself is still exactly the previous
generation. Reading the page numbers of those frames (the format is
SQLite's documented WAL format: a 32-byte header, then frames of a 24-byte
header — page number first — and one page) is how the build knows which
pages a delta must carry, without copying or comparing the file: the
litestream idea, applied once per generation.
"""

from __future__ import annotations

import os

WAL_HEADER = 32
FRAME_HEADER = 24
_MAGICS = (0x377F0682, 0x377F0683)


def written_pages(wal_path: str) -> tuple[set[int], int]:
    """(every page number a frame of the WAL holds, the database size in
    pages after the last commit frame; 0 when the WAL holds no commit)."""
    if not os.path.exists(wal_path):
        return set(), 0
    pages: set[int] = set()
    db_pages = 0
    with open(wal_path, "rb") as f:
        header = f.read(WAL_HEADER)
        if len(header) < WAL_HEADER:
            return set(), 0
        if int.from_bytes(header[:4], "big") not in _MAGICS:
            raise ValueError(f"{wal_path}: not a WAL file")
        page_size = int.from_bytes(header[8:12], "big")
        salts = header[16:24]
        while True:
            frame = f.read(FRAME_HEADER)
            if len(frame) < FRAME_HEADER or frame[8:16] != salts:
                break
            pages.add(int.from_bytes(frame[:4], "big"))
            commit = int.from_bytes(frame[4:8], "big")
            if commit:
                db_pages = commit
            f.seek(page_size, os.SEEK_CUR)
    return pages, db_pages
