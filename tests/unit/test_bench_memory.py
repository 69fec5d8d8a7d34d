"""`bench.memory`: a process tree's resident memory sampled together."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.memory import PARTS, PSS_PARTS, TreeSampler, descendants, describe, role_of

_STATUS = (
    "Name:\tpython\nVmHWM:\t{hwm} kB\nVmRSS:\t{rss} kB\n"
    "RssAnon:\t{anon} kB\nRssFile:\t{file} kB\nRssShmem:\t0 kB\n"
)


_ROLLUP = (
    "55d0-7ffd [rollup]\nRss:\t{rss} kB\nPss:\t{pss} kB\nPss_Dirty:\t0 kB\n"
    "Pss_Anon:\t{anon} kB\nPss_File:\t{file} kB\nPss_Shmem:\t0 kB\n"
)


def _write_process(
    proc: Path,
    pid: int,
    parent: int,
    command: str,
    anon: int,
    file: int,
    *,
    file_pss: int | None = None,
) -> None:
    """A process of `anon` + `file` MiB resident; with `file_pss`, a `smaps_rollup` whose
    file pages count `file_pss` MiB (fewer when some are mapped twice)."""
    directory = proc / str(pid)
    directory.mkdir(exist_ok=True)
    (directory / "stat").write_text(f"{pid} (py (x)) S {parent} 1 1 0\n")
    (directory / "cmdline").write_bytes(command.replace(" ", "\0").encode() + b"\0")
    # Figures in MiB, written in KiB as the kernel does.
    anon, file = anon * 1024, file * 1024
    rss = anon + file
    (directory / "status").write_text(_STATUS.format(hwm=rss + 7, rss=rss, anon=anon, file=file))
    rollup = directory / "smaps_rollup"
    if file_pss is None:
        rollup.unlink(missing_ok=True)
    else:
        pss_file = file_pss * 1024
        rollup.write_text(_ROLLUP.format(rss=rss, pss=anon + pss_file, anon=anon, file=pss_file))


@contextlib.contextmanager
def _ready_child(script: str) -> Iterator[subprocess.Popen[bytes]]:
    """A child running `script`, once it printed `ready`; told to end (stdin closed)
    and waited for on the way out."""
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        yield child
    finally:
        child.communicate(timeout=30)


def _remove_process(proc: Path, pid: int) -> None:
    for name in ("stat", "cmdline", "status", "smaps_rollup"):
        (proc / str(pid) / name).unlink(missing_ok=True)
    (proc / str(pid)).rmdir()


@st.composite
def _trees(draw: st.DrawFn) -> tuple[int, dict[int, int]]:
    """A forest of live processes (pid -> parent pid) and one of them as the root."""
    size = draw(st.integers(1, 30))
    pids = draw(st.lists(st.integers(2, 10_000), min_size=size, max_size=size, unique=True))
    parents = {pids[0]: 1}
    for index, pid in enumerate(pids[1:], start=1):
        parents[pid] = draw(st.sampled_from([1, *pids[:index]]))
    return draw(st.sampled_from(pids)), parents


@given(_trees())
def test_descendants_are_the_processes_below_the_root_parents_first(
    tree: tuple[int, dict[int, int]],
) -> None:
    root, parents = tree
    found = descendants(root, parents)
    below = set()
    for pid in parents:
        walk = pid
        while walk in parents and walk != root:
            walk = parents[walk]
        if walk == root:
            below.add(pid)
    assert found[0] == root
    assert set(found) == below | {root}
    assert len(found) == len(set(found))
    position = {pid: index for index, pid in enumerate(found)}
    assert all(position[parents[pid]] < position[pid] for pid in found if pid != root)


def test_roles_by_command_line() -> None:
    assert role_of(10, 10, "python -m orrery.cli serve") == "server"
    optimizer = "python -c import os ... changed = shard.optimize() ..."
    assert role_of(11, 10, optimizer) == "optimizer"
    assert role_of(12, 10, "python -m ingest.entrypoints.write_worker 3") == "write_worker"
    assert role_of(13, 10, "sh -c true") == "other"


def test_the_peak_is_that_of_the_sum_with_the_parts_of_the_same_instant(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    optimizer = "python -c shard.optimize()"
    _write_process(proc, 7, 1, "sh", 1_000, 0)  # not in the tree
    sampler = TreeSampler(100, proc=proc, series_every_s=0.0, pss_every_s=0.0)
    # 1: server 100 + optimizer 50 = 150; 2: server 120 alone; 3: server 90 + optimizer 70.
    _write_process(proc, 100, 1, "python -m orrery.cli serve", 60, 40)
    _write_process(proc, 200, 100, optimizer, 45, 5)
    assert sampler.sample() is not None
    _remove_process(proc, 200)
    _write_process(proc, 100, 1, "python -m orrery.cli serve", 80, 40)
    sampler.sample()
    _write_process(proc, 100, 1, "python -m orrery.cli serve", 50, 40)
    _write_process(proc, 201, 100, optimizer, 60, 10)
    _write_process(proc, 300, 201, "sh -c true", 3, 0)  # a grandchild counts too
    sampler.sample()
    report = sampler.report()
    assert report["samples"] == 3
    mib = 1024
    assert report["peak_sum_kb"] == (90 + 70 + 3) * mib
    at_peak = report["at_peak"]
    assert at_peak["server"] == {
        "rss_kb": 90 * mib,
        "processes": 1,
        "RssAnon": 50 * mib,
        "RssFile": 40 * mib,
        "RssShmem": 0,
        # No smaps_rollup written: PSS counts the RSS, its parts are unknown (0).
        "pss_kb": 90 * mib,
        "Pss_Anon": 0,
        "Pss_File": 0,
        "Pss_Shmem": 0,
    }
    assert at_peak["optimizer"]["rss_kb"] == 70 * mib
    assert at_peak["optimizer"]["RssAnon"] == 60 * mib
    assert at_peak["other"]["rss_kb"] == 3 * mib
    assert report["role_peaks_kb"] == {"server": 120 * mib, "optimizer": 70 * mib, "other": 3 * mib}
    assert report["role_vmhwm_kb"]["server"] == 120 * mib + 7  # VmHWM as the kernel reports it
    # [s, total, server, optimizer, other] MiB
    assert [row[1:] for row in report["series_mib"]["rows"]] == [
        [150, 100, 50, 0],
        [120, 120, 0, 0],
        [163, 90, 70, 3],
    ]
    line = describe(report)
    assert line.startswith("peak RSS of the process tree")
    assert "optimizer" in line and "server" in line


def test_the_pss_peak_counts_each_page_once_and_is_kept_apart(tmp_path: Path) -> None:
    """Two samples: the RSS peak (file pages mapped twice) is not the PSS peak; a process
    without a smaps_rollup counts its RSS."""
    proc = tmp_path / "proc"
    proc.mkdir()
    optimizer = "python -c shard.optimize()"
    sampler = TreeSampler(100, proc=proc, pss_every_s=0.0)
    mib = 1024
    # 1: RSS 100 + 80 = 180, PSS 100 + 40 (the child's 80 MiB of file pages mapped twice).
    _write_process(proc, 100, 1, "python -m orrery.cli serve", 60, 40, file_pss=40)
    _write_process(proc, 200, 100, optimizer, 0, 80, file_pss=40)
    sampler.sample()
    # 2: RSS 100 + 70 = 170, PSS 100 + 70 (a child without smaps_rollup: its RSS).
    _write_process(proc, 200, 100, optimizer, 70, 0)
    sampler.sample()
    report = sampler.report()
    assert report["peak_sum_kb"] == 180 * mib
    assert report["at_peak"]["optimizer"]["pss_kb"] == 40 * mib
    assert report["at_peak"]["optimizer"]["Pss_File"] == 40 * mib
    assert report["peak_sum_pss_kb"] == 170 * mib
    at_pss_peak = report["at_pss_peak"]
    assert at_pss_peak["server"]["pss_kb"] == 100 * mib
    assert at_pss_peak["server"]["Pss_Anon"] == 60 * mib
    assert at_pss_peak["optimizer"]["pss_kb"] == 70 * mib
    assert all(part in at_pss_peak["server"] for part in PSS_PARTS)
    assert "peak PSS 170 MiB" in describe(report)


@pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc smaps_rollup"
)
def test_a_file_mapped_twice_counts_twice_in_rss_and_once_in_pss(tmp_path: Path) -> None:
    """The kernel's own accounting, which the PSS figures exist for: a child maps one
    16 MiB file twice and reads both mappings."""
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(16 << 20))
    script = (
        "import mmap, sys\n"
        f"f = open({str(data)!r}, 'rb')\n"
        "maps = [mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) for _ in range(2)]\n"
        "total = sum(m[i] for m in maps for i in range(0, len(m), 4096))\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    with _ready_child(script):
        sampler = TreeSampler(os.getpid())
        sampler.sample()
        others = sampler.report()["at_peak"]["other"]
        # Twice the file in RSS, once in PSS (up to pages of other files both hold).
        assert others["RssFile"] >= 32 << 10
        assert others["RssFile"] - others["Pss_File"] >= 15 << 10


def test_pss_is_read_every_pss_every_s_and_its_peak_only_from_those_samples(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [0.0]
    sampler = TreeSampler(100, proc=proc, pss_every_s=5.0, clock=lambda: now[0])
    serve = "python -m orrery.cli serve"
    mib = 1024
    _write_process(proc, 100, 1, serve, 10, 10, file_pss=5)  # t=0: read, PSS 15
    assert sampler.sample()["pss_kb"] == 15 * mib  # type: ignore[index]
    now[0] = 2.0
    _write_process(proc, 100, 1, serve, 50, 10, file_pss=5)  # t=2: not read (RSS 60)
    summed = sampler.sample()
    assert summed is not None and "pss_kb" not in summed
    assert "pss_kb" not in summed["roles"]["server"]
    now[0] = 5.0
    _write_process(proc, 100, 1, serve, 20, 10, file_pss=5)  # t=5: read, PSS 25
    sampler.sample()
    report = sampler.report()
    assert report["peak_sum_kb"] == 60 * mib
    assert report["peak_sum_pss_kb"] == 25 * mib
    assert report["peak_pss_at_s"] == 5.0


def test_a_gone_root_is_no_sample(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    sampler = TreeSampler(100, proc=proc)
    assert sampler.sample() is None
    assert sampler.report()["peak_sum_kb"] is None
    assert describe(sampler.report()) == "process tree not sampled"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_real_child_is_sampled_with_its_parent() -> None:
    """A child holding 64 MiB of heap shows in the sum, as anonymous memory."""
    script = (
        "import sys; block = bytearray(64 << 20); block[::4096] = b'x' * len(block[::4096]); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    with _ready_child(script):
        sampler = TreeSampler(os.getpid())
        with sampler:
            summed = sampler.sample()
        assert summed is not None
        report = sampler.report()
        others = report["at_peak"]["other"]
        assert others["processes"] >= 1
        assert others["RssAnon"] >= 64 << 10
        server = report["at_peak"]["server"]
        assert report["peak_sum_kb"] >= server["rss_kb"] + others["rss_kb"]
        assert all(part in server for part in PARTS)
