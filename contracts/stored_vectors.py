"""A record's vector as the projector keeps it from a decoded event: its values, their
float32 array and the JSON text the canonical store keeps of it, so that nothing
downstream formats or converts a float of it again (issue 24: in server mode the
projector formatted each 384-d vector back to JSON for Qdrant, ~24 us, and packed it to
float32 for the ring statistics, ~9 us)."""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard, overload

import numpy as np
import numpy.typing as npt
from pydantic import TypeAdapter

__all__ = [
    "PackedVector",
    "StoredVector",
    "float32_bytes",
    "float32_wire",
    "is_encoded",
    "packed_vector",
    "stored_vector",
]

# The characters of a JSON list of numbers inside its brackets. A vector's text goes
# into another JSON body (Qdrant's) as it is: with only these, it cannot change that
# body's structure (no quote, bracket, brace, colon or space).
_NUMBER_CHARACTERS = b"0123456789.eE+-,"


class StoredVector(list[float]):
    """A vector as a `list` of its float values (what a `Record.vector` is), with
    `float32`, those values as a read-only float32 array (rounded to nearest, as numpy and
    every engine round), and `json`, its JSON text (the decimals of the values as the
    canonical store wrote them).

    Every engine stores float32: a Qdrant server given `json`, and the ring statistics
    given `float32`, store what they stored from the list before. `length` is
    `math.hypot(*values)`, the Euclidean length `contracts.admission.vector_problem`
    measures: the projector checks a vector twice (its admission, then the vector
    engine's adapter), and measures it once."""

    __slots__ = ("float32", "json", "length")

    float32: npt.NDArray[np.float32]
    json: bytes
    length: float


def stored_vector(values: Sequence[float], json_text: bytes) -> StoredVector | None:
    """`values` as a `StoredVector` whose text is `json_text`, or None when `json_text`
    is not a bracketed list made of number characters and commas only (then the caller
    keeps `values` as they are). `json_text` must be the text `values` were parsed from
    (`contracts.events.decode_record_changed` cuts it from the text pydantic parsed; a
    count of its commas cost 3 us a 384-d vector): only its characters are checked here,
    so that it cannot change the structure of a body it goes into."""
    if (
        json_text[:1] != b"["
        or json_text[-1:] != b"]"
        or json_text[1:-1].translate(None, _NUMBER_CHARACTERS)
    ):
        return None
    vector = StoredVector(values)
    # Packed from `values` (pydantic's list): a call unpacks an exact list faster than a
    # subclass of it (~5 against ~8 us for 384).
    vector.float32 = np.frombuffer(float32_bytes(values), dtype=np.float32)
    vector.json = json_text
    vector.length = math.hypot(*values)
    return vector


# One packer per vector length (at most `Record.vector`'s 4,096 lengths).
_PACKERS: dict[int, struct.Struct] = {}


def float32_bytes(values: Sequence[float]) -> bytes:
    """`values` as native float32 bytes, each rounded by C's conversion, as numpy's cast
    rounds (to nearest; past float32's range an infinity, as the engines make it: the
    door refuses such vectors, and the projector's admission check sees the values),
    without numpy's overflow warning context, which cost as much as the conversion.

    `struct` packs a list of floats in half the time `array("f", ...)` takes (~4 against
    ~9 us for 384), with the same cast in its native mode; should a Python refuse there a
    finite value that becomes an infinity (its standard modes do: OverflowError),
    `array` converts them."""
    packer = _PACKERS.get(len(values))
    if packer is None:
        packer = _PACKERS.setdefault(len(values), struct.Struct(f"{len(values)}f"))
    try:
        return packer.pack(*values)
    except OverflowError:
        return array("f", values).tobytes()


# A vector on the wire and in the canonical stores' `vector_f32` columns: its float32
# values, little-endian, in order (`float32_wire`).
_WIRE_FLOAT32 = np.dtype("<f4")
# `Record.vector`'s bounds on the number of values.
_MAX_VALUES = 4_096


def float32_wire(values: Sequence[float]) -> bytes:
    """`values` as little-endian float32 bytes (`float32_bytes`'s rounding): what the
    canonical stores keep beside a record's JSON (`vector_f32`) and the relay ships in the
    `contracts.events.VECTOR_HEADER` header, so that the projector reads the vector
    without parsing its decimals again (issue 24)."""
    packed = float32_bytes(values)
    if sys.byteorder == "little":
        return packed
    return np.frombuffer(packed, dtype=np.float32).astype(_WIRE_FLOAT32).tobytes()


_VALUES: TypeAdapter[list[float]] = TypeAdapter(list[float])


class PackedVector(Sequence[float]):
    """A decoded event's vector read from its float32 bytes (`float32_wire`), not from its
    decimals: `float32` (read-only, native order), `json` (the vector's JSON text as the
    canonical store wrote it: what Qdrant is sent) and `length` (the Euclidean length of
    the float32 values, in float64, by numpy: `contracts.admission.vector_problem`
    measures again with `math.hypot` near its bounds). No Python float is built unless
    the values are read: then they are parsed once from `json` (the same float64 values
    as `Record.vector` of the same event, `list[float]`'s validation of that text).

    Not a `list`: pydantic does not serialize it as `Record.vector`; a caller that dumps
    a decoded record converts it first (`list(vector)`, e.g. the dead letters)."""

    __slots__ = ("_values", "float32", "json", "length")

    def __init__(self, float32: npt.NDArray[np.float32], json_text: bytes) -> None:
        self.float32 = float32
        self.json = json_text
        wide = float32.astype(np.float64)
        self.length = math.sqrt(wide.dot(wide))
        self._values: list[float] | None = None

    def values(self) -> list[float]:
        """The float64 values, parsed from `json` on first use."""
        if self._values is None:
            self._values = _VALUES.validate_json(self.json, strict=True)
        return self._values

    def __len__(self) -> int:
        return int(self.float32.size)

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> list[float]: ...

    def __getitem__(self, index: int | slice) -> float | list[float]:
        return self.values()[index]

    def __iter__(self) -> Iterator[float]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedVector):
            return self.values() == other.values()
        if isinstance(other, list | tuple):
            return self.values() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedVector({len(self)} values)"

    def __reduce__(self) -> tuple[Any, tuple[bytes, bytes, float]]:
        """Pickled as its float32 bytes, text and length (the write workers' hand-over):
        unpickling makes one read-only array of the bytes, where numpy's own pickle of
        the array rebuilds its dtype too (5.0 -> 3.3 us a 384-d vector), and the worker
        pickles it in a quarter less time. The values parsed from `json`, if any, are
        not sent (parsed again on first use)."""
        return (_unpickled, (self.float32.tobytes(), self.json, self.length))


_NATIVE_FLOAT32 = np.dtype(np.float32)


def _unpickled(native: bytes, json_text: bytes, length: float) -> PackedVector:
    """The `PackedVector` that `PackedVector.__reduce__` pickled: `native` are its float32
    values in this machine's order (`tobytes` of its `float32`), read-only as before."""
    vector = PackedVector.__new__(PackedVector)
    vector.float32 = np.frombuffer(native, dtype=_NATIVE_FLOAT32)
    vector.json = json_text
    vector.length = length
    vector._values = None
    return vector


# The characters of a number in a JSON list, without the comma between them.
_DIGITS = b"0123456789.eE+-"
# `count - 1` commas in brackets, per count: what is left of a list of `count` numbers
# without their characters.
_COMMAS = [b"[" + b"," * max(count - 1, 0) + b"]" for count in range(_MAX_VALUES + 1)]


def packed_vector(wire: bytes, json_text: bytes) -> PackedVector | None:
    """The vector of `json_text` (its JSON list, cut from an event) read from `wire`, its
    float32 bytes (`float32_wire`), or None when the two cannot be the same vector's:
    `wire` is not a whole number of 1 to 4,096 float32 values, or `json_text` is not a
    bracketed list of as many values made of number characters (one pass over it: what
    is left without its digits must be the commas between them). Then the caller parses
    `json_text` as before. Within that check the bytes are trusted to be the float32 of
    those decimals, and the decimals to be JSON numbers: Orrery's relay ships the
    canonical store's column, which its ingest wrote from the values it wrote as
    `json_text`; the check keeps the text from changing the structure of a body it
    goes into and the two from disagreeing on the dimension."""
    count, rest = divmod(len(wire), 4)
    if (
        rest
        or not 1 <= count <= _MAX_VALUES
        or json_text[:1] != b"["
        or json_text[-1:] != b"]"
        or len(json_text) < 2 * count + 1
        # The whole text (its brackets are no digits): no copy of the list's inside.
        or json_text.translate(None, _DIGITS) != _COMMAS[count]
    ):
        return None
    values = np.frombuffer(wire, dtype=_WIRE_FLOAT32)
    if sys.byteorder != "little":
        values = values.astype(np.float32)
        values.flags.writeable = False
    return PackedVector(values, json_text)


def is_encoded(vector: Any) -> TypeGuard[StoredVector | PackedVector]:
    """Whether `vector` carries its float32 array and JSON text (`StoredVector`,
    `PackedVector`): the engines take those as they are."""
    return isinstance(vector, StoredVector | PackedVector)
