"""KoutenDB import / dump rates and backup / restore / compact times (issue 12).

Runs the same code the HTTP routes and the CLI run (`ingest.koutendb_io`,
`ingest.adapters.sqlite_maintenance`) in this process against a fresh embedded data
directory, with no projector running, so the figures are the canonical store's side
alone: an import of N JSON lines that carry their own 384-d vectors (the embedder is
not involved), a dump of them, a backup, its verification, a restore into a fresh data
directory and a compaction after re-importing every line once more (N superseded
revisions; the log position is set past them as after a projector caught up). The
garbage collector is tuned as the servers and the CLI tune it (`contracts.gc_tuning.tune_gc`).

    python -m bench.kouten_io                  # 100k lines (target: ≥ 5,000 lines/s)
    python -m bench.kouten_io --lines 10000    # smaller

Prints the figures and writes `docs/bench/kouten_io.json`. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, git_facts, machine_facts, utc_now, write_json
from contracts.gc_tuning import tune_gc
from ingest.adapters.sqlite_maintenance import (
    backup_database,
    compact_database,
    restore_database,
    verify_backup,
)
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.koutendb_io import ImportOptions, JsonlImporter, LineSplitter, dump_lines
from projector.adapters.sqlite_state import SqliteProjectorState
from query.settings import QuerySettings

OUT = REPO_ROOT / "docs" / "bench" / "kouten_io.json"
DIM = 384
NS = "bench"
WORDS = [
    "orbit",
    "ring",
    "galaxy",
    "halo",
    "comet",
    "nebula",
    "pulsar",
    "quasar",
    "meteor",
    "aurora",
    "zenith",
    "nadir",
]


def export_lines(count: int, seed: int = 7) -> bytes:
    """`count` NoSQL-export rows: a tenant (→ ring), a body object, a 384-d embedding."""
    rng = random.Random(seed)
    out = bytearray()
    for n in range(count):
        vector = [round(rng.uniform(-1, 1), 6) for _ in range(DIM)]
        row = {
            "_id": f"doc-{n:07d}",
            "tenant": f"t{n % 50}/topic{n % 1000}",
            "body": {"title": " ".join(rng.choices(WORDS, k=4)), "n": n},
            "embedding": vector,
        }
        out += json.dumps(row, separators=(",", ":")).encode() + b"\n"
    return bytes(out)


@contextmanager
def timed(figures: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    figures[name] = round(time.perf_counter() - start, 3)


def run_import(data: bytes, db: Path, *, chunk: int = 1 << 16) -> dict[str, Any]:
    store = SqliteRecordStore(db)
    options = ImportOptions(
        namespace=NS,
        snapshot_kind="objects",
        galaxy="g",
        ring_field="tenant",
        payload_field="body",
        vec_field="embedding",
        id_field="_id",
        batch_size=1_000,
        vector_dimension=DIM,
        max_record_bytes=QuerySettings().max_record_bytes,
    )
    importer = JsonlImporter(options, store)
    splitter = LineSplitter()
    try:
        for start in range(0, len(data), chunk):  # as the HTTP body arrives: 64 KB chunks
            for line in splitter.feed(data[start : start + chunk]):
                if importer.add(line):
                    importer.write_pending()
        for line in splitter.close():
            importer.add(line)
        importer.write_pending()
    finally:
        store.close()
    return importer.result().model_dump()


def run_dump(db: Path, out: Path) -> int:
    store = SqliteRecordStore(db)
    size = 0
    try:
        with out.open("wb") as handle:
            for chunk in dump_lines(store=store, namespace=NS, snapshot_kind="objects", galaxy="g"):
                size += len(chunk)
                handle.write(chunk)
    finally:
        store.close()
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    # The collector tuned as `orrery serve` and `orrery import-jsonl` run it: the figures
    # are the HTTP route's and the CLI's, not those of a default-tuned interpreter.
    tune_gc()
    load_before = os.getloadavg()
    seconds: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix="orrery-bench-kouten-io-"))
    try:
        data = export_lines(args.lines)
        first = root / "first"
        db = first / "orrery.sqlite"
        SqliteProjectorState(db).close()  # the registry shares the file, as when serving
        with timed(seconds, "import"):
            stats = run_import(data, db)
        dump_path = root / "dump.jsonl"
        with timed(seconds, "dump"):
            dump_bytes = run_dump(db, dump_path)
        with timed(seconds, "backup"):
            backup = backup_database(db, first / "backups", "b1")
        with timed(seconds, "verify"):
            verify_backup(backup.path)
        with timed(seconds, "restore"):
            restore_database(backup.path, root / "restored")
        # A second import of the same lines supersedes every record once.
        with timed(seconds, "reimport"):
            run_import(data, db)
        with sqlite3.connect(db) as conn:
            high = conn.execute("SELECT MAX(position) FROM outbox").fetchone()[0]
            conn.execute(
                "INSERT OR REPLACE INTO projector_positions VALUES ('projector', ?, 'now')",
                (high,),
            )
        with timed(seconds, "compact"):
            compacted = compact_database(db, log_is_outbox=True)
        report = {
            "benchmark": "kouten_io",
            "when": utc_now(),
            "lines": args.lines,
            "vector_dimension": DIM,
            "path": "in-process use cases (the HTTP route's and the CLI's code), no projector",
            "gc": "contracts.gc_tuning.tune_gc (as serve and import-jsonl run)",
            "input_bytes": len(data),
            "dump_bytes": dump_bytes,
            "import": {**stats, "errorLines": len(stats["errorLines"])},
            "seconds": seconds,
            "lines_per_second": {
                "import": round(args.lines / seconds["import"]),
                "dump": round(args.lines / seconds["dump"]),
            },
            "backup": {"items": backup.items, "bytes": backup.bytes},
            "compact": {
                "before_bytes": compacted.before_bytes,
                "after_bytes": compacted.after_bytes,
                "dropped_revisions": compacted.dropped_revisions,
                "items": compacted.items,
            },
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "machine": machine_facts(),
            "git": git_facts(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_json(args.out, report)
    print(f"kouten_io at {args.lines:,} lines with {DIM}-d vectors (load before {load_before})")
    for name, value in seconds.items():
        print(f"  {name:<9} {value:8.2f} s")
    rates = report["lines_per_second"]
    print(f"  import {rates['import']:,} lines/s, dump {rates['dump']:,} lines/s")
    print(
        f"  compact {compacted.before_bytes / 1e6:.0f} MB -> {compacted.after_bytes / 1e6:.0f} MB"
        f" ({compacted.dropped_revisions:,} revisions dropped)"
    )
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
