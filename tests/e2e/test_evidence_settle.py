"""An eligibility check while the projector writes (issue 24): the embedded store,
projector, tantivy, qdrant-edge and SQLite registry in this process.

A check's optimistic read runs without the writer lock; when a batch commits meanwhile,
the check reads again with writers held off. That re-read covers only the documents the
optimistic read saw differ from the registry (`PointReadback.pairs_of`), and falls back
to reading everything when they do not settle it. Both must give the verdict a full
re-read gives: eligible at the registry's new position, or the divergence, exactly.

The batch is written from the check's own `pace` hook, between the lexical and the
vector read: the lexical read misses it, the vector read sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.digests import id_set_digest
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.bootstrap import EmbedderFactory, embedded_generation_admin, embedded_projector
from projector.generations import GenerationOptions, check_evidence
from tests.fakes import FakeHashingEmbedder, titled_record

DIM = 16
NS = "settle"
KIND = "objects"


def rec(item: str, revision: int = 1, **fields: Any) -> Record:
    return titled_record(NS, KIND, item, revision, **fields)


class Pipeline:
    def __init__(self, tmp_path: Path) -> None:
        data_dir = tmp_path / "data"
        self.db = data_dir / "orrery.sqlite"
        self.store = SqliteRecordStore(self.db)
        self.projector = embedded_projector(
            data_dir, self.db, embedder=FakeHashingEmbedder(DIM), batch_size=500
        )
        self.admin = embedded_generation_admin(
            self.projector,
            self.db,
            drive_log=None,
            options=GenerationOptions(load_in_child=False),
            embedder_factory=EmbedderFactory("tests.fakes:FakeHashingEmbedder", {"dimension": DIM}),
        )

    def write(self, records: list[Record]) -> None:
        self.store.write(records)
        while self.projector.step().events:
            pass

    def generation(self) -> str:
        (generation_id,) = self.projector.state.write_targets(NS, KIND)
        return generation_id

    def close(self) -> None:
        self.admin.close()
        self.projector.close()
        self.store.close()


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    handle = Pipeline(tmp_path)
    yield handle
    handle.close()


# A batch during the check: new documents, newer revisions, deletes (of 300 held).
CONCURRENT = [
    pytest.param([rec(f"new-{i}") for i in range(40)], id="new"),
    pytest.param([rec(f"doc-{i}", 2) for i in range(0, 300, 7)], id="updates"),
    pytest.param([rec(f"doc-{i}", 2, deleted=True) for i in range(0, 300, 11)], id="deletes"),
    pytest.param(
        [rec("new-x"), rec("doc-5", 3), rec("doc-6", 2, deleted=True)],
        id="mixed",
    ),
]


def _check_with_a_batch_between_the_engines(
    pipeline: Pipeline, batch: list[Record]
) -> tuple[Any, int]:
    """A check whose `pace` writes `batch` just before the vector read; returns the
    check and how many times the whole registry (hence every engine) was read."""
    calls = {"pace": 0, "registry": 0}

    def pace() -> None:
        calls["pace"] += 1
        if calls["pace"] == 2:  # after the lexical read, before the vector read
            pipeline.write(batch)

    def progress(phase: str, _done: int, _total: int) -> None:
        calls["registry"] += phase == "registry"

    generation_id = pipeline.generation()
    check = check_evidence(generation_id, ports=pipeline.admin.ports, progress=progress, pace=pace)
    assert calls["pace"] >= 2, "the batch was never written"
    return check, calls["registry"]


@pytest.mark.parametrize("batch", CONCURRENT)
def test_a_batch_during_the_check_settles_without_reading_everything_again(
    pipeline: Pipeline, batch: list[Record]
) -> None:
    pipeline.write([rec(f"doc-{i}") for i in range(300)])
    check, full_reads = _check_with_a_batch_between_the_engines(pipeline, batch)
    registry = pipeline.projector.state.registry_pairs(pipeline.generation())
    assert check.ok, check.reason
    # The verdict speaks for the registry after the batch, with its exact digest.
    assert check.commit_seq == registry.commit_seq
    digest = id_set_digest(registry.pairs.items())
    assert (check.expected_count, check.expected_digest) == (len(registry.pairs), digest)
    assert {e.engine: (e.document_count, e.id_set_digest) for e in check.engines} == {
        "tantivy": (len(registry.pairs), digest),
        "qdrant-edge": (len(registry.pairs), digest),
    }
    assert full_reads == 1


def test_a_divergence_during_a_concurrent_batch_is_reported_as_a_full_reread_would(
    pipeline: Pipeline,
) -> None:
    pipeline.write([rec(f"doc-{i}") for i in range(300)])
    generation_id = pipeline.generation()
    # Behind the registry's back: tantivy loses two documents.
    lost = [rec("doc-3").doc_id, rec("doc-4").doc_id]
    pipeline.projector.lexical.apply(generation_id, [], [(d, 1) for d in lost])
    check, full_reads = _check_with_a_batch_between_the_engines(
        pipeline, [rec(f"new-{i}") for i in range(10)]
    )
    assert not check.ok
    tantivy = next(e for e in check.engines if e.engine == "tantivy")
    assert not tantivy.matches
    assert tantivy.missing_count == 2 and list(tantivy.missing) == sorted(lost)
    assert tantivy.unexpected_count == 0 and tantivy.stale_count == 0
    vector = next(e for e in check.engines if e.engine == "qdrant-edge")
    assert vector.matches and vector.document_count == 310
    assert full_reads == 2


def test_pairs_of_reads_named_documents_from_each_engine(pipeline: Pipeline) -> None:
    pipeline.write([rec(f"doc-{i}") for i in range(1_200)])
    pipeline.write([rec("doc-7", 4), rec("doc-8", 2, deleted=True)])
    generation_id = pipeline.generation()
    items = ["doc-7", "doc-8", "absent", *[f"doc-{i}" for i in range(100, 1_150)]]
    asked = [rec(item).doc_id for item in items]
    expected = sorted(
        [(rec("doc-7").doc_id, 4), *[(rec(f"doc-{i}").doc_id, 1) for i in range(100, 1_150)]]
    )
    for engine in (pipeline.projector.lexical, pipeline.projector.vectors):
        assert sorted(engine.pairs_of(generation_id, asked)) == expected


def test_a_check_frees_what_it_read_once_its_verdict_is_made(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-backs' pair lists and the registry's pairs are emptied (paced, by
    `release`) when the check is done, not left for one statement to free at a million
    pairs; the verdict is made before and unchanged."""
    pipeline.write([rec(f"doc-{i}") for i in range(300)])
    ports = pipeline.admin.ports
    held: list[Any] = []

    def keep(read: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = read(*args, **kwargs)
            held.append(result.pairs if hasattr(result, "pairs") else result)
            return result

        return wrapper

    monkeypatch.setattr(
        ports.lexical_readback, "stored_pairs", keep(ports.lexical_readback.stored_pairs)
    )
    monkeypatch.setattr(
        ports.vector_readback, "stored_pairs", keep(ports.vector_readback.stored_pairs)
    )
    monkeypatch.setattr(ports.contents, "registry_pairs", keep(ports.contents.registry_pairs))
    check = check_evidence(pipeline.generation(), ports=ports, pace=lambda: None)
    assert check.ok, check.reason
    assert check.expected_count == 300
    assert [len(h) for h in held] == [0, 0, 0]
