"""Retrieval quality over the real HTTP path, on any BEIR-format dataset.

    .venv/bin/python bench/quality.py DATASET_DIR [--out docs/bench/quality.json]
        [--mode embedded|servers] [--split test] [--profile ID ...] [--profiles JSON|FILE]
        [--data-dir DIR] [--language english]

1. Starts a real `orrery serve` on 127.0.0.1 (own temp data dir, or `--data-dir` to keep
   or reuse one; `--mode servers` uses the local harness: Kafka, OpenSearch, Redis, with
   names unique to this run, Qdrant through qdrant-client's local mode).
2. Loads `corpus.jsonl` through `POST /v1/records`: `_id` -> `item_id`, `title` ->
   `text.title`, `text` -> `text.body`, the row itself -> `payload`; every record gets
   the same status and `updated_at`, so freshness and status cannot reorder anything.
   The namespace's text language is `--language` (default english: BEIR is English).
   Waits (progress bar) until the projector has embedded and indexed every document.
3. Sends every query of `qrels/<split>.tsv` through `POST
   /v1/external/retrieve/topk_records` (result_limit 100, no filters) once per run:
   lexical only (title^2 + body + tags, as weighted@1/rrf@1; and the combined text field,
   as weighted@3/rrf@2), vector only, `rrf@1`, `rrf@2`, `weighted@1`, `weighted@2`,
   `weighted@3`, the server's default profile and any `--profile`.
4. Reports nDCG@10 (graded gains, log2 discount, as BEIR/pytrec_eval) and Recall@100
   (relevant = qrels score > 0), averaged over the queries with a relevant document;
   prints a table, writes the JSON (`--out`) and a bar chart next to it (`.png`).

Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/quality.py`: put the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    draw_chart,
    drop_harness_resources,
    git_facts,
    harness_servers_env,
    machine_facts,
    post_records,
    start_serve,
    utc_now,
)

__all__ = ["Dataset", "beir_record", "load_dataset", "main", "ndcg_at", "recall_at"]

NAMESPACE = "beir"
ADMIN_KEY = "bench-quality-admin"
SNAPSHOT_KIND = "objects"
SCOPE_REF = "longterm:objects:current"
UPDATED_AT = "2020-01-01T00:00:00Z"
BATCH = 500
RESULT_LIMIT = 100
QUERY_TIMEOUT_S = 30.0
ZERO = {
    "lexical_weight": 0.0,
    "vector_weight": 0.0,
    "freshness_weight": 0.0,
    "metadata_weight": 0.0,
}

console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class Dataset:
    """A BEIR-format dataset: corpus rows, query texts by id, graded qrels by query."""

    name: str
    corpus: list[dict[str, Any]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def load_dataset(directory: Path, split: str = "test") -> Dataset:
    """Read `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv` (header line
    `query-id corpus-id score`, tab-separated). Only queries with at least one relevant
    document (score > 0) and a text are kept."""
    corpus = [json.loads(line) for line in _lines(directory / "corpus.jsonl")]
    queries = {
        str(row["_id"]): str(row["text"])
        for row in map(json.loads, _lines(directory / "queries.jsonl"))
    }
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(_lines(directory / "qrels" / f"{split}.tsv")):
        parts = line.split("\t")
        if number == 0 and not parts[-1].strip().lstrip("-").isdigit():
            continue  # the header
        query_id, corpus_id, score = parts[0], parts[1], int(parts[2])
        qrels.setdefault(query_id, {})[corpus_id] = score
    kept = {
        q: rels
        for q, rels in qrels.items()
        if q in queries and any(score > 0 for score in rels.values())
    }
    return Dataset(directory.resolve().name, corpus, queries, kept)


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield line.rstrip("\n")


def ndcg_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k with gain = the graded relevance and discount 1/log2(rank + 1)."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 100) -> float:
    """Share of the relevant documents (score > 0) within the first k."""
    wanted = {doc for doc, gain in relevant.items() if gain > 0}
    return len(wanted.intersection(ranked[:k])) / len(wanted) if wanted else 0.0


def beir_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `POST /v1/records` item of a BEIR corpus row (no vector: the projector embeds)."""
    return {
        "namespace": NAMESPACE,
        "snapshot_kind": SNAPSHOT_KIND,
        "item_id": str(row["_id"]),
        "revision": 1,
        "payload_schema": "beir_corpus_v1",
        "payload": dict(row),
        "text": {"title": str(row.get("title") or ""), "body": str(row.get("text") or "")},
        "metadata": {"status": "active", "updated_at": UPDATED_AT},
    }


# --------------------------------------------------------------------------- the server


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def _scope_count(ready: Mapping[str, Any]) -> int:
    return sum(
        int(s["document_count"])
        for s in ready["scopes"]
        if s["namespace"] == NAMESPACE and s["snapshot_kind"] == SNAPSHOT_KIND
    )


def _load(client: httpx.Client, dataset: Dataset, timeout_s: float) -> dict[str, Any]:
    """Write the corpus, then wait until the projector indexed all of it."""
    records = [beir_record(row) for row in dataset.corpus]
    total = len(records)
    started = time.perf_counter()
    accepted = 0
    present = _scope_count(client.get("/v1/readiness").json())
    with _progress() as progress:
        task = progress.add_task("write records", total=total, rate="")
        # A reused data dir that holds the whole corpus already is not written again.
        for start in range(0, total if present < total else 0, BATCH):
            chunk = records[start : start + BATCH]
            response = post_records(client, chunk)
            stale = response.status_code == 409  # every revision already stored
            if response.status_code != 200 and not stale:
                raise RuntimeError(
                    f"POST /v1/records: {response.status_code} {response.text[:500]}"
                )
            accepted += 0 if stale else int(response.json()["accepted"])
            progress.update(task, advance=len(chunk))
        progress.update(task, completed=total)
    written_s = time.perf_counter() - started
    projected_at = time.perf_counter()
    first = _scope_count(client.get("/v1/readiness").json())
    with _progress() as progress:
        task = progress.add_task("embed + index", total=total, rate="")
        logged_at = 0.0
        while True:
            ready = client.get("/v1/readiness").json()
            count = _scope_count(ready)
            elapsed = time.perf_counter() - projected_at
            rate = f"{max(0, count - first) / max(elapsed, 1e-9):.1f} docs/s"
            progress.update(task, completed=count, rate=rate)
            if not console.is_terminal and elapsed - logged_at >= 30.0:
                # No live bar in a log file: one line every 30 s instead.
                console.print(f"embed + index: {count:,}/{total:,} after {elapsed:.0f} s ({rate})")
                logged_at = elapsed
            if ready["ready"] and count >= total:
                break
            if elapsed > timeout_s:
                raise RuntimeError(f"projection did not finish in {timeout_s:.0f} s: {ready}")
            time.sleep(1.0)
    projected_s = time.perf_counter() - projected_at
    return {
        "documents": total,
        "accepted": accepted,
        "already_present": total - accepted,
        "write_seconds": round(written_s, 2),
        "project_seconds": round(projected_s, 2),
        "project_docs_per_second": round(accepted / projected_s, 2) if accepted else None,
    }


# --------------------------------------------------------------------------- the runs


def _runs(extra: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, request fields) of every run; `default` names no profile. The single-source
    runs zero the other weights of a profile, so they rank with its BM25 fields."""
    runs: list[tuple[str, dict[str, Any]]] = [
        ("lexical", {"profile": "weighted@1", "ranking": {**ZERO, "lexical_weight": 1.0}}),
        ("lexical-text", {"profile": "weighted@3", "ranking": {**ZERO, "lexical_weight": 1.0}}),
        ("vector", {"profile": "weighted@1", "ranking": {**ZERO, "vector_weight": 1.0}}),
        ("rrf@1", {"profile": "rrf@1"}),
        ("rrf@2", {"profile": "rrf@2"}),
        ("weighted@1", {"profile": "weighted@1"}),
        ("weighted@2", {"profile": "weighted@2"}),
        ("weighted@3", {"profile": "weighted@3"}),
        ("default", {}),
    ]
    runs += [(profile, {"profile": profile}) for profile in extra]
    return runs


def _evaluate(
    client: httpx.Client,
    dataset: Dataset,
    name: str,
    fields: Mapping[str, Any],
    scope_ref: str = SCOPE_REF,
) -> dict[str, Any]:
    ndcg: list[float] = []
    top10: dict[str, list[str]] = {}
    recall: list[float] = []
    server_ms: list[float] = []
    profiles: set[str] = set()
    sources: set[str] = set()
    cache_hits = 0
    with _progress() as progress:
        task = progress.add_task(f"{name:>12}", total=len(dataset.qrels), rate="")
        for query_id, relevant in sorted(dataset.qrels.items()):
            body = {
                "namespace": NAMESPACE,
                "scope_ref": scope_ref,
                "query_text": dataset.queries[query_id],
                "result_limit": RESULT_LIMIT,
                "timeout_seconds": QUERY_TIMEOUT_S,
                **fields,
            }
            response = client.post("/v1/external/retrieve/topk_records", json=body)
            if response.status_code != 200:
                raise RuntimeError(
                    f"{name} query {query_id}: {response.status_code} {response.text}"
                )
            answer = response.json()
            profiles.add(answer["profile"])
            server_ms.append(float(answer["query_plan"]["latency_ms"]["total"]))
            cache_hits += answer["query_plan"]["cache"] == "hit"
            sources.update(answer["query_plan"]["indexes_used"])
            ranked = [result["item_id"] for result in answer["results"]]
            top10[query_id] = ranked[:10]
            ndcg.append(ndcg_at(ranked, relevant, 10))
            recall.append(recall_at(ranked, relevant, RESULT_LIMIT))
            progress.update(task, advance=1)
    server_ms.sort()
    return {
        "name": name,
        "profile": ", ".join(sorted(profiles)),
        "request": dict(fields),
        "sources": sorted(sources & {"bm25", "vector"}),
        "ndcg@10": round(sum(ndcg) / len(ndcg), 4),
        "recall@100": round(sum(recall) / len(recall), 4),
        "queries": len(ndcg),
        "server_ms_p50": round(server_ms[len(server_ms) // 2], 2),
        "cache_hits": cache_hits,
        "_top10": top10,
    }


def _spread_generation(client: httpx.Client, shards: int) -> str:
    """Build, seal and verify an N-shard generation of the dataset's scope (admin API);
    its id."""
    headers = {"x-admin-key": ADMIN_KEY}
    body = {"namespace": NAMESPACE, "snapshot_kind": SNAPSHOT_KIND, "shards": shards}
    admin = "/v1/admin/generations"
    started = client.post(f"{admin}/build", json=body, headers=headers, timeout=600)
    if started.status_code != 202:
        raise RuntimeError(f"build: {started.status_code} {started.text[:300]}")
    generation_id = str(started.json()["row"]["generation_id"])
    while True:
        view = client.get(f"{admin}/{generation_id}", headers=headers).json()
        if view["row"]["state"] != "building":
            break
        time.sleep(2)
    if view["row"]["state"] != "sealed":
        raise RuntimeError(f"build of {generation_id}: {view['row']}")
    check = client.post(f"{admin}/{generation_id}/verify", headers=headers, timeout=600).json()
    if not check.get("verified"):
        raise RuntimeError(f"verify of {generation_id}: {check}")
    return generation_id


def _lexical_recipe(profile_id: str) -> str | None:
    """The BM25 field boosts a built-in profile (or one derived from it) ranks with, as
    canonical JSON; None for an operator profile."""
    from contracts.index import field_boosts
    from query.profiles import BUILTIN_PROFILES

    base = profile_id.split("+", 1)[0]
    for profile in BUILTIN_PROFILES:
        if profile.id == base:
            return json.dumps(field_boosts(profile.lexical_boosts()), sort_keys=True)
    return None


def _verdict(runs: Sequence[Mapping[str, Any]], target: float) -> dict[str, Any]:
    """Whether the default reaches `target`, and whether each hybrid beats its own two
    sources (the vector run and the lexical run with its BM25 fields; the best lexical
    run when none has them) and, stricter, every single-source run."""
    by_name = {run["name"]: run for run in runs}
    lexical = [r for r in runs if r["sources"] == ["bm25"]]
    vector = max(r["ndcg@10"] for r in runs if r["sources"] == ["vector"])
    best_lexical = max(r["ndcg@10"] for r in lexical)
    hybrids = [r for r in runs if r["sources"] == ["bm25", "vector"]]

    def own_lexical(run: Mapping[str, Any]) -> float:
        recipe = _lexical_recipe(run["profile"])
        same = [float(r["ndcg@10"]) for r in lexical if _lexical_recipe(r["profile"]) == recipe]
        return max(same) if recipe is not None and same else float(best_lexical)

    return {
        "target_default_ndcg@10": target,
        "default_meets_target": by_name["default"]["ndcg@10"] >= target,
        "hybrids_above_both_sources": {
            r["name"]: r["ndcg@10"] > max(own_lexical(r), vector) for r in hybrids
        },
        "hybrids_above_every_single_source": {
            r["name"]: r["ndcg@10"] > max(best_lexical, vector) for r in hybrids
        },
    }


def _chart(path: Path, title: str, runs: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        run["name"] if run["name"] != "default" else f"default\n({run['profile']})" for run in runs
    ]
    x = range(len(runs))
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(runs)), 4.2))
    bars_n = ax.bar(
        [i - width / 2 for i in x], [r["ndcg@10"] for r in runs], width, label="nDCG@10"
    )
    bars_r = ax.bar(
        [i + width / 2 for i in x], [r["recall@100"] for r in runs], width, label="Recall@100"
    )
    for bars in (bars_n, bars_r):
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylim(0, 1.18)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", ncols=2, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="a BEIR-format directory")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "quality.json")
    parser.add_argument("--mode", choices=("embedded", "servers"), default="embedded")
    parser.add_argument("--split", default="test")
    parser.add_argument(
        "--profile", action="append", default=[], help="another profile id to evaluate"
    )
    parser.add_argument(
        "--profiles",
        default="",
        help="operator profiles for the server (ORRERY_PROFILES: JSON or a file path)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="embedded: keep (or reuse) the server's data here instead of a temp dir",
    )
    parser.add_argument(
        "--target", type=float, default=0.73, help="nDCG@10 the default should reach"
    )
    parser.add_argument("--project-timeout", type=float, default=7_200.0)
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="servers mode: also build an N-shard generation and run every query on it "
        "too (pinned), reporting its figures and the queries whose top 10 differ",
    )
    parser.add_argument(
        "--language",
        default="english",
        help="stemming language of the dataset's namespace (ORRERY_NAMESPACE_LANGUAGES); "
        "'none' = no stemming",
    )
    args = parser.parse_args(argv)
    if args.shards > 1 and args.mode != "servers":
        parser.error("--shards is for --mode servers only")
    if args.data_dir is not None and args.mode == "servers":
        # Server-mode resources are named per run, so a kept data dir cannot be reused.
        parser.error("--data-dir is for --mode embedded only")

    dataset = load_dataset(args.dataset, args.split)
    console.print(
        f"{dataset.name}: {len(dataset.corpus):,} documents, {len(dataset.qrels):,} "
        f"{args.split} queries with judgments; mode {args.mode}"
    )
    env = harness_servers_env("quality") if args.mode == "servers" else {}
    if args.profiles:
        env["ORRERY_PROFILES"] = args.profiles
    env["ORRERY_NAMESPACE_LANGUAGES"] = json.dumps({NAMESPACE: args.language})
    env["ORRERY_ADMIN_KEY"] = ADMIN_KEY
    temp: Path | None = None
    data_dir: Path = args.data_dir
    if data_dir is None:
        temp = Path(tempfile.mkdtemp(prefix="orrery-quality-"))
        data_dir = temp / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    server = start_serve(data_dir, data_dir.parent / "serve.log", env)
    client = server.client()
    try:
        load = _load(client, dataset, args.project_timeout)
        console.print(
            f"loaded: {load['accepted']:,} written in {load['write_seconds']} s, projected in "
            f"{load['project_seconds']} s ({load['project_docs_per_second']} docs/s)"
        )
        runs = [_evaluate(client, dataset, name, fields) for name, fields in _runs(args.profile)]
        if args.shards > 1:
            spread = _spread_generation(client, args.shards)
            console.print(f"built and verified {spread} with {args.shards} shards")
            for run in list(runs):
                fields = dict(run["request"])
                other = _evaluate(
                    client,
                    dataset,
                    f"{run['name']} n{args.shards}",
                    fields,
                    f"{SCOPE_REF}@{spread}",
                )
                other["shards"] = args.shards
                other["generation_id"] = spread
                other["top10_differs"] = sorted(
                    q for q, ids in other["_top10"].items() if run["_top10"].get(q) != ids
                )
                runs.append(other)
    except BaseException:
        console.print(f"[red]server log tail:[/]\n{server.log_text()[-3000:]}")
        raise
    finally:
        client.close()
        server.stop()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        if args.mode == "servers":
            drop_harness_resources(env)

    for run in runs:
        run.pop("_top10", None)
    verdict = _verdict([r for r in runs if "shards" not in r], args.target)
    result = {
        "benchmark": "quality",
        "created_at": utc_now(),
        "dataset": dataset.name,
        "split": args.split,
        "mode": args.mode,
        "corpus_size": len(dataset.corpus),
        "queries": len(dataset.qrels),
        "result_limit": RESULT_LIMIT,
        "text_language": args.language,
        "metrics": {
            "ndcg@10": "graded gain, log2 discount, mean over queries with a relevant document",
            "recall@100": "relevant (qrels > 0) in the first 100, over all relevant",
            "server_ms_p50": "query_plan.latency_ms.total; the first run that needs a "
            "query's vector pays its embedding; a run resolving to the same profile as an "
            "earlier one is answered from the response cache (cache_hits)",
        },
        "load": load,
        "runs": runs,
        "verdict": verdict,
        "machine": machine_facts(),
        "git": git_facts(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    draw_chart(
        _chart,
        args.out.with_suffix(".png"),
        f"{dataset.name} ({args.split}, {len(dataset.qrels)} queries, {args.mode}) over HTTP",
        runs,
    )

    table = Table(title=f"{dataset.name} {args.split} — {args.mode}")
    for column in ("run", "profile", "nDCG@10", "Recall@100", "server p50 ms", "cache hits"):
        table.add_column(column)
    for run in runs:
        table.add_row(
            run["name"],
            run["profile"],
            f"{run['ndcg@10']:.4f}",
            f"{run['recall@100']:.4f}",
            f"{run['server_ms_p50']:.1f}",
            str(run["cache_hits"]),
        )
    Console().print(table)
    console.print(f"verdict: {json.dumps(verdict)}")
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
