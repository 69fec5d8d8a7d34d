"""`ingest.write_workers`: a batch parsed and written in a worker process answers exactly
as `parse_body` + `write_records` in process (the same error, or the same response, the
same outbox events and the same events handed over, each exactly what its row decodes
to), and a worker that died answers 503 once and is started again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode, OrreryError
from contracts.events import LogEntry, RecordChanged
from contracts.records import Record
from contracts.stored_vectors import PackedVector
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.service import parse_body, write_records
from ingest.write_workers import WriteWorkers
from tests.unit.test_parse_body import DIMENSION, LIMITS, ORDINARY, bodies, body_of


class Pair:
    """A worker over one database, the in-process use cases over another: both get
    the same bodies in the same order, so positions and revisions agree."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.workers = WriteWorkers(
            root / "workers.sqlite",
            count=1,
            max_batch=LIMITS["max_batch"],
            vector_dimension=DIMENSION,
            max_record_bytes=LIMITS["max_record_bytes"],
        )
        self.workers.start()
        self.positions: list[tuple[str, int]] = []
        self.handed: list[LogEntry] = []
        self.store = SqliteRecordStore(
            root / "local.sqlite",
            on_positions=self.positions.extend,
            on_committed=self.handed.extend,
        )
        self.worker_db = root / "workers.sqlite"
        # Handed-over upserts whose vector came packed (`write_worker._packed`).
        self.packed = 0

    def check_handed(self, entries: list[LogEntry]) -> None:
        """Each handed-over event is exactly the event its outbox row decodes to (what
        the projector's log expects of `remember`)."""
        with contextlib.closing(sqlite3.connect(self.worker_db)) as conn:
            for entry in entries:
                (stored,) = conn.execute(
                    "SELECT r.record_json FROM outbox o JOIN records r ON r.document_id = "
                    "o.document_id AND r.revision = o.revision WHERE o.position = ?",
                    (entry.position,),
                ).fetchone()
                decoded = Record.model_validate_json(stored)
                assert entry.event == RecordChanged(record=decoded)
                vector = entry.event.record.vector
                if isinstance(vector, PackedVector):
                    # The float32 of the decimals stored, and those decimals as text.
                    assert decoded.vector is not None
                    expected = np.asarray(decoded.vector, dtype=np.float32)
                    assert vector.float32.tobytes() == expected.tobytes()
                    assert json.loads(vector.json) == decoded.vector
                    self.packed += 1

    def through_workers(self, raw: bytes, namespace: str | None) -> Any:
        async def post() -> Any:
            batch = await self.workers.parse(raw, allowed_namespace=namespace, allowed_galaxy=None)
            written = await self.workers.write(batch, traceparent=None)
            body = written.body if isinstance(written.body, dict) else json.loads(written.body)
            entries = [e async for chunk in written.handed_over() for e in chunk]
            self.check_handed(entries)
            handed = [(e.position, e.event.record.doc_id) for e in entries]
            return ("ok", batch.namespaces, written.status, body, written.events, handed)

        try:
            return self.loop.run_until_complete(post())
        except OrreryError as error:
            return ("error", error.code, error.message, error.details)

    def in_process(self, raw: bytes, namespace: str | None) -> Any:
        try:
            batch = parse_body(raw, **{**LIMITS, "allowed_namespace": namespace})
        except OrreryError as error:
            return ("error", error.code, error.message, error.details)
        self.positions.clear()
        self.handed.clear()
        result = write_records(batch.records, store=self.store, stored_json=batch.stored_json)
        if result.accepted == 0:
            status = 409
            body: dict[str, Any] = {
                "success": False,
                "error": {
                    "code": ErrorCode.REVISION_CONFLICT.value,
                    "message": "no record was accepted: every revision is stale",
                    "details": result.model_dump(mode="json", exclude={"searchable"}),
                },
            }
        else:
            status, body = 200, json.loads(result.model_dump_json(exclude={"searchable"}))
        namespaces = sorted({r.namespace for r in batch.records})
        handed = [(e.position, e.event.record.doc_id) for e in self.handed]
        return ("ok", namespaces, status, body, list(self.positions), handed)

    def close(self) -> None:
        self.workers.close()
        self.store.close()
        self.loop.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pair = Pair(tmp_path_factory.mktemp("write-workers"))
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A pair of its own for the tests that write through the worker alone."""
    pair = Pair(tmp_path_factory.mktemp("write-workers-lone"))
    try:
        yield pair
    finally:
        pair.close()


# Valid bodies too, often enough to write (and re-write: 409s) the same few documents.
writes = st.sampled_from(
    [
        body_of(ORDINARY),
        body_of({**ORDINARY, "revision": 2}),
        body_of({**ORDINARY, "item_id": "b"}, {**ORDINARY, "item_id": "c", "namespace": "other"}),
        body_of({**ORDINARY, "item_id": "b", "revision": 3, "deleted": True}),
    ]
)


@settings(max_examples=80, deadline=None)
@given(
    raws=st.lists(st.one_of(bodies, writes), min_size=1, max_size=3),
    namespace=st.sampled_from([None, "bench"]),
)
def test_a_worker_answers_as_the_in_process_path(
    pair: Pair, raws: list[bytes], namespace: str | None
) -> None:
    for raw in raws:
        assert pair.through_workers(raw, namespace) == pair.in_process(raw, namespace)


def test_a_dropped_batch_is_never_written(lone: Pair) -> None:
    pair = lone
    raw = body_of({**ORDINARY, "item_id": "dropped"})

    async def parse_and_drop() -> None:
        batch = await pair.workers.parse(raw, allowed_namespace=None, allowed_galaxy=None)
        await pair.workers.drop(batch)
        with pytest.raises(OrreryError) as refused:
            await pair.workers.write(batch, traceparent=None)
        assert refused.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE

    pair.loop.run_until_complete(parse_and_drop())
    # Written now for the first time: revision 1 is accepted.
    done = pair.through_workers(raw, None)
    assert done[2] == 200 and done[3]["accepted"] == 1


def test_a_batch_whose_worker_died_answers_503_and_the_next_is_written(lone: Pair) -> None:
    pair = lone
    raw = body_of({**ORDINARY, "item_id": "after-kill"})

    async def parse_kill_write() -> None:
        batch = await pair.workers.parse(raw, allowed_namespace=None, allowed_galaxy=None)
        (pid,) = pair.workers.pids()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(OrreryError) as refused:
            await pair.workers.write(batch, traceparent=None)
        assert refused.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE
        assert refused.value.details["dependency"] == "ingest write worker"
        assert pair.workers.pids() != [pid]

    pair.loop.run_until_complete(parse_kill_write())
    # Nothing of it was written: sent again, revision 1 is accepted.
    done = pair.through_workers(raw, None)
    assert done[2] == 200 and done[3]["accepted"] == 1


def test_an_upserts_vector_is_handed_over_packed_as_stored(lone: Pair) -> None:
    """The worker hands each upsert's vector over as a `PackedVector` of the record it
    stored (`check_handed` compares it with the row): also when the batch holds another
    record of the same document and revision, refused as stale."""
    pair = lone
    before = pair.packed
    twin = {**ORDINARY, "item_id": "twin", "vector": [0.1, -0.2, 0.3, 1e-3]}
    raw = body_of(twin, {**twin, "vector": [0.9, 0.8, -0.7, 0.6]})
    status = pair.through_workers(raw, None)
    assert status[0] == "ok" and status[2] == 200
    assert [item["status"] for item in status[3]["items"]] == [201, 409]
    assert pair.packed == before + 1


def test_a_second_start_keeps_the_running_worker_and_a_closed_one_spawns_none(
    tmp_path: Path,
) -> None:
    # A lazy start by the first POST, then the stack's own start (as `EmbeddedStack`
    # does when its loop was started alone): one process, never an orphaned second.
    workers = WriteWorkers(
        tmp_path / "store.sqlite",
        count=1,
        max_batch=LIMITS["max_batch"],
        vector_dimension=DIMENSION,
        max_record_bytes=LIMITS["max_record_bytes"],
    )
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(
            workers.parse(body_of(ORDINARY), allowed_namespace=None, allowed_galaxy=None)
        )
        (pid,) = workers.pids()
        workers.start()
        assert workers.pids() == [pid]
        workers.close()
        assert workers.pids() == []
        with pytest.raises(OrreryError) as refused:
            loop.run_until_complete(
                workers.parse(body_of(ORDINARY), allowed_namespace=None, allowed_galaxy=None)
            )
        assert refused.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE
        assert workers.pids() == []
    finally:
        workers.close()
        loop.close()
