"""The bulk-load child: loads one `building` generation's snapshot, then exits.

    python -m projector.entrypoints.bulk_load --data-dir DIR --db DIR/orrery.sqlite \\
        --generation g7 --text-analyzer NAME \\
        --embedder-factory projector.bootstrap:default_embedder [--embedder-kwargs JSON] \\
        [--batch-size 1000] [--pause-seconds 0] [--nice 10]

Started by `projector.adapters.subprocess_bulk_load.SubprocessBulkLoader` for
`projector.generations.run_build` in the embedded deployment. It lowers its CPU
priority first (`--nice`), then creates the generation's tantivy index and qdrant-edge
shard, loads the canonical snapshot into them and the registry's document table
(`projector.generations.load_snapshot`), builds the shard's HNSW graph, and closes
both, so the parent may open them. It writes nothing else: the parent's projector
leaves the generation alone meanwhile (`DeferredWrites`).

Protocol: one JSON object per line on stdout — `{"progress": [phase, done, total]}`
while it works, and last `{"result": {manifest, counters, durations}}` (exit 0) or
`{"error": {code, message}}` (exit 1). It exits at once (status 3) when its stdin
closes: the parent is gone, and a build nobody waits for must not hold the directories.
Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contracts.errors import ErrorCode, OrreryError
from contracts.generations import GenerationState
from projector.bootstrap import bulk_load_ports
from projector.generations import BuildControl, GenerationOptions, load_snapshot

__all__ = ["main"]

log = logging.getLogger("orrery.bulk_load")
# Exit status when the parent went away (stdin closed).
ORPHANED_EXIT = 3


def _emit(body: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(body, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _exit_with_parent() -> None:
    """A daemon thread that ends the process when stdin closes (the parent is gone)."""

    def watch() -> None:
        # The raw descriptor: a buffered reader's lock would hold up interpreter shutdown.
        while os.read(0, 4096):
            pass
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--db", type=Path, required=True, help="the canonical SQLite file")
    parser.add_argument("--generation", required=True)
    parser.add_argument("--text-analyzer", required=True, help="of the lexical index")
    parser.add_argument("--embedder-factory", required=True, help="module:callable")
    parser.add_argument("--embedder-kwargs", default="{}", help="JSON object")
    parser.add_argument("--batch-size", type=int, default=1_000)
    parser.add_argument("--pause-seconds", type=float, default=0.0)
    parser.add_argument("--nice", type=int, default=10)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.nice > 0:
        os.nice(args.nice)  # before any engine starts a thread: they inherit it
    _exit_with_parent()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s bulk-load %(message)s"
    )
    options = GenerationOptions(batch_size=args.batch_size, pause_seconds=args.pause_seconds)
    ports, optimize, close = bulk_load_ports(
        args.data_dir,
        args.db,
        embedder_factory=args.embedder_factory,
        embedder_kwargs=json.loads(args.embedder_kwargs),
        options=options,
    )
    generation_id = args.generation
    try:
        _, descriptor = ports.registry.generation(generation_id)
        if descriptor.state is not GenerationState.BUILDING:
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"{generation_id} is {descriptor.state.value}, not building",
                {"generation_id": generation_id},
            )
        if ports.embedder.embedder_id != descriptor.embedder_id:
            raise OrreryError(
                ErrorCode.EMBEDDER_MISMATCH,
                f"{generation_id} is built with {descriptor.embedder_id}, this loader has "
                f"{ports.embedder.embedder_id}",
                {"generation_id": generation_id},
            )
        ports.lexical.create(generation_id, text_analyzer=args.text_analyzer)
        ports.vectors.create(generation_id, descriptor.embedder_dim)
        control = BuildControl(
            progress=lambda phase, done, total: _emit({"progress": [phase, done, total]})
        )
        loaded = load_snapshot(descriptor, ports=ports, control=control)
        _emit({"progress": ["optimize", 0, 1]})
        started = time.perf_counter()
        optimize(generation_id)
        loaded.durations["optimize"] = time.perf_counter() - started
        _emit({"progress": ["optimize", 1, 1]})
        close()
        _emit(
            {
                "result": {
                    "manifest": loaded.manifest.model_dump(mode="json"),
                    "counters": loaded.counters,
                    "durations": loaded.durations,
                }
            }
        )
        return 0
    except OrreryError as exc:
        log.error("bulk load of %s failed: %s", generation_id, exc.message)
        _emit({"error": {"code": exc.code.value, "message": exc.message}})
        close()
        return 1


if __name__ == "__main__":
    sys.exit(main())
