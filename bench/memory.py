"""Resident memory of a process tree, sampled together: a server and its children.

`orrery serve` is not the only process of an embedded deployment: the qdrant-edge
optimizer builds each HNSW copy in a child process (`python -c`, holding the copy's
vectors and graph), and `ORRERY_INGEST_WORKERS` starts write workers. A peak read from
each process's own high-water mark (`VmHWM`) cannot be added up (the peaks need not
coincide), so `TreeSampler` reads the whole tree at the same instants and keeps the
peak of the *sum*, with what each part held at that instant.

Each process's resident set is read from `/proc/<pid>/status` as the kernel splits it:
`RssAnon` (heap, Python objects, engine structures: what only swap could take back),
`RssFile` (mapped file pages: qdrant-edge's and tantivy's mmaps, shared libraries: the
kernel may drop clean ones under pressure) and `RssShmem`. Linux only; elsewhere a
sampler records nothing.

`VmRSS` counts a page once per mapping: a file mapped twice by one process (qdrant-edge
maps a segment's vector files twice, a random-access and a sequential view) counts twice,
though it is one page of memory. So each process's proportional set size is read too
(`Pss` of `/proc/<pid>/smaps_rollup`: a page mapped n times counts 1/n each time, in this
process or across processes) and the tree's PSS is summed and its peak kept beside the
RSS one (`peak_sum_pss_kb`): the memory the tree holds, each page once (a page shared
with a process outside the tree, e.g. a shared library, counts only its share).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PARTS",
    "PSS_PARTS",
    "ProcessMemory",
    "TreeSampler",
    "descendants",
    "describe",
    "process_memory",
    "role_of",
]

# The parts of a process's resident set, as `/proc/<pid>/status` names them (KiB).
PARTS = ("RssAnon", "RssFile", "RssShmem")
_KEYS = frozenset((*PARTS, "VmRSS", "VmHWM"))
# The parts of a process's proportional set size, as `/proc/<pid>/smaps_rollup` names them.
PSS_PARTS = ("Pss_Anon", "Pss_File", "Pss_Shmem")
_PSS_KEYS = frozenset(("Pss", *PSS_PARTS))
# The optimizer child's command line (`projector.adapters.qdrant_edge_vectors`).
_OPTIMIZER_MARK = "shard.optimize()"
_WRITE_WORKER_MARK = "ingest.entrypoints.write_worker"


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """One process at one instant: its role, resident KiB by part, and its own peak."""

    pid: int
    role: str
    rss_kb: int
    parts_kb: Mapping[str, int]
    hwm_kb: int
    # `Pss` and its parts (`PSS_PARTS`), or None where the kernel has no smaps_rollup.
    pss_kb: int | None = None
    pss_parts_kb: Mapping[str, int] = field(default_factory=dict)


def role_of(pid: int, root: int, command: str) -> str:
    """`server` for the root, `optimizer` for a qdrant-edge optimizer child,
    `write_worker` for an ingest write worker, else `other`."""
    if pid == root:
        return "server"
    if _OPTIMIZER_MARK in command:
        return "optimizer"
    if _WRITE_WORKER_MARK in command:
        return "write_worker"
    return "other"


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """`root` and every process below it, given each live process's parent (pid ->
    parent pid), parents before children."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        if pid != parent:
            children.setdefault(parent, []).append(pid)
    out = [root]
    for pid in out:  # grows while walked: breadth first
        out.extend(sorted(children.get(pid, ())))
    return out


def _parents(proc: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # `comm` may hold spaces and parentheses: the fields follow the last ')'.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                out[int(entry.name)] = int(fields[1])
    return out


def process_memory(
    pid: int, root: int, proc: Path = Path("/proc"), *, with_pss: bool = True
) -> ProcessMemory | None:
    """`pid`'s resident memory now, or None if it is gone (or has no such fields); its
    PSS only `with_pss` (the kernel walks every mapping's pages for it: ~20-40 ms at 1
    GiB resident on a loaded machine, against ~0.1 ms for `status`)."""
    values: dict[str, int] = {}
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in _KEYS:
                values[key] = int(value.split()[0])
        command = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError, ValueError):
        return None
    if "VmRSS" not in values:
        return None  # a zombie or a kernel thread
    pss = _pss(proc / str(pid) / "smaps_rollup") if with_pss else None
    return ProcessMemory(
        pid=pid,
        role=role_of(pid, root, command),
        rss_kb=values["VmRSS"],
        parts_kb={part: values.get(part, 0) for part in PARTS},
        hwm_kb=values.get("VmHWM", values["VmRSS"]),
        pss_kb=None if pss is None else pss["Pss"],
        pss_parts_kb={} if pss is None else {part: pss.get(part, 0) for part in PSS_PARTS},
    )


def _pss(rollup: Path) -> dict[str, int] | None:
    """`Pss` and its parts (KiB) from a `smaps_rollup`, or None (no such file, or gone)."""
    values: dict[str, int] = {}
    try:
        for line in rollup.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in _PSS_KEYS:
                values[key] = int(value.split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return values if "Pss" in values else None


def _summed(processes: Iterable[ProcessMemory], *, with_pss: bool = True) -> dict[str, Any]:
    """Resident KiB of processes together, by role and part."""
    total = 0
    # PSS of processes without a smaps_rollup counts as their RSS (an upper bound).
    total_pss = 0
    roles: dict[str, dict[str, int]] = {}
    for process in processes:
        pss = process.rss_kb if process.pss_kb is None else process.pss_kb
        total += process.rss_kb
        total_pss += pss
        role = roles.setdefault(
            process.role,
            {
                "rss_kb": 0,
                "processes": 0,
                **dict.fromkeys(PARTS, 0),
                "pss_kb": 0,
                **dict.fromkeys(PSS_PARTS, 0),
            },
        )
        role["rss_kb"] += process.rss_kb
        role["processes"] += 1
        for part in PARTS:
            role[part] += process.parts_kb.get(part, 0)
        role["pss_kb"] += pss
        for part in PSS_PARTS:
            role[part] += process.pss_parts_kb.get(part, 0)
    if not with_pss:  # PSS not read this time: no PSS figures
        for role in roles.values():
            for key in ("pss_kb", *PSS_PARTS):
                del role[key]
        return {"rss_kb": total, "roles": roles}
    return {"rss_kb": total, "pss_kb": total_pss, "roles": roles}


@dataclass
class _Peaks:
    samples: int = 0
    peak: dict[str, Any] | None = None
    peak_at_s: float | None = None
    peak_pss: dict[str, Any] | None = None
    peak_pss_at_s: float | None = None
    role_peaks_kb: dict[str, int] = field(default_factory=dict)
    own_hwm_kb: dict[str, int] = field(default_factory=dict)
    series: list[list[Any]] = field(default_factory=list)


class TreeSampler:
    """Samples a process and its descendants every `interval_s` on a thread of its own.

    Guarantees: every sample reads all processes of the tree one after the other at
    once (a few ms apart, never seconds), and `report()` gives the peak of their summed
    `VmRSS` with each role's parts at that same sample, each role's own peak of its
    summed RSS over the samples (which need not coincide: not to be added up), and
    each role's largest `VmHWM` seen (the kernel's peak, between samples included);
    likewise the peak of the summed PSS with each role's parts at its sample, PSS read
    every `pss_every_s` only (a sample at least that long after the last one that read
    it), as it costs the kernel a walk of every resident page. A series
    of `[seconds, total, server, optimizer, other]` MiB is kept every
    `series_every_s`. Start/stop via `with`; `stop` is idempotent.
    """

    def __init__(
        self,
        root: int,
        *,
        interval_s: float = 1.0,
        series_every_s: float = 10.0,
        pss_every_s: float = 5.0,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
        self._interval_s = interval_s
        self._series_every_s = series_every_s
        self._pss_every_s = pss_every_s
        self._next_pss = 0.0
        self._proc = proc
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started_at = clock()
        self._next_series = 0.0
        self._peaks = _Peaks()

    def __enter__(self) -> TreeSampler:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is None and self._proc.is_dir():
            self._started_at = self._clock()
            self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.sample()
            self._stop.wait(max(0.0, self._interval_s - (self._clock() - started)))

    def sample(self) -> dict[str, Any] | None:
        """Read the tree once now; None if the root is gone."""
        try:
            parents = _parents(self._proc)
        except OSError:
            return None
        if self._root not in parents:
            return None
        # PSS costs the kernel a walk of every page (see `process_memory`): read it every
        # `pss_every_s`, not at every sample.
        with self._lock:
            now = self._clock() - self._started_at
            with_pss = now >= self._next_pss
            if with_pss:
                self._next_pss = now + self._pss_every_s
        processes = [
            memory
            for pid in descendants(self._root, parents)
            if (memory := process_memory(pid, self._root, self._proc, with_pss=with_pss))
            is not None
        ]
        if not processes:
            return None
        summed = _summed(processes, with_pss=with_pss)
        at = self._clock() - self._started_at
        with self._lock:
            peaks = self._peaks
            peaks.samples += 1
            if peaks.peak is None or summed["rss_kb"] > peaks.peak["rss_kb"]:
                peaks.peak, peaks.peak_at_s = summed, at
            if with_pss and (peaks.peak_pss is None or summed["pss_kb"] > peaks.peak_pss["pss_kb"]):
                peaks.peak_pss, peaks.peak_pss_at_s = summed, at
            for role, parts in summed["roles"].items():
                peaks.role_peaks_kb[role] = max(peaks.role_peaks_kb.get(role, 0), parts["rss_kb"])
            for process in processes:
                peaks.own_hwm_kb[process.role] = max(
                    peaks.own_hwm_kb.get(process.role, 0), process.hwm_kb
                )
            if at >= self._next_series:
                self._next_series = at + self._series_every_s
                roles = summed["roles"]
                peaks.series.append(
                    [
                        round(at, 1),
                        *(
                            round(kb / 1024, 1)
                            for kb in (
                                summed["rss_kb"],
                                roles.get("server", {}).get("rss_kb", 0),
                                roles.get("optimizer", {}).get("rss_kb", 0),
                                summed["rss_kb"]
                                - roles.get("server", {}).get("rss_kb", 0)
                                - roles.get("optimizer", {}).get("rss_kb", 0),
                            )
                        ),
                    ]
                )
        return summed

    def report(self) -> dict[str, Any]:
        """The figures so far (see the class docstring), KiB unless named MiB."""
        with self._lock:
            peaks = self._peaks
            return {
                "method": (
                    f"VmRSS of the server and all its descendants read from /proc at the same "
                    f"instants every {self._interval_s:g} s and summed; parts from "
                    f"/proc/<pid>/status ({', '.join(PARTS)}); PSS (each page once) from "
                    f"/proc/<pid>/smaps_rollup ({', '.join(PSS_PARTS)}), its peak kept apart"
                ),
                "samples": peaks.samples,
                "peak_sum_kb": None if peaks.peak is None else peaks.peak["rss_kb"],
                "peak_at_s": None if peaks.peak_at_s is None else round(peaks.peak_at_s, 1),
                "at_peak": None if peaks.peak is None else peaks.peak["roles"],
                # The tree's memory with each page once (see the module), its own peak.
                "peak_sum_pss_kb": None if peaks.peak_pss is None else peaks.peak_pss["pss_kb"],
                "peak_pss_at_s": (
                    None if peaks.peak_pss_at_s is None else round(peaks.peak_pss_at_s, 1)
                ),
                "at_pss_peak": None if peaks.peak_pss is None else peaks.peak_pss["roles"],
                "role_peaks_kb": dict(peaks.role_peaks_kb),
                "role_vmhwm_kb": dict(peaks.own_hwm_kb),
                "series_mib": {
                    "columns": ["s", "total", "server", "optimizer", "other"],
                    "every_s": self._series_every_s,
                    "rows": [list(row) for row in peaks.series],
                },
            }


def describe(report: Mapping[str, Any]) -> str:
    """One line: the peak of the sum and its parts (MiB)."""
    if not report.get("peak_sum_kb"):
        return "process tree not sampled"
    parts = []
    for role, held in sorted(report["at_peak"].items()):
        split = "/".join(f"{held[part] / 1024:,.0f}" for part in PARTS)
        parts.append(f"{role} {held['rss_kb'] / 1024:,.0f} (anon/file/shmem {split})")
    line = (
        f"peak RSS of the process tree {report['peak_sum_kb'] / 1024:,.0f} MiB "
        f"(sampled together, {report['samples']} samples): " + ", ".join(parts)
    )
    if report.get("peak_sum_pss_kb"):
        held = report["at_pss_peak"]
        split = ", ".join(f"{role} {held[role]['pss_kb'] / 1024:,.0f}" for role in sorted(held))
        line += f"; peak PSS {report['peak_sum_pss_kb'] / 1024:,.0f} MiB (each page once: {split})"
    return line
