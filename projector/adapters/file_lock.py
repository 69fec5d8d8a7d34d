"""Locks on files of the data directory: the generation writer lock and the operator lock.

`fcntl.flock` locks belong to an open file description, so they exclude other processes
(and other descriptions of the same file), not other threads of the holder; a thread lock
in front of it covers those. The kernel drops a dead process's locks, so a crash never
leaves a lock behind.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError

__all__ = ["FileWriterLock", "OperatorLock"]


class FileWriterLock:
    """`WriterLock` over `path`: exclusive across the threads and processes of one host.

    Guarantees: `hold()` blocks until no other holder is inside; it is re-entrant within
    a thread; the lock file is created on first use and never deleted.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread_lock:
            if self._depth == 0:
                self._acquire()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release()

    def _acquire(self) -> None:
        try:
            if self._fd is None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise DependencyUnavailable("lock", f"cannot lock {self._path}: {exc}") from exc

    def _release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class OperatorLock:
    """The one process that may open a data directory's embedded generation directories.

    qdrant-edge allows one process per shard directory and tantivy one writer per index,
    so `orrery serve` and a direct `orrery gen …` on the same data directory exclude each
    other: `acquire` fails at once (`INVALID_STATE`) while another process holds it.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"another process operates {self._path.parent} (an `orrery serve` or "
                "`orrery gen`); talk to the server with `orrery gen --url …` instead",
                {"lock": str(self._path)},
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
