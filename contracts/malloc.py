"""glibc malloc for a long-running server: few arenas, and free pages handed back.

glibc gives each new thread an arena of its own while there are fewer than 8 per core
(16 here). A server's work moves between threads (the request thread pool parses and
writes each batch of records on whichever worker is free, the projector, the optimizer
and the point-table builder run on theirs), so each arena grows to hold the largest
batch it ever saw and keeps that memory as free chunks: measured during a 200k-record
`bench/topk.py` ingest (docs/bench/README.md, session 23), the server's malloc held 613
MiB of arenas of which 347 MiB were free, against 311 / 100 MiB with two arenas. So the
process caps its arenas (`tune_malloc`, before its threads start) and, after work that
frees a lot at once (an optimize swapping in a new shard, which closes the old one and
drops its journal), hands free pages back to the kernel (`trim`).

Neither changes what any allocation holds: only where free memory waits. Both are
no-ops where the C library is not glibc (no `mallopt` / `malloc_trim`), and an operator's
own `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` wins over `tune_malloc`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Mapping

__all__ = ["DEFAULT_ARENAS", "trim", "tune_malloc"]

_log = logging.getLogger(__name__)

# mallopt(3) parameter of the arena cap (glibc's malloc.h).
_M_ARENA_MAX = -8
# Two arenas: the main one and one for every other thread. Measured (docs/bench/README.md,
# session 23): malloc's arenas held half the memory with two as with glibc's default.
DEFAULT_ARENAS = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None  # not glibc (musl has neither)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def tune_malloc(
    arenas: int = DEFAULT_ARENAS,
    *,
    environ: Mapping[str, str] | None = None,
) -> int | None:
    """Cap glibc's malloc arenas at `arenas` (call before starting threads: arenas made
    already stay). Returns the cap set, or None when left alone: `arenas` <= 0, the
    environment sets the cap (`MALLOC_ARENA_MAX`, or `arena_max` in `GLIBC_TUNABLES`),
    or the C library has no `mallopt`, or refuses it."""
    environ = os.environ if environ is None else environ
    if arenas <= 0 or "MALLOC_ARENA_MAX" in environ:
        return None
    if "arena_max" in environ.get("GLIBC_TUNABLES", ""):
        return None
    libc = _libc()
    if libc is None:
        return None
    if libc.mallopt(_M_ARENA_MAX, arenas) != 1:  # mallopt returns 1 on success
        _log.warning("malloc refused a cap of %d arenas", arenas)
        return None
    return arenas


def trim() -> bool:
    """Hand the free pages of every malloc arena back to the kernel (`malloc_trim(0)`);
    whether any were. Releases the GIL meanwhile (a ctypes call): other threads run,
    and only their allocations in the arena being trimmed wait."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))
