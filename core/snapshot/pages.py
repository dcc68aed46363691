"""A snapshot file's digest, by page: what lets a delta be verified in
time proportional to the delta.

A generation's ``digest`` is the sha256 of the concatenated sha256 of each
of its pages (page size from the SQLite header), written ``pages:<hex>``.
Like the file's sha256 it names the exact bytes (a different page, a page
more or less, gives another digest), but a holder of a generation's page
digests gets the next one's by hashing only the pages a delta changed,
plus 32 bytes a page of the list: at 342k claims (136k pages) that is a few
milliseconds, where hashing the 558 MB file is more than a second.
"""

from __future__ import annotations

import hashlib

DIGEST_PREFIX = "pages:"
_HASH = 32


def page_size_of(header: bytes) -> int:
    """The page size a SQLite file header (its first 100 bytes) records."""
    if len(header) < 18 or not header.startswith(b"SQLite format 3\x00"):
        raise ValueError("not a SQLite database file")
    size = int.from_bytes(header[16:18], "big")
    return 65536 if size == 1 else size


class PageDigests:
    """One sha256 per page of a file, and their digest."""

    __slots__ = ("page_size", "hashes")

    def __init__(self, page_size: int, hashes: bytearray):
        self.page_size = page_size
        self.hashes = hashes  # 32 bytes a page, page 1 first

    @property
    def page_count(self) -> int:
        return len(self.hashes) // _HASH

    def digest(self) -> str:
        return DIGEST_PREFIX + hashlib.sha256(self.hashes).hexdigest()

    def copy(self) -> "PageDigests":
        return PageDigests(self.page_size, bytearray(self.hashes))

    def resize(self, page_count: int) -> None:
        """Drop pages past ``page_count``, or make room for new ones (their
        hashes must then be set)."""
        want = page_count * _HASH
        if want < len(self.hashes):
            del self.hashes[want:]
        else:
            self.hashes.extend(bytes(want - len(self.hashes)))

    def set_page(self, pgno: int, page: bytes) -> None:
        at = (pgno - 1) * _HASH
        self.hashes[at:at + _HASH] = hashlib.sha256(page).digest()

    def to_bytes(self) -> bytes:
        return self.page_size.to_bytes(4, "big") + bytes(self.hashes)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "PageDigests":
        if len(raw) < 4 or (len(raw) - 4) % _HASH:
            raise ValueError("not a page digest list")
        return cls(int.from_bytes(raw[:4], "big"), bytearray(raw[4:]))


def hash_file(path: str, whole: bool = True) -> tuple[str | None, PageDigests]:
    """(the file's sha256, or None when ``whole`` is false; its page
    digests), in one pass over the file (a torn last page is hashed as it
    is: the digest then matches no generation's)."""
    whole_hash = hashlib.sha256() if whole else None
    with open(path, "rb") as f:
        header = f.read(100)
        page_size = page_size_of(header)
        f.seek(0)
        hashes = bytearray()
        chunk = page_size * 256
        while True:
            block = f.read(chunk)
            if not block:
                break
            if whole_hash is not None:
                whole_hash.update(block)
            view = memoryview(block)
            for at in range(0, len(block), page_size):
                hashes += hashlib.sha256(view[at:at + page_size]).digest()
    return (whole_hash.hexdigest() if whole_hash else None), PageDigests(page_size, hashes)
