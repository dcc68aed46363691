"""The sha256 of a file, streamed: the one way every part of titen names a
file's content (snapshot generations in their pointer, the local store's
ETags, the pinned model and tokenizer files)."""

from __future__ import annotations

import hashlib


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
