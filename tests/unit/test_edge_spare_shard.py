"""A qdrant-edge index with `spare_dimension` keeps an empty shard ready, made by a child
process, and a new generation of that config takes it (a rename and a load) instead of
creating its shard and payload indexes in process with the GIL held. A generation made
from the spare must answer exactly like one made in process; a generation of another
config must never get it; spares left by a process that is gone are removed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contracts.index import IndexDocument, SearchFilter
from projector.adapters.qdrant_edge_vectors import (
    _CONFIG_FILE,
    QdrantEdgeTuning,
    QdrantEdgeVectorIndex,
    _create_empty,
)
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch

DIMENSION = 4
_READY_WAIT_S = 120.0  # a child's start on a loaded machine: seconds, not minutes


def _spares(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(".spare-*")) if root.is_dir() else []


def _wait_for_spare(index: QdrantEdgeVectorIndex, root: Path) -> str:
    """The name of `index`'s ready spare, once its child has made it."""
    assert index._spares is not None
    name = index._spares._ready.name
    assert name.startswith(f".spare-{os.getpid()}-")
    deadline = time.monotonic() + _READY_WAIT_S
    while time.monotonic() < deadline:
        if name in _spares(root):
            return name
        time.sleep(0.05)
    raise AssertionError(f"no spare under {root} after {_READY_WAIT_S} s: {_spares(root)}")


def _documents() -> list[IndexDocument]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        IndexDocument(
            document_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"d{i}")) if i % 2 else f"doc-{i}",
            revision=1 + i % 3,
            item_id=f"item-{i}",
            galaxy="g" if i % 5 else "h",
            ring=("a/b" if i % 3 == 0 else "a") if i % 4 else "",
            status="active" if i % 7 else "archived",
            updated_at=start + timedelta(minutes=i),
            visibility=("public",) if i % 2 else ("public", "staff"),
            facets={"lang": ("en",) if i % 3 else ("de", "fr")},
            vector=(1.0, 0.05 * (i % 11), 0.5 - 0.03 * (i % 5), 0.2 + 0.01 * i),
        )
        for i in range(60)
    ]


def _segment_configs(path: Path) -> list[object]:
    return sorted(
        json.dumps(json.loads(p.read_text())["config"], sort_keys=True)
        for p in path.glob("segments/*/segment.json")
    )


_FILTERS = [
    SearchFilter(),
    SearchFilter(galaxy="g"),
    SearchFilter(galaxy="g", status=["active"]),
    SearchFilter(visibility=["staff"]),
    SearchFilter(facets={"lang": ["de"]}),
    SearchFilter(ring_trees=["a/b"]),
    SearchFilter(rings=["a"]),
    SearchFilter(updated_after=datetime(2026, 1, 1, 0, 20, tzinfo=UTC)),
    SearchFilter(
        updated_before=datetime(2026, 1, 1, 0, 40, tzinfo=UTC),
        document_ids=[f"doc-{i}" for i in range(0, 60, 4)],
    ),
]
_QUERIES = [[1.0, 0.0, 0.0, 0.0], [0.1, 0.9, 0.3, 0.2], [0.5, 0.5, -0.5, 1.0]]


def _answers(index: QdrantEdgeVectorIndex, generation_id: str) -> list[object]:
    """Every search and filter's candidates (ids, scores, fields), from payloads and
    from the point table, plus the stored pairs and evidence."""
    out: list[object] = [
        sorted(index.stored_pairs(generation_id)),
        index.evidence(generation_id),
        sorted(index.shard_for(generation_id).info().payload_schema),
    ]
    for search in (
        QdrantEdgeVectorSearch(index.shard_for),
        QdrantEdgeVectorSearch(index.shard_for, points_provider=index.points_for),
    ):
        for query in _QUERIES:
            for filter in _FILTERS:
                found = search.search(generation_id, query, filter, 25)
                out.append([(c.document_id, c.score, c.revision, c.updated_at) for c in found])
                listed = filter.model_copy(
                    update={"document_ids": [d.document_id for d in _documents()[::3]]}
                )
                out.append(sorted(search.scores(generation_id, query, listed).items()))
    return out


def test_a_generation_from_the_spare_answers_like_one_made_in_process(tmp_path: Path) -> None:
    spared_root, plain_root = tmp_path / "spared", tmp_path / "plain"
    spared = QdrantEdgeVectorIndex(spared_root, spare_dimension=DIMENSION, flat_scan=False)
    plain = QdrantEdgeVectorIndex(plain_root, flat_scan=False)
    try:
        name = _wait_for_spare(spared, spared_root)
        spared.create("g1", DIMENSION)
        plain.create("g1", DIMENSION)
        assert spared._spares is not None and spared._spares.taken == 1
        assert name not in _spares(spared_root)  # moved into place, not copied
        # The same segments (storage types, vector and payload config); the shard
        # configs are compared once both were loaded (a load writes the engine's
        # defaults into the file: `on_disk_payload`, `payload_memory`).
        assert _segment_configs(spared_root / "g1") == _segment_configs(plain_root / "g1")
        spared_schema = spared.shard_for("g1").info().payload_schema
        plain_schema = plain.shard_for("g1").info().payload_schema
        assert {k: v.data_type for k, v in spared_schema.items()} == {
            k: v.data_type for k, v in plain_schema.items()
        }
        documents = _documents()
        for index in (spared, plain):
            index.apply("g1", documents[:40], [])
            index.apply("g1", documents[40:], [(documents[3].document_id, 9)])
        assert _answers(spared, "g1") == _answers(plain, "g1")
        # Both optimized (HNSW built in a child, swapped in): still alike.
        for index in (spared, plain):
            index.optimize("g1")
        assert _answers(spared, "g1") == _answers(plain, "g1")
        # A new spare is made for the next generation, and taken by it.
        _wait_for_spare(spared, spared_root)
        spared.create("g2", DIMENSION)
        assert spared._spares.taken == 2
        spared.apply("g2", documents, [])
        plain.create("g2", DIMENSION)
        plain.apply("g2", documents, [])
        assert _answers(spared, "g2") == _answers(plain, "g2")
    finally:
        spared.close()
        plain.close()
    assert _spares(spared_root) == []  # close removes the spare
    # Reopened from disk by an index without spares: the same answers.
    reopened, plain = QdrantEdgeVectorIndex(spared_root), QdrantEdgeVectorIndex(plain_root)
    try:
        for generation_id in ("g1", "g2"):
            assert _answers(reopened, generation_id) == _answers(plain, generation_id)
            assert json.loads(
                (spared_root / generation_id / _CONFIG_FILE).read_text()
            ) == json.loads((plain_root / generation_id / _CONFIG_FILE).read_text())
    finally:
        reopened.close()
        plain.close()


def test_a_generation_of_another_config_does_not_take_the_spare(tmp_path: Path) -> None:
    index = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    tuning = QdrantEdgeTuning(hnsw_m=8)
    other = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION, tuning=tuning)
    try:
        name = _wait_for_spare(index, tmp_path)
        index.create("wide", DIMENSION * 2)  # another dimension: made in process
        assert index._spares is not None and index._spares.taken == 0
        assert index.shard_for("wide").info().payload_schema  # indexes made all the same
        assert json.loads((tmp_path / "wide" / _CONFIG_FILE).read_text())["vectors"]
        # Another index on the root (other tuning; or another process) neither takes
        # nor removes it.
        other.create("tuned", DIMENSION)
        assert name in _spares(tmp_path)
        config = json.loads((tmp_path / "tuned" / _CONFIG_FILE).read_text())
        assert config["hnsw_config"]["m"] == tuning.hnsw_m != QdrantEdgeTuning().hnsw_m
        index.create("same", DIMENSION)
        assert index._spares.taken == 1
        assert name not in _spares(tmp_path)
    finally:
        index.close()
        other.close()
    assert _spares(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def test_stale_spares_are_removed_at_start_up(tmp_path: Path) -> None:
    """Left by a crash: a ready spare of a process gone, one half made, and one named
    with this process's id by an earlier process (no maker of this process has its
    token). A live process's spare and the generations stay."""
    dead = _dead_pid()
    stale = [
        f".spare-{dead}-0badc0de-{'0' * 16}",
        f".spare-{dead}-0badc0de-{'0' * 16}.tmp",
        f".spare-{os.getpid()}-feedbeef-{'1' * 16}",
    ]
    for name in stale:
        _create_empty(str(tmp_path / name), DIMENSION, QdrantEdgeTuning())
    alive = tmp_path / f".spare-1-00000000-{'2' * 16}"  # pid 1 lives as long as we do
    alive.mkdir()
    kept = QdrantEdgeVectorIndex(tmp_path)
    kept.create("g1", DIMENSION)
    kept.close()
    assert set(stale) <= set(_spares(tmp_path))  # an index without spares leaves them
    index = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    try:
        left = _spares(tmp_path)
        assert not set(stale) & set(left)
        assert alive.name in left
        assert (tmp_path / "g1" / _CONFIG_FILE).is_file()
        index.shard_for("g1")
    finally:
        index.close()
    assert _spares(tmp_path) == [alive.name]


def test_a_stale_spare_still_written_to_does_not_stop_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed server's spare-making child outlives it and may still write into its
    half-made spare while the next server starts (CI: rmtree's "Directory not empty").
    The start goes on, the spare is left, and the next start removes it."""
    stale = tmp_path / f".spare-{_dead_pid()}-0badc0de-{'0' * 16}.tmp"
    _create_empty(str(stale), DIMENSION, QdrantEdgeTuning())
    rmtree = shutil.rmtree

    def written_meanwhile(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        if Path(path) == stale:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", "payload_index")
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", written_meanwhile)
    index = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    try:
        index.create("g1", DIMENSION)
        assert stale.name in _spares(tmp_path)
    finally:
        index.close()
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    again = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    try:
        assert stale.name not in _spares(tmp_path)
    finally:
        again.close()


def test_close_while_the_spare_is_made_leaves_nothing(tmp_path: Path) -> None:
    index = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    index.close()  # the child has just started, or not yet: killed, nothing left
    assert _spares(tmp_path) == []
    index.close()


def test_creating_before_the_spare_is_ready_works_and_a_spare_follows(tmp_path: Path) -> None:
    """`create` never waits for a spare being made: right after start-up (most likely
    still under way) it makes the shard in process; the spare is ready afterwards."""
    index = QdrantEdgeVectorIndex(tmp_path, spare_dimension=DIMENSION)
    try:
        index.create("g1", DIMENSION)
        index.create("g2", DIMENSION)  # right after a take, the next one is under way
        for generation_id in ("g1", "g2"):
            index.apply(generation_id, _documents()[:5], [])
            assert len(index.stored_pairs(generation_id)) == 5
        _wait_for_spare(index, tmp_path)
        assert index._spares is not None and index._spares.made >= 1
    finally:
        index.close()
    assert _spares(tmp_path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("script", ["_OPTIMIZE_SCRIPT", "_SPARE_SCRIPT"])
def test_a_child_dies_with_the_server_that_started_it(script: str) -> None:
    """The optimizer's and the spare maker's children begin with `_DIES_WITH_PARENT`:
    when the server dies (here a parent that exits at once), the child is killed instead
    of writing on into files the next start removes."""
    from projector.adapters import qdrant_edge_vectors as edge_module

    head = edge_module._DIES_WITH_PARENT
    assert getattr(edge_module, script).startswith(head)
    body = head + "import time\nprint('up', flush=True)\ntime.sleep(120)\n"
    parent = (
        "import subprocess, sys, os\n"
        f"child = subprocess.Popen([sys.executable, '-c', {body!r}],\n"
        "    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
        "assert child.stdout.readline().strip() == b'up'\n"
        "print(child.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=_READY_WAIT_S
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), f"child {pid} outlived its parent"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
