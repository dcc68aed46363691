"""Every accepted instant lies in 1970-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z
in UTC after its offset (docs/api.md §5); outside it is a 400 naming the field
and nothing is written. Calendar-edge offsets used to raise OverflowError (500)."""

import pytest

OUT_OF_RANGE = [
    "0001-01-01T00:00:00+14:00",   # before year 1 once the offset is applied
    "9999-12-31T23:59:59-14:00",   # past year 9999 once the offset is applied
    "0001-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999999Z",
    "1970-01-01T00:00:00+00:01",   # 1969-12-31T23:59Z
]
IN_RANGE = [
    ("occurred_at", "1970-01-01T00:00:00Z"),
    ("occurred_at", "1970-01-01T14:00:00+14:00"),  # exactly the earliest instant
    ("occurred_at", "9999-12-31T23:59:59.999999Z"),
    ("occurred_at", "9999-12-31T09:59:59-14:00"),
    ("valid_from", "1970-01-01T00:00:00Z"),
    ("valid_to", "9999-12-31T23:59:59Z"),
    ("valid_to", "9999-12-31T09:59:59-14:00"),
]

CLAIM = {"statement": "Deploy smoke must pass before release.", "kind": "procedural", "confidence": 0.9}


def observation(field, value):
    body = {"subject_id": "user_rama", "kind": "tool_result", "content": "ok",
            "source": {"type": "tool", "ref": "r"}, "visibility": "organization"}
    if field == "occurred_at":
        body["occurred_at"] = value
    else:
        body["claim"] = {**CLAIM, field: value}
        if field == "valid_to":
            body["claim"]["valid_from"] = "1970-01-01T00:00:00Z"
    return body


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("field", ["occurred_at", "valid_from", "valid_to"])
def test_an_observation_instant_out_of_range_is_a_400_naming_the_field(api, field, value):
    key = api.key()
    r = api.post("/v1/observations", observation(field, value), key)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["message"].startswith(field if field == "occurred_at" else f"claim.{field}")
    assert "1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z" in error["message"]
    assert api.ledger_keys() == []


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_a_consolidation_instant_out_of_range_is_a_400_naming_the_field(api, value):
    key = api.key()
    obs_id = api.observe(key)["observation_id"]
    before = api.ledger_keys()
    r = api.post("/v1/consolidations", {"subject_id": "user_rama", "claims": [
        {**CLAIM, "valid_from": value, "sources": [{"observation_id": obs_id, "relation": "supports"}]}]}, key)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("claims[0].valid_from")
    assert api.ledger_keys() == before


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_a_compile_at_out_of_range_is_a_400_naming_the_field(api, value):
    key = api.key()
    api.observe(key, claim=CLAIM)
    api.rebuild(key)
    before = api.ledger_keys()
    r = api.compile(key, "deploy", at=value)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "VALIDATION_ERROR"
    assert r.json()["error"]["message"].startswith("at must be an instant from")
    assert api.ledger_keys() == before  # no context run recorded


@pytest.mark.parametrize("field,value", IN_RANGE)
def test_the_ends_of_the_range_are_accepted(api, field, value):
    key = api.key()
    r = api.post("/v1/observations", observation(field, value), key)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("value", ["1970-01-01T00:00:00Z", "9999-12-31T23:59:59-00:00"])
def test_compile_at_the_ends_of_the_range_answers(api, value):
    key = api.key()
    api.observe(key, claim=CLAIM)
    api.rebuild(key)
    r = api.compile(key, "deploy", at=value)
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["at"][:4] == value[:4]


# The shape (core.instants.SHAPE): the extended ISO-8601 date and time, seconds
# and fraction optional, Z or an offset; nothing around it.
WELL_SHAPED = ["2026-07-30T12:00:00Z", "2026-07-30t12:00:00z", "2026-07-30 12:00:00Z", "2026-07-30T12:00Z",
               "2026-07-30T12:00:00.5+05:30", "2026-07-30T12:00:00+0530", "2026-07-30T12:00:00-03"]
ILL_SHAPED = ["2026-07-30T12:00:00Z ", " 2026-07-30T12:00:00Z", "2026-07-30T12:00:00.Z", "20260730T120000Z",
              "2026-W31-4T12:00:00Z", "2026-07-30T12:00:00", "10000-01-01T00:00:00Z", "2026-07-30",
              "２０２６-07-30T12:00:00Z",
              # offsets past 23 hours or 59 minutes (datetime.fromisoformat took +00:99 as 99 minutes)
              "2026-03-01T05:30:00+00:99", "2026-03-01T05:30:00-01:75", "2026-03-01T05:30:00+0099",
              "2026-03-01T05:30:00+00:60", "2026-03-01T05:30:00+24:00", "2026-03-01T05:30:00-24"]


@pytest.mark.parametrize("value", WELL_SHAPED)
def test_a_well_shaped_instant_is_accepted(api, value):
    assert api.post("/v1/observations", observation("occurred_at", value), api.key()).status_code == 201


@pytest.mark.parametrize("value", ILL_SHAPED)
def test_an_ill_shaped_instant_is_a_400_that_says_the_shape_and_writes_nothing(api, value):
    r = api.post("/v1/observations", observation("occurred_at", value), api.key())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(
        "occurred_at must be an ISO-8601 instant YYYY-MM-DDTHH:MM[:SS[.ffffff]] with Z or an offset")
    assert api.ledger_keys() == []


# the right shape, naming a date or time the calendar lacks: the error says which part
NO_SUCH_INSTANT = [("2026-02-30T00:00:00Z", "day is out of range for month"),
                   ("2025-02-29T12:00:00Z", "day is out of range for month"),
                   ("2026-13-01T00:00:00Z", "month must be in 1..12"),
                   ("2026-07-30T24:00:00Z", "hour must be in 0..23"),
                   ("2026-07-30T12:60:00Z", "minute must be in 0..59"),
                   ("2026-12-31T23:59:60Z", "second must be in 0..59")]


@pytest.mark.parametrize("value,reason", NO_SUCH_INSTANT)
def test_a_date_or_time_that_does_not_exist_is_a_400_saying_so_and_writes_nothing(api, value, reason):
    r = api.post("/v1/observations", observation("occurred_at", value), api.key())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == (
        f"occurred_at names a date or time that does not exist ({reason}); got {value!r}")
    assert api.ledger_keys() == []


@pytest.mark.parametrize("value,kept", [("2025-12-31T23:59:59.9999999Z", "2025-12-31T23:59:59.999999Z"),
                                        ("2026-07-30T12:00:00.123456789+02:00", "2026-07-30T10:00:00.123456Z")])
def test_a_fraction_is_kept_to_the_microsecond_and_never_rounded_up(value, kept):
    from core.instants import canonical, parse_instant
    assert canonical(parse_instant(value)) == kept

# (an offset that moves an in-pattern instant out of range is checked beyond the pattern)
@pytest.mark.parametrize("value", WELL_SHAPED + ILL_SHAPED + ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59.999999Z"])
def test_the_openapi_pattern_admits_only_what_the_validator_accepts(value):
    import re

    from core.instants import SCHEMA_PATTERN, parse_instant
    if re.search(SCHEMA_PATTERN, value):
        parse_instant(value)  # raises if the document promised what the service refuses


# instants the service accepts at the edges of its range, offsets included:
# 1969-12-31 with a negative offset is 1970 in UTC
ACCEPTED_AT_THE_EDGES = ["1969-12-31T23:00:00-01:00", "1969-12-31 20:00-0400", "1969-12-31T01:00-23:00",
                         "1970-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59+05:00"]


@pytest.mark.parametrize("value", WELL_SHAPED + ACCEPTED_AT_THE_EDGES)
def test_the_openapi_pattern_never_refuses_an_instant_the_service_accepts(value):
    import re

    from core.instants import SCHEMA_PATTERN, parse_instant
    parse_instant(value)
    assert re.search(SCHEMA_PATTERN, value), value
