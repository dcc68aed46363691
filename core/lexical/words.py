"""How text becomes the words the index holds, in languages FTS5 alone cannot search.

FTS5's tokenizer (``porter unicode61``) splits text at anything that is not
a letter, a digit or a combining mark, folds case and diacritics, and stems English. Two kinds
of language fall through it, and this module rewrites their text before the
tokenizer sees it. The rule: a statement gets ``index_text`` before it
enters ``claims_fts`` and a task gets ``task_text`` before it is planned
(``core.compile.planning``); the two differ only in that a statement's CJK
runs also give their single characters (rule 1), so both sides hold the
same words. Text
already in the form of rule 0 and in none of the scripts below comes back
unchanged (the same object), so English, Polish, German and the rest
tokenize and count exactly as they would without it (their scores move only
as any other claim moves them: BM25's average length is the organization's).

0. **One Unicode form.** The same word reaches us composed (``ü``), decomposed
   (``u`` and a combining diaeresis, as macOS and some keyboards write it),
   full-width (``ＡＰＩ``, as Japanese input gives Latin), half-width
   (``ﾃﾞﾌﾟﾛｲ``) or as a ligature (``ﬁ``). FTS5 folds none of these alike and
   the planner split a word at each combining mark, so a task typed in one
   form never found a statement stored in another. Text is brought to NFKC
   first, and Turkish dotless ``ı`` and dotted ``İ`` become ``i`` and ``I``
   (FTS5 folds ``İ`` but not ``ı``, so ``DAĞITIM`` never met ``dağıtım``;
   the cost is that the few Turkish words told apart only by the dot merge).
   Hebrew vowel points and cantillation marks are removed: Hebrew is mostly
   written without them, and FTS5 folds none of them, so pointed ``שָׁלוֹם``
   never met ``שלום``. A zero-width space next to a letter of Thai, Lao,
   Tibetan, Burmese or Khmer is a space: those scripts put no space between
   words, and it is how their writers mark where one ends (Khmer text
   mostly does). Invisible characters (Unicode's default ignorables:
   soft hyphen, zero-width space, joiner and non-joiner, word joiner,
   variation selectors), which text copied from web pages and PDFs carries
   inside words, are removed, as search folding (NFKC_Casefold) removes them:
   ``Fri\u00adday`` was two words, and the emoji selector U+FE0F after
   ``❤`` was a word of its own that matched every emoji. So is a combining
   mark with no letter or digit before it, and an enclosing mark (a keycap,
   a circle). An apostrophe between two Cyrillic letters (``п'ятниця``,
   ``п’ятниця``, ``пʼятниця``: three spellings of one Ukrainian word) is
   removed.
1. **Scripts written without spaces.** Chinese and Japanese put no space
   between words and Korean glues particles to them, so a whole clause
   (``金曜日のデプロイには二人目の承認者``) was one token and a task found a claim
   only by repeating that clause exactly. Every maximal run of one script
   among Han, Hiragana, Katakana and Hangul becomes its overlapping
   character bigrams, each a word of its own (``金曜日のデプロイ`` → ``金曜 曜日 の
   デプ プロ ロイ``; a lone character stays one word), as Lucene's CJK bigram
   analyzer does. A statement's runs also give their single characters
   (``index_text``; a task's do not: ``task_text``), so a one-character word
   (``猫``) finds the claims that hold it inside a run, while a longer task
   still matches by bigrams, not by any character it shares. Runs are cut where the script changes, so no bigram
   straddles a kanji stem and its kana ending or particle. A word written
   only in Hiragana is mostly a particle or an ending (``の``, ``には``,
   ``です``): ``hiragana_only`` lets the planner treat it as a function word.
2. **Inflected languages in their own script.** Porter stems English only,
   so ``пятницу`` never matched ``пятница``. A word in Cyrillic, Greek or
   Arabic script is replaced by its Snowball stem (Russian, Greek and Arabic
   rules; PyStemmer, the C build of the Snowball project's stemmers), after
   lower-casing, in place: one word stays one word (or none: an Arabic
   tatweel or vowel mark standing alone has no stem; a word whose stem would
   be one letter stays whole). The script picks the
   rules: Ukrainian or Bulgarian text gets the Russian ones, Persian the
   Arabic ones — imperfect,
   but the same on both sides, so it only ever merges too many forms, never
   loses an exact match. Latin-script languages other than English cannot
   be told apart by script: they get the English rules after folding.

``WORDS_ID`` names these rules and the stemmer's version; a snapshot
records it, and a build never extends one recorded with another (its
postings would be edited with other words than it holds): it replays the
ledger.

Pure, no I/O.
"""

from __future__ import annotations

import re
import threading
import unicodedata

import Stemmer

from core.lexical.marks import MARKS

# Han (unified ideographs, extension A, compatibility, the supplementary
# planes' extensions, and the iteration marks 々 〆 〇), Hiragana, Katakana
# (with the prolonged sound mark, the phonetic extensions and half-width
# forms; the middle dot ・ is punctuation and stays out), Hangul syllables
# and jamo. One alternative per script: a run ends where its script does.
_HAN = "\u3005-\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_HIRAGANA = "\u3041-\u309f"
_KATAKANA = "\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_HAN}]+|[{_HIRAGANA}]+|[{_KATAKANA}]+|[{_HANGUL}]+")
_HIRAGANA_WORD = re.compile(f"[{_HIRAGANA}]+")

# Each script's letters (and, for Arabic, its vowel marks, which the stemmer
# normalizes away) and the Snowball rules its words get.
_STEMMED_SCRIPTS = (
    ("russian", "\u0400-\u0481\u048a-\u052f"),
    ("greek", "\u0370-\u0373\u0376\u0377\u037b-\u037d\u0386\u0388-\u03ff\u1f00-\u1fff"),
    ("arabic", "\u0620-\u065f\u066e-\u06d3\u06d5\u06fa-\u06fc\u06ff\u0750-\u077f"),
)
_STEMMED_WORD = re.compile("|".join(f"(?P<{language}>[{letters}]+)" for language, letters in _STEMMED_SCRIPTS))
# A Stemmer is not safe to share between threads (compile runs on a thread
# pool): one set per thread. Its word cache is off: stemming costs 0.2 us a
# word, and a cache of 10,000 caller words of up to 4,000 characters would
# hold hundreds of MB per thread.
_local = threading.local()
_TURKISH_I = str.maketrans({"\u0131": "i", "\u0130": "I"})
# the nonspacing marks of the Hebrew block (points and cantillation); its
# punctuation (maqaf, paseq, sof pasuq, nun hafukha) stays
_HEBREW_POINT = re.compile("[\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7]")
# Thai, Lao, Tibetan, Myanmar, Khmer (and Khmer symbols): scripts written
# without spaces, whose writers mark a word boundary with a zero-width space
_UNSPACED = "\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u19e0-\u19ff"
_UNSPACED_BOUNDARY = re.compile(f"(?<=[{_UNSPACED}])\u200b+|\u200b+(?=[{_UNSPACED}])")
# Default_Ignorable_Code_Point (DerivedCoreProperties.txt)
_IGNORABLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
                        "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
# marks with no letter or digit before them, and enclosing marks (Me)
_STRAY_MARK = re.compile(f"(?<![^\\W_])(?<![{MARKS}])[{MARKS}]+|[\u0488\u0489\u1abe\u20dd-\u20e0\u20e2-\u20e4\ua670-\ua672]+")
_CYRILLIC_APOSTROPHE = re.compile("(?<=[\u0400-\u052f])['\u2019\u02bc](?=[\u0400-\u052f])")
WORDS_ID = ("words-6 nfkc unspaced-zwsp turkish-i hebrew-points ignorables stray-marks cyrillic-apostrophe marks-in-words "
            f"cjk-bigrams+unigrams snowball-russian,greek,arabic pystemmer-{Stemmer.version()}")


def _bigrams(match: re.Match) -> str:
    run = match.group()
    if len(run) == 1:
        return f" {run} "
    return " " + " ".join(run[i:i + 2] for i in range(len(run) - 1)) + " "


def _bigrams_and_characters(match: re.Match) -> str:
    run = match.group()
    return _bigrams(match) + (" ".join(run) + " " if len(run) > 1 else "")


def _stem(match: re.Match) -> str:
    stemmers = getattr(_local, "stemmers", None)
    if stemmers is None:
        stemmers = _local.stemmers = {language: Stemmer.Stemmer(language, 0) for language, _ in _STEMMED_SCRIPTS}
    word = match.group().lower()
    stem = stemmers[match.lastgroup].stemWord(word)
    # a stem of one letter from a longer word (Greek δούμε → δ, Russian ось
    # → о) would match every word with that letter, and the planner drops
    # one-letter words: such a word stays whole
    return word if len(stem) == 1 and len(word) > 1 else stem


def index_text(text: str) -> str:
    """A statement's words as the index holds them: ``text`` under rule 0,
    every CJK run written as its bigrams and its single characters, every
    Cyrillic, Greek or Arabic word as its stem; text those rules leave alone
    is returned as it is."""
    return _words(text, _bigrams_and_characters)


def task_text(text: str) -> str:
    """A task's words, as ``index_text`` but a CJK run of two or more
    characters gives its bigrams only."""
    return _words(text, _bigrams)


def _words(text: str, cut_cjk) -> str:
    if not text.isascii():
        text = _folded(text)
    if _CJK_RUN.search(text):
        text = _CJK_RUN.sub(cut_cjk, text)
    if _STEMMED_WORD.search(text):
        text = _STEMMED_WORD.sub(_stem, text)
    return text


def _folded(text: str) -> str:
    """Rule 0."""
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    if "\u200b" in text and _UNSPACED_BOUNDARY.search(text):
        text = _UNSPACED_BOUNDARY.sub(" ", text)
    if _IGNORABLE.search(text):
        text = _IGNORABLE.sub("", text)
    if "\u0131" in text or "\u0130" in text:
        text = text.translate(_TURKISH_I)
    if _HEBREW_POINT.search(text):
        text = _HEBREW_POINT.sub("", text)
    if _STRAY_MARK.search(text):
        text = _STRAY_MARK.sub("", text)
    if _CYRILLIC_APOSTROPHE.search(text):
        text = _CYRILLIC_APOSTROPHE.sub("", text)
    return text


def hiragana_only(word: str) -> bool:
    return _HIRAGANA_WORD.fullmatch(word) is not None
