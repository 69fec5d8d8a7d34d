"""Crash points: named places between two writes where a test build can die.

`ORRERY_CRASH_AT=<name>[,<name>…]` makes the process exit at once (`os._exit(137)`, as
after SIGKILL: no cleanup, no flush, no `finally`) the first time it reaches a named
point. Used only by the crash-point matrix (`tests/e2e/test_crash_points.py`) to kill a
process exactly between the two writes of a step and prove a restart converges; unset
(the default), a crash point costs one environment lookup.
"""

from __future__ import annotations

import os
import sys

__all__ = ["CRASH_ENV", "CRASH_EXIT_CODE", "crash_point"]

CRASH_ENV = "ORRERY_CRASH_AT"
CRASH_EXIT_CODE = 137


def crash_point(name: str) -> None:
    """Exit the process now if `ORRERY_CRASH_AT` names `name`."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or name not in wanted.split(","):
        return
    sys.stderr.write(f"orrery: crash point {name!r} reached: exiting as if killed\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)
