"""Interleaved A/B of the one-shot query path: two source trees, one data dir, one clock.

    .venv/bin/python bench/hotpath_ab.py --a /work/main --b . [--size 20000]
        [--corpus topk|scifact|synthetic] [--queries 200] [--rounds 3] [--data-dir DIR]
        [--compact-b] [--flat] [--data-dir-b DIR] [--out FILE.json]

1. Builds (or reuses, `--data-dir`) an embedded data dir of `--size` records of
   `bench/topk.py`'s corpus with the B tree's code (so its indexes have B's schema),
   then builds the HNSW index in place. `--corpus scifact`: SciFact (5,183 documents,
   `--size` ignored) with `bench/versus_qdrant.py`'s cached vectors, in a namespace of
   language english, queried with its 300 test queries under the server's default
   profile, as `versus_qdrant.py` sends them (each worker embeds the query texts once
   before the warm-up). `--corpus synthetic`: the data dir a `bench/versus_qdrant_
   synthetic.py --data-root R` run kept (`--data-dir R/data`, required: never
   built here), queried with that bench's query texts, body and namespace language.
2. Starts one worker process per tree (`PYTHONPATH=<tree>`), each on its own copy of
   that data dir (B of `--data-dir-b` if given: the same data built another way, say
   `bench/edge_rekey.py`'s integer and UUID point ids), with the query clock fixed
   (freshness is the same for both) and the response cache off; each warms up on 50
   queries. `--compact-b`: B's worker first compacts each generation's tantivy index
   to one segment (`compact_lexical`).
   `--flat`: each worker whose tree has `build_lexical_flat` (session 17) first builds
   each generation's in-memory lexical copy with it, as its background compactor would,
   and, where its tree has `build_points` (session 18), each generation's point table,
   as its first search would.
3. Sends the same `topk_records` requests (bench/topk.py's queries, every second one
   filtered) to A and B in turn, alternating who goes first, `--rounds` times over
   `--queries` queries, through each worker's FastAPI app in process (no sockets).
4. Reports whether every answer was identical (ids, scores, score breakdowns,
   `payload_sha256`), the p50/p95 of the client-side time and of the server's
   `latency_ms.total`, their B/A ratios, each side's `engine_ms` p50s and its
   server-total / raw-engine ratio, and the machine's load before and after.

Figures are reported, never asserted; under load, read the ratios, not the times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

if __package__ in (None, ""):  # run as `python bench/hotpath_ab.py`
    # Appended, not prepended: a worker imports its tree's code (PYTHONPATH) first.
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import print_report
from bench.topk import QuerySpec, Vocabulary, corpus_batches, make_queries, topk_body

FIXED_NOW = datetime(2026, 1, 15, tzinfo=UTC)
SEED = 20_260_101
WARMUP = 50


def _queries(count: int) -> list[QuerySpec]:
    """bench/topk.py's timed queries (after its warm-up queries), same seed."""
    vocab = Vocabulary.build(random.Random(SEED))
    rng = random.Random(SEED + 1)
    make_queries(rng, vocab, 20)
    return make_queries(rng, vocab, count)


def _scifact_env() -> None:
    """The namespace language `bench/versus_qdrant.py` gives SciFact (read by both the
    builder's and the workers' settings)."""
    from bench.quality import NAMESPACE

    os.environ["ORRERY_NAMESPACE_LANGUAGES"] = json.dumps({NAMESPACE: "english"})


def _synthetic_env() -> None:
    """The namespace language `bench/versus_qdrant_synthetic.py` gives its corpus."""
    from bench.topk import NAMESPACE
    from bench.versus_qdrant import LANGUAGE

    os.environ["ORRERY_NAMESPACE_LANGUAGES"] = json.dumps({NAMESPACE: LANGUAGE})


def _synthetic_bodies(count: int) -> list[dict[str, Any]]:
    """`bench/versus_qdrant_synthetic.py`'s `topk_records` bodies, same queries."""
    from bench.versus_qdrant_synthetic import queries, topk_content

    loaded: list[dict[str, Any]] = [json.loads(topk_content(q.text)) for q in queries(count)]
    return loaded


def _scifact_queries() -> list[str]:
    from bench.quality import load_dataset
    from bench.versus_qdrant import DEFAULT_DATASET

    dataset = load_dataset(DEFAULT_DATASET)
    return [dataset.queries[q] for q in sorted(dataset.qrels)]


def _scifact_batches() -> list[bytes]:
    """SciFact's `POST /v1/records` bodies with `versus_qdrant.py`'s cached vectors."""
    from bench.quality import beir_record, load_dataset
    from bench.versus_qdrant import BATCH, DEFAULT_DATASET, cached_vectors

    dataset = load_dataset(DEFAULT_DATASET)
    dense = cached_vectors(dataset, DEFAULT_DATASET, sorted(dataset.qrels)).documents
    bodies = []
    for start in range(0, len(dataset.corpus), BATCH):
        records = [
            {**beir_record(row), "vector": dense[start + i].tolist()}
            for i, row in enumerate(dataset.corpus[start : start + BATCH])
        ]
        bodies.append(json.dumps(records).encode())
    return bodies


def _stack(data_dir: Path, *, fixed_clock: bool) -> Any:
    import orrery.embedded as embedded
    from query.settings import QuerySettings

    if fixed_clock:
        # The stack builds its query ports through this name: wrap it to fix the clock.
        module = cast(Any, embedded)
        ports_of = module.embedded_query_ports

        def fixed_ports(*args: Any, **kwargs: Any) -> Any:
            return dataclasses.replace(ports_of(*args, **kwargs), clock=lambda: FIXED_NOW)

        module.embedded_query_ports = fixed_ports
    settings = QuerySettings(
        data_dir=data_dir,
        cache_responses=False,
        max_body_bytes=64 * 1024 * 1024,
        max_batch=2_000,
    )
    return embedded.EmbeddedStack.open(settings)


def post_until_applied(stack: Any, batches: Iterable[bytes], size: int) -> None:
    """POST each of `batches` (`/v1/records` bodies) into `stack`'s app in process, then
    wait until its projector applied all `size` documents (zero lag)."""
    from starlette.testclient import TestClient

    with TestClient(stack.app) as client:
        for body in batches:
            response = client.post(
                "/v1/records", content=body, headers={"content-type": "application/json"}
            )
            if response.status_code != 200:
                raise RuntimeError(f"POST /v1/records: {response.text[:300]}")
        while True:
            scopes = client.get("/v1/readiness").json().get("scopes", [])
            count = sum(s["document_count"] for s in scopes)
            if scopes and count == size and sum(s["lag_events"] for s in scopes) == 0:
                return
            time.sleep(0.2)


def build(data_dir: Path, size: int, corpus: str) -> None:
    """Ingest `size` records (or SciFact) through the app, wait for zero lag, build HNSW
    in place."""

    if corpus == "scifact":
        batches = _scifact_batches()
        size = sum(len(json.loads(body)) for body in batches)
    else:
        batches = list(corpus_batches(size, 2_000, SEED, Vocabulary.build(random.Random(SEED))))
    stack = _stack(data_dir, fixed_clock=False)
    stack.loop.start()
    started = time.perf_counter()
    post_until_applied(stack, batches, size)
    print(f"ingested {size:,} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    for generation_id, _namespace, _kind, _state in stack.projector.state.generations():
        started = time.perf_counter()
        stack.projector.vectors.optimize_in_place(generation_id)
        print(
            f"optimized {generation_id} in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
    stack.close()


def worker(data_dir: Path, corpus: str, *, compact: bool = False, flat: bool = False) -> None:
    """Answer query indexes read from stdin, one JSON line each (see the module doc)."""
    from starlette.testclient import TestClient

    stack = _stack(data_dir, fixed_clock=True)
    if compact:
        for generation_id, _namespace, _kind, _state in stack.projector.state.generations():
            stack.projector.compact_lexical(generation_id)
    build_flat = getattr(stack.projector, "build_lexical_flat", None)
    if flat and build_flat is not None:
        for generation_id, _namespace, _kind, _state in stack.projector.state.generations():
            built = build_flat(generation_id)
            print(f"in-memory lexical copy of {generation_id}: {built}", file=sys.stderr)
    build_points = getattr(stack.projector.vectors, "build_points", None)
    if flat and build_points is not None:
        # As the first search would start it (`QdrantEdgeVectorIndex.points_for`), but
        # done before the warm-up, so every timed query finds it.
        for generation_id, _namespace, _kind, _state in stack.projector.state.generations():
            built = build_points(generation_id)
            print(f"point table of {generation_id}: {built}", file=sys.stderr)
    bodies: list[dict[str, Any]]
    if corpus == "scifact":
        from bench.versus_qdrant import orrery_body

        bodies = [orrery_body(text) for text in _scifact_queries()]
    elif corpus == "synthetic":
        bodies = _synthetic_bodies(1_000)
    else:
        bodies = [topk_body(query, 10) for query in _queries(1_000)]
    with TestClient(stack.app) as client:
        if corpus in ("scifact", "synthetic"):
            # Embeds each query once, the first ones last: the query-vector cache keeps
            # the 512 latest per tenant, so the timed queries (the first `--queries`, up
            # to ~460 past the warm-up's 50) hit it (in order, synthetic's 1,000 bodies
            # left the first 488 to be embedded inside the timed requests).
            for request in reversed(bodies):
                warm = {k: request[k] for k in ("namespace", "scope_ref", "query_text")}
                client.post("/v1/external/retrieve", json={**warm, "limit": 1})

        def one(request: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
            started, cpu = time.perf_counter(), time.process_time()
            response = client.post("/v1/external/retrieve/topk_records", json=request)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            if response.status_code != 200:
                raise RuntimeError(f"topk_records: {response.text[:300]}")
            answered: dict[str, Any] = response.json()
            return seconds, cpu, answered

        for request in bodies[-WARMUP:]:
            one(request)
        print("ready", flush=True)
        for line in sys.stdin:
            seconds, cpu, body = one(bodies[int(line)])
            plan = body["query_plan"]
            answer = [
                [
                    r["document_id"],
                    r["score"],
                    r["score_breakdown"],
                    r["metadata"]["payload_sha256"],
                ]
                for r in body["results"]
            ]
            print(
                json.dumps(
                    {
                        "ms": seconds * 1000.0,
                        # The worker process's CPU (every thread) for the request: less
                        # sensitive to the machine's load than the wall clock.
                        "cpu_ms": cpu * 1000.0,
                        "total": plan["latency_ms"]["total"],
                        "stages": plan["latency_ms"],
                        "engine": plan.get("engine_ms") or {},
                        "results": answer,
                    }
                ),
                flush=True,
            )
    stack.close()


class Worker:
    """A worker process over its own copy of the data dir, with one tree's code."""

    def __init__(
        self,
        tree: Path,
        data_dir: Path,
        copy: Path,
        corpus: str,
        *,
        compact: bool = False,
        flat: bool = False,
    ) -> None:
        shutil.copytree(data_dir, copy)
        self.process = subprocess.Popen(
            [
                *(sys.executable, str(Path(__file__).resolve()), "--worker", str(copy)),
                *("--corpus", corpus),
                *(("--compact-b",) if compact else ()),
                *(("--flat",) if flat else ()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if flat else subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(tree.resolve())},
        )
        if self._out.readline().strip() != "ready":
            raise RuntimeError(f"worker for {tree} did not start")

    @property
    def _out(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def ask(self, index: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._out.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=120)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _largest_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference between the scores or score-breakdown values of two
    answers ranking the same documents."""
    gap = 0.0
    for (_, score_a, parts_a, _), (_, score_b, parts_b, _) in zip(
        a["results"], b["results"], strict=True
    ):
        gap = max(gap, abs(score_a - score_b))
        for key in parts_a:
            gap = max(gap, abs(float(parts_a[key]) - float(parts_b[key])))
    return gap


def _side(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    client = [s["ms"] for s in samples]
    cpu = [s["cpu_ms"] for s in samples]
    total = [s["total"] for s in samples]
    keys = sorted({k for s in samples for k in s["engine"]})
    raw = [
        s["engine"].get("tantivy_search", 0.0) + s["engine"].get("qdrant_edge_query", 0.0)
        for s in samples
    ]
    ratio = [t / r for t, r in zip(total, raw, strict=True) if r > 0]
    return {
        "client_ms": {"p50": round(_pct(client, 50), 3), "p95": round(_pct(client, 95), 3)},
        "server_total_ms": {"p50": round(_pct(total, 50), 3), "p95": round(_pct(total, 95), 3)},
        "process_cpu_ms": {
            "p50": round(_pct(cpu, 50), 3),
            "p95": round(_pct(cpu, 95), 3),
            "mean": round(sum(cpu) / len(cpu), 3),
        },
        "stage_ms": {
            stage: {
                p: round(_pct([s.get("stages", {}).get(stage, 0.0) for s in samples], q), 3)
                for p, q in (("p50", 50), ("p95", 95))
            }
            for stage in sorted({k for s in samples for k in s.get("stages", {})})
        },
        "engine_ms_p50": {
            k: round(_pct([s["engine"].get(k, 0.0) for s in samples], 50), 3) for k in keys
        },
        # None when no request reached a raw engine (every answer from in-memory copies).
        "server_over_raw_engines": {
            "p50": round(_pct(ratio, 50), 3) if ratio else None,
            "p95": round(_pct(ratio, 95), 3) if ratio else None,
        },
    }


def compare(
    a: Path,
    b: Path,
    data_dir: Path,
    queries: int,
    rounds: int,
    corpus: str = "topk",
    *,
    compact_b: bool = False,
    flat: bool = False,
    data_dir_b: Path | None = None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="orrery-ab-"))
    try:
        workers = {
            "A": Worker(a, data_dir, work / "A", corpus, flat=flat),
            "B": Worker(
                b, data_dir_b or data_dir, work / "B", corpus, compact=compact_b, flat=flat
            ),
        }
        load_before = Path("/proc/loadavg").read_text().strip()
        samples: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        identical = different = same_ranking = 0
        score_gap = 0.0
        for round_ in range(rounds):
            for index in range(queries):
                order = ("A", "B") if (index + round_) % 2 == 0 else ("B", "A")
                answers = {side: workers[side].ask(index) for side in order}
                for side in order:
                    samples[side].append(answers[side])
                if answers["A"]["results"] == answers["B"]["results"]:
                    identical += 1
                else:
                    different += 1
                    ranked = [[r[0] for r in answers[side]["results"]] for side in ("A", "B")]
                    if ranked[0] == ranked[1]:
                        same_ranking += 1
                        score_gap = max(score_gap, _largest_gap(answers["A"], answers["B"]))
        load_after = Path("/proc/loadavg").read_text().strip()
        for running in workers.values():
            running.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sides = {side: _side(s) for side, s in samples.items()}
    return {
        "benchmark": "hotpath_ab",
        "corpus": corpus,
        "flat": flat,
        "trees": {"A": str(a), "B": str(b)},
        "queries": queries,
        "rounds": rounds,
        "identical_answers": identical,
        "different_answers": different,
        # Of the different ones: the same documents in the same order, scores and score
        # breakdowns apart by at most `largest_score_gap` (rounding of float32 engines).
        "different_answers_same_ranking": same_ranking,
        "largest_score_gap": score_gap,
        "loadavg": {"before": load_before, "after": load_after},
        "sides": sides,
        "b_over_a": {
            f"{what}_{p}": round(sides["B"][what][p] / sides["A"][what][p], 3)
            for what in ("client_ms", "server_total_ms", "process_cpu_ms")
            for p in ("p50", "p95")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--a", type=Path, help="tree A (e.g. /work/main)")
    parser.add_argument("--b", type=Path, help="tree B (builds the data dir)")
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--corpus", choices=("topk", "scifact", "synthetic"), default="topk")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, help="reuse (or keep) this data dir")
    parser.add_argument(
        "--data-dir-b", type=Path, help="B's own kept data dir (e.g. bench/edge_rekey.py's)"
    )
    parser.add_argument(
        "--compact-b",
        action="store_true",
        help="B's worker compacts each generation's tantivy index to one segment first",
    )
    parser.add_argument(
        "--flat",
        action="store_true",
        help="each worker builds the in-memory lexical copies first where its tree can",
    )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.corpus == "scifact":
        _scifact_env()
    if args.corpus == "synthetic":
        _synthetic_env()
    if args.build is not None:
        build(args.build, args.size, args.corpus)
        return 0
    if args.worker is not None:
        worker(args.worker, args.corpus, compact=args.compact_b, flat=args.flat)
        return 0
    if args.a is None or args.b is None:
        parser.error("--a and --b are required")
    if args.corpus == "synthetic" and args.data_dir is None:
        parser.error("--corpus synthetic needs --data-dir (a versus_qdrant_synthetic one)")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="orrery-ab-data-")) / "data"
    if not (data_dir / "orrery.sqlite").exists():
        subprocess.run(
            [
                *(sys.executable, str(Path(__file__).resolve()), "--build", str(data_dir)),
                *("--size", str(args.size), "--corpus", args.corpus),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(args.b.resolve())},
        )
    queries = min(args.queries, 300) if args.corpus == "scifact" else args.queries
    report = compare(
        *(args.a, args.b, data_dir, queries, args.rounds, args.corpus),
        compact_b=args.compact_b,
        flat=args.flat,
        data_dir_b=args.data_dir_b,
    )
    print_report(report, args.out)
    if args.data_dir is None:
        shutil.rmtree(data_dir.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
