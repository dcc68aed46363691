"""Query planning: free text to a safe FTS5 MATCH expression (pure)."""

import pytest

from core.compile.planning import MAX_TERMS, plan_query


def test_terms_are_quoted_and_or_ed():
    assert plan_query("Deploy smoke").match == '"deploy" OR "smoke"'


def test_fts5_operators_become_words_or_punctuation():
    plan = plan_query('"xx" OR yy* NEAR(aa bb) col:zz ^qq (')
    assert plan.terms == ("xx", "yy", "near", "aa", "bb", "col", "zz", "qq")
    assert all(part.startswith('"') and part.endswith('"') for part in plan.match.split(" OR "))


def test_function_words_are_dropped_unless_nothing_else_is_left():
    assert plan_query("the deploy of the service").terms == ("deploy", "service")
    assert plan_query("the of and").terms == ("the", "of", "and")


def test_at_most_sixteen_distinct_terms_in_order():
    words = [f"w{i}" for i in range(30)]
    plan = plan_query(" ".join(words + words))
    assert plan.terms == tuple(words[:MAX_TERMS])


def test_no_searchable_term_gives_no_match():
    assert plan_query("?! ... ---").match is None


def test_terms_are_case_folded_and_deduplicated():
    assert plan_query("Deploy DEPLOY deploy").terms == ("deploy",)


def test_words_are_lower_cased_as_the_index_folds_case_not_case_folded():
    # casefold would write ß as ss; the index keeps straße
    assert plan_query("Straße DEPLOY").terms == ("straße", "deploy")


def test_the_marks_class_is_every_combining_mark_of_its_unicode_version():
    """core/lexical/marks.py is generated, not computed at import: it holds
    exactly the marks (M*) of the Unicode version it names, and every
    character in it is a mark in this Python's tables whatever their version."""
    import re
    import unicodedata

    from core.lexical.marks import MARKS, UNICODE_VERSION

    in_class = re.compile(f"[{MARKS}]")
    listed = {c for c in range(0x110000) if in_class.fullmatch(chr(c))}
    assert all(unicodedata.category(chr(c)).startswith("M") for c in listed)
    if unicodedata.unidata_version == UNICODE_VERSION:
        assert listed == {c for c in range(0x110000) if unicodedata.category(chr(c)).startswith("M")}


@pytest.mark.parametrize("task, terms", [
    ("wdrożenie w piątek", ("wdrożenie", "piątek")),
    ("qui est l'approbateur", ("qui", "est", "approbateur")),
    ("η γάτα", ("γατ",)),
    ("step 1", ("step", "1")),
    ("猫", ("猫",)),
    ("x", ("x",)),  # nothing else left: searched
    # a word whose stem would be one letter stays whole, and is not dropped
    ("να δούμε", ("να", "δούμε")),
    ("ось пятница", ("ось", "пятниц")),
])
def test_a_one_letter_word_of_a_cased_alphabet_is_dropped_like_a_function_word(task, terms):
    assert plan_query(task).terms == terms
