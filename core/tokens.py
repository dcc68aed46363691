"""A conservative token-count estimate used to pack responses into a budget.

``estimate_tokens(text)`` answers "how many cl100k_base tokens can this text
be, at most?" without a tokenizer: pure, deterministic, standard library only,
cheap enough to run on every response.

How it counts
-------------
cl100k_base first cuts text into pieces -- runs of letters (one leading sign
may stick to them), groups of at most three digits, runs of punctuation,
blanks -- and no token spans two pieces.  The estimate counts the same pieces
and prices each kind:

- a run of ASCII letters costs 1, plus 0.052 per letter (long and rare words
  split), 1.17 per camelCase hump and 0.75 per three capitals (acronyms);
- hexadecimal ids: three hex letters beside a digit add 0.3 and four hex
  letters in a row add 1.0, because ``f3bf41aae0`` tokenizes almost letter by
  letter;
- digits cost 1.07 per run plus 0.85 per three digits (cl100k groups them by
  three); a blank before a number, or at the very end, is a token (1.48);
- a run of ASCII punctuation costs 1.18 plus 1.13 per three signs; what
  cl100k glues back is returned (``":"`` and ``","`` -1.3, one sign joining
  two words as in ``x_id`` or ``a.b`` -0.47), and a word right after other
  punctuation (``-sub``, ``/path``) costs 0.43 more;
- a line break costs 1.47 (-1.5 per blank line, -0.98 after punctuation),
  indentation 0.42 per run, a tab 0.36;
- a non-ASCII character costs its UTF-8 length in bytes.  That is a hard upper
  bound -- a token is at least one byte -- so CJK (3 bytes a character),
  emoji (4, plus 3 per ZWJ or variation selector, 8 a flag) and accented
  letters are never undercounted.  Only the typographic quotes, dashes,
  ellipsis and bullet of English prose (one token each) are priced at 1.
- every estimate gets 1.4 more and is rounded up (see "Subadditivity").

The counts come from bytes.translate class views and substring counts: about
30 linear C-level scans and no Python loop over characters, ~0.2-0.35 ms for
5 KB of text.

Why it does not undercount
--------------------------
The non-ASCII part is a bound.  The ASCII weights were fitted by linear
programming against the real tokenizer (tiktoken ``cl100k_base``): minimise
the overestimate on ~100,000 chunks of 150-600 characters -- English prose
(licences, the Rust book, Node.js docs), Python and JavaScript source,
Markdown, AWS service JSON, compact JSON packs with hex ids, CJK, emoji --
with a heavy penalty on every chunk estimated below 1.06x its real count;
then rounded up.  Measured afterwards (estimate / real):

- compact JSON with hex ids: 1.09-1.50, mean 1.21, never below; random hex
  ids (32 and 64 digits, upper and lower case, UUIDs): never below in 160,000;
- CJK: 1.0-3.9, mean 1.9-2.5 (rare ideographs and Hangul syllables really
  are 3 tokens); emoji: 1.35-1.62; never below;
- English prose paragraphs: 1.15-1.76, mean 1.27, never below (905);
- chunks of prose, code and Markdown: mean ~1.35, below in about 1 chunk in
  3,000, down to 0.8x (0.6x for pathological ones): a few hundred characters
  dense with rare words or squashed identifiers ("idempotent opeartion",
  "dnspromisesresolvecaahostname").

``tests/test_token_estimate.py`` checks it against the tokenizer.  Known
limits: German, French and other Latin-script languages split long words far
more than English and can be undercounted by up to 2x; base64 and other
random letter strings by up to 1.7x.  Count those with the real tokenizer.

Subadditivity
-------------
Every count is of a short pattern, and for such counts joining two texts
keeps all the matches of both parts and adds at most one match per pattern
across the seam; the only weighted rise a seam can cause is 1.35 (``...0AB``
+ ``CD0...``: one capital triple and three hex patterns, minus the run that
merged).  Adding 1.4 to every estimate therefore makes
``estimate_tokens(a + b) <= estimate_tokens(a) + estimate_tokens(b)`` for all
``a`` and ``b``: the packer may sum item estimates.
"""

from __future__ import annotations

import math

__all__ = ["ESTIMATOR_NAME", "estimate_tokens"]

ESTIMATOR_NAME = "titen-est-v1"


def _view(classes: list[tuple[str, str]], default: bytes) -> bytes:
    """A bytes.translate table mapping each ASCII char to one class byte."""
    table = bytearray(default * 256)
    for chars, cls in classes:
        for ch in chars:
            table[ord(ch)] = ord(cls)
    return bytes(table)


_LOWER = "abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
_DIGITS = "0123456789"
_CONTROL = "".join(chr(c) for c in [*range(0, 9), *range(14, 32), 127])
_PUNCT = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum()) + _CONTROL
_GLUE = "._(<"  # a word led by one of these is one cl100k piece ("x_id" -> "x", "_id")
_QUOTES = "\"'`"
_OTHER_PUNCT = "".join(c for c in _PUNCT if c not in _GLUE + _QUOTES)

# Class views for bytes.translate.  Non-ASCII bytes get a class of their own
# ("x"/"y"), so that CJK or emoji text does not flood the patterns below.
_NON_ASCII = "".join(chr(c) for c in range(128, 256))
_CASE = _view([(_LOWER, "a"), (_UPPER, "A"), (_NON_ASCII, "x")], b" ")
_HEX = _view([("ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ", "a"), ("abcdef", "h"), ("ABCDEF", "H"), (_DIGITS, "0")], b" ")
_NUM = _view([(_DIGITS, "0"), (" ", " "), (_NON_ASCII, "y")], b"x")
_PUN = _view([(_PUNCT, "."), ("\n", "n"), (_NON_ASCII, "x")], b" ")
_LEAD = _view([(_LOWER + _UPPER, "a"), (_QUOTES, "q"), (_GLUE, "l"), (_OTHER_PUNCT, ".")], b" ")

# Non-ASCII characters that are one cl100k token each (3 UTF-8 bytes).
_TYPOGRAPHIC = tuple(ch.encode("utf-8") for ch in "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u2022")


# Joining two texts raises the weighted counts by at most 1.35 at the seam (see
# "Subadditivity" above); adding 1.4 to every estimate makes the estimate
# subadditive.  Raise it if a weight above grows.
_SEAM = 1.4


def estimate_tokens(text: str) -> int:
    """An upper estimate of the cl100k_base token count of ``text``."""
    if not text:
        return 0
    raw = text.encode("utf-8")
    case = raw.translate(_CASE)
    hexv = raw.translate(_HEX)
    num = raw.translate(_NUM)
    pun = raw.translate(_PUN)
    lead = raw.translate(_LEAD)

    # Letters: runs, length, camelCase humps, capital triples.
    first = case[:1]
    runs = case.count(b" a") + case.count(b" A") + (first == b"a" or first == b"A")
    non_ascii = case.count(b"x")
    if non_ascii:
        runs += case.count(b"xa") + case.count(b"xA")
    letters = len(raw) - case.count(b" ") - non_ascii
    x = (
        1.0 * runs
        + 0.052 * letters
        + 1.17 * case.count(b"aA")
        + 0.75 * case.count(b"AAA")
    )
    # Hex ids: letters between digits tokenize nearly one by one.
    x += 0.3 * (hexv.count(b"0hhh") + hexv.count(b"hhh0") + hexv.count(b"0HHH") + hexv.count(b"HHH0"))
    x += 1.0 * (hexv.count(b"hhhh") + hexv.count(b"HHHH"))
    # Numbers: one token per group of <= 3 digits; a blank before one is a token.
    blank_digit = num.count(b" 0")
    digit_runs = blank_digit + num.count(b"x0") + (num[:1] == b"0")
    if non_ascii:
        digit_runs += num.count(b"y0")
    x += 1.07 * digit_runs + 0.85 * num.count(b"000") + 1.48 * (blank_digit + (num[-1:] == b" "))
    # Punctuation runs; what cl100k glues back together is returned.
    punct_runs = pun.count(b" .") + pun.count(b"n.") + (pun[:1] == b".")
    if non_ascii:
        punct_runs += pun.count(b"x.")
    x += 1.18 * punct_runs + 1.13 * pun.count(b"...")
    x += -1.3 * (text.count('":"') + text.count('","')) - 0.47 * lead.count(b"ala")
    x += 0.43 * lead.count(b".a")
    # Line breaks, indentation, tabs.
    newlines = text.count("\n")
    pairs = text.count("\n\n")
    if "\r" in text:
        newlines += text.count("\r")
        pairs += text.count("\r\n")
    if newlines:
        x += 1.47 * newlines - 1.5 * pairs - 0.98 * pun.count(b".n")
    x += 0.42 * (text.count("  ") - text.count("    ")) + 0.36 * text.count("\t")
    # Non-ASCII: UTF-8 bytes, a hard upper bound (typographic marks: 1 token).
    if non_ascii:
        x += non_ascii
        if b"\xe2\x80" in raw:
            x -= 2 * sum(raw.count(mark) for mark in _TYPOGRAPHIC)
    return max(1, math.ceil(x + _SEAM))
