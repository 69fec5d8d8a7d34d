"""Embedded ingest beside Qdrant's own ingest of the same points, in one run.

    python bench/ingest_anchor.py [--size 100000] [--rounds 1] [--batch-size 2000]
        [--qdrant-batch 1000] [--out docs/bench/ingest_anchor.json]

The corpus of `bench/topk.py` (384-d unit vectors, ~0.5-1 KB payloads, no document
embedded) goes, per round and in alternating order, to:

- **Orrery**: a fresh `orrery serve` (this tree, own temp data dir) over
  `POST /v1/records` flat out (`bench.topk.ingest`: answered on commit, paced by the
  projector's backlog); *searchable* = every record applied by the projector (zero lag
  in `/v1/readiness`), with each POST's freshness lag; *HNSW built* = the last
  qdrant-edge optimize ended (`bench.topk.wait_for_vector_index`).
- **Qdrant**: the harness Qdrant server (`ORRERY_QDRANT_URL`) — a fresh collection
  (cosine, 384-d, default HNSW and optimizer), `galaxy` and `status` keyword payload
  indexes created before the points, then `PUT /collections/<c>/points?wait=true` in
  batches of `--qdrant-batch` over raw REST (bodies prepared beforehand, as Orrery's are);
  *acknowledged* = the last upsert answered (searchable: `wait=true`); *green* = the
  collection's status is green (its optimizers built the HNSW index).

CPU: the Orrery server process (all threads; the optimizer's child processes are not
counted) and the Qdrant server process, from `/proc`, per 1,000 records. The machine is
shared: the load average is recorded before and after each phase.

Writes `docs/bench/ingest_anchor.json` and a PNG beside it, and prints a table. Figures
are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    ingest_env,
    run_and_publish,
    start_serve,
)
from bench.topk import (
    DIMENSION,
    OPTIMIZE_INTERVAL_S,
    WARMUP_QUERIES,
    SpooledCorpus,
    Vocabulary,
    corpus_batches,
    index_wait_s,
    ingest,
    make_queries,
    wait_for_vector_index,
)

console = Console(stderr=True)

GREEN_TIMEOUT_S = 1_800.0
KEYWORD_INDEXES = ("galaxy", "status")


def qdrant_bodies(batches: Iterator[bytes], batch_size: int) -> Iterator[bytes]:
    """`PUT /collections/<c>/points` bodies of `batch_size` points from Orrery's POST
    bodies: the same vectors, the record's payload plus the `galaxy` and `status` its
    keyword indexes cover (and `item_id`, `updated_at`, `visibility`)."""
    pending: list[dict[str, Any]] = []
    for body in batches:
        for record in json.loads(body):
            payload = {
                **record["payload"],
                "item_id": record["item_id"],
                "galaxy": record["galaxy"],
                "status": record["metadata"]["status"],
                "updated_at": record["metadata"]["updated_at"],
                "visibility": record["metadata"]["visibility"],
            }
            point_id = str(uuid.uuid5(uuid.NAMESPACE_URL, record["item_id"]))
            pending.append({"id": point_id, "vector": record["vector"], "payload": payload})
            if len(pending) == batch_size:
                yield json.dumps({"points": pending}, separators=(",", ":")).encode()
                pending = []
    if pending:
        yield json.dumps({"points": pending}, separators=(",", ":")).encode()


def qdrant_pid() -> int | None:
    """The Qdrant server's process id: `ORRERY_QDRANT_PID` (a server started for the run,
    e.g. a niced one for a 1M build), else the harness's (`/tmp/orrery-servers/
    servers.json`), if alive."""
    given = os.environ.get("ORRERY_QDRANT_PID")
    if given:
        return int(given) if Path(f"/proc/{int(given)}").exists() else None
    base = Path(os.environ.get("ORRERY_SERVERS_DIR", "/tmp/orrery-servers"))
    try:
        record = json.loads((base / "servers.json").read_text())["servers"]["qdrant"]
    except (OSError, KeyError, ValueError):
        return None
    pid = record.get("pid")
    return pid if isinstance(pid, int) and Path(f"/proc/{pid}").exists() else None


def process_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_qdrant(
    url: str, bodies: Iterable[bytes], size: int, green_timeout_s: float = GREEN_TIMEOUT_S
) -> dict[str, Any]:
    """A fresh collection, its keyword indexes, the points (`wait=true`), then green."""
    name = f"orrery-ingest-anchor-{uuid.uuid4().hex[:8]}"
    pid = qdrant_pid()
    with httpx.Client(base_url=url, timeout=300.0, trust_env=False) as client:
        client.put(
            f"/collections/{name}",
            json={"vectors": {"size": DIMENSION, "distance": "Cosine"}},
        ).raise_for_status()
        try:
            for field in KEYWORD_INDEXES:
                client.put(
                    f"/collections/{name}/index",
                    params={"wait": "true"},
                    json={"field_name": field, "field_schema": "keyword"},
                ).raise_for_status()
            load_before = _load()
            cpu_before = process_cpu_s(pid)
            started = time.perf_counter()
            for body in bodies:
                client.put(
                    f"/collections/{name}/points",
                    params={"wait": "true"},
                    content=body,
                    headers={"content-type": "application/json"},
                ).raise_for_status()
            acked_s = time.perf_counter() - started
            cpu_acked = process_cpu_s(pid)
            # Green can lag far behind "every vector HNSW-indexed" on a busy machine (a
            # load-25 run stayed yellow for 30 min with 100k of 100k indexed): both are
            # recorded, and a run that never turns green reports None, not an error.
            indexed_s: float | None = None
            green_s: float | None = None
            while time.perf_counter() - started < green_timeout_s:
                info = client.get(f"/collections/{name}").json()["result"]
                if indexed_s is None and (info.get("indexed_vectors_count") or 0) >= size:
                    indexed_s = time.perf_counter() - started
                if info["status"] == "green":
                    green_s = time.perf_counter() - started
                    break
                time.sleep(0.2)
            cpu_green = process_cpu_s(pid)
        finally:
            client.delete(f"/collections/{name}")
    per_1k = None if cpu_before is None else 1000.0 / size
    return {
        "points": info["points_count"],
        "indexed_vectors": info.get("indexed_vectors_count"),
        "segments": info.get("segments_count"),
        "acknowledged_seconds": round(acked_s, 2),
        "all_indexed_seconds": None if indexed_s is None else round(indexed_s, 2),
        "green_seconds": None if green_s is None else round(green_s, 2),
        "acknowledged_records_per_s": round(size / acked_s, 1),
        "green_records_per_s": None if green_s is None else round(size / green_s, 1),
        "all_indexed_records_per_s": None if indexed_s is None else round(size / indexed_s, 1),
        "server_cpu_s_per_1k_acknowledged": None
        if per_1k is None or cpu_acked is None or cpu_before is None
        else round((cpu_acked - cpu_before) * per_1k, 3),
        "server_cpu_s_per_1k_green": None
        if per_1k is None or cpu_green is None or cpu_before is None
        else round((cpu_green - cpu_before) * per_1k, 3),
        "load_before": load_before,
        "load_after": _load(),
    }


def run_orrery(
    corpus: SpooledCorpus,
    size: int,
    batch_size: int,
    seed: int,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A fresh `orrery serve` (`extra_env` over the bench's own settings): POST flat out
    until zero lag, then wait for HNSW."""
    root = Path(tempfile.mkdtemp(prefix="orrery-ingest-anchor-"))
    env = {
        **ingest_env(batch_size),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
        **(extra_env or {}),
    }
    probes = make_queries(random.Random(seed + 1), Vocabulary.build(random.Random(seed)), 20)
    server = start_serve(root / "data", root / "serve.log", env)
    try:
        load_before = _load()
        cpu_before = server.cpu_seconds()
        reaped_before = server.reaped_children_cpu_seconds()
        workers_before = server.worker_cpu_seconds()
        with server.client(timeout_s=300.0) as client:
            result = ingest(server, client, corpus, size)
            cpu_ready = server.cpu_seconds()
            workers_ready = server.worker_cpu_seconds()
            load_ready = _load()
            wait = wait_for_vector_index(
                server,
                client,
                probes[:WARMUP_QUERIES],
                result_limit=10,
                start_wall=result["wall_start"],
                ready_wall=result["wall_ready"],
                max_wait_s=index_wait_s(size),
            )
        cpu_end = server.cpu_seconds()
        reaped_end = server.reaped_children_cpu_seconds()
        workers_end = server.worker_cpu_seconds()
        problems = server.log_problems()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    ready_s = result["ready_seconds"]
    after_ready = wait.get("last_optimize_s_after_ready")
    built_s = ready_s + max(0.0, after_ready or 0.0)
    lag = result["freshness"].get("lag_ms", {})
    return {
        "searchable_seconds": ready_s,
        "searchable_records_per_s": result["records_per_s"],
        "post_records_per_s": result["post_records_per_s"],
        "freshness_lag_ms": {k: lag.get(k) for k in ("p50", "p95", "p99", "max")},
        "freshness_method": result["freshness"]["method"],
        "hnsw_built_seconds": round(built_s, 2),
        "hnsw_built_records_per_s": round(size / built_s, 1),
        "hnsw_stable": wait["stable"],
        "optimizes_ended_s_after_first_post": wait["optimizes_ended_s_after_first_post"],
        "optimizes_failed": len(wait["optimizes_failed"]),
        # Each optimize's phases as the server logged them (copy, child, catch-up, swap).
        "optimizer_log": wait["optimizer_log"],
        "server_cpu_us_per_record_to_searchable": round((cpu_ready - cpu_before) / size * 1e6, 1),
        # The write workers' processes (ORRERY_INGEST_WORKERS), beside the server's own.
        "write_workers_cpu_us_per_record_to_searchable": round(
            (workers_ready - workers_before) / size * 1e6, 1
        ),
        "server_cpu_s_per_1k_to_built": round((cpu_end - cpu_before) / size * 1000, 3),
        # The optimizer's build children (ended by then, so counted once reaped) and the
        # write workers, to built: with the server's, what the machine's cores gave
        # Orrery against Qdrant's `server_cpu_s_per_1k_green`.
        "optimizer_children_cpu_s_per_1k_to_built": round(
            (reaped_end - reaped_before) / size * 1000, 3
        ),
        "write_workers_cpu_s_per_1k_to_built": round(
            (workers_end - workers_before) / size * 1000, 3
        ),
        "log_problems": problems,
        "load_before": load_before,
        "load_at_searchable": load_ready,
        "load_after": _load(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Looked up only when Qdrant is measured: `--sides orrery` runs without the harness.
    url = (
        os.environ.get("ORRERY_QDRANT_URL") or _harness_qdrant_url()
        if "qdrant" in args.sides
        else None
    )
    vocab = Vocabulary.build(random.Random(args.seed))
    console.print(f"{args.size:,} records, two spooled copies: Orrery's, Qdrant's")

    def generate() -> Iterator[bytes]:
        return corpus_batches(args.size, args.batch_size, args.seed, vocab)

    if args.corpus_cache is None:
        orrery_corpus = SpooledCorpus(generate())
    else:  # the file `bench/topk.py --corpus-cache` keeps: the same records, not generated
        name = f"corpus-{args.size}-b{args.batch_size}-s{args.seed}-clustered.json"
        orrery_corpus, reused = SpooledCorpus.cached(args.corpus_cache / name, generate)
        console.print(("reused " if reused else "kept ") + str(args.corpus_cache / name))
    qdrant_corpus = SpooledCorpus(qdrant_bodies(iter(orrery_corpus), args.qdrant_batch))
    if "orrery" not in args.sides:
        orrery_corpus.close()  # the Qdrant bodies are spooled: the records are not needed
    rounds: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            order = ("qdrant", "orrery") if round_ % 2 == 0 else ("orrery", "qdrant")
            figures: dict[str, Any] = {"order": [s for s in order if s in args.sides]}
            for side in figures["order"]:
                console.rule(f"round {round_ + 1}: {side}")
                if side == "qdrant":
                    assert url is not None  # looked up above for this side
                    figures[side] = run_qdrant(url, qdrant_corpus, args.size, args.green_timeout)
                else:
                    figures[side] = run_orrery(
                        orrery_corpus, args.size, args.batch_size, args.seed, args.env
                    )
            figures["ratios"] = ratios(figures)
            rounds.append(figures)
    finally:
        orrery_corpus.close()
        qdrant_corpus.close()
    return {
        "config": {
            "size": args.size,
            "rounds": args.rounds,
            "orrery_batch_size": args.batch_size,
            "qdrant_batch_size": args.qdrant_batch,
            "seed": args.seed,
            "corpus_cache": None if args.corpus_cache is None else str(args.corpus_cache),
            "vector_dimension": DIMENSION,
            "qdrant_url": url,
            "qdrant_keyword_indexes": list(KEYWORD_INDEXES),
            "orrery_env": {"ORRERY_OPTIMIZE_INTERVAL_SECONDS": OPTIMIZE_INTERVAL_S, **args.env},
            "note": "shared 2-core machine: other sessions' load is recorded, not controlled",
        },
        "targets": {
            "searchable_records_per_s": 2_500,
            "hnsw_built_vs_qdrant_green": 1.0,
            "freshness_p95_ms": 1_000,
        },
        "rounds": rounds,
    }


def ratios(figures: Mapping[str, Any]) -> dict[str, float | None]:
    if "orrery" not in figures or "qdrant" not in figures:
        return {}  # one side only (`--sides`): its figures stand beside another run's
    orrery, qdrant = figures["orrery"], figures["qdrant"]
    return {
        "searchable_vs_qdrant_acknowledged": round(
            orrery["searchable_records_per_s"] / qdrant["acknowledged_records_per_s"], 3
        ),
        "hnsw_built_vs_qdrant_green": None
        if not qdrant["green_records_per_s"]
        else round(orrery["hnsw_built_records_per_s"] / qdrant["green_records_per_s"], 3),
    }


def _harness_qdrant_url() -> str:
    from tests.harness.servers import server_urls

    url = server_urls().get("qdrant")
    if not url:
        raise SystemExit("the harness Qdrant is not running (ORRERY_QDRANT_URL unset)")
    return url


def print_table(report: Mapping[str, Any]) -> None:
    table = Table(title=f"ingest of {report['config']['size']:,} records: Orrery vs Qdrant")
    for column in ("round", "side", "searchable rec/s", "HNSW rec/s", "fresh p95 ms", "load"):
        table.add_column(column)
    for i, figures in enumerate(report["rounds"], 1):
        orrery, qdrant = figures.get("orrery"), figures.get("qdrant")
        if orrery is not None:
            p95 = orrery["freshness_lag_ms"]["p95"]
            table.add_row(
                str(i),
                "orrery embedded",
                f"{orrery['searchable_records_per_s']:,.0f}",
                f"{orrery['hnsw_built_records_per_s']:,.0f}",
                "-" if p95 is None else f"{p95:,.0f}",
                f"{orrery['load_before'][0]:.1f}",
            )
        if qdrant is None:
            continue
        table.add_row(
            str(i),
            "qdrant server",
            f"{qdrant['acknowledged_records_per_s']:,.0f}",
            "-"
            if qdrant["green_records_per_s"] is None
            else f"{qdrant['green_records_per_s']:,.0f}",
            "-",
            f"{qdrant['load_before'][0]:.1f}",
        )
    console.print(table)


def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rounds: Sequence[Mapping[str, Any]] = report["rounds"]
    if any("orrery" not in r or "qdrant" not in r for r in rounds):
        return  # one side only: nothing to draw side by side
    labels = ["searchable / acknowledged", "HNSW built / green"]
    orrery = [
        np.mean([r["orrery"]["searchable_records_per_s"] for r in rounds]),
        np.mean([r["orrery"]["hnsw_built_records_per_s"] for r in rounds]),
    ]
    qdrant = [
        np.mean([r["qdrant"]["acknowledged_records_per_s"] for r in rounds]),
        np.mean([r["qdrant"]["green_records_per_s"] or 0.0 for r in rounds]),
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(labels))
    for offset, values, name in ((-0.2, orrery, "Orrery embedded"), (0.2, qdrant, "Qdrant")):
        bars = ax.bar(x + offset, values, 0.4, label=name)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(x, labels)
    ax.set_ylabel("records/s")
    size = report["config"]["size"]
    ax.set_title(f"ingest of {size:,} records, 384-d, same points, same run", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=2_000, help="records per Orrery POST")
    parser.add_argument("--qdrant-batch", type=int, default=1_000, help="points per upsert")
    parser.add_argument("--seed", type=int, default=20_260_101)
    parser.add_argument("--timeout", type=int, default=7_200, help="global timeout in s")
    parser.add_argument(
        "--sides",
        default="qdrant,orrery",
        help="comma-separated: qdrant, orrery (one alone, e.g. Qdrant's time to green for "
        "the points of a `bench/topk.py --data-root` build; ORRERY_QDRANT_URL and "
        "ORRERY_QDRANT_PID name a server started for it)",
    )
    parser.add_argument(
        "--corpus-cache",
        type=Path,
        default=None,
        help="a directory keeping the corpus between runs (shared with bench/topk.py "
        "--corpus-cache: a 1M build's records are not generated again)",
    )
    parser.add_argument(
        "--green-timeout", type=float, default=GREEN_TIMEOUT_S, help="max s to wait for green"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "ingest_anchor.json"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="ORRERY_NAME=VALUE",
        help="a setting of the Orrery server (repeatable), e.g. ORRERY_INGEST_WORKERS=0",
    )
    args = parser.parse_args(argv)
    pairs = [str(item).partition("=") for item in args.env]
    if any(not key.startswith("ORRERY_") or not sep for key, sep, _ in pairs):
        parser.error("--env takes ORRERY_NAME=VALUE")
    args.env = {key: value for key, _, value in pairs}
    args.sides = [s.strip() for s in str(args.sides).split(",") if s.strip()]
    if not args.sides or not set(args.sides) <= {"qdrant", "orrery"}:
        parser.error("--sides takes qdrant and/or orrery")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_and_publish(
        "ingest_anchor",
        lambda: run(args),
        timeout_s=args.timeout,
        out=args.out,
        plot=plot,
        table=print_table,
    )


if __name__ == "__main__":
    sys.exit(main())
