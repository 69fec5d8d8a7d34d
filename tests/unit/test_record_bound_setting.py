"""`ORRERY_MAX_RECORD_BYTES` is one setting of the deployment (issue 22): unset, the most
its store or log takes; more than that is refused when settings are read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.admission import MAX_RECORD_BYTES
from contracts.events import KAFKA_MAX_RECORD_BYTES
from orrery.startup import ExpectedFailure, load_settings
from query.settings import QuerySettings, record_ceiling

CEILINGS = {"embedded": MAX_RECORD_BYTES, "servers": KAFKA_MAX_RECORD_BYTES}


def test_unset_it_is_the_most_the_deployment_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORRERY_MAX_RECORD_BYTES", raising=False)
    monkeypatch.delenv("ORRERY_MODE", raising=False)
    assert QuerySettings().max_record_bytes == 4 * 1024 * 1024
    assert QuerySettings(mode="servers").max_record_bytes == 960 * 1024
    # The command line's --mode changes the default too (not a copy of the embedded one).
    assert load_settings(mode="servers").max_record_bytes == 960 * 1024
    monkeypatch.setenv("ORRERY_MODE", "servers")
    assert QuerySettings().max_record_bytes == 960 * 1024
    monkeypatch.setenv("ORRERY_MAX_RECORD_BYTES", "")
    assert QuerySettings().max_record_bytes == 960 * 1024


@given(mode=st.sampled_from(sorted(CEILINGS)), value=st.integers(1_024, 8 * 1024 * 1024))
def test_a_value_is_taken_exactly_when_the_deployment_can_store_it(mode: str, value: int) -> None:
    ceiling = record_ceiling(mode)
    assert ceiling == CEILINGS[mode]
    if value <= ceiling:
        assert QuerySettings(mode=mode, max_record_bytes=value).max_record_bytes == value
    else:
        with pytest.raises(ValidationError, match="is more than"):
            QuerySettings(mode=mode, max_record_bytes=value)


def test_too_large_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORRERY_MAX_RECORD_BYTES", str(KAFKA_MAX_RECORD_BYTES + 1))
    assert load_settings().max_record_bytes == KAFKA_MAX_RECORD_BYTES + 1  # embedded: fits
    with pytest.raises(ExpectedFailure) as caught:
        load_settings(mode="servers")
    assert caught.value.message.startswith(
        f"ORRERY_MAX_RECORD_BYTES: Value error, {KAFKA_MAX_RECORD_BYTES + 1} is more than "
        "one Kafka message"
    )
