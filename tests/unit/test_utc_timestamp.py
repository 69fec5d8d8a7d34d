"""`contracts.vector_payload.utc_timestamp`: RFC 3339 in UTC with microseconds and a "Z",
the form `updated_at` is stored and compared in; `isoformat` where it writes what
`strftime` writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import OrreryError
from contracts.vector_payload import utc_instant, utc_timestamp

_OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


@given(
    value=st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_OFFSETS
    )
)
def test_the_text_is_strftimes(value: datetime) -> None:
    text = utc_timestamp(value)
    instant = utc_instant(value)
    assert text == instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if instant.year >= 1000:  # `%Y` of earlier years is not padded on every platform
        assert datetime.fromisoformat(text) == value
        assert len(text) == 27 and text.endswith("Z")


def test_examples() -> None:
    assert utc_timestamp(datetime(2026, 3, 19, 12, tzinfo=UTC)) == "2026-03-19T12:00:00.000000Z"
    plus_two = timezone(timedelta(hours=2))
    assert (
        utc_timestamp(datetime(1678, 1, 1, 1, 0, 0, 5, tzinfo=plus_two))
        == "1677-12-31T23:00:00.000005Z"
    )


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(OrreryError):
        utc_timestamp(datetime(2026, 3, 19))
