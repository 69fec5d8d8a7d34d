"""A record's vector as the projector keeps it from a decoded event: its values, their
float32 array and the JSON text the canonical store keeps of it, so that nothing
downstream formats or converts a float of it again (issue 24: in server mode the
projector formatted each 384-d vector back to JSON for Qdrant, ~24 us, and packed it to
float32 for the ring statistics, ~9 us)."""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["StoredVector", "float32_bytes", "stored_vector"]

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
