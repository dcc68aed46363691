"""The generation a rebuild just published, kept in its work directory.

Why: the next incremental build of the organization starts from it instead
of downloading and verifying the published file again. The rules:

- a kept file is taken only when it is exactly the generation the pointer
  names (same generation, page digest and size), with its page digests
  (``core.snapshot.pages``: what the next delta is computed against) and the machine has not restarted since
  it was kept: it is written without fsync, so after a crash or power loss
  it may be torn (``boot_id``);
- and only when its bytes still hash to those page digests: the record
  beside it says what the file was, not what it is now, and a file changed
  in place at the same size would otherwise be built upon and published,
  carrying the change into every later generation (one pass of sha256 over
  the file, far cheaper than the download it saves);
- it is taken at most once (the build changes it in place), and never when
  it is hard-linked elsewhere (``cp -al`` of a work directory);
- all kept files together stay under ``keep_bytes``: other organizations'
  older files go first;
- keeping never fails a build: a file not kept only costs a download.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable

from core.snapshot.pages import PageDigests, hash_file


def _boot_id() -> str | None:
    """This boot of the machine (Linux); None elsewhere, where kept files are
    then never trusted."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


class KeptGeneration:
    def __init__(self, work_dir: str, org_id: str, keep_bytes: int,
                 progress: Callable[[str], None] = lambda message: None):
        self.work_dir = work_dir
        self.org_id = org_id
        self.keep_bytes = keep_bytes
        self.progress = progress
        base = os.path.join(work_dir, f"kept-{org_id}")
        self.path, self.record, self.pages = base + ".sqlite", base + ".json", base + ".pages"

    def keep(self, work: str, generation: int, digests: PageDigests, size: int) -> None:
        """Move ``work`` (the file just published as ``generation``, whose
        page digests are ``digests``) into place as the next build's
        starting point. Never raises."""
        try:
            self._keep(work, generation, digests, size)
        except OSError as exc:
            self.progress(f"{self.org_id}: generation {generation} not kept locally: {exc}")

    def _keep(self, work: str, generation: int, digests: PageDigests, size: int) -> None:
        for stale in (self.record, self.pages, self.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        if size > self.keep_bytes:
            return
        others = []
        for name in os.listdir(self.work_dir):
            other = os.path.join(self.work_dir, name)
            if name.startswith("kept-") and name.endswith(".sqlite") and other != self.path:
                with contextlib.suppress(FileNotFoundError):  # another build took or dropped it
                    st = os.stat(other)
                    others.append((st.st_mtime, st.st_size, other))
        total = size + sum(n for _, n, _ in others)
        for _, n, other in sorted(others):
            if total <= self.keep_bytes:
                break
            total -= n
            for stale in (other[:-len(".sqlite")] + ".json", other[:-len(".sqlite")] + ".pages", other):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
        os.replace(work, self.path)
        with open(self.pages, "wb") as f:
            f.write(digests.to_bytes())
        with open(self.record, "w") as f:
            json.dump({"generation": generation, "digest": digests.digest(), "bytes": size,
                       "boot_id": _boot_id()}, f)

    def take(self, work: str, pointer: dict) -> PageDigests | None:
        """Move the kept file into place as ``work`` when it is exactly the
        generation ``pointer`` names (module docstring): its page digests;
        None otherwise."""
        try:
            with open(self.record) as f:
                kept = json.load(f)
            os.unlink(self.record)  # taken at most once: the work file is changed in place
            with open(self.pages, "rb") as f:
                digests = PageDigests.from_bytes(f.read())
            st = os.stat(self.path)
        except (FileNotFoundError, ValueError):
            return None
        # st_nlink: a hard-linked copy (cp -al of the work directory) is not
        # ours to change in place
        if (kept.get("generation") != pointer["generation"] or kept.get("digest") != pointer.get("digest")
                or digests.digest() != kept.get("digest")
                or st.st_size != kept.get("bytes") or st.st_size != pointer.get("bytes") or st.st_nlink != 1
                or kept.get("boot_id") is None or kept.get("boot_id") != _boot_id()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return None
        try:
            _, actual = hash_file(self.path, whole=False)
        except (OSError, ValueError):
            actual = None
        if actual is None or actual.digest() != kept.get("digest"):
            self.progress(f"{self.org_id}: the kept copy of generation {pointer['generation']} no longer matches "
                          "its page digests; fetching the published file")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return None
        try:
            os.replace(self.path, work)
        except FileNotFoundError:  # evicted meanwhile by another organization's build
            return None
        return digests
