"""Strict JSON for request bodies: the one loader every HTTP body parser uses.

`json.loads` accepts more than a public API should: `NaN` and `Infinity`, numbers that
overflow to infinity (`1e999`), duplicate object keys (the last one silently wins),
integers of thousands of digits (a `ValueError` past Python's digit limit, and quadratic
work below it), nesting deep enough to exhaust the interpreter's stack, and escaped lone
surrogates (`"\\ud800"`) that no later UTF-8 encoding of the value survives. Each of
those ended as a 500, or worse as an acknowledged write the projector could not index.
`loads_strict` turns every one of them into `400 invalid_json` before a model sees the
value.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic_core import from_json

from contracts.errors import ErrorCode, OrreryError

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "JsonInt",
    "json_key_count",
    "loads_strict",
    "typed_parse_pairs",
    "validate_strict",
]

# Deeper than any request or payload Orrery needs, far below the interpreter's stack.
MAX_DEPTH = 64
# Every 64-bit integer fits; beyond it JSON clients disagree about the value anyway.
MAX_INT_DIGITS = 20

# A JSON string (as UTF-8 bytes): removing them leaves the body's structure and numbers.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
for _opening in b"[{":
    _STEP[_opening] = 1
for _closing in b"]}":
    _STEP[_closing] = -1
# Only a body with a long number gets the (slower, per-number) checking parsers: over
# MAX_INT_DIGITS digits in a row, or a positive exponent of three or more digits (a float
# overflows only with one of the two). Searched in the body's structure with every digit
# mapped to 0: a substring and a regex with a literal first character are fast over
# megabytes of vectors; a regex with a digit class is not.
_NUMBER_SHAPE = bytes.maketrans(b"123456789E", b"000000000e")
_LONG_DIGITS = b"0" * (MAX_INT_DIGITS + 1)
_LONG_EXPONENT = re.compile(rb"e\+?000")
# An escaped UTF-16 surrogate; whether it is paired is checked on the parsed value.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _invalid(message: str, **details: Any) -> OrreryError:
    return OrreryError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {message}", details)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _invalid(f"duplicate object key {key[:100]!r}", key=key[:100])
            seen.add(key)
    return out


def _no_constant(name: str) -> Any:
    raise _invalid(f"{name} is not a JSON number (non-finite numbers are not accepted)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _invalid(
            f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})",
            max_digits=MAX_INT_DIGITS,
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid(f"the number {text[:40]} overflows to infinity")
    return value


def _skeleton(raw: bytes) -> bytes:
    """`raw` with every string's content removed (`""` left in its place)."""
    if b"\\" not in raw:
        # No escapes: quotes alternate open/close, so every second piece is a string's
        # content (twice as fast as the regex over megabytes of vectors). An odd number
        # of quotes (an unterminated string) takes the regex, as any escape does.
        pieces = raw.split(b'"')
        if len(pieces) % 2 == 1:
            return b'""'.join(pieces[::2])
    return _STRING.sub(b'""', raw)


# `_STEP` as a numpy lookup table, for bodies of many brackets (a batch of records).
_STEPS = np.array(_STEP, dtype=np.int8)
_NUMPY_BRACKETS = 256


def _depth(skeleton: bytes) -> int:
    brackets = skeleton.translate(None, _NOT_BRACKET)
    if len(brackets) > _NUMPY_BRACKETS:
        # The same running sum, in numpy: ~1 against ~0.1 us a record of a 2,000-record
        # body (16 brackets each); below the threshold the calls cost more than the sum.
        steps = _STEPS[np.frombuffer(brackets, dtype=np.uint8)].astype(np.int64)
        return int(np.cumsum(steps).max())
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads_strict(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of a request body, or `OrreryError(INVALID_JSON)` (400).

    Guarantees on a returned value: `raw` was UTF-8 JSON text; it held no duplicate
    object key, no non-finite number (`NaN`, `Infinity`, or a literal that overflows a
    float), no integer of more than `MAX_INT_DIGITS` digits, no arrays or objects nested
    deeper than `max_depth`, and no unpaired surrogate escape — so the value survives
    canonical JSON encoding. Depth is checked on the text before parsing, so no input
    can exhaust the stack. No I/O.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"invalid UTF-8 at byte {exc.start}", byte=exc.start) from None
    skeleton = _skeleton(raw)
    depth = _depth(skeleton)
    if depth > max_depth:
        raise _invalid(f"nested deeper than {max_depth} levels", max_depth=max_depth)
    shape = skeleton.translate(_NUMBER_SHAPE)
    checked = _LONG_DIGITS in shape or _LONG_EXPONENT.search(shape) is not None
    surrogate = _SURROGATE_ESCAPE.search(raw) is not None
    if not checked and not surrogate:
        fast = _fast_loads(raw, skeleton)
        if fast is not _REFUSED:
            return fast
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_int if checked else int,
            parse_float=_finite_float if checked else float,
        )
    except json.JSONDecodeError as exc:
        raise _invalid(str(exc), line=exc.lineno, column=exc.colno) from None
    except (RecursionError, ValueError) as exc:  # defence in depth: the scans catch these
        raise _invalid(type(exc).__name__) from None
    if surrogate:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _invalid("a string holds an unpaired UTF-16 surrogate escape") from None
    return value


def typed_parse_pairs(raw: bytes, *, max_depth: int = MAX_DEPTH) -> int | None:
    """How many key/value pairs the JSON text `raw` holds (colons outside strings), when
    a typed parse of it (pydantic's `validate_json` into a model that refuses non-finite
    numbers where it types them) can stand in for `loads_strict`; None when it cannot,
    and `loads_strict` must read it.

    Not None only for valid UTF-8 nested at most `max_depth` deep without what the typed
    parse would take where `loads_strict` refuses it: no long number (over
    `MAX_INT_DIGITS` digits, or a positive exponent of three or more digits), no
    surrogate escape, no `NaN` / `Infinity` token. The one refusal left to the caller is
    a duplicate object key, which the parser drops silently: the caller compares the
    pairs its parsed value holds (`json_key_count`, `model_fields_set`) with this count,
    and reads the body with `loads_strict` when they differ. No I/O.
    """
    if not raw.isascii():  # ASCII is UTF-8: the check at a third of the decode's cost
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    skeleton = _skeleton(raw)
    if _depth(skeleton) > max_depth:
        return None
    shape = skeleton.translate(_NUMBER_SHAPE)
    if _LONG_DIGITS in shape or _LONG_EXPONENT.search(shape) is not None:
        return None
    # Outside strings, letters are `true`, `false`, `null`, exponents (`e`, `E`) — or the
    # non-finite tokens, which the skeleton shows by their capitals.
    if b"N" in skeleton or b"I" in skeleton or _SURROGATE_ESCAPE.search(raw) is not None:
        return None
    return skeleton.count(b":")


_REFUSED = object()


def _fast_loads(raw: bytes, skeleton: bytes) -> Any:
    """The value of `raw` by pydantic's JSON parser (several times faster than `json`
    with a pairs hook on bodies of vectors), or `_REFUSED` when the strict path must
    decide: a parse error (the strict path words it) or a duplicate key.

    Only for a body the scans found free of long numbers and surrogate escapes (the
    cases where the parsers differ). A duplicate key is seen by counting: every colon
    outside strings (`skeleton`) separates one key from its value, so the text holds
    exactly as many pairs as the parsed objects hold keys unless a key repeats.
    """
    try:
        value = from_json(raw, allow_inf_nan=False)
    except ValueError:
        return _REFUSED
    if json_key_count(value) != skeleton.count(b":"):
        return _REFUSED
    return value


def json_key_count(value: Any) -> int:
    """The number of keys of every object in a parsed JSON value — or fewer: a list whose
    first and last items are numbers is taken for a list of numbers (a vector) without
    looking at the rest. Counting short is safe: a caller comparing it with the text's
    colons (`_fast_loads`, `typed_parse_pairs`) then lets the strict path decide, as for
    a duplicate key; only a list mixing numbers and containers takes that slower path.
    Vectors are most of a body, and their items' types cost a quarter of the fast parse
    when each is looked at."""
    count = 0
    stack = [value]
    push = stack.append
    while stack:
        item = stack.pop()
        if type(item) is dict:
            count += len(item)
            # An object's values one by one: objects are small (a payload's ~10 keys),
            # where building a set of their types cost twice as much.
            for v in item.values():
                if type(v) is dict or type(v) is list:
                    push(v)
        elif type(item) is list:
            if not item or (type(item[0]) in _NUMBERS and type(item[-1]) in _NUMBERS):
                continue
            # A list's types at C speed first: lists can be long (tags, strings).
            types = set(map(type, item))
            if dict in types or list in types:
                stack.extend([v for v in item if type(v) is dict or type(v) is list])
    return count


_NUMBERS = frozenset({int, float})


def _json_integer(value: object) -> object:
    # JSON Schema's integer is a number without a fraction: `2.0` is one (OpenAPI
    # clients and fuzzers send it), `true` and `"2"` are not (the strict type refuses
    # them after this).
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# An integer field of a request body: in a strict model, a JSON integer or a number
# without a fraction (`2`, `2.0`), never a boolean, a string or `2.5`. In an optional
# field pydantic writes its bounds as `ge`/`le` inside the union: say them again as
# `minimum`/`maximum` in the field's `json_schema_extra`.
JsonInt = Annotated[int, BeforeValidator(_json_integer)]

M = TypeVar("M", bound=BaseModel)


def validate_strict(raw: Any, model: type[M]) -> M:
    """`raw` (from `loads_strict`) as `model`: unknown fields are `422 unknown_field`,
    every other mismatch `422 invalid_request`, each naming the fields."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        details = {
            "errors": [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
        }
        unknown = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            raise OrreryError(
                ErrorCode.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", details
            ) from exc
        raise OrreryError(ErrorCode.INVALID_REQUEST, "the request is invalid", details) from exc
