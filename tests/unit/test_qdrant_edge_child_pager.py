"""`_ChildPager`: the optimizer reclaims its child's resident pages of the files the copy
held when the child started (its input), never those of files made later (its output),
and the child reads every input byte back unchanged afterwards."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from projector.adapters.qdrant_edge_vectors import _ChildPager

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process_madvise is Linux's")

_SIZE = 4 << 20

# Maps `in` (read in whole), then makes `out` and maps it (written in whole, synced so
# its pages are clean, as reclaimable as the input's), says "ready", and on a line of
# stdin prints the digest of `in` read through its mapping.
_CHILD = """
import hashlib, mmap, os, sys
root = sys.argv[1]
with open(os.path.join(root, "in"), "rb") as f:
    inp = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
hashlib.sha256(inp).hexdigest()
with open(os.path.join(root, "out"), "w+b") as f:
    f.truncate(len(inp))
    out = mmap.mmap(f.fileno(), 0)
    out[:] = bytes(range(256)) * (len(inp) // 256)
    out.flush()
print("ready", flush=True)
sys.stdin.readline()
print(hashlib.sha256(inp).hexdigest(), flush=True)
"""


def _rss_kib(pid: int, name: str) -> int:
    """Resident KiB of `pid`'s mappings of the file `name`."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip("\n").endswith(name)
            elif head == "Rss:" and inside:
                total += int(line.split()[1])
    return total


def test_child_pager_reclaims_the_input_pages_only(tmp_path: Path) -> None:
    data = os.urandom(_SIZE)
    (tmp_path / "in").write_bytes(data)
    fd = os.open(tmp_path / "in", os.O_RDONLY)
    os.fsync(fd)  # clean pages: the kernel reclaims no dirty page
    os.close(fd)
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        # As `_optimize_in_child` makes it: once the copy is there, before the child's
        # build makes its own files.
        pager = _ChildPager(child.pid, tmp_path)
        try:
            assert child.stdout.readline().strip() == "ready"
            input_before = _rss_kib(child.pid, f"{tmp_path}/in")
            output_before = _rss_kib(child.pid, f"{tmp_path}/out")
            assert input_before >= _SIZE // 1024 // 2 and output_before >= _SIZE // 1024 // 2
            pager.page_out()
            if pager.refused is not None:
                pytest.skip(f"process_madvise refused here: {pager.refused}")
            assert pager.rounds == 1
            assert _rss_kib(child.pid, f"{tmp_path}/in") < input_before // 4
            assert _rss_kib(child.pid, f"{tmp_path}/out") == output_before
            assert pager.reclaimed_kb >= input_before // 2
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == hashlib.sha256(data).hexdigest()
        finally:
            pager.close()
            child.kill()


def test_child_pager_after_the_child_exited_stops_quietly(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"x" * 4096)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pager = _ChildPager(child.pid, tmp_path)
    child.wait()
    pager.page_out()  # reaped: nothing mapped to advise, no error
    pager.page_out()
    pager.close()
    pager.close()
    assert pager.reclaimed_kb == 0
    assert pager.refused is None
