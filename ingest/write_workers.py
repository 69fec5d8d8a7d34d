"""Write workers: `POST /v1/records`' parse, validation and store write in child
processes (`ingest.entrypoints.write_worker`), so the embedded server's interpreter
keeps only the projector and the queries.

A batch is parsed by the least busy worker and held there; the route then takes its
namespaces through the process's `WritePacer` (nothing of a worker is held while a
writer waits for its namespace) and has the same worker write it. So every guarantee of
the in-process path holds: the same validation answers (the same code runs), the same
per-namespace pacing, the same transaction, outbox order and idempotence (the canonical
store's revision rule, under SQLite's write lock).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.events import LogEntry
from contracts.faults import CRASH_EXIT_CODE
from ingest.entrypoints.write_worker import DEPENDENCY

__all__ = ["DEPENDENCY", "ParsedBatch", "WriteWorkers", "Written"]

log = logging.getLogger("orrery.ingest")

_MODULE = "ingest.entrypoints.write_worker"
_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """A batch admitted and held by one worker under `token`."""

    worker: _Worker
    token: int
    namespaces: list[str]


@dataclass(frozen=True, slots=True)
class Written:
    """A written batch: the answer's status and body (the body a `str` of JSON, or the
    error document of a 409), its `(namespace, position)` events in position order and
    its committed outbox events as the store hands them over in process (`handed_over`).
    """

    status: int
    body: str | dict[str, Any]
    events: list[tuple[str, int]]
    # What the store hands over after a commit (`SqliteRecordStore(on_committed=...)`),
    # as the worker pickled it: lists of `LogEntry`s in position order.
    chunks: list[bytes]

    async def handed_over(self) -> AsyncIterator[list[LogEntry]]:
        """The committed outbox events, a chunk at a time in position order, each
        unpickled on a thread as it is asked for: a caller hands each chunk on before
        the next is unpickled (the projector's log can start on the first ~5 ms after
        the answer came, not after all of them, ~80 ms for 2,000 384-d records)."""
        for chunk in self.chunks:
            # Our own child's pickles (the pipe is this process's); one chunk at a time.
            entries: list[LogEntry] = await asyncio.to_thread(pickle.loads, chunk)
            yield entries


class _Worker:
    """One child process and its two pipes; one command at a time (`lock`)."""

    def __init__(self, argv: list[str], on_crash: Callable[[int], None]) -> None:
        self._argv = argv
        self._on_crash = on_crash
        self.lock = asyncio.Lock()
        self.busy = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._commands: Connection | None = None
        self._answers: Connection | None = None
        self._start_lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        """Start the process unless a live one is running (a lazy start by `exchange`
        may come first: a second process would orphan the first)."""
        with self._start_lock:
            self._stopped = False
            if self._process is not None and self._process.poll() is None:
                return
            self._discard()
            self._spawn()

    def _spawn(self) -> None:
        commands_read, commands_write = os.pipe()
        answers_read, answers_write = os.pipe()
        try:
            self._process = subprocess.Popen(
                [
                    *self._argv,
                    "--commands-fd",
                    str(commands_read),
                    "--answers-fd",
                    str(answers_write),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(commands_read, answers_write),
                env=_child_env(),
            )
        except BaseException:
            for fd in (commands_read, commands_write, answers_read, answers_write):
                os.close(fd)
            raise
        os.close(commands_read)
        os.close(answers_write)
        self._commands = Connection(commands_write, readable=False)
        self._answers = Connection(answers_read, writable=False)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def exchange(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        """Send `command`, wait for its answer (blocking; the caller holds `lock`)."""
        with self._start_lock:
            if self._stopped:
                raise DependencyUnavailable(DEPENDENCY, "the write workers are closed")
            if self._process is None or self._process.poll() is not None:
                self._discard()
                self._spawn()
        assert self._commands is not None and self._answers is not None
        try:
            self._commands.send(command)
            answer: tuple[Any, ...] = self._answers.recv()
        except (EOFError, OSError) as exc:
            raise self._died(exc) from None
        return answer

    def _died(self, exc: BaseException) -> OrreryError:
        assert self._process is not None
        try:
            code = self._process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        if code == CRASH_EXIT_CODE:
            self._on_crash(code)
        self._discard()
        return DependencyUnavailable(
            DEPENDENCY, f"the worker process ended (exit code {code}): {exc!r}"
        )

    def _discard(self) -> None:
        for conn in (self._commands, self._answers):
            if conn is not None:
                conn.close()
        self._commands = self._answers = None
        self._process = None

    def stop(self) -> None:
        with self._start_lock:
            self._stopped = True
        process = self._process
        for conn in (self._commands, self._answers):
            if conn is not None:
                conn.close()
        self._commands = self._answers = None
        if process is None:
            return
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._process = None


def _child_env() -> dict[str, str]:
    """This environment, with the tree this module was imported from first on the
    path: the worker runs the same code as its server."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def _crash(code: int) -> None:
    # A crash point reached in a worker (`contracts.faults`) is the server's crash: the
    # whole deployment dies between the two writes, as the crash-point matrix expects.
    sys.stderr.write("orrery: a write worker crashed at a crash point: exiting as if killed\n")
    sys.stderr.flush()
    os._exit(code)


class WriteWorkers:
    """`count` worker processes over the canonical SQLite file `db_path`.

    Guarantees: `parse` answers what `ingest.service.parse_body` answers for the body
    (its `OrreryError`, or the batch's namespaces with the batch held); `write` writes a
    held batch as `ingest.service.write_records` does and answers what the route answers
    (status and body) with the batch's events; every parsed batch is written or dropped
    exactly once. A worker that died is started again at its next command; its command
    answers `503 dependency_unavailable`. A worker that died at a crash point takes the
    server with it. Workers end when `close` closes their pipes, or when this process
    ends (their pipes close with it)."""

    def __init__(
        self,
        db_path: Path,
        *,
        count: int,
        max_batch: int,
        vector_dimension: int | None,
        max_record_bytes: int,
    ) -> None:
        if count < 1:
            raise ValueError("at least one write worker")
        argv = [
            sys.executable,
            "-m",
            _MODULE,
            "--db",
            str(db_path),
            "--max-batch",
            str(max_batch),
            "--max-record-bytes",
            str(max_record_bytes),
        ]
        if vector_dimension is not None:
            argv += ["--vector-dimension", str(vector_dimension)]
        self._workers = [_Worker(argv, _crash) for _ in range(count)]
        self._tokens = itertools.count(1)
        self._background: set[asyncio.Future[None]] = set()

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def pids(self) -> list[int]:
        return [pid for worker in self._workers if (pid := worker.pid) is not None]

    async def parse(
        self, body: bytes, *, allowed_namespace: str | None, allowed_galaxy: str | None
    ) -> ParsedBatch:
        worker = min(self._workers, key=lambda w: w.busy)
        token = next(self._tokens)
        answer = await self._exchange(
            worker, ("parse", token, body, allowed_namespace, allowed_galaxy)
        )
        return ParsedBatch(worker, token, list(answer[1]))

    async def write(self, batch: ParsedBatch, *, traceparent: str | None) -> Written:
        answer = await self._exchange(batch.worker, ("write", batch.token, traceparent))
        _, status, body, events, chunks = answer
        return Written(int(status), body, [(str(ns), int(pos)) for ns, pos in events], list(chunks))

    async def drop(self, batch: ParsedBatch) -> None:
        await self._exchange(batch.worker, ("drop", batch.token))

    def let_go(self, batch: ParsedBatch) -> None:
        """`drop` the batch in the background (from a request that was refused or
        cancelled: it must not wait, and the worker must still forget the batch)."""
        task = asyncio.ensure_future(self.drop(batch))
        self._background.add(task)
        task.add_done_callback(self._dropped)

    def _dropped(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a write worker did not drop a batch: %s", task.exception())

    async def _exchange(self, worker: _Worker, command: tuple[Any, ...]) -> tuple[Any, ...]:
        # Shielded: a cancelled request must not leave an answer in the pipe for the
        # next command to read as its own.
        task = asyncio.ensure_future(self._exchange_locked(worker, command))
        answer = await asyncio.shield(task)
        status = answer[0]
        if status == "ok":
            return answer
        if status == "error":
            _, code, message, details = answer
            raise OrreryError(ErrorCode(code), message, details)
        raise OrreryError(ErrorCode.INTERNAL, f"{DEPENDENCY}: {answer[1]}")

    @staticmethod
    async def _exchange_locked(worker: _Worker, command: tuple[Any, ...]) -> tuple[Any, ...]:
        worker.busy += 1
        try:
            async with worker.lock:
                return await asyncio.to_thread(worker.exchange, command)
        finally:
            worker.busy -= 1

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
