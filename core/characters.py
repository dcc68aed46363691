"""Which characters a text in a body may not hold (docs/api.md §4).

One table, read by the validator (core.validation) and by the OpenAPI
document's string patterns (core.bodies), so the service and its document
never disagree: C0 controls except tab (09) and line feed (0A), DEL, C1
controls, and the bidirectional controls (ALM, LRM/RLM, embeddings and
overrides, isolates), which can make a stored text read other than it is.
"""

FORBIDDEN_RANGES = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x9F), (0x61C, 0x61C), (0x200E, 0x200F),
                    (0x202A, 0x202E), (0x2066, 0x2069))

# the ranges as the inside of a regular-expression class, as backslash-u
# escapes of four hex digits, which Python's re and ECMA-262 (JSON Schema's
# pattern) read alike
FORBIDDEN_CLASS = "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}"
                          for lo, hi in FORBIDDEN_RANGES)
