"""The body rules of core/validation.py checked against JSON itself: the
depth limit counts the nesting the parser sees (brackets inside strings,
escapes and all), and the text rules find a forbidden character however it
was written (as itself or as an escape)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ValidationError
from core.validation import MAX_DEPTH, check_depth, parse_json_body, parse_json_value


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# strings full of what a bracket counter could trip on
_TRICKY = st.text(alphabet='[]{}"\\\nabc\t/', max_size=12)


def _nested(depth: int, leaf):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value, "s": "]}\"\\"}
    return value


@settings(max_examples=300, deadline=None)
@given(depth=st.integers(min_value=0, max_value=MAX_DEPTH + 8), leaf=_TRICKY,
       siblings=st.lists(_TRICKY, max_size=40))
def test_the_depth_limit_is_the_nesting_the_parser_sees(depth, leaf, siblings):
    value = {"pad": siblings, "v": _nested(depth, leaf)}
    text = json.dumps(value)
    if _depth(value) > MAX_DEPTH:
        with pytest.raises(ValidationError, match="nests deeper"):
            parse_json_value(text.encode())
    else:
        assert parse_json_value(text.encode()) == value


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(min_value=0, max_value=MAX_DEPTH + 8), leaf=_TRICKY,
       siblings=st.lists(_TRICKY, max_size=40))
def test_the_depth_rule_on_a_parsed_body_agrees_with_the_parser(depth, leaf, siblings):
    # MCP reads a tool's arguments inside a wider message, then checks them as a body
    value = {"pad": siblings, "v": _nested(depth, leaf)}
    try:
        parse_json_value(json.dumps(value).encode())
        refused = None
    except ValidationError as exc:
        refused = exc.message
    try:
        check_depth(value)
        checked = None
    except ValidationError as exc:
        checked = exc.message
    assert checked == refused


def test_a_json_error_names_its_place_once():
    # Python's message for a raw control character ends in "at"; the position was then "at at line"
    with pytest.raises(ValidationError) as raised:
        parse_json_value(b'{"a": "x\x01"}')
    assert raised.value.message == "request body is not valid JSON: Invalid control character at line 1 column 9"


@pytest.mark.parametrize("raw", [b'{"a": 1, "a": 1}', b'{"a": [{"b": 1, "c": 2, "b": 3}]}', b'{"a": {"\\u0062": 1, "b": 2}}'])
def test_a_key_twice_in_one_object_is_refused(raw):
    with pytest.raises(ValidationError, match="twice in one object"):
        parse_json_value(raw)


def test_the_same_key_in_two_objects_is_no_repeat():
    assert parse_json_value(b'{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}


def test_brackets_inside_strings_do_not_count_as_nesting():
    body = {"content": "[" * 200 + "{" * 200, "escaped": "\\\"[[[[" * 50}
    assert parse_json_body(json.dumps(body).encode()) == body


def test_a_string_that_never_closes_is_invalid_json_not_too_deep():
    with pytest.raises(ValidationError, match="not valid JSON"):
        parse_json_value(b'{"a": "' + b"[" * 100)


@pytest.mark.parametrize("written", [
    '"bell \\u0007"',      # an escape
    '"cr \\r"',            # a short escape
    '"bidi \u202e"',       # the character itself
    '"del \x7f"',          # the character itself (DEL is legal raw JSON)
])
@pytest.mark.parametrize("where", ["value", "key", "nested"])
def test_a_forbidden_character_is_refused_however_it_is_written(written, where):
    text = {"value": '{"content": %s}', "key": '{%s: 1}', "nested": '{"a": [{"b": [%s]}]}'}[where] % written
    with pytest.raises(ValidationError, match="is not allowed"):
        parse_json_body(text.encode())


def test_plain_text_with_escaped_quotes_and_line_feeds_is_accepted():
    body = {"content": 'she said "yes"\nand left\t(ok)', "path": "C:\\tmp"}
    assert parse_json_body(json.dumps(body).encode()) == body


def test_a_long_unclosed_string_after_many_brackets_is_refused_in_one_pass():
    """300 KB of escaped quotes inside a string that never closes: each one
    used to restart the string match to the end of the text (quadratic,
    minutes for a 1 MiB body); it is now one scan."""
    with pytest.raises(ValidationError, match="nests deeper"):
        parse_json_value(("{" * 65 + '"' + '\\"' * 150_000).encode())
    with pytest.raises(ValidationError, match="not valid JSON"):
        parse_json_value(("[" * 10 + '{"a": "' + "[" * 70 + '\\"' * 150_000).encode())


@pytest.mark.parametrize("digits", [4301, 5000])
def test_an_integer_too_long_to_read_is_refused_as_such_not_as_invalid_json(digits):
    with pytest.raises(ValidationError) as refused:
        parse_json_value(b'{"max_tokens": ' + b"9" * digits + b"}")
    assert refused.value.message == (f"request body holds an integer of {digits} digits; "
                                     "an integer in a body may have at most 4300")


def test_an_integer_of_4300_digits_is_still_json():
    assert parse_json_value(b"[-" + b"7" * 4300 + b"]")[0] == -int("7" * 4300)
