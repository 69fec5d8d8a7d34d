"""`contracts.malloc`: glibc's arena cap and trim, observed through glibc's own report."""

from __future__ import annotations

import subprocess
import sys

import pytest

from contracts.malloc import _libc, tune_malloc

pytestmark = pytest.mark.skipif(_libc() is None, reason="needs glibc (mallopt, malloc_trim)")

# Eight threads allocate at once, then glibc reports its arenas (`malloc_stats`, on
# stderr: one "Arena N:" block each). Each new thread takes an arena of its own while
# fewer than the cap exist, so the count shows the cap.
_ARENAS_SCRIPT = """
import ctypes, sys, threading
from contracts.malloc import tune_malloc
print(tune_malloc(int(sys.argv[1])), flush=True)
start = threading.Barrier(8)
held = []
def work():
    start.wait()
    held.append([bytearray(1024) for _ in range(2000)])
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(cap: int, env: dict[str, str] | None = None) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS_SCRIPT, str(cap)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    arenas = sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))
    return done.stdout.strip(), arenas


def test_the_cap_bounds_the_arenas_of_a_threaded_process() -> None:
    set_to, capped = _arenas(2)
    assert set_to == "2"
    assert 1 <= capped <= 2
    left, default = _arenas(0)
    assert left == "None"
    assert default > 2  # glibc's default: a new arena per thread, up to 8 per core


def test_the_environment_wins() -> None:
    assert tune_malloc(2, environ={"MALLOC_ARENA_MAX": "4"}) is None
    assert tune_malloc(2, environ={"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is None
    assert tune_malloc(0, environ={}) is None


# 200 MiB of 2 KiB blocks freed below one block still held: glibc keeps the hole (only a
# free top of the heap goes back by itself); `trim` hands its pages back.
_TRIM_SCRIPT = """
import sys
from contracts.malloc import trim
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
blocks = [bytearray(2048) for _ in range(100_000)]
pin = bytearray(2048)
del blocks
before = anon()
done = trim()
print(done, before - anon())
"""


def test_trim_hands_a_freed_hole_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TRIM_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    trimmed, freed_kb = done.stdout.split()
    assert trimmed == "True"
    assert int(freed_kb) > 100 << 10
