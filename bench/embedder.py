"""The default embedder's throughput on SciFact abstracts against onnxruntime's own.

    .venv/bin/python bench/embedder.py [../shared/data/scifact] [--docs 256] [--threads 2]
                                       [--out docs/bench/embedder.json]

Embeds the first `--docs` SciFact documents (title and abstract, as the projector
builds a record's embedding text) with `OnnxMiniLMEmbedder` (`--threads` intra-op
threads, the projector's session) and reports docs/s for:

- `embedder`: `embed(texts)` as the projector calls it (tokenize, batch by length, run,
  mean-pool, normalize, to tuples);
- `onnxruntime_floor`: the very same batches (same token ids, same padding, same session)
  through `session.run` alone: what the model itself costs, the floor;
- `tokenize`: the tokenizer alone.

Then the query side: one short query at a time through a 1-thread session (what the query
worker uses, `ORRERY_QUERY_EMBEDDER_THREADS`), p50/p95 ms. The machine's load average is
recorded: other processes share the CPUs. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/embedder.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, git_facts, latency_summary, machine_facts, utc_now, write_json
from contracts.embedding import embedding_text
from contracts.records import RecordText
from projector.adapters.onnx_embedder import OnnxMiniLMEmbedder

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "scifact"
QUERIES = 100


def load_texts(data: Path, count: int) -> list[str]:
    texts = []
    with (data / "corpus.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            doc = json.loads(line)
            texts.append(embedding_text(RecordText(title=doc["title"], body=doc["text"])))
            if len(texts) == count:
                break
    return texts


def floor_seconds(embedder: OnnxMiniLMEmbedder, texts: Sequence[str], batch_size: int) -> float:
    """`session.run` alone over the batches `embed` forms (same order, same padding)."""
    runtime = embedder._load()  # the same session `embed` uses
    encodings = runtime.tokenizer.encode_batch(list(texts))
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    feeds = []
    for start in range(0, len(order), batch_size):
        batch = [encodings[i] for i in order[start : start + batch_size]]
        width = max(len(e.ids) for e in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, encoding in enumerate(batch):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in runtime.input_names:
            feed["token_type_ids"] = np.zeros_like(ids)
        feeds.append(feed)
    started = time.perf_counter()
    for feed in feeds:
        runtime.session.run([runtime.output_name], feed)
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="best of this many rounds")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "embedder.json")
    args = parser.parse_args(argv)
    texts = load_texts(args.data, args.docs)
    embedder = OnnxMiniLMEmbedder(intra_op_num_threads=args.threads, batch_size=args.batch_size)
    embedder.embed(texts[:16])  # load and warm up
    load_before = os.getloadavg()[0]
    full, floor, tokenize = [], [], []
    for _ in range(args.rounds):  # interleaved, so a burst of load hits all alike
        started = time.perf_counter()
        embedder.embed(texts)
        full.append(time.perf_counter() - started)
        floor.append(floor_seconds(embedder, texts, args.batch_size))
        started = time.perf_counter()
        embedder._load().tokenizer.encode_batch(list(texts))
        tokenize.append(time.perf_counter() - started)
    query_embedder = OnnxMiniLMEmbedder(intra_op_num_threads=1)
    queries = [t.split(".")[0][:80] + f" {i}" for i, t in enumerate(texts[:QUERIES])]
    query_embedder.embed(queries[:2])
    query_s = []
    for query in queries:
        started = time.perf_counter()
        query_embedder.embed([query])
        query_s.append(time.perf_counter() - started)
    tokens = sum(len(e.ids) for e in embedder._load().tokenizer.encode_batch(list(texts)))
    figures: dict[str, Any] = {
        "docs": len(texts),
        "tokens_mean": round(tokens / len(texts), 1),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "docs_per_s": {
            "embedder": round(len(texts) / min(full), 1),
            "onnxruntime_floor": round(len(texts) / min(floor), 1),
            "tokenize": round(len(texts) / min(tokenize), 1),
        },
        "embedder_over_floor_time": round(min(full) / min(floor), 3),
        "query_1_thread_ms": latency_summary(query_s),
        "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
    }
    report = {
        "benchmark": "embedder",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {"data": str(args.data), "rounds": args.rounds},
        "figures": figures,
    }
    write_json(args.out, report)
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
