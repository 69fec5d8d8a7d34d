"""The embedded server runs with its configured thread switch interval and gives the
interpreter's back when it closes (`ORRERY_SWITCH_INTERVAL_SECONDS`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orrery.embedded import EmbeddedStack
from query.settings import QuerySettings


@pytest.mark.parametrize("wanted", [0.002, None])
def test_the_switch_interval_holds_while_serving_and_is_restored(
    tmp_path: Path, wanted: float | None
) -> None:
    before = sys.getswitchinterval()
    stack = EmbeddedStack.open(
        QuerySettings(data_dir=tmp_path / "data", switch_interval_seconds=wanted)
    )
    try:
        stack.start()
        assert sys.getswitchinterval() == pytest.approx(before if wanted is None else wanted)
    finally:
        stack.close()
    assert sys.getswitchinterval() == pytest.approx(before)
