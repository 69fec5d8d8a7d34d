"""A `BulkLoader` that runs `projector.entrypoints.bulk_load` as a child process.

Why a child: a bulk load is CPU-bound Python plus tantivy and qdrant-edge writes, and
qdrant-edge holds the GIL in writes and in its HNSW build. Run in the serving process it
takes the interpreter from query threads at every hand-off (query p95 4.3x idle during
a 100k rebuild, measured). In a niced child it competes only for CPUs, where the
kernel favours the server.

The child gets its stdin as a pipe that is never written: when this process dies, the
pipe closes and the child exits at once (it must not keep the generation's directories
while a restarted server marks the build failed and `gc` drops them).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.generations import GenerationDescriptor, SourceManifest
from projector.generations import BuildControl, BulkLoad

__all__ = ["SubprocessBulkLoader"]

log = logging.getLogger("orrery.generations")

DEPENDENCY = "bulk-load child"
_MODULE = "projector.entrypoints.bulk_load"
# How often the parent looks at cancellation while the child runs, and heartbeats.
_POLL_S = 0.1
_HEARTBEAT_S = 5.0
_STDERR_TAIL = 2_000


class SubprocessBulkLoader:
    """Loads a generation in `python -m projector.entrypoints.bulk_load`.

    Guarantees (those of `projector.generations.BulkLoader`): `load` returns only after
    the child exited 0 and reported its result; on cancellation, a non-zero exit, a
    signal or a malformed report it kills the child if needed, waits for it and raises
    (`DependencyUnavailable`, or `INVALID_STATE` when cancelled), with the tail of the
    child's stderr in the message. `pid(generation_id)` names a running child.
    """

    def __init__(
        self,
        data_dir: Path,
        db_path: Path,
        *,
        embedder_factory: str,
        embedder_kwargs: dict[str, Any],
        batch_size: int,
        pause_seconds: float,
        nice: int,
    ) -> None:
        self._data_dir = data_dir
        self._db_path = db_path
        self._embedder_factory = embedder_factory
        self._embedder_kwargs = embedder_kwargs
        self._batch_size = batch_size
        self._pause_seconds = pause_seconds
        self._nice = nice
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}

    def pid(self, generation_id: str) -> int | None:
        with self._lock:
            return self._running.get(generation_id)

    def load(
        self,
        descriptor: GenerationDescriptor,
        control: BuildControl,
        heartbeat: Callable[[], None],
        *,
        text_analyzer: str,
    ) -> BulkLoad:
        generation_id = descriptor.generation_id
        argv = [
            sys.executable,
            "-m",
            _MODULE,
            "--data-dir",
            str(self._data_dir),
            "--db",
            str(self._db_path),
            "--generation",
            generation_id,
            "--text-analyzer",
            text_analyzer,
            "--embedder-factory",
            self._embedder_factory,
            "--embedder-kwargs",
            json.dumps(self._embedder_kwargs),
            "--batch-size",
            str(self._batch_size),
            "--pause-seconds",
            str(self._pause_seconds),
            "--nice",
            str(self._nice),
        ]
        reports: list[dict[str, Any]] = []
        with tempfile.TemporaryFile() as stderr:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            except OSError as exc:
                raise DependencyUnavailable(DEPENDENCY, f"cannot start: {exc}") from exc
            with self._lock:
                self._running[generation_id] = process.pid
            assert process.stdout is not None
            reader = threading.Thread(
                target=_read_reports,
                args=(process.stdout, control, reports),
                name=f"orrery-bulk-load-{generation_id}",
                daemon=True,
            )
            reader.start()
            try:
                cancelled = _wait(process, control, heartbeat)
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait()
                if process.stdin is not None:
                    process.stdin.close()
                reader.join(10)
                process.stdout.close()
                with self._lock:
                    self._running.pop(generation_id, None)
            stderr.seek(0)
            tail = stderr.read().decode("utf-8", "replace")[-_STDERR_TAIL:].strip()
        if cancelled:
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"the bulk load of {generation_id} was cancelled",
                {"generation_id": generation_id},
            )
        result = next((r["result"] for r in reports if "result" in r), None)
        error = next((r["error"] for r in reports if "error" in r), None)
        if process.returncode != 0 or result is None:
            status = (
                f"was killed by signal {-process.returncode}"
                if process.returncode < 0
                else f"exited with status {process.returncode}"
            )
            said = f": {error['message']}" if error else (f": {tail}" if tail else "")
            raise DependencyUnavailable(DEPENDENCY, f"the loader of {generation_id} {status}{said}")
        try:
            return BulkLoad(
                manifest=SourceManifest.model_validate(result["manifest"]),
                counters={k: int(v) for k, v in result["counters"].items()},
                durations={k: float(v) for k, v in result["durations"].items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DependencyUnavailable(
                DEPENDENCY, f"the loader of {generation_id} reported {result!r:.300}"
            ) from exc


def _wait(
    process: subprocess.Popen[str], control: BuildControl, heartbeat: Callable[[], None]
) -> bool:
    """Wait for the child, heartbeating; kill it when cancelled (returns True then)."""
    beat = time.monotonic()
    while process.poll() is None:
        if control.cancelled():
            process.kill()
            return True
        if time.monotonic() - beat >= _HEARTBEAT_S:
            try:
                heartbeat()
            except OrreryError as exc:
                log.warning("build heartbeat failed: %s", exc.message)
            beat = time.monotonic()
        control.wait(_POLL_S)
    return control.cancelled()


def _read_reports(stream: IO[str], control: BuildControl, reports: list[dict[str, Any]]) -> None:
    """Forward the child's progress lines to `control`; keep its result or error."""
    for line in stream:
        try:
            body = json.loads(line)
        except json.JSONDecodeError:
            log.warning("bulk-load child printed %r", line[:200])
            continue
        if not isinstance(body, dict):
            continue
        progress = body.get("progress")
        if isinstance(progress, list) and len(progress) == 3:
            control.progress(str(progress[0]), int(progress[1]), int(progress[2]))
        else:
            reports.append(body)
