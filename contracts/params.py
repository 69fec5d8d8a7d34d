"""Query-string parameters: text, read strictly.

A query string has no types: every value is text. Orrery reads the typed ones by one
rule on every route (docs/reliability.md, "Strict types"):

- an integer (`QueryInt`) is decimal digits, optionally after a `-`, at most
  `MAX_INT_DIGITS` of them: `8`, `08`, `-1` (then refused by the route's bounds);
  never `8.0`, `+8`, ` 8`, `1_000` or `0x8`;
- a boolean (`QueryBool`) is exactly `true` or `false`: never `1`, `yes`, `on` or
  `True` (the lax parsers' `"yes"` → true is how a typo becomes a different request).

Anything else is `422 invalid_request` naming the parameter. Bodies are JSON and typed
(`contracts.wire`); their models are strict (`"2"` is no integer there).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["MAX_INT_DIGITS", "QueryBool", "QueryInt", "query_bool", "query_int"]

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


QueryInt = Annotated[int, BeforeValidator(query_int)]
QueryBool = Annotated[bool, BeforeValidator(query_bool)]
