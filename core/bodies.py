"""The request bodies, declared once: what the validator enforces and what the documents say.

Each body is a ``Record`` of field specs (``Text``, ``Integer``, ``Number``,
``Flag``, ``Instant``, ``Record``, ``List``). ``core.validation.Fields``
reads a field through its spec (``Fields.take``), so the checks the write,
compile and feedback code run are these; ``schema()`` turns the same specs
into JSON Schema for ``GET /openapi.json`` (``core/api/openapi.py``) and the MCP
tools' input schemas (``core/api/mcp.py``). The document and the validator
therefore cannot drift: a limit changed here changes both.

The schemas never forbid what the validator accepts. Rules a schema cannot
state exactly (ill-formed Unicode and control characters, an instant's time
zone, cross-field rules such as ``valid_to > valid_from``, scopes) are
enforced by the code and described in ``docs/api.md``; a request the
schema allows may still be refused with 400, never the other way round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.domain import (CLAIM_KINDS, FEEDBACK_OUTCOMES, MAX_TASK_CHARS, OBSERVATION_KINDS, RELATIONS, TRUST_LEVELS,
                         VISIBILITY_RANK)
from core.instants import SCHEMA_PATTERN
from core.characters import FORBIDDEN_CLASS

IDENTIFIER_MAX = 128


def identifier_pattern(max_len: int) -> re.Pattern:
    """An identifier (letters, digits, '_.:@-', starting with a letter or
    digit) of at most ``max_len`` characters, so a schema's pattern and its
    maxLength say the same."""
    return re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,%d}$" % (max_len - 1))


IDENTIFIER = identifier_pattern(IDENTIFIER_MAX)
SOURCE_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# What ``str.strip`` removes (every character with ``str.isspace()``), so
# "not blank" reads the same in Python and in the JSON Schema pattern.
PY_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                 "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_WHITESPACE_CLASS = "".join(f"\\u{ord(c):04x}" for c in PY_WHITESPACE)
# Free text in the document: no character the body rules refuse
# (core.characters), and not blank. Stated in full so that
# a generator working from the document (schemathesis) sends text the
# service accepts; tab and line feed stay allowed.
FREE_TEXT = f"^[^{FORBIDDEN_CLASS}]*[^{FORBIDDEN_CLASS}{_WHITESPACE_CLASS}][^{FORBIDDEN_CLASS}]*$"


def _nullable(schema: dict, nullable: bool) -> dict:
    if nullable:
        schema = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    return schema


@dataclass(frozen=True)
class Text:
    max_len: int = 256
    pattern: re.Pattern | None = None
    choices: tuple[str, ...] | None = None
    default: str | None = None
    description: str = ""
    # choices the reader takes so that a later rule can refuse them with its
    # own message, and the schema therefore leaves out of its enum
    refused: tuple[str, ...] = ()
    # likewise a format a later rule enforces with its own message: stated
    # in the schema only
    format_pattern: str | None = None

    def read(self, f, name: str, required: bool):
        # a refused choice is read (a later rule refuses it with its own
        # message) but never offered in the message for a wrong one
        return f.string(name, required=required, max_len=self.max_len, pattern=self.pattern,
                        choices=self.choices, default=self.default, refused=self.refused)

    def schema(self, nullable: bool) -> dict:
        if self.choices is not None:
            s: dict[str, Any] = {"type": "string", "enum": [c for c in self.choices if c not in self.refused]}
        else:
            s = {"type": "string", "maxLength": self.max_len,
                 "pattern": (self.pattern.pattern if self.pattern is not None
                             else self.format_pattern or FREE_TEXT)}
        if self.default is not None:
            s["default"] = self.default
        if self.description:
            s["description"] = self.description
        return _nullable(s, nullable)


@dataclass(frozen=True)
class Integer:
    lo: int
    hi: int
    description: str = ""

    def read(self, f, name: str, required: bool):
        return f.integer(name, required=required, lo=self.lo, hi=self.hi)

    def schema(self, nullable: bool) -> dict:
        s = {"type": "integer", "minimum": self.lo, "maximum": self.hi}
        if self.description:
            s["description"] = self.description
        return _nullable(s, nullable)


@dataclass(frozen=True)
class Number:
    lo: float
    hi: float
    description: str = ""

    def read(self, f, name: str, required: bool):
        return f.number(name, required=required, lo=self.lo, hi=self.hi)

    def schema(self, nullable: bool) -> dict:
        s = {"type": "number", "minimum": self.lo, "maximum": self.hi}
        if self.description:
            s["description"] = self.description
        return _nullable(s, nullable)


@dataclass(frozen=True)
class Flag:
    default: bool = False
    description: str = ""

    def read(self, f, name: str, required: bool):
        return f.boolean(name, default=self.default)

    def schema(self, nullable: bool) -> dict:
        s = {"type": "boolean", "default": self.default}
        if self.description:
            s["description"] = self.description
        return _nullable(s, nullable)


@dataclass(frozen=True)
class Instant:
    description: str = "instant with Z or an offset, 1970-9999, e.g. 2026-07-30T12:00:00Z"
    # the document's example: a field whose rule compares it with another
    # (valid_to later than valid_from) has one a client may combine with it
    example: str = "2026-07-30T12:00:00Z"

    def read(self, f, name: str, required: bool):
        return f.instant(name, required=required)

    def schema(self, nullable: bool) -> dict:
        return _nullable({"type": "string", "maxLength": 64, "pattern": SCHEMA_PATTERN,
                          "description": self.description, "examples": [self.example]}, nullable)


@dataclass(frozen=True)
class Record:
    fields: dict[str, Any]
    required: tuple[str, ...] = ()
    description: str = ""
    # cross-field rules the document can state (JSON Schema ``if``/``then``);
    # the reader enforces them with its own messages
    rules: tuple[dict, ...] = ()

    def read(self, f, name: str, required: bool):
        return f.object(name, self, required=required)

    def only(self, *names: str, required: tuple[str, ...] | None = None) -> "Record":
        return Record({n: self.fields[n] for n in names},
                      tuple(n for n in self.required if n in names) if required is None else required)

    def extended(self, fields: dict[str, Any], required: tuple[str, ...] = ()) -> "Record":
        return Record({**self.fields, **fields}, self.required + required, self.description)

    def schema(self, nullable: bool = False) -> dict:
        s: dict[str, Any] = {"type": "object",
                             "properties": {n: spec.schema(n not in self.required)
                                            for n, spec in self.fields.items()},
                             "additionalProperties": False}
        if self.required:
            s["required"] = list(self.required)
        if self.rules:
            s["allOf"] = list(self.rules)
        if self.description:
            s["description"] = self.description
        return _nullable(s, nullable)


@dataclass(frozen=True)
class List:
    items: Any
    max_len: int
    min_len: int = 0
    # an item the list must hold (JSON Schema ``contains``), enforced by the reader
    contains: dict | None = None

    def read(self, f, name: str, required: bool):
        return f.array(name, required=required, min_len=self.min_len, max_len=self.max_len)

    def schema(self, nullable: bool) -> dict:
        s = {"type": "array", "items": self.items.schema(False), "minItems": self.min_len, "maxItems": self.max_len}
        if self.contains is not None:
            s["contains"] = self.contains
        return _nullable(s, nullable)


@dataclass(frozen=True)
class Raw:
    """A value checked by the code that reads it, not by its container
    (a batch item: its errors are reported per index)."""
    description: str = ""

    def read(self, f, name: str, required: bool):
        return f.raw(name)

    def schema(self, nullable: bool) -> dict:
        # any JSON value, but the body rules hold inside it as in the whole
        # body: a text with a refused character refuses the request
        s = {"$ref": "#/components/schemas/BodyValue"}
        return {**s, "description": self.description} if self.description else s


_NO_FORBIDDEN = f"^[^{FORBIDDEN_CLASS}]*$"
# Any JSON value whose texts and keys hold no refused character (the
# OpenAPI document's components.schemas.BodyValue; recursive, so a Raw
# field is only ever stated inside that document).
BODY_VALUE = {"anyOf": [{"type": "string", "pattern": _NO_FORBIDDEN}, {"type": ["number", "boolean", "null"]},
                        {"type": "array", "items": {"$ref": "#/components/schemas/BodyValue"}},
                        {"type": "object", "propertyNames": {"pattern": _NO_FORBIDDEN},
                         "additionalProperties": {"$ref": "#/components/schemas/BodyValue"}}]}


def identifier(description: str = "") -> Text:
    return Text(max_len=128, pattern=IDENTIFIER, description=description)


MAX_CONTENT = 32_768
MAX_STATEMENT = 4_000
TRUST_CHOICES = tuple(TRUST_LEVELS)  # policy_approved is read, then refused with a clear message
WRITE_REFUSED_TRUST = ("policy_approved",)

CLAIM = Record({
    "statement": Text(max_len=MAX_STATEMENT),
    "kind": Text(choices=CLAIM_KINDS),
    "confidence": Number(0.0, 1.0),
    "valid_from": Instant("start of validity (default: when the ledger accepted the claim)"),
    "valid_to": Instant("end of validity, later than valid_from (default: open-ended)",
                        example="2027-07-30T12:00:00Z"),
    "observer_id": identifier("who observed it, when not the writer"),
}, ("statement", "kind", "confidence"))

SOURCE = Record({
    "type": Text(max_len=32, pattern=SOURCE_TYPE),
    "ref": Text(max_len=1024),
    "id": Text(max_len=256),
}, ("type", "ref"))

OBSERVATION = Record({
    "subject_id": identifier("who or what the evidence is about"),
    "project_id": identifier(),
    "workspace_id": identifier("required for team visibility"),
    "kind": Text(choices=OBSERVATION_KINDS),
    "content": Text(max_len=MAX_CONTENT),
    "source": SOURCE,
    "trust": Text(choices=TRUST_CHOICES, default="asserted", refused=WRITE_REFUSED_TRUST,
                  description="verified needs memory:verify; policy_approved is never accepted"),
    "visibility": Text(choices=tuple(VISIBILITY_RANK), default="private"),
    "occurred_at": Instant(),
    "claim": CLAIM,
}, ("subject_id", "kind", "content", "source"), "one piece of evidence, optionally with the claim it supports",
    rules=({"if": {"properties": {"visibility": {"const": "team"}}, "required": ["visibility"]},
            "then": {"properties": {"workspace_id": {"type": "string"}}, "required": ["workspace_id"]}},))

CLAIM_SOURCE = Record({
    # (refused as "not an observation id" by core/writes/consolidations.py)
    "observation_id": Text(max_len=64, description="obs_<32 hex>", format_pattern=r"^obs_[0-9a-f]{32}$"),
    "relation": Text(choices=RELATIONS),
}, ("observation_id", "relation"))

CONSOLIDATED_CLAIM = CLAIM.extended({
    "trust": Text(choices=TRUST_CHOICES, refused=WRITE_REFUSED_TRUST,
                  description="capped by the strongest supporting evidence; policy_approved is never accepted"),
    "visibility": Text(choices=tuple(VISIBILITY_RANK),
                       description="default and widest: the narrowest of the supporting evidence"),
    "workspace_id": identifier(),
    "sources": List(CLAIM_SOURCE, min_len=1, max_len=20,
                    contains={"type": "object", "properties": {"relation": {"const": "supports"}},
                              "required": ["relation"]}),
}, ("sources",))

CONSOLIDATION = Record({
    "subject_id": identifier(),
    "project_id": identifier(),
    "claims": List(CONSOLIDATED_CLAIM, min_len=1, max_len=50),
}, ("subject_id", "claims"), "caller-written claims, each citing its evidence")

TRANSITION = Record({
    "expected_version": Integer(1, 1_000_000, "the claim's current version (409 otherwise)"),
    "reason": Text(max_len=500),
}, ("expected_version",))

SUPERSEDE = TRANSITION.extended(CLAIM.only(*CLAIM.fields, required=()).fields, ("statement",))

COMPILE = Record({
    "subject_id": identifier(),
    "task": Text(max_len=MAX_TASK_CHARS, description="what the agent is about to do"),
    "max_tokens": Integer(128, 32000, "the bound on the size of the answer's data in cl100k_base tokens (meta is not "
                                       "counted)"),
    "project_id": identifier("narrow to this project (claims without one are then excluded)"),
    "include_checkpoints": Flag(),
    "at": Instant("evaluate validity and recency as of this instant (default: now)"),
}, ("subject_id", "task", "max_tokens"))

MAX_BATCH_ITEMS = 100
BATCH = Record({
    "items": List(Raw("one POST /v1/observations body (#/components/schemas/Observation); an invalid item is "
                      "reported by its index and stored nowhere, the others are stored"),
                  min_len=1, max_len=MAX_BATCH_ITEMS),
}, ("items",), "up to 100 observation bodies in one ledger entry")

FEEDBACK = Record({
    "outcome": Text(choices=FEEDBACK_OUTCOMES),
    "claim_id": Text(max_len=64, description="a claim of the pack; omitted: feedback on the whole pack"),
    "reason_code": Text(max_len=64, pattern=identifier_pattern(64)),
}, ("outcome",))

__all__ = ["BATCH", "CLAIM", "CLAIM_SOURCE", "COMPILE", "CONSOLIDATED_CLAIM", "CONSOLIDATION", "FEEDBACK", "IDENTIFIER",
           "OBSERVATION", "Record", "SOURCE", "SUPERSEDE", "TRANSITION"]
