"""The embedded projector's qdrant-edge write per record, in process, two trees interleaved:
`QdrantEdgeVectorIndex.apply` (the payload, the binding's `Point`s, `EdgeShard.update`:
the largest GIL-held share of the embedded server's ingest) for `bench/topk.py`'s records,
their vectors as the write workers hand them over (`PackedVector`).

    python bench/edge_apply_ab.py --baseline /path/to/other/tree [--records 8000]
        [--batch 2000] [--rounds 6] [--out docs/bench/edge_apply_ab.json]

Each round runs one child process per tree (alternating which goes first) with the
tree as working directory and first on `PYTHONPATH`: it creates a fresh generation
(384-d) and applies the records in batches of `--batch`, as the projector does, without
the in-memory flat copy (a generation past ~6.5k points has none) and without
optimizing. Reported: CPU µs a record (`time.process_time` of the child's `apply` calls,
the median over rounds, and each round's pair), robust to a busy machine unlike wall
time. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, git_facts, machine_facts, utc_now, write_json

_CHILD = r"""
import json, sys, tempfile, time
from pydantic import TypeAdapter
from bench.topk import stage_bench_batch
from contracts.index import to_index_document
from contracts.records import Record
from contracts.stored_vectors import float32_wire, packed_vector
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex

records_n, batch = int(sys.argv[1]), int(sys.argv[2])
_, body = stage_bench_batch("edge apply", ["--records", str(records_n)])
raw = json.loads(body)
records = TypeAdapter(list[Record]).validate_python(raw)
documents = []
for source, record in zip(raw, records):
    text = json.dumps(source["vector"], separators=(",", ":")).encode()
    vector = packed_vector(float32_wire(record.vector), text)
    documents.append(to_index_document(record, vector))
with tempfile.TemporaryDirectory(prefix="orrery-edge-apply-") as root:
    index = QdrantEdgeVectorIndex(root, flat_scan=False, flat_max_bytes=0)
    index.create("g", 384)
    spent = 0.0
    for start in range(0, len(documents), batch):
        chunk = documents[start : start + batch]
        began = time.process_time()
        index.apply("g", chunk, [])
        spent += time.process_time() - began
    index.close()
print(json.dumps({"us_per_record": spent / len(documents) * 1e6}))
"""


def _run(tree: Path, records: int, batch: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(records), str(batch)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_record"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--records", type=int, default=8_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs/bench/edge_apply_ab.json")
    args = parser.parse_args()
    trees = {"this": REPO_ROOT, "baseline": args.baseline.resolve()}
    started = utc_now()
    pairs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        order = ["this", "baseline"] if round_ % 2 == 0 else ["baseline", "this"]
        load = os.getloadavg()[0]
        pair = {side: round(_run(trees[side], args.records, args.batch), 1) for side in order}
        pair["load"] = round(load, 2)
        pairs.append(pair)
        print(f"round {round_ + 1}: {pair}", file=sys.stderr)
    summary = {side: statistics.median(p[side] for p in pairs) for side in ("this", "baseline")}
    summary["ratio"] = round(summary["this"] / summary["baseline"], 3)
    report = {
        "benchmark": "edge_apply_ab",
        "date": started,
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "records": args.records,
            "batch": args.batch,
            "rounds": args.rounds,
            "trees": {k: str(v) for k, v in trees.items()},
        },
        "pairs": pairs,
        "median_us_per_record": summary,
    }
    write_json(args.out, report)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
