"""Start `orrery serve` as a real process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from tests.harness.otlp import OtlpReceiver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    data_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    client: httpx.Client
    log_path: Path
    # The PostgreSQL database of a server-mode process (None: the SQLite file in data_dir).
    database_url: str | None = None

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def post_records(self, records: list[dict[str, Any]]) -> httpx.Response:
        return self.client.post("/v1/records", json=records)

    def topk(self, **body: Any) -> httpx.Response:
        return self.client.post("/v1/external/retrieve/topk_records", json=body)

    def wait_projected(
        self,
        timeout: float = 60.0,
        *,
        documents: dict[tuple[str, str], int] | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Block until the projector applied everything on the log (and, when given, each
        `(namespace, snapshot_kind)` scope holds exactly that many live documents)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = self.client.get("/v1/readiness", headers=headers).json()
            counts = {
                (s["namespace"], s["snapshot_kind"]): s["document_count"] for s in ready["scopes"]
            }
            if (
                ready["scopes"]
                and ready["ready"]
                and all(s["applied_position"] >= ready["log_high_water"] for s in ready["scopes"])
                and (documents is None or all(counts.get(k) == n for k, n in documents.items()))
            ):
                return dict(ready)
            if time.monotonic() > deadline:
                raise AssertionError(f"projector did not catch up: {ready}")
            time.sleep(0.05)


def canonical_heads(
    data_dir: Path, namespace: str, kind: str, database_url: str | None = None
) -> list[tuple[str, int]]:
    """The canonical store's live `(document_id, revision)` pairs of a scope, read from
    PostgreSQL when a server-mode deployment uses it, else from `data_dir`'s SQLite file."""
    if database_url:
        import psycopg

        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT document_id, revision FROM heads WHERE namespace = %s AND "
                "snapshot_kind = %s AND NOT deleted",
                (namespace, kind),
            ).fetchall()
    else:
        with contextlib.closing(sqlite3.connect(data_dir / "orrery.sqlite")) as conn:
            rows = conn.execute(
                "SELECT document_id, revision FROM heads WHERE namespace = ? AND "
                "snapshot_kind = ? AND deleted = 0",
                (namespace, kind),
            ).fetchall()
    return [(str(d), int(r)) for d, r in rows]


def start_server(
    data_dir: Path,
    *extra: str,
    env: Mapping[str, str | None] | None = None,
    command: str = "serve",
) -> Server:
    """Start an `orrery` HTTP command on a free port and wait until /healthz answers.
    `env` is added to this process's environment; a None value removes that variable."""
    port = free_port()
    log_path = data_dir.parent / f"{command}-{port}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orrery.cli",
                command,
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"orrery serve exited: {log_path.read_text()[-3000:]}")
        try:
            if client.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            process.wait(timeout=30)  # reaped: no ResourceWarning in a later test
            client.close()
            raise AssertionError(f"orrery serve did not start: {log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    database_url = (env or {}).get("ORRERY_DATABASE_URL") or None
    return Server(data_dir, port, process, client, log_path, database_url)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("e2e") / "data")
    yield srv
    srv.stop()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver on loopback (`tests.harness.otlp`), closed afterwards."""
    # Imported here: the receiver decodes with the `otlp` extra's opentelemetry-proto,
    # which no other e2e test needs.
    from tests.harness.otlp import OtlpReceiver

    otlp = OtlpReceiver()
    yield otlp
    otlp.close()
