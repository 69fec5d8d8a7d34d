"""The synthetic corpus's topics: vectors clustered around embedded centres, text that
shares its cluster's words (the generator behind `bench/topk.py`'s `corpus_batches`).

    .venv/bin/python bench/synthetic.py [--size 20000] [--queries 100] [--vectors clustered]

Real embeddings are not i.i.d. on the sphere: documents bunch around topics, and the
query embedder puts a query near the documents that share its words. I.i.d. unit
vectors are HNSW's worst case (every neighbour nearly as far as every other: Qdrant's
dense recall@10 on them was 0.13 at 100k, `docs/bench/versus_qdrant_synthetic-100k-
session11.json`), and a query embedded from text is unrelated to all of them, so
lexical and vector search never agree. Here:

- `Topics.build(seed, vocab)`: `TOPICS` topics, each `TOPIC_WORDS` words drawn from the
  vocabulary outside its `COMMON_WORDS` most frequent ones (so they are discriminative
  for BM25); a topic's centre is the default query embedder's vector of its words
  (`projector.bootstrap.default_embedder`, all-MiniLM-L6-v2 int8), so a query embedded
  from words of a topic lands near its documents. Centres are embedded once and cached
  under `~/.cache/orrery-bench/` (keyed by embedder id, seed and vocabulary), rounded
  to 6 decimals.
- `Topics.document(rng, np_rng)`: a record's topic (uniform), its words (each title
  word from the topic with probability `TITLE_TOPIC_SHARE`, each body word with
  `BODY_TOPIC_SHARE`, else the Zipf vocabulary) and its vector: the centre plus
  Gaussian noise of norm ~`NOISE`, normalized.
- `--vectors uniform`: the i.i.d. unit vectors every synthetic run used before (kept
  so the committed results made with them can be reproduced: `docs/bench/topk*.json`,
  `versus_qdrant_synthetic-100k-session11.json`, `hotpath_ab-*`, `scaleout-*`,
  `ingest_*`, `generations*`, `servers*`, `chonkydb*`, `shards.json` before session 12).

Run as a script it measures what the corpus is for: qdrant-edge's HNSW (Orrery's
collection config, m 16, ef_construct 100, searched at `hnsw_ef` 128 as the query side
does) against exact search, recall@10 and recall@100 (the default candidate cap), for
queries the way qualification makes them (document titles) and the way the benches
make them (`make_queries`). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/synthetic.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from bench.topk import Vocabulary

DIMENSION = 384
TOPICS = 1_000
TOPIC_WORDS = 12
COMMON_WORDS = 200
TITLE_TOPIC_SHARE = 0.5
BODY_TOPIC_SHARE = 0.3
NOISE = 0.7
VECTOR_KINDS = ("clustered", "uniform")
CACHE_DIR = Path.home() / ".cache" / "orrery-bench"


@dataclass(frozen=True)
class Topics:
    words: tuple[tuple[str, ...], ...]
    centres: np.ndarray[Any, Any]

    @classmethod
    def build(cls, seed: int, vocab: Vocabulary, count: int = TOPICS) -> Topics:
        rng = random.Random(f"topics-{seed}")
        pool = vocab.words[COMMON_WORDS:]
        words = tuple(tuple(rng.sample(pool, TOPIC_WORDS)) for _ in range(TOPICS))
        centres = _centres([" ".join(w) for w in words])
        return cls(words[:count], centres[:count])

    def document(
        self, rng: random.Random, np_rng: np.random.Generator, vocab: Vocabulary
    ) -> tuple[str, str, np.ndarray[Any, Any]]:
        """A record's title, body and unit vector."""
        topic = rng.randrange(len(self.words))
        own = self.words[topic]

        def text(count: int, share: float) -> str:
            background = vocab.sample(rng, count)
            return " ".join(
                rng.choice(own) if rng.random() < share else background[i] for i in range(count)
            )

        title = text(rng.randint(3, 7), TITLE_TOPIC_SHARE)
        body = text(rng.randint(30, 60), BODY_TOPIC_SHARE)
        raw = self.centres[topic] + NOISE / np.sqrt(DIMENSION) * np_rng.standard_normal(DIMENSION)
        vector: np.ndarray[Any, Any] = raw / np.linalg.norm(raw)
        return title, body, vector


def _centres(texts: Sequence[str]) -> np.ndarray[Any, Any]:
    """The default embedder's vectors of `texts`, cached on disk."""
    from projector.bootstrap import default_embedder

    embedder = default_embedder(threads=2)
    key = hashlib.sha256(json.dumps([embedder.embedder_id, *texts]).encode()).hexdigest()
    path = CACHE_DIR / f"synthetic-topics-{key[:24]}.npy"
    if path.exists():
        stored: np.ndarray[Any, Any] = np.load(path)
        return stored
    array = np.round(np.asarray(embedder.embed(list(texts)), dtype=np.float64), 6)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npy")
    np.save(partial, array)
    partial.replace(path)
    return array


# -- the recall check ----------------------------------------------------------------------


def _recall(size: int, queries: int, seed: int, kind: str) -> dict[str, Any]:
    import tempfile

    from qdrant_edge import EdgeShard, Point, SearchParams, UpdateOperation

    from bench.topk import Vocabulary, corpus_batches, make_queries
    from projector.adapters.qdrant_edge_vectors import VECTOR_NAME, QdrantEdgeTuning
    from projector.bootstrap import default_embedder

    vocab = Vocabulary.build(random.Random(seed))
    titles: list[str] = []
    with tempfile.TemporaryDirectory(prefix="orrery-synthetic-") as tmp:
        # A generation's own engine config (Qdrant's defaults: m 16, ef_construct 100).
        config = QdrantEdgeTuning().edge_config(DIMENSION)
        shard = EdgeShard.create(tmp, config)
        started = time.perf_counter()
        for body in corpus_batches(size, 2_000, seed, vocab, vectors=kind):
            records = json.loads(body)
            points = [
                Point(id=len(titles) + i, vector={VECTOR_NAME: r["vector"]}, payload={})
                for i, r in enumerate(records)
            ]
            titles.extend(r["text"]["title"] for r in records)
            shard.update(UpdateOperation.upsert_points(points))
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        shard.optimize()
        optimize_s = time.perf_counter() - started
        rng = random.Random(seed + 3)
        samples = {
            "titles": [titles[rng.randrange(size)] for _ in range(queries)],
            "make_queries": [q.text for q in make_queries(random.Random(seed + 1), vocab, queries)],
        }
        embedder = default_embedder(threads=2)
        out: dict[str, Any] = {
            "size": size,
            "vectors": kind,
            "load_s": round(load_s, 1),
            "optimize_s": round(optimize_s, 1),
        }
        for name, texts in samples.items():
            # (limit, hnsw_ef): the query side's ef is max(128, limit + 1).
            recalls: dict[tuple[int, int], list[float]] = {
                (10, 128): [], (100, 128): [], (100, 256): [], (100, 512): []
            }  # fmt: skip
            for vector in embedder.embed(texts):
                exact_ids: dict[int, set[Any]] = {}
                for (limit, ef), got in recalls.items():
                    if limit not in exact_ids:
                        exact_ids[limit] = _ids(shard, vector, limit, SearchParams(exact=True))
                    found = _ids(shard, vector, limit, SearchParams(hnsw_ef=ef))
                    got.append(len(exact_ids[limit] & found) / limit)
            out[name] = {
                f"recall_at_{limit}_ef{ef}": {
                    "mean": round(float(np.mean(v)), 4),
                    "min": round(float(np.min(v)), 4),
                }
                for (limit, ef), v in recalls.items()
            }
        shard.close()
    return out


def _ids(shard: Any, vector: Sequence[float], limit: int, params: Any) -> set[Any]:
    from qdrant_edge import Query, QueryRequest

    from projector.adapters.qdrant_edge_vectors import VECTOR_NAME

    request = QueryRequest(
        query=Query.Nearest(list(vector), using=VECTOR_NAME), limit=limit, params=params
    )
    return {point.id for point in shard.query(request)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--vectors", choices=VECTOR_KINDS, default="clustered")
    args = parser.parse_args(argv)
    print(json.dumps(_recall(args.size, args.queries, args.seed, args.vectors)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
