"""Poison records in a generation *build* (issue 22: one bad record must never stop the
world, a rebuild included): the embedded store, projector, tantivy, qdrant-edge, the
SQLite registry, the bulk loader in a child process and in this one, readiness and the
CLI.

Poison records reach the canonical store the way the door no longer lets them: written
to it directly (`SqliteRecordStore.write` checks revisions, not engines), as a record
written before the door existed would be. Before the containment a build of such a
scope failed ("has an all-zero vector") and the scope could never be rebuilt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts.admin import BuildRequest
from contracts.admission import MAX_RECORD_BYTES
from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from orrery.cli import app
from orrery.redrive import redrive_dead_letters
from projector.bootstrap import (
    EmbeddedProjector,
    EmbedderFactory,
    embedded_generation_admin,
    embedded_projector,
)
from projector.generations import BuildControl, GenerationAdmin, GenerationOptions
from query.adapters.sqlite_routing import SqliteRouting
from query.entrypoints.http import readiness
from tests.e2e.test_generations import (
    DEPLOYMENTS,
    admin_get,
    best_lexical,
    build_sealed,
    deployed,
    ok,
    promote,
    records,
    topk,
    verify,
)
from tests.e2e.test_generations import NS as GEN_NS
from tests.fakes import FakeHashingEmbedder, titled_record

DIM = 16
NS = "poisoner"
KIND = "objects"


def rec(item: str, revision: int = 1, **fields: Any) -> Record:
    return titled_record(NS, KIND, item, revision, **fields)


def unit(i: int) -> list[float]:
    return [1.0 if j == i % DIM else 0.0 for j in range(DIM)]


POISON = {
    "zero": [0.0] * DIM,
    "overflow": [1e39, *[1.0] * (DIM - 1)],
}


@dataclass
class Deployment:
    data_dir: Path
    db: Path
    store: SqliteRecordStore
    projector: EmbeddedProjector
    admin: GenerationAdmin

    def run(self, steps: int = 20) -> None:
        for _ in range(steps):
            if self.projector.step().events == 0:
                return
        raise AssertionError(f"not caught up after {steps} steps")

    def build(self) -> Any:
        return self.admin.build(BuildRequest(namespace=NS, snapshot_kind=KIND), BuildControl())

    def canonical(self) -> set[tuple[str, int]]:
        return {
            (h.document_id, h.revision)
            for h in self.store.heads([r.doc_id for r in self.records])
            if not h.deleted
        }

    def held(self, generation_id: str) -> dict[str, set[tuple[str, int]]]:
        """What the registry and each engine hold of a generation."""
        return {
            "registry": set(self.projector.state.registry_pairs(generation_id).pairs.items()),
            "tantivy": set(self.projector.lexical.stored_pairs(generation_id)),
            "qdrant-edge": set(self.projector.vectors.stored_pairs(generation_id)),
        }

    records: tuple[Record, ...] = ()


@contextmanager
def deployment(
    tmp_path: Path, *, in_child: bool, pause_seconds: float = 0.0
) -> Iterator[Deployment]:
    data_dir = tmp_path / "data"
    db = data_dir / "orrery.sqlite"
    store = SqliteRecordStore(db)
    projector = embedded_projector(data_dir, db, embedder=FakeHashingEmbedder(DIM), batch_size=50)
    admin = embedded_generation_admin(
        projector,
        db,
        drive_log=None,
        options=GenerationOptions(
            batch_size=7, load_in_child=in_child, pause_seconds=pause_seconds
        ),
        embedder_factory=EmbedderFactory("tests.fakes:FakeHashingEmbedder", {"dimension": DIM}),
    )
    try:
        yield Deployment(data_dir, db, store, projector, admin)
    finally:
        admin.close()
        projector.close()
        store.close()


def write_corpus(dep: Deployment) -> list[Record]:
    good = [rec(f"ok-{i}", vector=unit(i)) for i in range(20)] + [rec("text-only")]
    poison = [rec(name, vector=vector) for name, vector in POISON.items()]
    # Poison in the middle of the snapshot's batches, not at an edge.
    records = good[:10] + poison + good[10:]
    dep.store.write(records)
    dep.records = tuple(records)
    return poison


def assert_dead_lettered_once(dep: Deployment, poison: list[Record]) -> None:
    letters = dep.projector.state.dead_letters(namespace=NS)
    assert sorted((d.document_id, d.revision, d.snapshot_kind) for d in letters) == sorted(
        (p.doc_id, 1, KIND) for p in poison
    )
    ready = readiness(SqliteRouting(dep.db), None)
    assert {s["namespace"]: s["dead_letters"] for s in ready["scopes"]} == {NS: len(poison)}
    listed = CliRunner().invoke(
        app, ["project", "--dead-letters", "--namespace", NS, "--data-dir", str(dep.data_dir)]
    )
    assert listed.exit_code == 0, listed.output
    shown = [json.loads(line) for line in listed.output.splitlines()]
    assert sorted(s["document_id"] for s in shown) == sorted(p.doc_id for p in poison)


@pytest.mark.parametrize("in_child", [True, False], ids=["child-process-load", "in-process-load"])
def test_a_rebuild_parks_poison_records_and_seals_verifies_and_promotes(
    tmp_path: Path, in_child: bool
) -> None:
    """A scope whose live generation dead-lettered two poison records is rebuilt (in the
    bulk loader's child process or here): the build parks them again (no second letter),
    leaves them out, seals with a manifest naming them, verifies and is promoted; every
    other record is in both engines. A corrected revision then reaches the new
    generation, a re-drive finds the letters superseded, and verify still matches."""
    with deployment(tmp_path, in_child=in_child) as dep:
        poison = write_corpus(dep)
        dep.run()
        first = dep.admin.rows(NS, KIND)[0].generation_id
        assert_dead_lettered_once(dep, poison)

        built = dep.build()
        assert built.state.value == "sealed"
        parked = {(p.doc_id, 1) for p in poison}
        assert built.source_manifest is not None
        assert set(built.source_manifest.dead_lettered) == parked
        assert built.source_manifest.document_count == len(dep.records)
        assert built.build_receipt is not None and built.build_receipt.failed == 0
        expected = dep.canonical() - parked
        assert len(expected) == len(dep.records) - len(poison)
        for source, pairs in dep.held(built.generation_id).items():
            assert pairs == expected, source
        assert built.id_set_digest == id_set_digest(sorted(expected))
        assert_dead_lettered_once(dep, poison)

        check = dep.admin.verify(built.generation_id)
        assert check.ok, check.reason
        assert check.coverage is not None and check.coverage.dead_lettered == len(poison)
        assert dep.admin.verify(first).ok  # the live path's generation agrees
        report = dep.admin.promote(built.generation_id)
        assert report.generation_id == built.generation_id

        # The producer fixes one record; a re-drive clears both letters (the other one,
        # still refused at the door, is kept).
        zero, overflow = (p.doc_id for p in poison)
        dep.store.write([rec("zero", revision=2, vector=unit(3))])
        dep.run()
        assert (zero, 2) in dep.held(built.generation_id)["qdrant-edge"]
        outcomes = redrive_dead_letters(
            box=dep.projector.state,
            store=dep.store,
            dimension=DIM,
            max_record_bytes=MAX_RECORD_BYTES,
        )
        assert sorted((o.document_id, o.outcome) for o in outcomes) == sorted(
            [(overflow, "still_refused"), (zero, "superseded")]
        )
        assert [d.document_id for d in dep.projector.state.dead_letters()] == [overflow]
        again = dep.admin.verify(built.generation_id)
        assert again.ok, again.reason
        assert again.coverage is not None and again.coverage.dead_lettered == 1

        # The next build takes the corrected revision and parks only what is still poison.
        rebuilt = dep.build()
        assert rebuilt.source_manifest is not None
        assert rebuilt.source_manifest.dead_lettered == ((overflow, 1),)
        assert dep.held(rebuilt.generation_id)["tantivy"] == dep.canonical() - {(overflow, 1)}
        assert dep.admin.verify(rebuilt.generation_id).ok


def test_a_first_build_parks_what_the_projector_never_saw(tmp_path: Path) -> None:
    """A build of a scope the projector has not applied yet loads the snapshot itself:
    the build is the first to refuse the poison record and parks it, named by
    namespace, kind, document id and revision (a snapshot record has no log position);
    the projector applying the same events afterwards parks nothing twice."""
    with deployment(tmp_path, in_child=False) as dep:
        poison = write_corpus(dep)
        built = dep.build()
        assert built.state.value == "sealed"
        letters = dep.projector.state.dead_letters(namespace=NS)
        assert sorted(d.message.where for d in letters) == sorted(
            f"record@{NS}/{KIND}/{p.doc_id}@1" for p in poison
        )
        assert {d.consumer for d in letters} == {"build"}
        assert all(d.message.position is None for d in letters)
        dep.run()
        for source, pairs in dep.held(built.generation_id).items():
            assert pairs == dep.canonical() - {(p.doc_id, 1) for p in poison}, source
        assert dep.admin.verify(built.generation_id).ok
        assert dep.admin.promote(built.generation_id).generation_id == built.generation_id
        assert_dead_lettered_once(dep, poison)


def test_without_a_dead_letter_box_a_poison_record_still_fails_the_build(
    tmp_path: Path,
) -> None:
    """Nothing is left out silently: with nowhere to park it, the build fails."""
    import dataclasses

    with deployment(tmp_path, in_child=False) as dep:
        write_corpus(dep)
        ports = dep.admin.ports
        dep.admin.ports = dataclasses.replace(ports, dead_letters=None)
        with pytest.raises(Exception, match="no dead-letter box"):
            dep.build()
        (row,) = dep.admin.rows(NS, KIND)
        assert row.state.value == "failed"


def wait_for(what: str, condition: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"after {timeout}s: {what}")


def test_a_poison_record_written_during_a_child_build_is_parked_by_its_hand_over(
    tmp_path: Path,
) -> None:
    """A record written after the child process took its snapshot reaches the new
    generation through the hand-over's replay of the log, which runs the door check too:
    the build seals without it and it stays one dead letter."""
    with deployment(tmp_path, in_child=True, pause_seconds=0.3) as dep:
        good = [rec(f"ok-{i}", vector=unit(i)) for i in range(30)]
        dep.store.write(good)
        dep.records = tuple(good)
        dep.run()
        started = dep.admin.start_build(BuildRequest(namespace=NS, snapshot_kind=KIND))
        generation_id = started.generation_id

        def loading() -> bool:
            progress = dep.admin.jobs.progress(generation_id)
            return progress is not None and progress.phase == "load" and progress.done > 0

        wait_for("the child loads its snapshot", loading)
        poison = rec("zero", vector=[0.0] * DIM)
        dep.store.write([poison])
        dep.records = (*good, poison)
        dep.run()  # the projector parks it for the live generation

        def finished() -> str | None:
            progress = dep.admin.jobs.progress(generation_id)
            return (
                None
                if progress is None or progress.phase not in ("done", "failed")
                else (progress.phase)
            )

        assert wait_for("the build ends", finished) == "done"
        dep.run()
        (row,) = [r for r in dep.admin.rows(NS, KIND) if r.generation_id == generation_id]
        assert row.state.value == "sealed"
        for source, pairs in dep.held(generation_id).items():
            assert pairs == dep.canonical() - {(poison.doc_id, 1)}, source
        assert [d.document_id for d in dep.projector.state.dead_letters()] == [poison.doc_id]
        assert dep.admin.verify(generation_id).ok


# -- a real `orrery serve`, embedded and in server mode ----------------------------------


@pytest.mark.parametrize("kind", DEPLOYMENTS)
def test_orrery_serve_rebuilds_promotes_and_serves_a_scope_holding_a_poison_record(
    tmp_path: Path, kind: str
) -> None:
    """The way it failed: a scope holding an all-zero vector written before the door (here
    straight into the canonical store) could not be rebuilt. Now the build seals with the
    record parked, verifies, is promoted, and every other record is searchable in it."""
    with deployed(kind, tmp_path / "data", ORRERY_GEN_BUILD_BATCH_SIZE="10") as srv:
        assert srv.post_records(records(0, 40)).status_code == 200
        bad = Record.model_validate(
            {
                "namespace": GEN_NS,
                "snapshot_kind": KIND,
                "item_id": "obj-poison",
                "revision": 1,
                "text": {"title": "poison number 99"},
                "metadata": {"status": "active", "updated_at": "2026-06-01T10:00:00Z"},
                "vector": [0.0] * 384,
            }
        )
        store: Any
        if srv.database_url:
            from ingest.adapters.postgres_store import PostgresRecordStore

            store = PostgresRecordStore(srv.database_url)
        else:
            store = SqliteRecordStore(srv.data_dir / "orrery.sqlite")
        try:
            store.write([bad])
        finally:
            store.close()
        srv.wait_projected(timeout=120, documents={(GEN_NS, KIND): 40})
        generation_id = build_sealed(srv)
        view = ok(admin_get(srv, f"/{generation_id}"))
        assert view["descriptor"]["source_manifest"]["dead_lettered"] == [[bad.doc_id, 1]]
        check = verify(srv, generation_id)
        assert check["verified"], check
        assert check["check"]["coverage"]["dead_lettered"] == 1
        promote(srv, generation_id)
        answer = ok(topk(srv, "item number 17"))
        assert answer["generation_id"] == generation_id
        assert best_lexical(answer) == "obj-17"
        everything = ok(topk(srv, "", limit=100, filters={"status": ["active"]}))
        assert sorted(r["item_id"] for r in everything["results"]) == sorted(
            f"obj-{i}" for i in range(40)
        )
        letters = _dead_letters(srv, GEN_NS)
        assert [(d["document_id"], d["revision"]) for d in letters] == [(bad.doc_id, 1)]


def _dead_letters(srv: Any, namespace: str) -> list[dict[str, Any]]:
    if srv.database_url:
        from query.adapters.postgres_routing import PostgresRouting, open_reads

        reads = open_reads(srv.database_url, pool_size=1)
        try:
            return list(PostgresRouting(reads).dead_letters(1_000, namespace=namespace))
        finally:
            reads.close()
    return list(
        SqliteRouting(srv.data_dir / "orrery.sqlite").dead_letters(1_000, namespace=namespace)
    )


class UnreachableVectors:
    """The real vector index, but every write fails as an unreachable engine does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes = 0

    def apply(self, *args: Any, **kwargs: Any) -> None:
        self.writes += 1
        raise DependencyUnavailable("qdrant-edge", "unreachable (injected)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_transient_fault_still_fails_the_build_and_parks_nothing(tmp_path: Path) -> None:
    """An engine that cannot be reached is the engine's fault, not a record's: the batch
    is tried `_LOAD_ATTEMPTS` times, then the build fails; nothing is dead-lettered."""
    import dataclasses

    with deployment(tmp_path, in_child=False) as dep:
        dep.store.write([rec(f"ok-{i}", vector=unit(i)) for i in range(5)])
        unreachable = UnreachableVectors(dep.admin.ports.vectors)
        dep.admin.ports = dataclasses.replace(dep.admin.ports, vectors=unreachable)
        with pytest.raises(DependencyUnavailable, match="unreachable"):
            dep.build()
        assert unreachable.writes == 3
        (row,) = dep.admin.rows(NS, KIND)
        assert row.state.value == "failed"
        assert dep.projector.state.dead_letter_count() == 0
