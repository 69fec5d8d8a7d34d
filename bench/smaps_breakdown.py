"""Where a process's resident memory is, by mapping: `/proc/<pid>/smaps` grouped.

    .venv/bin/python bench/smaps_breakdown.py <pid> [--top 25] [--per-point N] [--json]

Anonymous memory is split into `[heap]` (the main arena, brk), glibc's thread arenas
(64 MiB-aligned reservations of 64 MiB or less: malloc from other threads, Rust's
allocations included, qdrant-edge's search pool and tantivy's threads), other large
anonymous mappings (numpy arrays, mmap'd allocations: over 128 KiB glibc maps them
directly) and the rest; file pages are grouped by file, with qdrant-edge segment files
named by their component (`segments/<uuid>/<component>` → `segment/<component>`) and
summed over segments. With `--per-point N` each group also gets bytes a point. Each group
shows its `Pss` beside its `Rss`: a page mapped twice by the process (qdrant-edge maps a
segment's vector files twice) counts twice in `Rss` and once in `Pss` (`bench/memory.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

_SEGMENT = re.compile(r".*/segments/[0-9a-f-]{36}/(?P<component>[^/]+)(/.*)?$")
_ARENA = 64 << 20


def breakdown(pid: int, field: str = "Rss") -> dict[str, dict[str, int]]:
    """KiB per group of `field` (`Rss` or `Pss`): {"anon": {group: kib}, "file": {...}}."""
    groups: dict[str, dict[str, int]] = {"anon": defaultdict(int), "file": defaultdict(int)}
    kind, group = "anon", "other"
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                size = int(high, 16) - int(low, 16)
                name = fields[5].strip() if len(fields) == 6 else ""
                if name.startswith("/"):
                    kind = "file"
                    name = name.removesuffix(" (deleted)")
                    match = _SEGMENT.match(name)
                    group = (
                        f"segment/{match['component']}"
                        if match
                        else re.sub(r"/\d+(?=/|$)", "/<n>", name)
                    )
                else:
                    kind = "anon"
                    if name == "[heap]":
                        group = "heap (main arena)"
                    elif name.startswith("["):
                        group = name
                    elif int(low, 16) % _ARENA == 0 and size <= _ARENA:
                        group = "thread arenas (64 MiB-aligned)"
                    elif size >= 1 << 20:
                        group = "large anonymous mappings (>= 1 MiB)"
                    else:
                        group = "small anonymous mappings"
            elif head == f"{field}:":
                groups[kind][group] += int(line.split()[1])
    return {kind: dict(values) for kind, values in groups.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--per-point", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    groups = breakdown(args.pid)
    proportional = breakdown(args.pid, "Pss")
    if args.json:
        json.dump({"rss": groups, "pss": proportional}, sys.stdout, indent=2)
        print()
        return 0
    for kind, values in groups.items():
        total = sum(values.values())
        total_pss = sum(proportional[kind].values())
        per = f" ({total * 1024 / args.per_point:.0f} B/point)" if args.per_point else ""
        print(f"{kind}: {total / 1024:.1f} MiB{per} (PSS {total_pss / 1024:.1f} MiB)")
        for group, kib in sorted(values.items(), key=lambda kv: -kv[1])[: args.top]:
            per = f" {kib * 1024 / args.per_point:8.0f} B/point" if args.per_point else ""
            pss = proportional[kind].get(group, 0)
            print(f"  {kib / 1024:9.1f} MiB{per}  (PSS {pss / 1024:9.1f})  {group}")
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
