"""bench/topk.py's `optimizer_busy`: what counts as an optimize under way (issue 24's
benchmarks wait for the optimizer to be quiet before they time anything)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import ServeProcess
from bench.topk import SPARE_SHARD_PREFIX, optimizer_busy


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    """A stand-in server: a process without children, over a data dir of our own."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield ServeProcess(tmp_path / "data", 0, process, tmp_path / "serve.log")
    finally:
        process.communicate(timeout=30)


def test_a_spare_shard_is_no_optimize_but_a_staging_copy_is(server: ServeProcess) -> None:
    vectors = server.data_dir / "generations" / "vectors"
    (vectors / "g1").mkdir(parents=True)
    (vectors / "g1+live").write_text("g1")
    (vectors / f"{SPARE_SHARD_PREFIX}123-abcd1234-0123456789abcdef").mkdir()
    assert optimizer_busy(server) is None
    (vectors / ".g1.optimizing").mkdir()
    busy = optimizer_busy(server)
    assert busy is not None
    assert busy["staging_dirs"] == [".g1.optimizing"]
