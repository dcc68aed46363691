"""A generation published as the pages it changed: the delta object.

A delta names its base (generation and page digest, ``core.snapshot.pages``)
and the file it makes (generation, page digest, page count), then carries
each changed page whole, and ends with the sha256 of everything before it,
so a damaged object is refused before any page of it is written. Applying
it to a copy of the base (``apply``) and checking the result's page digest
gives exactly the file the build published; anything else — another base,
a torn or altered object, a digest that does not come out — raises
``DeltaRefused``, and the caller falls back to the full file.

Layout::

    b"titen-delta 1\\n"  header JSON  b"\\n"  page × n  sha256(all before)

header: generation, base_generation, base_digest, digest, page_size,
page_count (of the resulting file), pages (their numbers, ascending).
"""

from __future__ import annotations

import hashlib
import json
import os

from core.snapshot.pages import PageDigests

MAGIC = b"titen-delta 1\n"


class DeltaRefused(Exception):
    """A delta that cannot make the file it names from the file at hand."""


def encode(path: str, pages: set[int], page_count: int, base: PageDigests, *, generation: int,
           base_generation: int) -> tuple[bytes, PageDigests]:
    """The delta taking ``base`` to the file at ``path``, given every page
    that may differ (``pages``; pages past the base's end are added), and
    the new file's page digests."""
    page_size = base.page_size
    wanted = sorted({p for p in pages if 1 <= p <= page_count} | set(range(base.page_count + 1, page_count + 1)))
    digests = base.copy()
    digests.resize(page_count)
    body = bytearray()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != page_count * page_size:
            raise ValueError(f"{path} is not {page_count} pages of {page_size} bytes")
        for pgno in wanted:
            f.seek((pgno - 1) * page_size)
            page = f.read(page_size)
            digests.set_page(pgno, page)
            body += page
    header = {"generation": generation, "base_generation": base_generation, "base_digest": base.digest(),
              "digest": digests.digest(), "page_size": page_size, "page_count": page_count, "pages": wanted}
    raw = MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + bytes(body)
    return raw + hashlib.sha256(raw).digest(), digests


def read_header(raw: bytes) -> tuple[dict, int]:
    """(the header, where the pages start); ``DeltaRefused`` when the object
    is not a whole, intact delta."""
    if len(raw) < len(MAGIC) + 32 or not raw.startswith(MAGIC):
        raise DeltaRefused("not a delta object")
    if hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
        raise DeltaRefused("the delta object fails its own sha256 (damaged or torn)")
    end = raw.index(b"\n", len(MAGIC))
    header = json.loads(raw[len(MAGIC):end])
    if len(raw) - 32 - (end + 1) != len(header["pages"]) * header["page_size"]:
        raise DeltaRefused("the delta object's pages do not match its header")
    return header, end + 1


def apply(raw: bytes, path: str, digests: PageDigests, *, expect_digest: str | None = None) -> PageDigests:
    """Write the delta's pages into the file at ``path`` (a copy of its
    base, whose page digests are ``digests``), in place; the new digests.
    Raises ``DeltaRefused`` (the file then is unusable and must be dropped)
    when the base is another file or the result is not the named one."""
    header, at = read_header(raw)
    if header["base_digest"] != digests.digest():
        raise DeltaRefused(f"the delta to generation {header['generation']} is based on generation "
                           f"{header['base_generation']}, which this file is not")
    if header["page_size"] != digests.page_size:
        raise DeltaRefused("the delta's page size is not the base's")
    page_size = header["page_size"]
    out = digests.copy()
    out.resize(header["page_count"])
    view = memoryview(raw)
    with open(path, "r+b") as f:
        for pgno in header["pages"]:
            page = view[at:at + page_size]
            at += page_size
            f.seek((pgno - 1) * page_size)
            f.write(page)
            out.set_page(pgno, page)
        f.truncate(header["page_count"] * page_size)
    digest = out.digest()
    if digest != header["digest"] or (expect_digest is not None and digest != expect_digest):
        raise DeltaRefused(f"applying the delta to generation {header['generation']} does not give the "
                           "digest it names")
    return out
