"""The `orrery` command line (composition root for the embedded deployment)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from contracts.errors import OrreryError
from contracts.gc_tuning import tune_gc
from contracts.malloc import tune_malloc
from contracts.records import Record
from ingest.bootstrap import canonical_db_path, embedded_store
from ingest.sample import SAMPLE_NAMESPACE, sample_queries, sample_records
from ingest.service import write_records
from orrery.announce import Announcer
from orrery.gen_cli import gen_app, remove_server_file, write_server_file
from orrery.http_protocol import bounded_httptools
from orrery.search_cli import register as register_search
from orrery.startup import (
    ExpectedFailure,
    bind_socket,
    check_bind,
    check_config,
    load_settings,
    report,
)
from query.settings import QuerySettings

__all__ = ["app", "main"]

app = typer.Typer(
    name="orrery",
    help="Fast, explainable hybrid retrieval over a canonical record store.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        print(f"orrery {package_version('orrery')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version"),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Tracebacks for expected failures too [ORRERY_DEBUG]"),
    ] = False,
) -> None:
    """Fast, explainable hybrid retrieval over a canonical record store."""
    if debug:
        os.environ["ORRERY_DEBUG"] = "1"


app.add_typer(gen_app, name="gen")
register_search(app.command)
db_app = typer.Typer(help="The PostgreSQL canonical store (server mode).", no_args_is_help=True)
app.add_typer(db_app, name="db")

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Where the embedded stack keeps its data [ORRERY_DATA_DIR]"),
]


def _settings(**overrides: object) -> QuerySettings:
    return load_settings(**overrides)


def _check_bind(settings: QuerySettings) -> None:
    check_config(settings)
    check_bind(settings)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
    )


Mode = Annotated[
    str | None,
    typer.Option("--mode", help="embedded (default) or servers [ORRERY_MODE]"),
]
Host = Annotated[str | None, typer.Option(help="Bind address [ORRERY_HOST]")]
Port = Annotated[int | None, typer.Option(help="Port [ORRERY_PORT]")]


def _serve_http(app: Any, settings: QuerySettings, sock: socket.socket | None = None) -> None:
    """Serve `app` on `sock` (bound by `bind_socket`, so a port in use was one line
    before anything started) or on the settings' address."""
    if sock is None:
        sock = bind_socket(settings.host, settings.port)
    # uvloop + httptools by name (both are dependencies): uvicorn's "auto" would pick
    # them only where installed, so the same release would serve differently.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,  # INFO lines, never shown at "warning": not even formatted
        loop="uvloop",
        # httptools with a bound on each request's head (uvicorn bounds it for h11 only).
        http=bounded_httptools(settings.max_header_bytes, settings.max_headers),
    )
    uvicorn.Server(config).run(sockets=[sock])


def _logging(role: str = "serve") -> None:
    """Logs as `ORRERY_LOG_FORMAT` / `ORRERY_LOG_LEVEL` say (`orrery.logs`)."""
    from orrery.logs import configure_logging

    try:
        settings = QuerySettings()
    except ValidationError:
        # A bad setting: logged with the defaults, and reported in one line (exit 2) by
        # the command's own settings check right after.
        configure_logging(role=role)
        return
    configure_logging(settings.log_format, settings.log_level, role)


@app.command()
def serve(
    data_dir: DataDir = None,
    host: Host = None,
    port: Port = None,
    mode: Mode = None,
    sample: Annotated[bool, typer.Option("--sample", help="Load the sample corpus")] = False,
    roles: Annotated[
        str | None,
        typer.Option(help="servers mode: a subset of ingest,relay,projector,query (default all)"),
    ] = None,
) -> None:
    """Run every role in one process: ingest API, relay/projector loop and query worker
    (embedded: SQLite + tantivy + qdrant-edge; servers: Kafka + OpenSearch + Qdrant +
    Redis)."""
    began = time.monotonic()
    _logging()
    settings = _settings(data_dir=data_dir, host=host, port=port, mode=mode)
    # Before the stack starts its threads: an arena made already stays.
    tune_malloc(settings.malloc_arenas)
    _check_bind(settings)
    readiness: Callable[[], dict[str, Any]] | None
    if settings.mode == "servers":
        from orrery.servers import Role

        servers = _open_servers(settings, frozenset(Role))
        store, wake, app_, readiness = (
            servers.store,
            servers.relay.wake if servers.relay else None,
            servers.app,
            servers.readiness,
        )
        start, close = servers.start, servers.close
    else:
        from orrery.embedded import EmbeddedStack

        embedded = EmbeddedStack.open(settings)
        store, wake, app_ = embedded.store, embedded.loop.wake, embedded.app
        readiness = embedded.readiness
        start, close = embedded.start, embedded.close
    assert store is not None and app_ is not None
    try:
        sock = bind_socket(settings.host, settings.port)
    except BaseException:
        close()
        raise
    tune_gc()
    start()
    announcer = None
    try:
        wanted: set[tuple[str, str]] = set()
        if sample:
            records = sample_records()
            outcome = write_records(records, store=store, on_commit=wake)
            wanted = {(r.namespace, r.snapshot_kind) for r in records}
            console.print(
                f"sample corpus: {outcome.accepted} records written, "
                f"{outcome.rejected} already present (namespace {SAMPLE_NAMESPACE!r})"
            )
        base = f"http://{_url_host(settings.host)}:{settings.port}"
        console.print(
            f"Orrery ({settings.mode}) is starting on {base} (data: {settings.data_dir}); indexing…"
        )
        announcer = Announcer(
            readiness, wanted, began=began, announce=lambda s: _announce(settings, base, s)
        )
        announcer.start()
        # `orrery gen` finds this server (and its admin API) through this file.
        write_server_file(settings)
        _serve_http(app_, settings, sock)
    finally:
        if announcer is not None:
            announcer.stop()
        remove_server_file(settings)
        close()


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _announce(settings: QuerySettings, base: str, seconds: float) -> None:
    """The banner, once what `serve` loaded is searchable."""
    example = sample_queries()[0]
    body = json.dumps(
        {
            "namespace": SAMPLE_NAMESPACE,
            "scope_ref": example["scope_ref"],
            "query_text": example["query_text"],
            "result_limit": 3,
        },
        ensure_ascii=False,
    )
    console.print(
        f"[bold green]Orrery ({settings.mode}) is serving on {escape(base)}[/] — searchable "
        f"after {seconds:.1f} s"
    )
    console.print(f"  explain:   {escape(base)}/ui", highlight=False)
    console.print(
        f"  search:    orrery search --url {escape(base)} {escape(repr(example['query_text']))}",
        highlight=False,
    )
    console.print(f"  readiness: curl {escape(base)}/v1/readiness", highlight=False)
    console.print(
        f"  query:     curl -s {escape(base)}/v1/external/retrieve/topk_records "
        f"-H 'content-type: application/json' -d '{escape(body)}'",
        highlight=False,
    )


def _open_servers(settings: QuerySettings, roles: frozenset[Any]) -> Any:
    """The server-mode stack; a setting that cannot work across machines is one line."""
    from orrery.servers import ServerStack, check_settings

    try:
        check_settings(settings, roles)
    except ValueError as exc:
        raise ExpectedFailure(str(exc)) from exc
    return ServerStack.open(settings, roles)


def _run_role(role_names: list[str], settings: QuerySettings, *, http: bool) -> None:
    from orrery.servers import Role

    check_config(settings)
    tune_malloc(settings.malloc_arenas)
    stack = _open_servers(settings, frozenset(Role(r) for r in role_names))
    tune_gc()
    stack.start()
    try:
        if http:
            assert stack.app is not None
            _serve_http(stack.app, settings)
        else:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            console.print(f"orrery {', '.join(role_names)} running (server mode); Ctrl-C stops")
            stop.wait()
    finally:
        stack.close()


@app.command()
def relay(data_dir: DataDir = None) -> None:
    """Server mode: publish the canonical outbox to Kafka (marks rows after the ack)."""
    _logging("relay")
    _run_role(["relay"], _settings(data_dir=data_dir, mode="servers"), http=False)


@app.command()
def project(
    data_dir: DataDir = None,
    dead_letters: Annotated[
        bool,
        typer.Option(
            "--dead-letters",
            help="Print the parked undecodable events (JSON lines, raw bytes base64) and exit",
        ),
    ] = False,
    limit: Annotated[int, typer.Option(help="At most this many dead letters")] = 100,
    redrive: Annotated[
        bool,
        typer.Option(
            "--redrive",
            help="Write each dead-lettered record again as its next revision (after a fix), "
            "print the outcomes (JSON lines) and exit",
        ),
    ] = False,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Only this namespace's dead letters")
    ] = None,
) -> None:
    """Server mode: consume Kafka into OpenSearch + Qdrant generations."""
    if dead_letters:
        settings = _settings(data_dir=data_dir)
        for letter in _dead_letters(settings, limit, namespace):
            print(json.dumps(letter, ensure_ascii=False))
        return
    if redrive:
        for outcome in _redrive(_settings(data_dir=data_dir), limit, namespace):
            print(json.dumps(dataclasses.asdict(outcome), ensure_ascii=False))
        return
    _logging("projector")
    _run_role(["projector"], _settings(data_dir=data_dir, mode="servers"), http=False)


def _dead_letters(
    settings: QuerySettings, limit: int, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The projector's parked messages, from PostgreSQL with a URL, else the SQLite file."""
    if settings.database_url:
        from query.adapters.postgres_routing import PostgresRouting, open_reads

        reads = open_reads(settings.database_url, pool_size=1)
        try:
            return PostgresRouting(reads).dead_letters(limit, namespace=namespace)
        finally:
            reads.close()
    from query.adapters.sqlite_routing import SqliteRouting

    return SqliteRouting(canonical_db_path(settings.data_dir)).dead_letters(
        limit, namespace=namespace
    )


def _redrive(settings: QuerySettings, limit: int, namespace: str | None) -> list[Any]:
    """`orrery.redrive.redrive_dead_letters` on this deployment's store and state."""
    from ingest.bootstrap import server_store
    from orrery.redrive import redrive_dead_letters
    from projector.bootstrap import dead_letter_box, default_embedder

    store = server_store(settings.data_dir, settings.database_url)
    box = dead_letter_box(canonical_db_path(settings.data_dir), settings.database_url)
    try:
        return redrive_dead_letters(
            box=box,
            store=store,
            dimension=default_embedder(1).dimension,
            max_record_bytes=settings.max_record_bytes,
            namespace=namespace,
            limit=limit,
        )
    finally:
        box.close()
        store.close()


@app.command("query-worker")
def query_worker(data_dir: DataDir = None, host: Host = None, port: Port = None) -> None:
    """Server mode: the stateless HTTP query worker."""
    _logging("query")
    settings = _settings(data_dir=data_dir, host=host, port=port, mode="servers")
    _check_bind(settings)
    _run_role(["query"], settings, http=True)


@app.command("ingest-api")
def ingest_api(data_dir: DataDir = None, host: Host = None, port: Port = None) -> None:
    """Server mode: the write API (`POST /v1/records`) over the canonical store."""
    _logging("ingest")
    settings = _settings(data_dir=data_dir, host=host, port=port, mode="servers")
    _check_bind(settings)
    _run_role(["ingest"], settings, http=True)


@db_app.command("migrate")
def db_migrate(
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", help="PostgreSQL URL [ORRERY_DATABASE_URL]"),
    ] = None,
) -> None:
    """Apply the pending migrations under an advisory lock (also done at every start);
    exit 1 when an applied migration was edited or the database does not answer."""
    from contracts.errors import OrreryError
    from ingest.bootstrap import describe_store
    from orrery.servers import migrate_all

    settings = _settings(database_url=database_url)
    if not settings.database_url:
        console.print("[red]no database: set ORRERY_DATABASE_URL or pass --database-url")
        raise typer.Exit(2)
    try:
        reports = migrate_all(settings.database_url)
    except OrreryError as exc:
        console.print(f"[red]migrate failed: {escape(exc.message)}")
        raise typer.Exit(1) from exc
    where = describe_store(settings.data_dir, settings.database_url)
    for component, (applied, already) in reports.items():
        if applied:
            console.print(
                f"{where}: {component}: applied migrations {list(applied)} "
                f"({len(already)} were there)"
            )
        else:
            console.print(f"{where}: {component}: up to date ({len(already)} migrations applied)")


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as exc:
                    console.print(
                        f"[red]{escape(str(path))}:{line_no}: not valid JSON: {escape(str(exc))}"
                    )
                    raise typer.Exit(1) from exc


@app.command()
def ingest(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="Records, one JSON per line")
    ],
    data_dir: DataDir = None,
    batch_size: Annotated[int, typer.Option(min=1, max=10_000)] = 500,
) -> None:
    """Load records from a JSONL file into the canonical store (a running `serve` on the
    same data dir projects them within its poll interval)."""
    from contracts.admission import check_record_size, record_problems
    from projector.bootstrap import default_embedder

    settings = _settings(data_dir=data_dir)
    dimension = default_embedder(1).dimension
    lines = list(_read_jsonl(file))
    records: list[Record] = []
    for line_no, raw in lines:
        try:
            record = Record.model_validate(raw)
        except ValidationError as exc:
            console.print(
                f"[red]{escape(str(file))}:{line_no}: invalid record:\n{escape(str(exc))}"
            )
            raise typer.Exit(1) from exc
        # What `POST /v1/records` refuses with 422: nothing an engine cannot take is written.
        problems = record_problems(record, dimension=dimension)
        for problem in problems:
            where = ".".join(map(str, problem.loc))
            console.print(f"[red]{file}:{line_no}: {where}: {problem.msg} ({problem.type})")
        if problems:
            raise typer.Exit(1)
        try:
            # What every write route refuses with 413 (ORRERY_MAX_RECORD_BYTES).
            check_record_size(record, max_record_bytes=settings.max_record_bytes)
        except OrreryError as exc:
            console.print(f"[red]{escape(str(file))}:{line_no}: {exc.code.value}: {exc.message}")
            raise typer.Exit(1) from exc
        records.append(record)
    store = embedded_store(settings.data_dir)
    accepted = rejected = 0
    try:
        with _progress() as progress:
            task = progress.add_task("ingest", total=len(records), rate="")
            for start in range(0, len(records), batch_size):
                chunk = records[start : start + batch_size]
                outcome = write_records(chunk, store=store)
                accepted += outcome.accepted
                rejected += outcome.rejected
                elapsed = progress.tasks[0].elapsed or 1e-9
                progress.update(
                    task, advance=len(chunk), rate=f"{(start + len(chunk)) / elapsed:,.0f} rec/s"
                )
    finally:
        store.close()
    console.print(f"{accepted} accepted, {rejected} rejected as stale (already stored)")


Namespace = Annotated[str, typer.Option("--namespace", help="The namespace")]
ScopeRef = Annotated[str, typer.Option("--scope-ref", help="Scope ref naming the snapshot kind")]
Galaxy = Annotated[str, typer.Option("--galaxy", help="The galaxy (default: default)")]


def _fail(exc: OrreryError) -> typer.Exit:
    console.print(f"[red]{exc.code.value}: {escape(exc.message)}")
    return typer.Exit(1)


def _snapshot_kind(settings: QuerySettings, namespace: str, scope_ref: str) -> str:
    from query.bootstrap import scope_registry

    return scope_registry(settings).target(namespace, scope_ref).snapshot_kind


@app.command("import-jsonl")
def import_jsonl(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSON-lines file")],
    namespace: Namespace,
    data_dir: DataDir = None,
    scope_ref: ScopeRef = "longterm:objects:current",
    galaxy: Galaxy = "default",
    default_ring: Annotated[str, typer.Option("--default-ring")] = "imported",
    ring_field: Annotated[str | None, typer.Option("--ring-field")] = None,
    ring_prefix: Annotated[str, typer.Option("--ring-prefix")] = "",
    payload_field: Annotated[str | None, typer.Option("--payload-field")] = None,
    vec_field: Annotated[str | None, typer.Option("--vec-field")] = None,
    id_field: Annotated[str | None, typer.Option("--id-field")] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=10_000)] = 1_000,
) -> None:
    """Import JSON lines (a KoutenDB dump or any NoSQL export) into the canonical store,
    with the rules of `POST /v1/koutendb/import`; prints its JSON answer. A running
    `serve` on the same data dir projects them within its poll interval."""
    from ingest.koutendb_io import ImportOptions, JsonlImporter, LineSplitter
    from projector.bootstrap import default_embedder

    settings = _settings(data_dir=data_dir)
    try:
        options = ImportOptions(
            namespace=namespace,
            snapshot_kind=_snapshot_kind(settings, namespace, scope_ref),
            galaxy=galaxy,
            default_ring=default_ring,
            ring_field=ring_field,
            ring_prefix=ring_prefix,
            payload_field=payload_field,
            vec_field=vec_field,
            id_field=id_field,
            batch_size=batch_size,
            vector_dimension=default_embedder(1).dimension,
            max_record_bytes=settings.max_record_bytes,
        )
    except OrreryError as exc:
        raise _fail(exc) from exc
    tune_gc()  # a batch job allocating millions of containers, as a server does
    store = embedded_store(settings.data_dir)
    importer = JsonlImporter(options, store)
    splitter = LineSplitter()
    try:
        with file.open("rb") as handle, _progress() as progress:
            task = progress.add_task("import", total=file.stat().st_size, rate="")
            while chunk := handle.read(1 << 20):
                for line in splitter.feed(chunk):
                    if importer.add(line):
                        importer.write_pending()
                elapsed = progress.tasks[0].elapsed or 1e-9
                progress.update(
                    task, advance=len(chunk), rate=f"{importer.read / elapsed:,.0f} lines/s"
                )
            for line in splitter.close():
                importer.add(line)
            importer.write_pending()
    except OrreryError as exc:
        raise _fail(exc) from exc
    finally:
        store.close()
    print(importer.result().model_dump_json())


@app.command()
def dump(
    namespace: Namespace,
    data_dir: DataDir = None,
    scope_ref: ScopeRef = "longterm:objects:current",
    galaxy: Galaxy = "default",
    out: Annotated[
        Path | None, typer.Option("--out", help="File to write (default stdout)")
    ] = None,
    include_vectors: Annotated[bool, typer.Option("--vectors/--no-vectors")] = True,
) -> None:
    """Write the live records of one galaxy as `koutendb.dump.v1` JSON lines (what
    `GET /v1/koutendb/dump` answers)."""
    from ingest.koutendb_io import dump_lines

    settings = _settings(data_dir=data_dir)
    store = embedded_store(settings.data_dir)
    try:
        lines = dump_lines(
            store=store,
            namespace=namespace,
            snapshot_kind=_snapshot_kind(settings, namespace, scope_ref),
            galaxy=galaxy,
            include_vectors=include_vectors,
        )
        if out is None:
            for chunk in lines:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        else:
            temp = out.with_name(f".{out.name}.tmp")
            with temp.open("wb") as handle:
                for chunk in lines:
                    handle.write(chunk)
            temp.replace(out)
    except OrreryError as exc:
        raise _fail(exc) from exc
    finally:
        store.close()


def _maintenance(settings: QuerySettings) -> Any:
    from ingest.bootstrap import store_maintenance
    from projector.adapters.file_lock import FileWriterLock
    from projector.bootstrap import writer_lock_path

    lock = FileWriterLock(writer_lock_path(settings.data_dir))
    return store_maintenance(
        settings.data_dir,
        settings.database_url,
        exclusive=lock.hold,
        log_is_outbox=settings.mode != "servers",
    )


@app.command()
def backup(
    name: Annotated[str, typer.Option("--name", help="The backup's name (not a path)")],
    data_dir: DataDir = None,
) -> None:
    """Back up the canonical store and the generation registry to
    `DATA_DIR/backups/NAME` (consistent while a server writes; nothing is left under the
    name when it fails); prints the counts as JSON."""
    settings = _settings(data_dir=data_dir)
    try:
        result = _maintenance(settings).backup(name)
        verified = _maintenance(settings).verify(name)
    except OrreryError as exc:
        raise _fail(exc) from exc
    print(
        verified.model_dump_json() if verified.items == result.items else result.model_dump_json()
    )


@app.command()
def restore(
    backup_dir: Annotated[
        Path, typer.Option("--backup", exists=True, file_okay=False, help="A backup directory")
    ],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="The data dir to restore into")],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the data of a non-empty data dir")
    ] = False,
) -> None:
    """Restore a backup into a data dir that is empty (or, with --overwrite, replaced).
    Generations are rebuilt: the next `orrery serve` projects the restored outbox."""
    from ingest.adapters.sqlite_maintenance import restore_database
    from projector.bootstrap import operator_lock

    data_dir.mkdir(parents=True, exist_ok=True)
    lock = operator_lock(data_dir)
    try:
        lock.acquire()
    except OrreryError as exc:
        raise _fail(exc) from exc
    try:
        info = restore_database(backup_dir, data_dir, overwrite=overwrite)
    except OrreryError as exc:
        raise _fail(exc) from exc
    finally:
        lock.release()
    print(
        json.dumps(
            {
                "restored": info.name,
                "dataDir": str(data_dir),
                "items": info.items,
                "liveItems": info.live_items,
            }
        )
    )


@app.command()
def compact(data_dir: DataDir = None) -> None:
    """Drop tombstones and superseded revisions no reader needs, then VACUUM; prints the
    sizes before and after as JSON."""
    settings = _settings(data_dir=data_dir)
    try:
        result = _maintenance(settings).compact()
    except OrreryError as exc:
        raise _fail(exc) from exc
    print(result.model_dump_json())


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        app()
    except Exception as exc:  # expected failures: one line, exit 2 (orrery.startup)
        report(exc)


if __name__ == "__main__":
    main()
