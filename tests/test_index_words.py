"""What the index holds of text FTS5 alone cannot search, the same on both
sides (a statement entering the index, a task being planned): text in one
Unicode form (NFKC) with Turkish i folded, Chinese, Japanese and Korean as
character bigrams, Cyrillic, Greek and Arabic words as their Snowball stems.

Without it FTS5's unicode61 tokenizer made a whole unspaced CJK clause one
token, and porter stems English only, so ``пятницу`` never found
``пятница``."""

import random
import shutil
import unicodedata

import apsw
import pytest
from hypothesis import given, strategies as st

from core import lexical
from core.compile.planning import plan_query
from core.compile.retrieval import CompileScope, fts_candidates
from core.keys import Principal
from core.lexical.words import hiragana_only, index_text, task_text
from core.scope import reader_tags
from conftest import ALL_SCOPES


def found_alone(api, statement: str, task: str, other: str) -> list[dict]:
    """Store ``statement`` and ``other`` as claims of one subject, compile
    ``task``: the pack is ``statement``'s claim alone (its items returned)."""
    key = api.key()
    wanted = api.observe(key, claim={"statement": statement, "kind": "procedural", "confidence": 0.9})["claim_id"]
    api.observe(key, claim={"statement": other, "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    r = api.compile(key, task)
    assert r.status_code == 200, r.text
    items = r.json()["data"]["items"]
    assert [item["claim_id"] for item in items] == [wanted]
    return items


@pytest.mark.parametrize("text, indexed", [
    ("金曜日", " 金曜 曜日 "),
    ("部署需要", " 部署 署需 需要 "),
    ("日", " 日 "),
    # a run ends where its script does: no bigram straddles kanji and kana
    ("金曜日のデプロイ", " 金曜 曜日  の  デプ プロ ロイ "),
    ("배포는 금요일에", " 배포 포는   금요 요일 일에 "),
    ("ABC金曜 test", "ABC 金曜  test"),
    # half-width Katakana is the full-width word (NFKC)
    ("ﾃﾞﾌﾟﾛｲ", " デプ プロ ロイ "),
    # the Katakana middle dot is punctuation, not part of a run
    ("スモーク・テスト", " スモ モー ーク ・ テス スト "),
])
def test_a_tasks_cjk_runs_become_overlapping_bigrams(text, indexed):
    assert task_text(text) == indexed


@pytest.mark.parametrize("text, indexed", [
    ("金曜日", " 金曜 曜日 金 曜 日 "),
    ("日", " 日 "),
    ("我家的猫。", " 我家 家的 的猫 我 家 的 猫 。"),
])
def test_a_statements_cjk_runs_give_their_bigrams_and_their_characters(text, indexed):
    assert index_text(text) == indexed


@pytest.mark.parametrize("language, statement, task, other", [
    ("zh", "我家的猫叫皮克斯。", "猫", "周一的例会十点开始。"),
    ("ja", "毎晩ジョギングします。", "晩", "月曜日の朝会は十時に始まります。"),
])
def test_a_one_character_word_finds_the_claim_that_holds_it_inside_a_run(api, language, statement, task, other):
    found_alone(api, statement, task, other)


@pytest.mark.parametrize("forms", [
    ("пятница", "пятницу", "пятницы", "Пятнице"),
    ("развёртывание", "развертывания", "Развёртыванием"),
    ("ανάπτυξη", "ανάπτυξης", "Ανάπτυξη"),
    ("παρασκευή", "παρασκευής"),
    ("الجمعة", "جمعة"),
])
def test_inflected_forms_in_cyrillic_greek_and_arabic_index_as_one_word(forms):
    assert len({index_text(form) for form in forms}) == 1
    assert all(len(index_text(form).split()) == 1 for form in forms)  # one word stays one word


def test_a_stem_replaces_its_word_in_place():
    assert index_text("Deploy в пятницу, x1пятницу!") == "Deploy в пятниц, x1пятниц!"


# Latin (English, Polish, German, …), IPA, Hebrew, Devanagari, Thai: no
# bigrams, no stems, nothing removed
_OTHER_SCRIPTS = st.text(alphabet=st.one_of(
    st.characters(blacklist_categories=("Cs",), max_codepoint=0x036f, blacklist_characters="\u0130\u0131"),
    # Hebrew letters and punctuation (its points are removed: UNICODE_FORMS)
    st.characters(min_codepoint=0x05be, max_codepoint=0x05ff, blacklist_characters="\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7"),
    st.characters(min_codepoint=0x0900, max_codepoint=0x0e7f)))


def _plain(text: str) -> bool:
    """In NFKC, with no mark and no invisible formatting character (rule 0 removes some of those)."""
    return unicodedata.is_normalized("NFKC", text) and not any(
        unicodedata.category(ch)[0] == "M" or unicodedata.category(ch) == "Cf" for ch in text)


@given(_OTHER_SCRIPTS.filter(_plain))
def test_plain_text_in_other_scripts_is_indexed_unchanged(text):
    assert index_text(text) is text
    assert task_text(text) is text


@pytest.mark.parametrize("text, folded", [
    ("Pru\u0308fer", "Prüfer"),                       # decomposed: composed
    ("ＡＰＩ ﬁle", "API file"),                         # full-width, ligature
    ("Fri\u00adday de\u200bploy", "Friday deploy"),  # soft hyphen, zero-width space
    ("पश्\u200dचिम", "पश्चिम"),                          # a joiner inside an Indic word
    ("❤\ufe0f cat", "❤ cat"),                         # an emoji's variation selector
    ("1\ufe0f\u20e3 step", "1 step"),                # a keycap
    ("\u0301x \u00a8", "x  "),                       # marks with no letter before them
    ("शुक्रवार", "शुक्रवार"),                              # marks after their letter stay
])
def test_rule_zero_folds_what_is_invisible_or_another_encoding_of_the_same_word(text, folded):
    assert index_text(text) == folded == task_text(text)


# Khmer, Thai, Lao, Burmese and Tibetan put no space between words; where a
# writer marks the boundaries, it is with a zero-width space, which there is a
# space (anywhere else it is removed, as an invisible character inside a word)
@pytest.mark.parametrize("text, words", [
    ("\u179f\u1780\u1798\u17d2\u1798\u1797\u17b6\u1796\u200b\u1793\u17c1\u17c7",
     "\u179f\u1780\u1798\u17d2\u1798\u1797\u17b6\u1796 \u1793\u17c1\u17c7"),            # Khmer
    ("การ\u200bปรับ\u200bใช้\u200bวัน\u200bศุกร์", "การ ปรับ ใช้ วัน ศุกร์"),                       # Thai
    ("ສະບາຍ\u200bດີ", "ສະບາຍ ດີ"),                                                              # Lao
    ("မင်္ဂလာ\u200bပါ", "မင်္ဂလာ ပါ"),                                                            # Burmese
    ("de\u200bploy", "deploy"),                                               # inside a Latin word
])
def test_a_zero_width_space_between_words_of_an_unspaced_script_separates_them(text, words):
    assert index_text(text) == words == task_text(text)


def test_a_khmer_claim_written_with_word_boundaries_is_found_by_one_of_its_words(api):
    statement = "\u1780\u17b6\u179a\u200b\u178a\u17b6\u1780\u17cb\u200b\u1796\u1784\u17d2\u179a\u17b6\u1799"  # ការ​ដាក់​ពង្រាយ
    found_alone(api, statement, "\u178a\u17b6\u1780\u17cb", "\u1790\u17d2\u1784\u17c3\u200b\u179f\u17bb\u1780\u17d2\u179a")


def test_an_apostrophe_inside_a_cyrillic_word_is_removed_in_every_spelling():
    assert {index_text(w) for w in ("п'ятниця", "п’ятниця", "пʼятниця", "пятниця")} == {index_text("пятниця")}
    assert index_text("l'eau") == "l'eau"  # a Latin elision is split by the tokenizer, as before


# The same words typed in another Unicode form: decomposed (NFD, as macOS
# file names and some keyboards give them), full-width (as Japanese input
# gives Latin), a ligature, Turkish capitals.
UNICODE_FORMS = {
    "de": ("Der Prüfer genehmigt Änderungen", unicodedata.normalize("NFD", "Prüfer Änderungen")),
    "ru": ("Развёртывание в пятницу", unicodedata.normalize("NFD", "развёртывание")),
    "el": ("Η ανάπτυξη την Παρασκευή", unicodedata.normalize("NFD", "ανάπτυξη Παρασκευή")),
    "ko": ("금요일 배포는 승인자가 필요합니다", unicodedata.normalize("NFD", "배포 승인자")),
    "ja": ("ＡＰＩキーの更新", "API"),
    "latin ligature": ("the config ﬁle", "file"),
    "tr": ("DAĞITIM CUMA GÜNÜ YAPILIR", "dağıtım"),
    "he": ("הפריסה ביום שישי דורשת אישור שני", "פְּרִיסָה אִישּׁוּר"),
    "uk": ("Реліз у пʼятницю заборонено.", "п'ятницю"),
    "fa": ("پشتیبان\u200cگیری هر شب انجام می\u200cشود", "پشتیبانگیری"),
    "emoji": ("❤️ Pixel the cat loves tuna", "❤ Pixel"),
}


@pytest.mark.parametrize("language", sorted(UNICODE_FORMS))
def test_a_word_plans_the_same_terms_in_any_unicode_form(language):
    statement, task = UNICODE_FORMS[language]
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        assert plan_query(unicodedata.normalize(form, task)).terms == plan_query(task).terms


@pytest.mark.parametrize("language", sorted(UNICODE_FORMS))
@pytest.mark.parametrize("stored, asked", [("NFC", "NFD"), ("NFD", "NFC")])
def test_a_claim_is_found_by_a_task_in_another_unicode_form(api, language, stored, asked):
    statement, task = UNICODE_FORMS[language]
    statement = unicodedata.normalize(stored, statement)
    key = api.key()
    wanted = api.observe(key, claim={"statement": statement, "kind": "procedural", "confidence": 0.9})["claim_id"]
    api.observe(key, claim={"statement": "Standup is at ten.", "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    r = api.compile(key, unicodedata.normalize(asked, task))
    assert r.status_code == 200, r.text
    assert [item["claim_id"] for item in r.json()["data"]["items"]] == [wanted]
    assert r.json()["data"]["items"][0]["claim"] == statement  # as written, in the form it was written


@pytest.mark.parametrize("word, particle", [
    ("の", True), ("には", True), ("です", True), ("金曜", False), ("デプ", False), ("배포", False),
    ("deploy", False),
])
def test_words_written_only_in_hiragana_are_particles(word, particle):
    assert hiragana_only(word) is particle


def test_a_japanese_task_plans_its_bigrams_without_particles():
    assert plan_query("金曜日のデプロイには承認が必要").terms == (
        "金曜", "曜日", "デプ", "プロ", "ロイ", "承認", "必要")


def test_a_task_of_particles_alone_still_searches_them():
    assert plan_query("のには").terms == ("のに", "には")


LANGUAGES = {
    "ja": ("金曜日のデプロイには二人目の承認者とスモークテストの成功が必要です。", "デプロイの承認者",
           "月曜日の朝会は十時に始まります。"),
    "zh": ("周五部署需要第二位审批人，并且冒烟测试必须通过。", "部署审批人是谁",
           "周一的例会十点开始。"),
    "ko": ("금요일 배포는 두 번째 승인자와 스모크 테스트 통과가 필요합니다.", "배포 승인자",
           "월요일 회의는 열 시에 시작합니다."),
    # each task word in another inflection than the statement's
    "ru": ("Развёртывание в пятницу требует второго утверждающего.", "пятница развёртыванием",
           "Совещание по понедельникам начинается в десять."),
    "el": ("Η ανάπτυξη την Παρασκευή απαιτεί δεύτερο εγκριτή.", "ανάπτυξης παρασκευής",
           "Η συνάντηση της Δευτέρας ξεκινά στις δέκα."),
    "ar": ("النشر يوم الجمعة يتطلب موافقة ثانية.", "نشر جمعة",
           "اجتماع الاثنين يبدأ في العاشرة."),
}


# Scripts whose vowel signs and viramas are combining marks (Unicode M*):
# a word is its letters and its marks, never the letters alone.
MARKED_WORDS = {
    "hi": ("शुक्रवार की तैनाती के लिए दूसरा अनुमोदक चाहिए।", "शुक्रवार",
           "परिनियोजन से पहले सुरक्षा ऑडिट होता है।"),
    "ta": ("வெள்ளிக்கிழமை வெளியீட்டுக்கு இரண்டாவது ஒப்புதல் தேவை.", "வெள்ளிக்கிழமை",
           "திங்கள் கூட்டம் பத்து மணிக்கு தொடங்கும்."),
    "bn": ("শুক্রবার ডিপ্লয়ের জন্য দ্বিতীয় অনুমোদন লাগে।", "শুক্রবার",
           "সোমবারের সভা দশটায় শুরু হয়।"),
}


@pytest.mark.parametrize("word", ["शुक्रवार", "तैनाती", "வெள்ளிக்கிழமை", "শুক্রবার", "ภาษา"])
def test_a_word_with_combining_marks_plans_as_one_term(word):
    assert plan_query(f"{word}, {word}!").terms == (word,)


@pytest.mark.parametrize("language", sorted(MARKED_WORDS))
def test_a_claim_in_a_marked_script_is_found_by_its_word_and_no_other_claim_is(api, language):
    """Split at its marks, a word was a handful of single letters, and a
    task matched any claim holding one of them."""
    found_alone(api, *MARKED_WORDS[language])


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_a_claim_is_found_by_a_task_in_other_words_or_forms(api, language):
    statement, task, other = LANGUAGES[language]
    item, = found_alone(api, statement, task, other)
    assert item["claim"] == statement  # the item shows the statement as written


def test_the_candidate_index_equals_the_fts5_query_on_these_scripts(api):
    """The bigrams and stems reach the candidate index through the builder: same rows,
    same order, bit-identical bm25 as FTS5's own query."""
    rng = random.Random(7)
    words = ["金曜日", "の", "デプロイ", "には", "承認者", "スモークテスト", "部署", "审批人", "测试", "周五",
             "배포는", "승인자", "테스트", "deploy", "smoke", "、", " пятницу ", " пятница ", " ανάπτυξης ",
             " الجمعة ", " शुक्रवार ", " தமிழ் "]
    key = api.key()
    for i in range(40):
        # unspaced, as these languages are written; word frequencies uneven
        text = "".join(rng.choice(words[:rng.randint(3, len(words))]) for _ in range(rng.randint(2, 9)))
        api.observe(key, content=f"note {i}", claim={"statement": text, "kind": "semantic_fact",
                                                     "confidence": 0.9})
    api.rebuild(key)
    snapshot = api.service.reader.current("acme")
    scope = CompileScope(Principal("acme", "p", "key", frozenset({"context:compile"}), ()), "user_rama", None,
                         "2100-01-01T00:00:00.000000Z")
    where, params = scope.where()
    checked = 0
    for task in ["デプロイ 承認", "部署 审批人 测试", "배포 승인자", "金曜日 deploy", "スモーク smoke 周五", "пятницы",
                 "ανάπτυξη الجمعة", "शुक्रवार தமிழ்"]:
        plan = plan_query(task)
        expected = fts_candidates(snapshot.db, where, params, plan.match, 200)
        got = lexical.top_candidates(snapshot.db, "user_rama", reader_tags(scope.principal), where, params,
                                     plan.terms, 200)
        if got is None:  # this platform's FTS5 sums this many phrases its own way
            continue
        assert expected and got == expected, task
        checked += 1
    assert checked >= 3


def _lexical_rows(path):
    db = apsw.Connection(path)
    rows = (list(db.execute("SELECT * FROM lex_terms ORDER BY term")),
            list(db.execute("SELECT * FROM lex_postings ORDER BY subject_id, term, first_rowid")))
    db.close()
    return rows


def test_erasing_stemmed_claims_leaves_the_candidate_index_a_whole_build_would_write(api, tmp_path):
    """An erasure edits the candidate index with the words claims_fts holds
    (here stems), not the statement as written: no posting of an erased
    claim stays behind, and the index is what a whole build writes."""
    key = api.key(scopes=ALL_SCOPES + ",memory:erase")
    # stems keep a statement's word count, so the incremental edit is taken
    # (a count that changed would send the build to a whole one and hide a
    # wrong edit)
    for statement in ("Развёртывание в пятницу требует второго утверждающего.", "Релизы по пятницам запрещены.",
                      "Η ανάπτυξη την Παρασκευή."):
        api.observe(key, subject_id="subj_r", claim={"statement": statement, "kind": "procedural",
                                                     "confidence": 0.9})
    api.observe(key, subject_id="subj_k", claim={"statement": "Деплой в пятницу разрешён.", "kind": "procedural",
                                                 "confidence": 0.9})
    api.rebuild(key)
    assert api.client.delete("/v1/subjects/subj_r", headers={"authorization": key["authorization"]}).status_code == 202
    api.rebuild(key)
    snapshot = api.service.reader.current("acme")
    assert snapshot.db.execute("SELECT count(*) FROM lex_postings WHERE subject_id = 'subj_r'").fetchone()[0] == 0
    copy = str(tmp_path / "copy.sqlite")
    shutil.copyfile(snapshot.path, copy)
    served = _lexical_rows(copy)
    db = apsw.Connection(copy)
    with db:
        lexical.build_lexical_index(db)
    db.close()
    assert served == _lexical_rows(copy)
    assert [i["claim"] for i in api.compile(key, "пятница", subject_id="subj_k").json()["data"]["items"]] == [
        "Деплой в пятницу разрешён."]


def test_an_emojis_variation_selector_is_not_a_word_that_matches_every_emoji(api):
    key = api.key()
    for statement in ("☀️ sunny weather today", "❤️ Pixel the cat loves tuna"):
        api.observe(key, claim={"statement": statement, "kind": "procedural", "confidence": 0.9})
    api.rebuild(key)
    r = api.compile(key, "⚠️ warning")
    assert r.status_code == 200 and r.json()["data"]["items"] == []
