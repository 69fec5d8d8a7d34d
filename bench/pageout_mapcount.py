"""Does `process_madvise(MADV_PAGEOUT)` reclaim a file's pages mapped twice in one process?

    .venv/bin/python bench/pageout_mapcount.py [--dir DIR] [--mib 64]

qdrant-edge maps each vector chunk of an appendable segment twice (read-write, and
read-only for sequential reads); the optimizer's `_ChildPager` pages its child's input
out from the serving process. A child here maps a synced file of random bytes shared
read-write, touches every page, and (by case) maps it a second time read-only and
touches it there too; this process then advises each mapping `MADV_PAGEOUT` through a
pidfd, as `_ChildPager` does, and reports each mapping's resident MiB before and after.
Each case runs with the file's pages cached by the write and dropped first
(`POSIX_FADV_DONTNEED`: the child's faults read them in).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MADV_PAGEOUT = 21
_SYS_PROCESS_MADVISE = 440

_CHILD = """
import mmap, os, sys
path, case = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
size = os.fstat(fd).st_size
rw = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
ro = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) if case != "once" else None
total = 0
for offset in range(0, size, 4096):
    total += rw[offset]
if case == "twice":
    for offset in range(0, size, 4096):
        total += ro[offset]
print("ready", flush=True)
sys.stdin.readline()
"""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _mappings(pid: int, path: str) -> list[tuple[str, int]]:
    """(permissions, resident MiB) of each of `pid`'s mappings of `path`."""
    found: list[tuple[str, int]] = []
    permissions = None
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                permissions = fields[1] if line.rstrip("\n").endswith(path) else None
            elif fields[0] == "Rss:" and permissions is not None:
                found.append((permissions, int(fields[1]) // 1024))
    return found


def _page_out(pid: int, path: str) -> None:
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
            for line in maps:
                if line.rstrip("\n").endswith(path):
                    low, high = (int(x, 16) for x in line.split()[0].split("-"))
                    iov = _IoVec(low, high - low)
                    done = syscall(
                        ctypes.c_long(_SYS_PROCESS_MADVISE),
                        ctypes.c_int(pidfd),
                        ctypes.byref(iov),
                        ctypes.c_size_t(1),
                        ctypes.c_int(_MADV_PAGEOUT),
                        ctypes.c_uint(0),
                    )
                    if done < 0:
                        raise OSError(ctypes.get_errno(), "process_madvise")
    finally:
        os.close(pidfd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        path = os.path.realpath(os.path.join(scratch, "pages.bin"))
        with open(path, "wb") as file:
            file.write(os.urandom(args.mib << 20))
            file.flush()
            os.fsync(file.fileno())  # clean pages: the kernel reclaims no dirty page
        rows = []
        for cache in ("cached", "dropped"):
            for case in ("once", "twice_one_touched", "twice"):
                if cache == "dropped":
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
                with subprocess.Popen(
                    [sys.executable, "-c", _CHILD, path, case],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                ) as child:
                    assert child.stdin is not None and child.stdout is not None
                    child.stdout.readline()
                    before = _mappings(child.pid, path)
                    _page_out(child.pid, path)
                    time.sleep(0.3)
                    after = _mappings(child.pid, path)
                    child.communicate("\n")
                rows.append(
                    {"cache": cache, "case": case, "rss_mib_before": before, "after": after}
                )
    print(json.dumps({"kernel": os.uname().release, "file_mib": args.mib, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
