"""Token counts in cl100k_base, exactly: the budget a pack is measured in.

Every budget decision counts with the real tokenizer, ``tiktoken``'s BPE
over the official ``cl100k_base.tiktoken`` merge table. The table ships with
the package (``core/models/cl100k_base.tiktoken``, MIT licence beside it)
and is checked against OpenAI's published sha256 when this module loads; a
file that fails the check is an error at start-up, never a silent other
count. Nothing is ever downloaded: the table is parsed here and handed to
``tiktoken.Encoding`` directly, bypassing tiktoken's URL loader and cache.

Loading costs ~170 ms once per process (parse ~80 ms, tiktoken's BPE build
~85 ms); it happens at import, i.e. in Lambda's init phase, never inside a
request. ``TOKENIZER_ID`` (name and file hash) is recorded in every snapshot
whose stored item counts were made with it, so a reader with another table
never trusts those counts (``docs/architecture.md``, "Token budget").
"""

from __future__ import annotations

import binascii
import hashlib
import os

import tiktoken

__all__ = ["TOKENIZER_NAME", "TOKENIZER_SHA256", "TOKENIZER_ID", "count_tokens", "count_tokens_batch",
           "TokenizerFileError"]

TOKENIZER_NAME = "cl100k_base"
TOKENIZER_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
TOKENIZER_ID = f"{TOKENIZER_NAME}:{TOKENIZER_SHA256}"
TOKENIZER_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "cl100k_base.tiktoken")

# cl100k_base's pre-tokenizer, as tiktoken_ext.openai_public defines it.
_PAT_STR = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
            r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
# cl100k_base's special tokens. Counting never treats text as one of them
# (``encode_ordinary``): "<|endoftext|>" inside a claim is data, counted as text.
_SPECIAL_TOKENS = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


class TokenizerFileError(RuntimeError):
    """The shipped merge table is missing or is not the official one."""


def _load(path: str = TOKENIZER_PATH, expected_sha256: str = TOKENIZER_SHA256) -> tiktoken.Encoding:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise TokenizerFileError(f"cannot read the cl100k_base merge table {path}: {exc}") from None
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected_sha256:
        raise TokenizerFileError(f"{path} has sha256 {actual}, not the official {expected_sha256}")
    # one "<base64 token> <rank>" pair per line; ranks are 0..n-1 in order
    parts = raw.split()
    del raw
    ranks = dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2])))
    del parts
    encoding = tiktoken.Encoding(TOKENIZER_NAME, pat_str=_PAT_STR, mergeable_ranks=ranks,
                                 special_tokens=_SPECIAL_TOKENS)
    # The BPE core (Rust) holds its own copy of the table; the Python dict
    # is only read by decoding helpers this service never calls. Dropping it
    # returns ~14 MiB per process.
    encoding._mergeable_ranks = {}
    return encoding


_ENCODING = _load()
_encode = _ENCODING.encode_ordinary


def count_tokens(text: str) -> int:
    """The real cl100k_base token count of ``text`` (0 for "")."""
    return len(_encode(text)) if text else 0


def count_tokens_batch(texts: list[str]) -> list[int]:
    """``count_tokens`` of many texts: the snapshot build prices every
    changed item this way. A plain loop: tiktoken's threaded
    ``encode_ordinary_batch`` measured 2-3x slower here on 10,000 item
    prefixes (~435 bytes: 1.1 s looped, 2.0-2.9 s batched, 2 cores)."""
    encode = _encode
    return [len(encode(t)) if t else 0 for t in texts]
