"""`metadata.updated_at` stays within what every engine can index.

A time outside tantivy's range (nanoseconds since the epoch in an i64) was acknowledged
(200) and then failed every projector batch after it: the projector stopped for all
writes. Such a record is now `422` at the API.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.records import Record

BASE = {"namespace": "demo", "snapshot_kind": "objects", "item_id": "a", "revision": 1}


@pytest.mark.parametrize(
    "when", ["1678-01-01T00:00:00Z", "2026-03-19T12:00:00+01:00", "2261-12-31T23:59:59Z"]
)
def test_indexable_times_are_accepted(when: str) -> None:
    Record.model_validate({**BASE, "metadata": {"updated_at": when}})


@pytest.mark.parametrize(
    "when",
    [
        "1000-03-09T17:40:51Z",
        "1677-12-31T23:59:59Z",
        "2262-01-01T00:00:00Z",
        "5541-06-20T00:09:40Z",
    ],
)
def test_times_no_engine_can_index_are_refused(when: str) -> None:
    with pytest.raises(ValidationError, match="updated_at must be from 1678-01-01"):
        Record.model_validate({**BASE, "metadata": {"updated_at": when}})
