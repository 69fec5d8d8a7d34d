"""The strict JSON loader every body parser uses: each hostile class → 400 invalid_json,
every ordinary body unchanged; and every error code has exactly one status."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import HTTP_STATUS, ErrorCode, OrreryError
from contracts.wire import MAX_DEPTH, MAX_INT_DIGITS, json_key_count, loads_strict


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def rejected(raw: bytes, **kwargs: Any) -> OrreryError:
    with pytest.raises(OrreryError) as caught:
        loads_strict(raw, **kwargs)
    assert caught.value.code is ErrorCode.INVALID_JSON
    assert caught.value.http_status == 400
    assert caught.value.message.startswith("the body is not valid JSON: ")
    return caught.value


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "Expecting property name"),
        (b"", "Expecting value"),
        (b"\xff\xfe[]", "invalid UTF-8 at byte 0"),
        (b'{"a": "caf\xe9"}', "invalid UTF-8 at byte 10"),
        ('[{"a": 1}]'.encode("utf-16"), "invalid UTF-8"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b"[Infinity]", "Infinity is not a JSON number"),
        (b'{"v": [0.5, -Infinity]}', "-Infinity is not a JSON number"),
        (b"[1e999]", "overflows to infinity"),
        (b"[-1E+0400]", "overflows to infinity"),
        (b"[" + b"9" * 400 + b".5]", "overflows to infinity"),
        (b'{"revision": ' + b"1" * 5001 + b"}", "an integer of 5001 digits"),
        (b"[-" + b"1" * (MAX_INT_DIGITS + 1) + b"]", f"{MAX_INT_DIGITS + 1} digits"),
        (b'{"a": 1, "b": 2, "a": 3}', "duplicate object key 'a'"),
        (b'[{"x": {"k": 1, "k": 1}}]', "duplicate object key 'k'"),
        # Behind a vector and beside colons in strings (the fast path counts keys).
        (b'[{"v": [0.5, 1, -2e-3], "s": "a:b"}, [0.25, {"k": ":", "k": 2}]]', "key 'k'"),
        (b'{"p": {"x": 1}, "q": [{"y": 1, "z": 2}], "p": 3}', "duplicate object key 'p'"),
        # Inside a list that starts and ends with numbers (counted as a vector: unseen).
        (b'{"v": [0.5, {"k": 1, "k": 2}, 0.25]}', "duplicate object key 'k'"),
        (b'[[1, [2, {"a": {"b": 0, "b": 1}}], 3]]', "duplicate object key 'b'"),
        (nested(10_000), f"nested deeper than {MAX_DEPTH} levels"),
        (b"[" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
        (b'{"a": ' * 5_000 + b"1" + b"}" * 5_000, f"nested deeper than {MAX_DEPTH}"),
        (b'["\\ud800"]', "unpaired UTF-16 surrogate"),
        (b'{"s": "x\\uDC00y"}', "unpaired UTF-16 surrogate"),
        (b'["\\ud83d"]', "unpaired UTF-16 surrogate"),
    ],
)
def test_hostile_bodies_are_invalid_json(raw: bytes, says: str) -> None:
    assert says in rejected(raw).message


def test_depth_is_counted_outside_strings_and_bounded_exactly() -> None:
    assert loads_strict(nested(MAX_DEPTH)) is not None
    rejected(nested(MAX_DEPTH + 1))
    assert loads_strict(nested(3), max_depth=3) == [[[]]]
    rejected(nested(4), max_depth=3)
    brackets_in_text = json.dumps({"text": "[[[[{{{{" * 100, "q": '"\\]]]'}).encode()
    assert loads_strict(brackets_in_text, max_depth=1) == json.loads(brackets_in_text)


def test_ordinary_bodies_parse_as_json_loads_does() -> None:
    rng = random.Random(7)
    body = [
        {
            "namespace": "ns",
            "item_id": f"fact:{i}",
            "revision": 2**62,
            "payload": {"nested": {"list": [1, -2, 3.25, True, None, "ü€😀"]}, "big": 10**19},
            "text": {"title": 'quote " and \\ backslash [', "tags": []},
            "vector": [rng.uniform(-1, 1) for _ in range(16)] + [1e-300, -2.5e-8, 1e308],
        }
        for i in range(50)
    ]
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert loads_strict(raw) == json.loads(raw)
    ascii_raw = json.dumps(body, ensure_ascii=True).encode()  # paired surrogate escapes
    assert loads_strict(ascii_raw) == body
    assert loads_strict(b"-" + b"9" * MAX_INT_DIGITS) == -int("9" * MAX_INT_DIGITS)
    assert loads_strict(b'"\\\\ud800"') == "\\ud800"  # an escaped backslash, no surrogate
    assert loads_strict(b"[1e-999, 1E+99]") == [0.0, 1e99]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**19), max_value=10**19)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_every_finite_shallow_value_round_trips(value: Any, ensure_ascii: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    assert loads_strict(raw) == value


def test_every_error_code_has_exactly_one_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert HTTP_STATUS[ErrorCode.BODY_TOO_LARGE] == 413
    assert HTTP_STATUS[ErrorCode.METHOD_NOT_ALLOWED] == 405
    assert HTTP_STATUS[ErrorCode.UNSUPPORTED_MEDIA_TYPE] == 415
    assert HTTP_STATUS[ErrorCode.INVALID_JSON] == 400


def test_bodies_of_vectors_parse_exactly() -> None:
    """The fast parser (bodies without long numbers or surrogate escapes) gives the
    very floats `json.loads` gives, shortest repr or 17 digits."""
    rng = random.Random(11)
    body = [
        {
            "item_id": f"v{i}",
            "vector": [round(rng.uniform(-1, 1), 6) for _ in range(384)],
            "raw": [float(f"{rng.uniform(-1, 1):.17g}") for _ in range(64)],
            "meta": {"k": "v:1", "n": [{"a": 1}, {"b": [2, {"c": 3}]}]},
        }
        for i in range(20)
    ]
    raw = json.dumps(body).encode()
    assert loads_strict(raw) == json.loads(raw) == body


def test_lists_mixing_numbers_and_containers_parse_exactly() -> None:
    body = {"v": [0.5, {"a": 1, "b": [2, {"c": 3}]}, [4, 5], 0.25], "w": [1, [], {}, 2.5]}
    raw = json.dumps(body).encode()
    assert loads_strict(raw) == json.loads(raw) == body


@settings(max_examples=200, deadline=None)
@given(json_values, st.booleans())
def test_the_fast_skeleton_is_the_regex_skeleton(value: Any, ensure_ascii: bool) -> None:
    from contracts.wire import _STRING, _skeleton

    raw = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    for body in (raw, raw + b' "open', b'["a", "b"] "' + raw):
        assert _skeleton(body) == _STRING.sub(b'""', body)


def _keys_of_every_object(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys_of_every_object(v) for v in value.values())
    if isinstance(value, list):
        return sum(_keys_of_every_object(v) for v in value)
    return 0


def _has_vector_shaped_list_of_containers(value: Any) -> bool:
    """A list whose first and last items are numbers but that holds a container: the one
    case where `json_key_count` may count short (it takes such a list for a vector)."""
    if isinstance(value, dict):
        return any(_has_vector_shaped_list_of_containers(v) for v in value.values())
    if isinstance(value, list):
        numbers = (int, float)
        if (
            value
            and type(value[0]) in numbers
            and type(value[-1]) in numbers
            and any(isinstance(v, dict | list) for v in value)
        ):
            return True
        return any(_has_vector_shaped_list_of_containers(v) for v in value)
    return False


@given(json_values)
def test_json_key_count_counts_every_key_or_fewer_for_vector_shaped_lists(value: Any) -> None:
    """The keys of every object of a parsed value, exactly, except inside a list whose
    first and last items are numbers (taken for a vector): then never more."""
    counted = json_key_count(value)
    keys = _keys_of_every_object(value)
    if _has_vector_shaped_list_of_containers(value):
        assert counted <= keys
    else:
        assert counted == keys


@given(st.binary(max_size=600), st.lists(st.sampled_from(b"[]{}"), min_size=150, max_size=600))
def test_the_depth_of_many_brackets_is_the_running_sum(noise: bytes, brackets: list[int]) -> None:
    """`_depth` (numpy past a few hundred brackets) is the maximum of the running sum of
    +1 per opening and -1 per closing bracket, as counted one by one."""
    from contracts.wire import _depth

    skeleton = bytes(brackets) + noise
    steps = [1 if b in b"[{" else -1 for b in skeleton if b in b"[]{}"]
    assert _depth(skeleton) == max(itertools.accumulate(steps), default=0)
