"""Query-string parameters: text, read strictly.

A query string has no types: every value is text. Orrery reads the typed ones by one
rule on every route (docs/reliability.md, "Strict types"):

- an integer (`AS_INT`) is decimal digits, optionally after a `-`, at most
  `MAX_INT_DIGITS` of them: `8`, `08`, `-1` (then refused by the route's bounds);
  never `8.0`, `+8`, ` 8`, `1_000` or `0x8`;
- a boolean (`AS_BOOL`) is exactly `true` or `false`: never `1`, `yes`, `on` or
  `True` (the lax parsers' `"yes"` → true is how a typo becomes a different request).

Anything else is `422 invalid_request` naming the parameter. Bodies are JSON and typed
(`contracts.wire`); their models are strict (`"2"` is no integer there).
"""

from __future__ import annotations

import re

from pydantic import BeforeValidator

__all__ = ["AS_BOOL", "AS_INT", "MAX_INT_DIGITS", "query_bool", "query_int"]

MAX_INT_DIGITS = 20
_INT = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")


def query_int(value: object) -> object:
    """The integer a query-string value spells (`ValueError` otherwise); a non-string
    (a default, a Python caller) passes through to the type's own check."""
    if not isinstance(value, str):
        return value
    if not _INT.fullmatch(value):
        raise ValueError(f"must be an integer in decimal digits (at most {MAX_INT_DIGITS})")
    return int(value)


def query_bool(value: object) -> object:
    """The boolean a query-string value spells: `true` or `false` (`ValueError`
    otherwise); a non-string passes through to the type's own check."""
    if not isinstance(value, str):
        return value
    if value == "true":
        return True
    if value == "false":
        return False
    raise ValueError("must be true or false")


# The validators of a typed query parameter, after its `Query(...)` in `Annotated`
# (`n: Annotated[int, Query(ge=0), AS_INT] = 8`: FastAPI keeps both only so).
AS_INT = BeforeValidator(query_int)
AS_BOOL = BeforeValidator(query_bool)
