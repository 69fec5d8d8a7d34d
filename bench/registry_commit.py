"""The embedded projector's registry commit, CPU a record as a generation grows.

    python bench/registry_commit.py [--size 1000000] [--batch 2000] [--out F.json]

`SqliteProjectorState.commit` of `--batch` new documents (random UUID ids, as an ingest
of new records writes them) into one live generation, in a temporary database, until it
holds `--size`; the process's CPU a record, per tenth of `--size`. Run it in each tree
of an A/B. Session 31: the commit recounted the generation's live documents every time
(`COUNT(*)`), so its cost grew linearly with the generation (docs/bench/README.md).
Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/registry_commit.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import git_facts, machine_facts, print_report
from projector.adapters.sqlite_state import SqliteProjectorState


def run(size: int, batch: int) -> dict[str, Any]:
    tenth = max(batch, size // 10)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        state = SqliteProjectorState(Path(scratch) / "state.sqlite")
        try:
            generation_id = state.create_generation(
                "ns",
                "objects",
                embedder_id="e@1",
                embedder_dim=4,
                lexical_engine="tantivy",
                vector_engine="qdrant-edge",
                schema_digest="s",
                make_live=True,
            ).generation_id
            rng = random.Random(20_260_101)
            cpu, counted, held = 0.0, 0, 0
            for position, _ in enumerate(range(0, size, batch), start=1):
                docs = {str(uuid.UUID(int=rng.getrandbits(128))): (1, False) for _ in range(batch)}
                started = time.process_time()
                state.commit("projector", position, {generation_id: docs})
                cpu += time.process_time() - started
                counted += batch
                held += batch
                if counted >= tenth or held >= size:
                    rows.append(
                        {"documents_held": held, "cpu_us_per_record": round(cpu / counted * 1e6, 1)}
                    )
                    print(
                        f"{held:>9,}: {rows[-1]['cpu_us_per_record']} us a record", file=sys.stderr
                    )
                    cpu, counted = 0.0, 0
            count = state.generation(generation_id)[0].document_count
        finally:
            state.close()
    return {"size": size, "batch": batch, "document_count": count, "tenths": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    report = {
        "benchmark": "registry_commit",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_facts(),
        "machine": machine_facts(),
        **run(args.size, args.batch),
    }
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
