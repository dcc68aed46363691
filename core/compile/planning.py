"""Query planning: free task text → a safe FTS5 MATCH expression.

Pure, no I/O. The task is first rewritten as statements are when they are
indexed (``core.lexical.words.task_text``: one Unicode form, CJK runs as
bigrams, Cyrillic, Greek and Arabic words as stems), then split into words the way the index's unicode61
tokenizer splits text (runs of letters, digits and combining marks: a
Devanagari vowel sign is part of its word), lower-cased as the
tokenizer folds case (not ``casefold``, which writes ß as ss where the
index keeps ß), function words (and words written only in Hiragana, mostly
particles, and one-letter words of an alphabet with case: Polish ``w``,
Russian ``в``, Greek ``η``, French ``l`` of ``l'eau`` are prepositions,
articles or elisions, never what a task asks about) dropped unless nothing
else is left, deduplicated in order, and
capped at 16 terms. Each term is emitted as a double-quoted FTS5 string and
the terms are OR-ed, so operators typed into a task (``NEAR``, ``AND``, ``*``,
``^``, ``col:``, quotes, parentheses) are searched as words or dropped as
punctuation — never executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.lexical.marks import MARKS
from core.lexical.words import hiragana_only, task_text

MAX_TERMS = 16
_WORD = re.compile(f"(?:[^\\W_]|[{MARKS}])+")
_ASCII_WORD = re.compile(r"[^\W_]+")  # the same words in ASCII text, four times faster

FUNCTION_WORDS = frozenset("""
a about above after again against all also am an and any are as at be been before being below
between both but by can could did do does doing down during each every few for from further had
has have having he her here hers him his how i if in into is it its itself just me more most must
my no nor not now of off on once only or other our ours out over own same she should since so
some such than that the their theirs them then there these they this those through to too under
until up upon very was we were what when where which while who whom why will with would you
your yours
""".split())


@dataclass(frozen=True)
class QueryPlan:
    terms: tuple[str, ...]

    @property
    def match(self) -> str | None:
        """The FTS5 MATCH expression, or None when there is nothing to search."""
        if not self.terms:
            return None
        return " OR ".join(f'"{t}"' for t in self.terms)


def _one_cased_letter(word: str) -> bool:
    """A word of one letter of an alphabet with upper and lower case (Latin,
    Cyrillic, Greek, …); digits and CJK characters are not."""
    return len(word) == 1 and word.upper() != word.lower()


def plan_query(task: str) -> QueryPlan:
    text = task_text(task)
    words = [w.lower() for w in (_ASCII_WORD if text.isascii() else _WORD).findall(text)]
    content = [w for w in words if w not in FUNCTION_WORDS and not hiragana_only(w) and not _one_cased_letter(w)]
    chosen = content or words
    terms: list[str] = []
    seen: set[str] = set()
    for w in chosen:
        if w not in seen:
            seen.add(w)
            terms.append(w)
            if len(terms) == MAX_TERMS:
                break
    return QueryPlan(tuple(terms))
