"""Poison records in the embedded projector (issue 22: one bad record must never stop
the world): real SQLite store and outbox, tantivy, qdrant-edge, the SQLite registry
and ring statistics, the query worker's readiness and the CLI.

Poison records reach the log here the way the door no longer lets them: written to the
canonical store directly (`SqliteRecordStore.write` checks revisions, not engines).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from contracts.admission import MAX_RECORD_BYTES
from contracts.errors import OrreryError
from contracts.index import to_index_document
from contracts.index_fields import DEFAULT_TEXT_ANALYZER
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from orrery.cli import app
from orrery.redrive import redrive_dead_letters
from projector.bootstrap import EmbeddedProjector, embedded_projector
from projector.service import BatchContainment, PoisonGuard, _write_generation
from query.adapters.sqlite_routing import SqliteRouting
from query.entrypoints.http import readiness
from tests.fakes import FakeHashingEmbedder

DIM = 16


def rec(namespace: str, item: str, revision: int = 1, **fields: Any) -> Record:
    return Record.model_validate(
        {
            "namespace": namespace,
            "snapshot_kind": "objects",
            "item_id": item,
            "revision": revision,
            "ring": fields.pop("ring", "r"),
            "text": {"title": f"{item} title", "body": "body"},
            **fields,
        }
    )


def unit(i: int, dim: int = DIM) -> list[float]:
    return [1.0 if j == i % dim else 0.0 for j in range(dim)]


@dataclass
class Stack:
    data_dir: Path
    db: Path
    store: SqliteRecordStore
    projector: EmbeddedProjector

    def run(self, steps: int = 10) -> None:
        for _ in range(steps):
            report = self.projector.step()
            if report.events == 0:
                return
        raise AssertionError(f"not caught up after {steps} steps")

    def counts(self) -> dict[str, int]:
        return {s.namespace: s.document_count for s in SqliteRouting(self.db).scopes()}


class FakeOtherEmbedder(FakeHashingEmbedder):
    """Another model (its own id, so the vector cache keeps its vectors apart)."""

    @property
    def embedder_id(self) -> str:
        return f"fake-hashing-{self.dimension}@1"


def open_stack(data_dir: Path, dimension: int = DIM) -> Stack:
    db = data_dir / "orrery.sqlite"
    store = SqliteRecordStore(db)
    embedder = FakeHashingEmbedder(dimension) if dimension == DIM else FakeOtherEmbedder(dimension)
    projector = embedded_projector(data_dir, db, embedder=embedder, batch_size=50)
    return Stack(data_dir, db, store, projector)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    opened = open_stack(tmp_path / "data")
    yield opened
    opened.projector.close()
    opened.store.close()


POISON_VECTORS = {
    "zero": [0.0] * DIM,
    "overflow": [1e39, *[1.0] * (DIM - 1)],
    "unnormalizable": [3e38] * DIM,
    "dimension": [1.0] * (DIM - 3),
}


def test_poison_records_are_dead_lettered_alone_and_every_other_write_applies(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack.store.write([rec("tenant-a", f"a{i}", vector=unit(i)) for i in range(3)])
    stack.store.write(
        [rec("poisoner", name, vector=vector) for name, vector in POISON_VECTORS.items()]
        + [rec("poisoner", "fine", vector=unit(1))]
    )
    stack.store.write([rec("tenant-b", f"b{i}") for i in range(3)])
    with caplog.at_level("ERROR", logger="orrery.projector"):
        report = stack.projector.step()
    # One batch: nothing retried, nothing held back.
    assert report.events == 11 and report.dead_lettered == 4 and report.upserts == 7
    assert stack.projector.step().events == 0
    assert stack.counts() == {"tenant-a": 3, "tenant-b": 3, "poisoner": 1}
    assert sum("cannot be applied" in r.getMessage() for r in caplog.records) == 4

    letters = stack.projector.state.dead_letters(namespace="poisoner")
    assert sorted(d.message.reason.split(":")[0] for d in letters) == sorted(
        ["vector_zero", "vector_not_finite", "vector_not_finite", "embedder_mismatch"]
    )
    assert {d.namespace for d in letters} == {"poisoner"}
    assert all(d.revision == 1 and d.message.where.startswith("event@") for d in letters)
    assert stack.projector.state.dead_letters(namespace="tenant-a") == []

    # Readiness: ready, and the dead letters counted on the poisoner's scope only.
    ready = readiness(SqliteRouting(stack.db), None)
    assert ready["ready"] is True
    assert {s["namespace"]: s["dead_letters"] for s in ready["scopes"]} == {
        "poisoner": 4,
        "tenant-a": 0,
        "tenant-b": 0,
    }
    # The CLI lists them per namespace, naming each record.
    listed = CliRunner().invoke(
        app,
        ["project", "--dead-letters", "--namespace", "poisoner", "--data-dir", str(stack.data_dir)],
    )
    assert listed.exit_code == 0, listed.output
    shown = [json.loads(line) for line in listed.output.splitlines()]
    assert len(shown) == 4 and {s["namespace"] for s in shown} == {"poisoner"}
    assert all(s["document_id"] and s["revision"] == 1 for s in shown)

    # Ring statistics stayed finite (no poison vector was summed).
    assert_ring_stats_finite(stack.db)


def test_a_replayed_batch_parks_nothing_twice_and_a_restart_does_not_retry(
    tmp_path: Path,
) -> None:
    first = open_stack(tmp_path / "data")
    first.store.write([rec("poisoner", "zero", vector=[0.0] * DIM), rec("tenant-a", "a")])
    first.run()
    assert first.projector.state.dead_letter_count() == 1
    first.projector.close()
    first.store.close()
    again = open_stack(tmp_path / "data")
    try:
        assert again.projector.step().events == 0  # nothing delivered again
        again.store.write([rec("tenant-a", "b")])
        again.run()
        assert again.projector.state.dead_letter_count() == 1
        assert again.counts() == {"tenant-a": 2, "poisoner": 0}
    finally:
        again.projector.close()
        again.store.close()


def test_a_corrected_revision_applies_and_supersedes_the_dead_letter(stack: Stack) -> None:
    stack.store.write([rec("poisoner", "p", vector=[0.0] * DIM)])
    stack.run()
    assert stack.counts() == {"poisoner": 0}
    stack.store.write([rec("poisoner", "p", revision=2, vector=unit(3))])
    stack.run()
    assert stack.counts() == {"poisoner": 1}
    (outcome,) = redrive_dead_letters(
        box=stack.projector.state,
        store=stack.store,
        dimension=DIM,
        max_record_bytes=MAX_RECORD_BYTES,
    )
    assert outcome.outcome == "superseded"
    assert stack.projector.state.dead_letter_count() == 0


def test_an_engine_that_refuses_everything_is_retried_a_bounded_number_of_times_then_redriven(
    tmp_path: Path,
) -> None:
    """A deterministic refusal of every write (here: the projector restarted with an
    embedder of another dimension than its generations hold) fails the batch, which is
    retried; after `PoisonGuard.max_attempts` batches its records are dead-lettered and
    the projector goes on. After the fix (the right embedder) a re-drive applies them."""
    data_dir = tmp_path / "data"
    right = open_stack(data_dir)
    right.store.write([rec("tenant-a", "first")])
    right.run()
    right.projector.close()

    wrong = open_stack(data_dir, dimension=8)  # the generation holds 16-d vectors
    wrong.store.write([rec("tenant-a", "second")])
    for _ in range(2):
        with pytest.raises(OrreryError, match="8"):
            wrong.projector.step()
    third = wrong.projector.step()  # the third attempt parks it: never forever
    assert third.dead_lettered == 1
    assert wrong.projector.step().events == 0
    wrong.projector.close()
    wrong.store.close()

    fixed = open_stack(data_dir)
    try:
        (letter,) = fixed.projector.state.dead_letters()
        assert letter.message.reason.startswith("embedder_mismatch")
        (outcome,) = redrive_dead_letters(
            box=fixed.projector.state,
            store=fixed.store,
            dimension=DIM,
            max_record_bytes=MAX_RECORD_BYTES,
        )
        assert (outcome.outcome, outcome.revision) == ("redriven", 2)
        fixed.run()
        assert fixed.counts() == {"tenant-a": 2}
        assert fixed.projector.state.dead_letter_count() == 0
    finally:
        fixed.projector.close()
        fixed.store.close()


def test_redrive_keeps_a_record_the_door_still_refuses(stack: Stack) -> None:
    stack.store.write([rec("poisoner", "p", vector=[1e39] * DIM)])
    stack.run()
    result = CliRunner().invoke(
        app, ["project", "--redrive", "--namespace", "poisoner", "--data-dir", str(stack.data_dir)]
    )
    # The CLI checks with the real embedder's dimension (384): still refused either way.
    assert result.exit_code == 0, result.output
    (shown,) = [json.loads(line) for line in result.output.splitlines()]
    assert shown["outcome"] == "still_refused" and "vector" in shown["reason"]
    assert stack.projector.state.dead_letter_count() == 1


# -- bisection with real engines ----------------------------------------------------------


def test_bisection_isolates_the_document_an_engine_refuses(stack: Stack) -> None:
    """The engine path (no admission check in front): a document qdrant-edge refuses
    among good ones is found by bisecting, the rest written."""
    stack.store.write([rec("tenant-a", "seed")])
    stack.run()
    (generation_id,) = stack.projector.state.write_targets("tenant-a", "objects")
    good = [rec("tenant-a", f"g{i}", vector=unit(i)) for i in range(20)]
    # Built without validation, as the projector builds documents: nothing in front.
    bad = to_index_document(rec("tenant-a", "bad"), (0.0,) * DIM)
    docs = [to_index_document(r, tuple(r.vector or ())) for r in good[:7]]
    docs += [bad] + [to_index_document(r, tuple(r.vector or ())) for r in good[7:]]
    positions = {(d.document_id, d.revision): i + 100 for i, d in enumerate(docs)}
    calls: list[int] = []

    def write(d: Any, x: Any) -> None:
        calls.append(len(d) + len(x))
        _write_generation(
            generation_id,
            d,
            x,
            lexical=stack.projector.lexical,
            vectors=stack.projector.writes,
            text_analyzer=DEFAULT_TEXT_ANALYZER,
            dimension=DIM,
        )

    containment = BatchContainment(PoisonGuard(), [])
    refused = containment.write(write, docs, [], positions, {})
    assert refused == [(bad.document_id, bad.revision)]
    assert containment.wrote and len(calls) <= 2 + 2 * math.ceil(math.log2(len(docs)))
    held = {d for d, _ in stack.projector.vectors.stored_pairs(generation_id)}
    assert {d.document_id for d in docs if d is not bad} <= held and bad.document_id not in held

    # Alone, it is retried `max_attempts` times (the engine took nothing: maybe its fault).
    alone = PoisonGuard(max_attempts=3)
    for _ in range(2):
        with pytest.raises(OrreryError):
            BatchContainment(alone, []).write(write, [bad], [], positions, {})
    assert BatchContainment(alone, []).write(write, [bad], [], positions, {}) == [
        (bad.document_id, bad.revision)
    ]
    assert alone.failures == {}


# -- ring statistics ----------------------------------------------------------------------


def assert_ring_stats_finite(db: Path) -> None:
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT documents, vector_sum, unit_sum FROM ring_stats").fetchall()
    for _documents, vector_sum, unit_sum in rows:
        assert np.isfinite(np.frombuffer(vector_sum, dtype=np.float64)).all()
        assert np.isfinite(np.frombuffer(unit_sum, dtype=np.float64)).all()


def test_ring_statistics_made_non_finite_by_an_older_version_heal_on_the_next_change(
    stack: Stack,
) -> None:
    """A store written before the door and the projector refused such vectors holds a
    member with an infinite vector and a ring row of NaN; deleting that record (or any
    change to the ring) rebuilds the row from its finite members."""
    stack.store.write([rec("tenant-a", f"a{i}", vector=unit(i)) for i in range(3)])
    stack.run()
    (generation_id,) = stack.projector.state.write_targets("tenant-a", "objects")
    poisoned = rec("tenant-a", "legacy", vector=unit(5))
    with closing(sqlite3.connect(stack.db)) as conn, conn:
        # What an older projector wrote for a 1e39 vector: its float32 (inf) bytes, and
        # sums that became NaN.
        inf_vector = np.asarray([np.inf, *[1.0] * (DIM - 1)], dtype=np.float32).tobytes()
        conn.execute(
            "INSERT INTO ring_members VALUES (?,?,?,?,?,?,?)",
            (generation_id, poisoned.doc_id, 1, 0, "default", "r", inf_vector),
        )
        nan = np.full(DIM, np.nan, dtype=np.float64).tobytes()
        conn.execute(
            "UPDATE ring_stats SET documents = documents + 1, vector_sum = ?, unit_sum = ? "
            "WHERE generation_id = ?",
            (nan, nan, generation_id),
        )
    stack.store.write([rec("tenant-a", "legacy", deleted=True)])
    stack.run()
    assert_ring_stats_finite(stack.db)
    with closing(sqlite3.connect(stack.db)) as conn:
        ((documents, vector_sum),) = conn.execute(
            "SELECT documents, vector_sum FROM ring_stats WHERE generation_id = ?",
            (generation_id,),
        ).fetchall()
    assert documents == 3
    assert np.allclose(
        np.frombuffer(vector_sum, dtype=np.float64), np.sum([unit(i) for i in range(3)], axis=0)
    )
