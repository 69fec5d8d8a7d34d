"""`orrery search` and `orrery explain`: a query from the terminal, read at a glance.

Both send Orrery's public one-shot request (`POST /v1/external/retrieve/topk_records`)
to a running server — `--url`, or the server running on `--data-dir` (its server
file) — or, with no server on the data dir, to the data dir's stack opened in this
process. `search` prints a table (rank, item id, title, fused score and its lexical,
vector and freshness parts); `--compare PROFILE` runs the query under a second profile
and joins each document's two ranks; `explain` adds each source's own rank (the same
query with only that source's weight) and the query plan: generation, cache state,
candidates per source, the latency partition and the phrase-plan report. `--json`
prints the answers as they came.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, cast

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contracts.errors import OrreryError
from orrery.gen_cli import read_server_file
from orrery.startup import ExpectedFailure, load_settings

__all__ = ["Target", "explain", "overlap_at_k", "register", "search", "source_ranks", "title"]

TOPK_PATH = "/v1/external/retrieve/topk_records"
RETRIEVE_PATH = "/v1/external/retrieve"
# How deep `explain` looks for a document in one source's own ranking.
SOURCE_DEPTH = 100
SOURCES = ("lexical", "vector")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

Query = Annotated[str, typer.Argument(help="The query text")]
NamespaceOpt = Annotated[
    str, typer.Option("--namespace", "-n", envvar="ORRERY_NAMESPACE", help="Namespace")
]
ScopeOpt = Annotated[str, typer.Option("--scope", "-s", help="Scope ref (`…@gN` pins one)")]
UrlOpt = Annotated[
    str | None, typer.Option("--url", help="A running server (default: the data dir's)")
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="The data dir [ORRERY_DATA_DIR]")
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", help="API key [ORRERY_API_KEY]", envvar="ORRERY_API_KEY"),
]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="Fusion profile")]
LimitOpt = Annotated[int, typer.Option("--limit", "-k", min=1, max=1_000, help="Results")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answers as JSON")]


class Target:
    """Where requests go: a base URL (`httpx.Client`), or an in-process app."""

    def __init__(self, client: httpx.Client, where: str) -> None:
        self.client = client
        self.where = where

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(path, json=body)
        except httpx.TransportError as exc:
            raise ExpectedFailure(f"no Orrery answers at {self.where}: {exc}") from exc
        answer: dict[str, Any] = response.json()
        if response.status_code >= 400:
            error = answer.get("error", {})
            raise ExpectedFailure(
                f"{error.get('code', response.status_code)}: {error.get('message', '')}"
            )
        return answer


@contextmanager
def _target(
    url: str | None, data_dir: Path | None, key: str | None, wanted: tuple[str, str]
) -> Iterator[Target]:
    headers = {"x-api-key": key} if key else {}
    settings = load_settings(data_dir=data_dir)
    found = url or read_server_file(settings.data_dir)
    if found:
        with httpx.Client(base_url=found, headers=headers, timeout=30.0) as client:
            yield Target(client, found)
        return
    if not (settings.data_dir / "orrery.sqlite").exists():
        raise ExpectedFailure(
            f"no server runs on {settings.data_dir} and it holds no data: start "
            "`orrery serve --sample` or pass --url"
        )
    yield from _in_process(settings, headers, wanted)


def _wanted(namespace: str, scope: str, data_dir: Path | None) -> tuple[str, str]:
    """The `(namespace, snapshot kind)` a query reads, for waiting on an opened data dir."""
    from query.bootstrap import scope_registry
    from query.scopes import PIN_SEPARATOR, runtime_kind

    base = scope.partition(PIN_SEPARATOR)[0]
    try:
        kind = (
            scope_registry(load_settings(data_dir=data_dir)).target(namespace, base).snapshot_kind
        )
    except OrreryError:
        kind = runtime_kind(base) or base
    return namespace, kind


def _in_process(
    settings: Any, headers: dict[str, str], wanted: tuple[str, str]
) -> Iterator[Target]:
    """The data dir's stack in this process (it takes the data dir's lock meanwhile)."""
    from fastapi.testclient import TestClient

    from ingest.bootstrap import canonical_db_path
    from orrery.announce import searchable
    from orrery.embedded import EmbeddedStack
    from query.adapters.sqlite_routing import SqliteRecordReader

    if not SqliteRecordReader(canonical_db_path(settings.data_dir)).holds(*wanted):
        raise ExpectedFailure(
            f"{settings.data_dir} holds no records of {wanted[0]}/{wanted[1]} (namespace/"
            "snapshot kind)"
        )
    err.print(f"[dim]no server on {escape(str(settings.data_dir))}: opening it here…")
    stack = EmbeddedStack.open(settings)
    stack.start()
    try:
        deadline = time.monotonic() + 120
        while not searchable(stack.readiness(), [wanted]):
            if time.monotonic() > deadline:
                raise ExpectedFailure(f"{settings.data_dir} did not become ready in 120 s")
            time.sleep(0.1)
        with TestClient(stack.app, headers=headers) as client:
            yield Target(cast(httpx.Client, client), str(settings.data_dir))
    finally:
        stack.close()


def _request(
    query: str, namespace: str, scope: str, limit: int, profile: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": namespace,
        "scope_ref": scope,
        "query_text": query,
        "result_limit": limit,
        "include": {"content": True},
    }
    if profile:
        body["profile"] = profile
    return body


def title(result: dict[str, Any], width: int = 60) -> str:
    """A result's title: its text's title, else a summary-like payload field."""
    content = result.get("content") or {}
    payload = result.get("payload") or {}
    for value in (
        content.get("title"),
        payload.get("title"),
        payload.get("summary"),
        content.get("body"),
    ):
        if isinstance(value, str) and value.strip():
            text = " ".join(value.split())
            return text if len(text) <= width else text[: width - 1] + "…"
    return ""


def overlap_at_k(a: list[str], b: list[str], k: int) -> float:
    """|top-k(a) ∩ top-k(b)| / k."""
    if k <= 0:
        return 0.0
    return len(set(a[:k]) & set(b[:k])) / k


def source_ranks(
    target: Target, base: dict[str, Any], depth: int = SOURCE_DEPTH
) -> dict[str, dict[str, int]]:
    """Each source's own ranking of the query: `{source: {document_id: rank}}`, from the
    generic retrieve with only that source's weight (documents past `depth` absent)."""
    ranks: dict[str, dict[str, int]] = {}
    for source in SOURCES:
        weights = {f"{s}_weight": 0.0 for s in ("lexical", "vector", "freshness", "metadata")}
        weights[f"{source}_weight"] = 1.0
        body = {
            "namespace": base["namespace"],
            "scope_ref": base["scope_ref"],
            "query_text": base["query_text"],
            "limit": depth,
            "ranking": weights,
        }
        if base.get("profile"):
            body["profile"] = base["profile"]
        answer = target.post(RETRIEVE_PATH, body)
        scored = [c for c in answer["candidates"] if c["score_breakdown"][source] > 0]
        ranks[source] = {c["document_id"]: i for i, c in enumerate(scored, start=1)}
    return ranks


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _results_table(answer: dict[str, Any], ranks: dict[str, dict[str, int]] | None) -> Table:
    table = Table(
        title=(
            f"{escape(answer['scope_ref'])} · {escape(answer['generation_id'])} · "
            f"profile {escape(answer['profile'])}"
        ),
        title_justify="left",
    )
    table.add_column("rank", justify="right")
    table.add_column("id", overflow="fold")
    table.add_column("title", overflow="fold")
    table.add_column("fused", justify="right")
    table.add_column("lexical", justify="right")
    table.add_column("vector", justify="right")
    table.add_column("freshness", justify="right")
    for result in answer["results"]:
        parts = result.get("score_breakdown") or {}
        cells = [_score(parts.get(s)) for s in ("lexical", "vector", "freshness")]
        if ranks is not None:
            for i, source in enumerate(SOURCES):
                own = ranks[source].get(result["document_id"])
                cells[i] += f" (#{own})" if own else f" (>{SOURCE_DEPTH})"
        table.add_row(
            str(result["rank"]),
            escape(result["item_id"]),
            escape(title(result)),
            f"{result['score']:.3f}",
            *cells,
        )
    return table


def _compare_table(a: dict[str, Any], b: dict[str, Any], k: int) -> Table:
    ids_a = [r["document_id"] for r in a["results"]]
    ids_b = [r["document_id"] for r in b["results"]]
    by_id = {r["document_id"]: r for r in a["results"] + b["results"]}
    table = Table(
        title=(
            f"{escape(a['profile'])} vs {escape(b['profile'])} · overlap@{k} "
            f"{overlap_at_k(ids_a, ids_b, k):.2f}"
        ),
        title_justify="left",
    )
    for name in ("id", "title", a["profile"], b["profile"], "move"):
        table.add_column(escape(name), justify="right" if name not in ("id", "title") else "left")
    for doc_id in list(dict.fromkeys(ids_a + ids_b)):
        ra = ids_a.index(doc_id) + 1 if doc_id in ids_a else None
        rb = ids_b.index(doc_id) + 1 if doc_id in ids_b else None
        if ra is None:
            move = "[green]new"
        elif rb is None:
            move = "[red]gone"
        elif rb < ra:
            move = f"[green]↑{ra - rb}"
        elif rb > ra:
            move = f"[red]↓{rb - ra}"
        else:
            move = "="
        table.add_row(
            escape(by_id[doc_id]["item_id"]),
            escape(title(by_id[doc_id], 40)),
            str(ra or "–"),
            str(rb or "–"),
            move,
        )
    return table


def _plan_lines(answer: dict[str, Any]) -> list[str]:
    plan = answer.get("query_plan") or {}
    latency = plan.get("latency_ms") or {}
    stages = [k for k in latency if k != "total"]
    total = latency.get("total", 0.0)
    lines = [
        f"generation {plan.get('generation_id')} (applied position "
        f"{plan.get('applied_position')}), profile {plan.get('profile')}, cache "
        f"{plan.get('cache')}",
        f"candidates: {plan.get('candidate_count')} "
        f"({', '.join(f'{k} {v}' for k, v in (plan.get('source_counts') or {}).items())}), "
        f"reranked {plan.get('reranked_count')}, indexes {', '.join(plan.get('indexes_used', []))}",
        f"latency {total:.2f} ms: "
        + ", ".join(f"{s} {latency[s]:.2f}" for s in stages if latency.get(s)),
    ]
    phrase = plan.get("phrase_plan")
    if phrase:
        lines.append(f"phrase plan: {json.dumps(phrase, ensure_ascii=False)}")
    return lines


def _run(
    query: str,
    namespace: str,
    scope: str,
    url: str | None,
    data_dir: Path | None,
    key: str | None,
    profile: str | None,
    compare: str | None,
    limit: int,
    as_json: bool,
    *,
    explain_ranks: bool,
) -> None:
    with _target(url, data_dir, key, _wanted(namespace, scope, data_dir)) as target:
        body = _request(query, namespace, scope, limit, profile)
        answer = target.post(TOPK_PATH, body)
        other = (
            target.post(TOPK_PATH, _request(query, namespace, scope, limit, compare))
            if compare
            else None
        )
        ranks = source_ranks(target, body) if explain_ranks else None
    if as_json:
        doc: dict[str, Any] = {"answer": answer}
        if other is not None:
            ids_a = [r["document_id"] for r in answer["results"]]
            ids_b = [r["document_id"] for r in other["results"]]
            doc["compare"] = other
            doc["overlap_at_k"] = overlap_at_k(ids_a, ids_b, limit)
        if ranks is not None:
            doc["source_ranks"] = ranks
        print(json.dumps(doc if (other or ranks) else answer, ensure_ascii=False, indent=2))
        return
    if not answer["results"]:
        out.print(f"no results in {escape(answer['scope_ref'])} ({answer['generation_id']})")
    else:
        out.print(_results_table(answer, ranks))
    if other is not None:
        out.print(_compare_table(answer, other, limit))
    if explain_ranks:
        for line in _plan_lines(answer):
            out.print(escape(line), highlight=False)


def search(
    query: Query,
    namespace: NamespaceOpt = "demo",
    scope: ScopeOpt = "longterm:objects:current",
    url: UrlOpt = None,
    data_dir: DataDirOpt = None,
    key: KeyOpt = None,
    profile: ProfileOpt = None,
    compare: Annotated[
        str | None, typer.Option("--compare", help="A second profile, side by side")
    ] = None,
    limit: LimitOpt = 10,
    as_json: JsonOpt = False,
) -> None:
    """Search from the terminal: a table of the top results with their fused score and
    its parts (a running server: --url or the data dir's; else the data dir itself)."""
    _run(
        query, namespace, scope, url, data_dir, key, profile, compare, limit, as_json,
        explain_ranks=False,
    )  # fmt: skip


def explain(
    query: Query,
    namespace: NamespaceOpt = "demo",
    scope: ScopeOpt = "longterm:objects:current",
    url: UrlOpt = None,
    data_dir: DataDirOpt = None,
    key: KeyOpt = None,
    profile: ProfileOpt = None,
    limit: LimitOpt = 10,
    as_json: JsonOpt = False,
) -> None:
    """`search`, plus each source's own rank of every result and the query plan
    (generation, cache, candidates per source, latency per stage, phrase plan)."""
    _run(
        query, namespace, scope, url, data_dir, key, profile, None, limit, as_json,
        explain_ranks=True,
    )  # fmt: skip


def register(command: Callable[..., Any]) -> None:
    """Add `search` and `explain` to the CLI (`command` is `app.command`)."""
    command("search")(search)
    command("explain")(explain)
