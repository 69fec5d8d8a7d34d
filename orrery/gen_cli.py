"""`orrery gen …`: build, verify, promote, roll back, retire and collect generations.

Where a command runs:
- `--url URL` (or a running server found through `DATA_DIR/server.json`, which
  `orrery serve` writes at start and removes at exit): over the server's admin API
  (`/v1/admin/generations…`, key from `--admin-key` / `ORRERY_ADMIN_KEY`). qdrant-edge
  allows one process per shard directory and tantivy one writer per index, so while
  `orrery serve` runs on a data directory this is the only way in.
- otherwise directly on `--data-dir` (embedded) or on the servers named in the settings
  (`ORRERY_MODE=servers`): the command takes the data directory's operator lock (a
  server starting meanwhile refuses to), and runs the projector itself while it waits
  for a build to catch up with the log.

A composition root (import-linter allows its imports of `projector`); the projector's
modules are imported only when a command runs directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from contracts.admin import BuildRequest, RollbackRequest
from contracts.errors import ErrorCode, OrreryError
from contracts.qualification import QualifyRequest
from query.settings import QuerySettings

__all__ = [
    "SERVER_FILE",
    "gen_app",
    "read_server_file",
    "remove_server_file",
    "write_server_file",
]

SERVER_FILE = "server.json"
ADMIN_PREFIX = "/v1/admin/generations"

gen_app = typer.Typer(
    name="gen",
    help="Build, verify, promote, roll back, retire and collect index generations.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)
out = Console()

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="The embedded data directory [ORRERY_DATA_DIR]"),
]
Url = Annotated[
    str | None,
    typer.Option("--url", help="A running server's base URL (default: DATA_DIR/server.json)"),
]
AdminKey = Annotated[
    str | None,
    typer.Option("--admin-key", help="The admin API key [ORRERY_ADMIN_KEY]", show_default=False),
]
Mode = Annotated[str | None, typer.Option("--mode", help="embedded or servers [ORRERY_MODE]")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts)")]


# -- server.json ----------------------------------------------------------------------------


def write_server_file(settings: QuerySettings) -> Path:
    """Tell `orrery gen` where the server of this data directory listens (`orrery serve`
    only: it creates the data directory when server mode on PostgreSQL did not need it)."""
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    path = settings.data_dir / SERVER_FILE
    body = {
        "url": f"http://{host}:{settings.port}",
        "host": settings.host,
        "port": settings.port,
        "pid": os.getpid(),
        "mode": settings.mode,
        "started_at": datetime.now(UTC).isoformat(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def remove_server_file(settings: QuerySettings) -> None:
    """Remove `server.json` if this process wrote it."""
    info = _load_server_file(settings.data_dir)
    if info is not None and info.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            (settings.data_dir / SERVER_FILE).unlink()


def _load_server_file(data_dir: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((data_dir / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def read_server_file(data_dir: Path) -> str | None:
    """The URL of the server running on `data_dir`, if its process is alive."""
    info = _load_server_file(data_dir)
    if info is None or not isinstance(info.get("pid"), int):
        return None
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    url = info.get("url")
    return url if isinstance(url, str) else None


# -- the two ways to reach the lifecycle ----------------------------------------------------

ProgressFn = Callable[[str, int, int], None]


class Admin(Protocol):
    """What every command needs; answers are JSON-ready dicts."""

    def rows(self, namespace: str | None, snapshot_kind: str | None) -> list[dict[str, Any]]: ...

    def show(self, generation_id: str) -> dict[str, Any]: ...

    def call(
        self,
        action: str,
        generation_id: str | None,
        body: dict[str, Any],
        progress: ProgressFn | None = None,
    ) -> Any: ...

    def build(self, request: BuildRequest, progress: ProgressFn, detach: bool) -> str: ...

    def close(self) -> None: ...


class HttpAdmin:
    """The admin API of a running server."""

    def __init__(self, url: str, admin_key: str) -> None:
        if not admin_key:
            raise OrreryError(
                ErrorCode.UNAUTHORIZED,
                f"a server runs at {url}: pass --admin-key or set ORRERY_ADMIN_KEY",
            )
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            headers={"x-admin-key": admin_key},
            timeout=httpx.Timeout(600.0, connect=5.0),
            trust_env=False,
        )

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._client.request(method, ADMIN_PREFIX + path, json=body)
        except httpx.HTTPError as exc:
            raise OrreryError(
                ErrorCode.DEPENDENCY_UNAVAILABLE, f"cannot reach {self.url}: {exc}"
            ) from exc
        try:
            payload = response.json()
        except ValueError as exc:
            raise OrreryError(
                ErrorCode.INTERNAL, f"{self.url} answered {response.status_code} without JSON"
            ) from exc
        if response.is_error or not payload.get("success", False):
            error = payload.get("error") or {}
            code = error.get("code", "internal")
            raise OrreryError(
                ErrorCode(code) if code in ErrorCode.__members__.values() else ErrorCode.INTERNAL,
                str(error.get("message", response.text)),
                dict(error.get("details") or {}),
            )
        return payload

    def rows(self, namespace: str | None, snapshot_kind: str | None) -> list[dict[str, Any]]:
        params = {
            k: v for k, v in (("namespace", namespace), ("snapshot_kind", snapshot_kind)) if v
        }
        query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        return list(self._request("GET", query)["generations"])

    def show(self, generation_id: str) -> dict[str, Any]:
        body = dict(self._request("GET", f"/{generation_id}"))
        body.pop("success", None)
        return body

    def call(
        self,
        action: str,
        generation_id: str | None,
        body: dict[str, Any],
        progress: ProgressFn | None = None,
    ) -> Any:
        path = f"/{generation_id}/{action}" if generation_id else f"/{action}"
        payload = dict(self._request("POST", path, body))
        payload.pop("success", None)
        return payload

    def build(self, request: BuildRequest, progress: ProgressFn, detach: bool) -> str:
        started = self._request("POST", "/build", request.model_dump(mode="json"))
        generation_id = str(started["row"]["generation_id"])
        if detach:
            return generation_id
        while True:
            view = self.show(generation_id)
            job = view.get("build") or {}
            if job:
                progress(str(job["phase"]), int(job["done"]), int(job["total"]))
            if view["row"]["state"] != "building":
                return generation_id
            if job.get("phase") in ("failed", "aborted"):
                return generation_id
            time.sleep(0.3)

    def close(self) -> None:
        self._client.close()


@dataclass
class DirectAdmin:
    """The lifecycle in this process, on the data directory (or the configured servers)."""

    admin: Any
    closers: list[Callable[[], None]]

    @classmethod
    def open(cls, settings: QuerySettings) -> DirectAdmin:
        if settings.mode == "servers":
            return cls._open_servers(settings)
        return cls._open_embedded(settings)

    @classmethod
    def _open_embedded(cls, settings: QuerySettings) -> DirectAdmin:
        from ingest.bootstrap import canonical_db_path
        from orrery.embedded import ORPHANED_BUILD, generation_options
        from projector.bootstrap import (
            default_embedder,
            embedded_generation_admin,
            embedded_projector,
            operator_lock,
        )

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        lock = operator_lock(settings.data_dir)
        lock.acquire()
        closers: list[Callable[[], None]] = [lock.release]
        try:
            db_path = canonical_db_path(settings.data_dir)
            projector = embedded_projector(
                settings.data_dir,
                db_path,
                embedder=default_embedder(settings.embedder_threads, settings.embedding_cache_dir),
                batch_size=settings.projector_batch_size,
                text_languages=settings.text_languages(),
            )
            closers.insert(0, projector.close)
            for generation_id in projector.state.fail_orphaned_builds(
                ORPHANED_BUILD, older_than=None
            ):
                console.print(f"[yellow]{generation_id}: {ORPHANED_BUILD}; marked failed")
            admin = embedded_generation_admin(
                projector,
                db_path,
                drive_log=lambda: projector.step().events > 0,
                options=generation_options(settings),
            )
            closers.insert(0, admin.close)
        except BaseException:
            for close in closers:
                close()
            raise
        return cls(admin, closers)

    @classmethod
    def _open_servers(cls, settings: QuerySettings) -> DirectAdmin:
        from ingest.bootstrap import canonical_db_path
        from orrery.embedded import generation_options
        from orrery.servers import migrate_all, qdrant_client
        from projector.bootstrap import (
            default_embedder,
            server_generation_admin,
            writer_lock_path,
        )
        from query.bootstrap import (
            cursor_codec,
            scope_registry,
            server_qualifier,
            server_query_ports,
        )

        if settings.database_url:
            migrate_all(settings.database_url)
        embedder = default_embedder(settings.embedder_threads, settings.embedding_cache_dir)
        qdrant = qdrant_client(settings)
        # The query side a qualification runs through (no response cache, no gate).
        ports, close_ports = server_query_ports(
            canonical_db_path(settings.data_dir),
            embedder=embedder,
            opensearch_url=settings.opensearch_url,
            opensearch_index_prefix=settings.opensearch_index_prefix,
            qdrant=qdrant,
            qdrant_collection_prefix=settings.qdrant_collection_prefix,
            redis_url=None,
            cache_responses=False,
            scopes=scope_registry(settings),
            cursors=cursor_codec(settings),
            database_url=settings.database_url,
            opensearch_search_type=settings.opensearch_search_type,
            vector_hnsw_ef=settings.vector_hnsw_ef,
            vector_spread_ef_factor=settings.vector_spread_ef_factor,
            vector_spread_acorn_selectivity=settings.vector_spread_acorn_selectivity,
        )
        admin, close = server_generation_admin(
            canonical_db_path(settings.data_dir),
            projector=None,
            embedder=embedder,
            lock_path=writer_lock_path(settings.data_dir),
            opensearch_url=settings.opensearch_url,
            opensearch_index_prefix=settings.opensearch_index_prefix,
            opensearch_refresh_interval=settings.opensearch_refresh_interval,
            qdrant=qdrant,
            qdrant_collection_prefix=settings.qdrant_collection_prefix,
            drive_log=None,
            options=generation_options(settings, ordered_log=False),
            text_languages=settings.text_languages(),
            database_url=settings.database_url,
            index_shape=settings.index_shape,
            qualify=server_qualifier(settings, ports, qdrant=qdrant),
        )
        return cls(admin, [close, close_ports])

    def rows(self, namespace: str | None, snapshot_kind: str | None) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in self.admin.rows(namespace, snapshot_kind)]

    def show(self, generation_id: str) -> dict[str, Any]:
        return dict(self.admin.view(generation_id).model_dump(mode="json"))

    def call(
        self,
        action: str,
        generation_id: str | None,
        body: dict[str, Any],
        progress: ProgressFn | None = None,
    ) -> Any:
        admin = self.admin
        if action == "verify":
            check = admin.verify(generation_id, progress)
            state = admin.view(generation_id).row.state.value
            return {"verified": check.ok, "state": state, "check": check.model_dump(mode="json")}
        if action == "promote":
            return {"report": admin.promote(generation_id).model_dump(mode="json")}
        if action == "qualify":
            receipt = admin.qualify(generation_id, QualifyRequest.model_validate(body))
            return {"receipt": receipt.model_dump(mode="json")}
        if action == "rollback":
            report = admin.rollback(RollbackRequest.model_validate(body))
            return {"report": report.model_dump(mode="json")}
        if action == "retire":
            return {"descriptor": admin.retire(generation_id).model_dump(mode="json")}
        if action == "abort":
            return {"descriptor": admin.abort(generation_id).model_dump(mode="json")}
        if action == "gc":
            return {"report": admin.gc(int(body.get("keep", 1))).model_dump(mode="json")}
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"unknown action {action!r}")

    def build(self, request: BuildRequest, progress: ProgressFn, detach: bool) -> str:
        from projector.generations import BuildControl

        control = BuildControl(progress=progress)
        descriptor = self.admin.build(request, control)
        return str(descriptor.generation_id)

    def close(self) -> None:
        for close in self.closers:
            close()


def _settings(data_dir: Path | None, mode: str | None) -> QuerySettings:
    # Validated with the overrides: `--mode` changes the deployment's defaults.
    updates: dict[str, Any] = {
        k: v for k, v in (("data_dir", data_dir), ("mode", mode)) if v is not None
    }
    return QuerySettings(**updates)


@contextlib.contextmanager
def _admin(
    data_dir: Path | None, url: str | None, admin_key: str | None, mode: str | None
) -> Iterator[Admin]:
    """The admin of `--url`, else of the server running on the data dir, else direct.

    Any `OrreryError` becomes a red message and exit status 1."""
    settings = _settings(data_dir, mode)
    key = admin_key if admin_key is not None else settings.admin_key
    admin: Admin | None = None
    try:
        found = url or read_server_file(settings.data_dir)
        admin = HttpAdmin(found, key) if found else DirectAdmin.open(settings)
        yield admin
    except OrreryError as exc:
        console.print(f"[red]{exc.code.value}: {escape(exc.message)}")
        if exc.details:
            console.print_json(json.dumps(exc.details, default=str))
        raise typer.Exit(1) from exc
    finally:
        if admin is not None:
            admin.close()


# -- output ---------------------------------------------------------------------------------


def _emit(value: Any, as_json: bool, human: Callable[[], None]) -> None:
    if as_json:
        out.print_json(json.dumps(value, default=str))
    else:
        human()


@contextlib.contextmanager
def _progress(what: str) -> Iterator[ProgressFn]:
    """A rich progress bar; the callback takes `(phase, done, total)` and shows a rate."""
    started = time.monotonic()
    phase_started: dict[str, float] = {}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(what, total=None, rate="")

        def update(phase: str, done: int, total: int) -> None:
            # A build's rate is over its load phase, a verify's over the whole read-back.
            since = phase_started.setdefault(phase, time.monotonic())
            elapsed = max(time.monotonic() - (since if phase == "load" else started), 1e-3)
            rate = f"{done / elapsed:,.0f} docs/s" if total > 1 and done else ""
            bar.update(
                task,
                description=f"{what}: {phase}",
                completed=done,
                total=total or None,
                rate=rate,
            )

        yield update
        bar.update(task, description=f"{what}: done in {time.monotonic() - started:.1f}s")


def _rows_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(show_header=True, header_style="bold")
    for column in ("id", "scope", "state", "live", "docs", "applied", "descriptor"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["generation_id"],
            f"{row['namespace']}/{row['snapshot_kind']}",
            row["state"],
            "*" if row["live"] else "",
            str(row["document_count"]),
            str(row["applied_position"]),
            str(row["descriptor_digest"])[:12],
        )
    return table


def _print_check(check: dict[str, Any]) -> None:
    for engine in [*check["engines"], *([check["coverage"]] if check.get("coverage") else [])]:
        mark = "[green]ok" if engine["matches"] else "[red]MISMATCH"
        out.print(
            f"  {engine['engine']:<12} {engine['document_count']:>8} docs  "
            f"{engine['id_set_digest'][:16]}  {mark}"
        )
        for label in ("missing", "unexpected", "stale"):
            if engine.get(f"{label}_count"):
                sample = ", ".join(engine[label][:5])
                out.print(f"    {engine[f'{label}_count']} {label}: {sample}")
    out.print(
        f"  expected     {check['expected_count']:>8} docs  {check['expected_digest'][:16]}"
        f"  at position {check['applied_position']}"
    )


# -- commands -------------------------------------------------------------------------------


@gen_app.command("list")
def list_generations(
    namespace: Annotated[str | None, typer.Option(help="Only this namespace")] = None,
    snapshot_kind: Annotated[str | None, typer.Option(help="Only this snapshot kind")] = None,
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
    ids: Annotated[
        bool, typer.Option("--ids", help="Only the generation ids, oldest first, one a line")
    ] = False,
) -> None:
    """The registry rows (`--json`: as JSON; `--ids`: the ids only, for scripts:
    `NEW=$(orrery gen list --namespace demo --snapshot-kind objects --ids | tail -1)`)."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        rows = admin.rows(namespace, snapshot_kind)
    if ids:
        for row in sorted(rows, key=lambda r: (str(r["created_at"]), r["generation_id"])):
            print(row["generation_id"])
        return
    _emit(rows, as_json, lambda: out.print(_rows_table(rows)))


@gen_app.command()
def show(
    generation_id: Annotated[str, typer.Argument(help="Generation id, e.g. g3")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """The full descriptor, the row and recent evidence checks (`--json`: as JSON)."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        view = admin.show(generation_id)

    def human() -> None:
        row, descriptor = view["row"], view["descriptor"]
        out.print(_rows_table([row]))
        out.print(f"descriptor {descriptor['descriptor_digest']}")
        if descriptor.get("source_manifest"):
            manifest = descriptor["source_manifest"]
            out.print(
                f"built from position {manifest['high_water']}: {manifest['document_count']} "
                f"documents, id set {manifest['id_set_digest'][:16]}"
            )
        out.print(
            f"sealed evidence: {descriptor['document_count']} documents at position "
            f"{descriptor['applied_position']}, id set {descriptor['id_set_digest'][:16]}"
        )
        for change in descriptor["history"]:
            out.print(f"  {change['at']}  {change['state']:<9} {change['reason']}")
        for check in view.get("checks", [])[:1]:
            out.print(f"latest check ({check['kind']}, ok={check['ok']}): {check['reason']}")
            _print_check(check)
        topology = descriptor["topology"]
        out.print(f"topology: {topology['shards']} shard(s), {topology['replicas']} replica(s)")
        for receipt in view.get("receipts", [])[:1]:
            current = receipt["descriptor_digest"] == descriptor["descriptor_digest"]
            out.print(
                f"latest receipt {receipt['receipt_id'][:16]}: passed={receipt['passed']}"
                f"{'' if current else ' (for an older descriptor)'}"
            )

    _emit(view, as_json, human)


@gen_app.command()
def build(
    namespace: Annotated[str, typer.Argument(help="Namespace")],
    snapshot_kind: Annotated[str, typer.Argument(help="Snapshot kind, e.g. objects")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Over HTTP: return once the build started")
    ] = False,
    shards: Annotated[
        int | None, typer.Option(help="Shards of the new generation (server mode)")
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(help="Extra copies of each shard (server mode)")
    ] = None,
    allow_empty: Annotated[
        bool,
        typer.Option("--allow-empty", help="Build even a scope that never held a record"),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Build a new generation from the canonical snapshot, catch up with the log, seal it.

    The projector dual-writes new events into it meanwhile. Exit status 1 unless sealed;
    a scope that never held a record is refused unless --allow-empty.
    `--shards` / `--replicas` override ORRERY_INDEX_SHARDS / ORRERY_INDEX_REPLICAS.
    """
    request = BuildRequest(
        namespace=namespace,
        snapshot_kind=snapshot_kind,
        shards=shards,
        replicas=replicas,
        allow_empty=allow_empty,
    )
    with _admin(data_dir, url, admin_key, mode) as admin:
        try:
            with _progress("build") as progress:
                generation_id = admin.build(request, progress, detach)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted (a build running in a server goes on)")
            raise typer.Exit(130) from None
        view = admin.show(generation_id)
    state = view["row"]["state"]
    _emit(view, as_json, lambda: out.print(_rows_table([view["row"]])))
    if state != "sealed" and not (detach and state == "building"):
        reason = view["descriptor"]["history"][-1]["reason"]
        console.print(f"[red]{generation_id} is {state}: {reason}")
        raise typer.Exit(1)


@gen_app.command()
def verify(
    generation_id: Annotated[str, typer.Argument(help="Generation id")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Read the generation back from every engine and compare it with its evidence and
    the canonical store. Exit status 1 when it does not match (it is then failed)."""
    with (
        _admin(data_dir, url, admin_key, mode) as admin,
        _progress(f"verify {generation_id}") as progress,
    ):
        result = admin.call("verify", generation_id, {}, progress)
    check = result["check"]

    def human() -> None:
        colour = "green" if result["verified"] else "red"
        out.print(
            f"[{colour}]{generation_id}: verified={result['verified']} state={result['state']}"
            f"[/] ({check['seconds']:.2f}s, "
            f"{check['expected_count'] / max(check['seconds'], 1e-9):,.0f} docs/s per engine)"
        )
        if check["reason"]:
            out.print(f"  {check['reason']}")
        _print_check(check)

    _emit(result, as_json, human)
    if not result["verified"]:
        raise typer.Exit(1)


@gen_app.command()
def qualify(
    generation_id: Annotated[str, typer.Argument(help="A sealed, verified or live generation")],
    queries: Annotated[
        Path | None,
        typer.Option(help="Query texts, one a line (default: a sample of document titles)"),
    ] = None,
    sample_size: Annotated[
        int | None, typer.Option(help="Queries to sample (default ORRERY_QUALIFY_QUERIES)")
    ] = None,
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Compare the generation's production search with a global reference (a 1-shard
    copy, exact vectors) over a sample, and store the receipt a promote of a sharded or
    replicated generation needs. Exit status 1 when the receipt does not pass."""
    body: dict[str, Any] = {}
    if queries is not None:
        lines = [line.strip() for line in queries.read_text(encoding="utf-8").splitlines()]
        body["queries"] = [line for line in lines if line]
    if sample_size is not None:
        body["sample_size"] = sample_size
    QualifyRequest.model_validate(body)
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("qualify", generation_id, body)
    receipt = result["receipt"]

    def human() -> None:
        colour = "green" if receipt["passed"] else "red"
        out.print(
            f"[{colour}]{generation_id}: passed={receipt['passed']}[/] receipt "
            f"{receipt['receipt_id']} ({receipt['sample_size']} queries, "
            f"{receipt['shards']} shard(s), {receipt['replicas']} replica(s), "
            f"{receipt['seconds']:.1f}s)"
        )
        for figures in receipt["slices"]:
            sources = ", ".join(
                f"{name} inclusion {f['inclusion_mean']}/{f['inclusion_min']} (cap {f['cap']})"
                for name, f in figures["sources"].items()
                if f["inclusion_mean"] is not None
            )
            out.print(f"  {figures['slice']}: {figures['queries']} queries; {sources}")
            for profile, f in figures["profiles"].items():
                out.print(
                    f"    {profile}: overlap {f['overlap_mean']}/{f['overlap_min']}, order "
                    f"{f['order_agreement_mean']}/{f['order_agreement_min']}"
                )
        for failure in receipt["failures"]:
            out.print(f"  [red]{failure}")

    _emit(result, as_json, human)
    if not receipt["passed"]:
        raise typer.Exit(1)


def _report(result: dict[str, Any], as_json: bool) -> None:
    report = result["report"]

    def human() -> None:
        out.print(
            f"{report['action']}: {report['namespace']}/{report['snapshot_kind']} now reads "
            f"{report['generation_id']} (was {report['previous_generation_id']}; flip "
            f"{report['flip_ms']:.2f} ms, lag {report['lag_events']} events)"
        )
        for engine, what in report["aliases"].items():
            out.print(f"  alias {engine}: {what}")

    _emit(result, as_json, human)


@gen_app.command()
def promote(
    generation_id: Annotated[str, typer.Argument(help="A verified generation")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Make a verified, caught-up generation live (one atomic pointer write), then mirror
    native aliases. The previous live generation stays verified (rollback target)."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("promote", generation_id, {})
    _report(result, as_json)


@gen_app.command()
def rollback(
    namespace: Annotated[str, typer.Argument(help="Namespace")],
    snapshot_kind: Annotated[str, typer.Argument(help="Snapshot kind")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Point the scope back at its previous verified generation."""
    body = {"namespace": namespace, "snapshot_kind": snapshot_kind}
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("rollback", None, body)
    _report(result, as_json)


@gen_app.command()
def retire(
    generation_id: Annotated[str, typer.Argument(help="A generation that is not live")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Stop writing a generation; `gc` drops its engine indexes later."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("retire", generation_id, {})
    _emit(result, as_json, lambda: out.print(f"{generation_id} retired"))


@gen_app.command()
def abort(
    generation_id: Annotated[str, typer.Argument(help="A building generation")],
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Stop a build; its generation becomes failed (never promotable)."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("abort", generation_id, {})
    state = result["descriptor"]["state"]
    _emit(result, as_json, lambda: out.print(f"{generation_id} is {state}"))


@gen_app.command()
def gc(
    keep: Annotated[int, typer.Option("--keep", min=0, help="Retired generations kept")] = 1,
    data_dir: DataDir = None,
    url: Url = None,
    admin_key: AdminKey = None,
    mode: Mode = None,
    as_json: AsJson = False,
) -> None:
    """Drop the engine indexes of failed generations and of retired ones beyond the
    `--keep` newest per scope."""
    with _admin(data_dir, url, admin_key, mode) as admin:
        result = admin.call("gc", None, {"keep": keep})
    report = result["report"]
    _emit(
        result,
        as_json,
        lambda: out.print(
            f"dropped: {', '.join(report['dropped']) or '-'}; kept: "
            f"{', '.join(report['kept']) or '-'}"
        ),
    )
