"""`bench.common.interpreter_speed`: the VM's speed recorded beside a measurement."""

from __future__ import annotations

from bench.common import interpreter_speed


def test_interpreter_speed_reports_the_median_and_best_of_its_trials() -> None:
    speed = interpreter_speed(trials=3)
    assert set(speed) == {"loop_median_ms", "loop_best_ms", "memory_median_ms", "memory_best_ms"}
    assert 0 < speed["loop_best_ms"] <= speed["loop_median_ms"]
    assert 0 < speed["memory_best_ms"] <= speed["memory_median_ms"]
