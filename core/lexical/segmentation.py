"""Words for scripts written without spaces: CJK runs become overlapping bigrams.

FTS5's unicode61 tokenizer splits text at anything that is not a letter or
a digit. Chinese and Japanese put no spaces between words and Korean glues
particles to them, so a whole clause (``金曜日のデプロイには二人目の承認者``)
was one token: a task found a claim only by repeating that exact run, and
lexical search in those languages found nothing.

The rule, applied alike to a statement before it enters ``claims_fts`` and
to a task before it is planned (``core.compile.planning``): every maximal
run of one script among Han, Hiragana, Katakana and Hangul becomes its
overlapping character bigrams, each a word of its own (``金曜日のデプロイ``
→ ``金曜 曜日 の デプ プロ ロイ``; a lone character stays one word), as
Lucene's CJK bigram analyzer does. Runs are cut where the script changes, so
no bigram straddles a kanji stem and its kana ending or particle. Text
holding none of those characters comes back unchanged, so every other
language tokenizes, counts and scores exactly as before.

A word written only in Hiragana is mostly a particle or an inflection
(``の``, ``には``, ``です``): ``hiragana_only`` lets the planner treat it as a
function word.

Pure, no I/O.
"""

from __future__ import annotations

import re

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


def _bigrams(match: re.Match) -> str:
    run = match.group()
    if len(run) == 1:
        return f" {run} "
    return " " + " ".join(run[i:i + 2] for i in range(len(run) - 1)) + " "


def index_text(text: str) -> str:
    """``text`` with every CJK run written as space-separated bigrams; any
    other text is returned as it is."""
    if not _CJK_RUN.search(text):
        return text
    return _CJK_RUN.sub(_bigrams, text)


def hiragana_only(word: str) -> bool:
    return _HIRAGANA_WORD.fullmatch(word) is not None
