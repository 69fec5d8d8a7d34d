"""`contracts.vector_payload.utc_timestamp`: RFC 3339 in UTC with microseconds and a "Z",
the form `updated_at` is stored and compared in, with a four-digit year for every year
(`strftime`'s `%Y` leaves years before 1000 unpadded on this platform)."""

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
def test_the_text_is_rfc3339_and_reads_back(value: datetime) -> None:
    text = utc_timestamp(value)
    instant = utc_instant(value)
    assert datetime.fromisoformat(text) == value
    assert len(text) == 27 and text.endswith("Z")
    assert text[:4] == f"{instant.year:04d}"
    if instant.year >= 1000:
        assert text == instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_OFFSETS),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_OFFSETS),
)
def test_the_texts_sort_as_the_instants(a: datetime, b: datetime) -> None:
    # Stored texts are compared as text by a datetime index's readers and by the point
    # table: their order must be the instants' own, across the year-1000 boundary too.
    assert (utc_timestamp(a) < utc_timestamp(b)) == (a < b)


def test_examples() -> None:
    assert utc_timestamp(datetime(2026, 3, 19, 12, tzinfo=UTC)) == "2026-03-19T12:00:00.000000Z"
    plus_two = timezone(timedelta(hours=2))
    assert (
        utc_timestamp(datetime(1678, 1, 1, 1, 0, 0, 5, tzinfo=plus_two))
        == "1677-12-31T23:00:00.000005Z"
    )
    assert utc_timestamp(datetime(999, 1, 1, tzinfo=UTC)) == "0999-01-01T00:00:00.000000Z"


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(OrreryError):
        utc_timestamp(datetime(2026, 3, 19))
