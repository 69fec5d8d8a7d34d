"""Backup, verify, restore and compaction of the canonical SQLite database.

In the embedded deployment (and server mode on one host without PostgreSQL) one SQLite
file, `DATA_DIR/orrery.sqlite`, holds the canonical store (records, heads, outbox) and
the generation registry (generations, live pointers, generation documents, positions).
This module works on that whole file, so it names a few registry tables: the registry
is copied with the store, compaction keeps every revision a generation still lists, and
a restore forgets the generations (their index directories are not in a backup).

- **backup**: SQLite's online backup API copies a consistent snapshot in one step (one
  read transaction; writers go on)
  into `backups/.<name>.tmp-<random>/`, with `manifest.json` (counts and the sha256 of
  the copy); both files and the directory are fsynced, then the directory is renamed to
  `backups/<name>`. A backup that fails at any point leaves nothing under its name.
  Each backup holds a `flock` on its temporary directory while it works: a name whose
  directory exists, or whose backup is under way (locked), is `409 invalid_state`; a
  temporary directory nobody holds (its process was killed) is removed by the next
  backup and when the process starts (`sweep_backup_temps`).
- **verify**: re-reads a backup: the manifest, the file's digest, `PRAGMA
  integrity_check`, and the counts again.
- **restore**: a verified backup into an empty (or, with `overwrite`, cleared) data
  directory, through a temporary file renamed into place; the registry is reset so the
  projector rebuilds every scope's first generation from the outbox.
- **compact**: drops superseded revisions (for a deleted document: everything but its
  tombstone) that the log and every generation are done with, then `VACUUM`s.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.faults import crash_point
from contracts.fsync import fsync_path
from contracts.koutendb_io import BackupResponse, CompactResponse, backup_name_problem

__all__ = [
    "BACKUP_DB",
    "MANIFEST",
    "BackupInfo",
    "CompactInfo",
    "SqliteStoreMaintenance",
    "backup_database",
    "compact_database",
    "database_bytes",
    "restore_database",
    "sweep_backup_temps",
    "verify_backup",
]

BACKUP_DB = "orrery.sqlite"
MANIFEST = "manifest.json"
_MANIFEST_FORMAT = "orrery.backup.v1"
# The whole database in one step: in WAL mode that step is one read transaction
# (writers go on), and nothing written meanwhile restarts it — a stepwise copy restarts
# after every write of another connection and may never finish under steady writes.
_BACKUP_PAGES = -1
# Registry tables a restore empties: they describe index directories a backup lacks.
_DERIVED_TABLES = (
    "generations",
    "live_pointers",
    "generation_documents",
    "generation_checks",
    "projector_positions",
    "projector_log_status",
)
# The embedded projector's consumer name in `projector_positions` (its log is the outbox).
_OUTBOX_CONSUMER = "projector"
# Entries an empty data directory may have: backups and the (empty) lock files.
_KEPT_ENTRIES = frozenset({"backups", "operator.lock", "generations.lock"})
# Entries of a data directory a restore with `overwrite` replaces (backups/ stays).
_DATA_ENTRIES = (
    "orrery.sqlite",
    "orrery.sqlite-wal",
    "orrery.sqlite-shm",
    "generations",
    "qdrant-local",
    "server.json",
)


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What a backup holds: record revisions (`items`), live documents, registry rows."""

    name: str
    path: Path
    items: int
    live_items: int
    generations: int
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class CompactInfo:
    before_bytes: int
    after_bytes: int
    items: int
    live_items: int
    tombstones: int
    dropped_revisions: int
    dropped_outbox_rows: int


def database_bytes(db_path: Path) -> int:
    """The database's size on disk: the file and its WAL."""
    return sum(
        p.stat().st_size for p in (db_path, db_path.with_name(db_path.name + "-wal")) if p.exists()
    )


def _sqlite_errors(what: str) -> Callable[[sqlite3.Error], DependencyUnavailable]:
    def wrap(exc: sqlite3.Error) -> DependencyUnavailable:
        return DependencyUnavailable("sqlite", f"{what}: {exc}")

    return wrap


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {str(r[0]) for r in rows}


def _counts(conn: sqlite3.Connection) -> tuple[int, int, int]:
    tables = _tables(conn)
    if "records" not in tables or "heads" not in tables:
        raise OrreryError(ErrorCode.INVALID_STATE, "the database has no canonical store tables")
    items = int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
    live = int(conn.execute("SELECT COUNT(*) FROM heads WHERE deleted = 0").fetchone()[0])
    generations = (
        int(conn.execute("SELECT COUNT(*) FROM generations").fetchone()[0])
        if "generations" in tables
        else 0
    )
    return items, live, generations


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


_TEMP_MARK = ".tmp-"


def _temp_name(name: str) -> str:
    return f".{name}{_TEMP_MARK}{uuid.uuid4().hex[:12]}"


def _temp_owner(entry: str) -> str | None:
    """The backup name of a temporary directory's name (`.<name>.tmp-<hex>`), or None."""
    if not entry.startswith(".") or _TEMP_MARK not in entry:
        return None
    return entry[1:].rsplit(_TEMP_MARK, 1)[0]


def _try_lock(path: Path) -> int | None:
    """An open descriptor of directory `path` holding its exclusive `flock`, or None
    when another open descriptor holds it (a backup under way) or it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextmanager
def _dir_lock(path: Path) -> Iterator[None]:
    """`path`'s exclusive `flock`, waiting for it: one backup at a time picks its name."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sweep(backups_dir: Path, name: str | None = None) -> bool:
    """Remove every temporary directory no backup holds; whether a backup of `name` is
    under way. Called with `backups_dir`'s lock held."""
    busy = False
    for entry in sorted(os.listdir(backups_dir)):
        owner = _temp_owner(entry)
        if owner is None:
            continue
        fd = _try_lock(backups_dir / entry)
        if fd is None:
            busy = busy or owner == name
            continue
        try:
            shutil.rmtree(backups_dir / entry, ignore_errors=True)
        finally:
            os.close(fd)
    return busy


def sweep_backup_temps(backups_dir: Path) -> None:
    """Remove the temporary directories of backups that died (killed mid-copy): every
    `.<name>.tmp-*` no running backup holds. Run when a process that takes backups
    starts; a backup runs it too."""
    if not backups_dir.is_dir():
        return
    with _dir_lock(backups_dir):
        _sweep(backups_dir)


def _taken(name: str) -> OrreryError:
    return OrreryError(ErrorCode.INVALID_STATE, f"a backup named {name!r} exists", {"name": name})


def backup_database(db_path: Path, backups_dir: Path, name: str) -> BackupInfo:
    """Snapshot `db_path` into `backups_dir/<name>` (see the module docstring).

    `422 invalid_request` for a name that is a path; `409 invalid_state` when a backup of
    that name exists or is being taken (by this process or another); `503
    dependency_unavailable` when SQLite or the disk fails (nothing is left under the
    name). Temporary directories of backups that died are removed first."""
    problem = backup_name_problem(name)
    if problem is not None:
        raise OrreryError(ErrorCode.INVALID_REQUEST, problem, {"name": name[:200]})
    final = backups_dir / name
    if final.exists():
        raise _taken(name)
    if not db_path.exists():
        raise OrreryError(ErrorCode.INVALID_STATE, f"no database at {db_path}")
    backups_dir.mkdir(parents=True, exist_ok=True)
    with _dir_lock(backups_dir):
        if _sweep(backups_dir, name):
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"a backup named {name!r} is being taken",
                {"name": name, "in_progress": True},
            )
        if final.exists():
            raise _taken(name)
        temp = backups_dir / _temp_name(name)
        temp.mkdir()
        held = _try_lock(temp)
    if held is None:  # nobody else knows the new name; cannot happen short of a fault
        shutil.rmtree(temp, ignore_errors=True)
        raise DependencyUnavailable("disk", f"backup {name!r}: cannot lock {temp}")
    try:
        return _backup_into(db_path, backups_dir, name, temp)
    finally:
        os.close(held)


def _backup_into(db_path: Path, backups_dir: Path, name: str, temp: Path) -> BackupInfo:
    final = backups_dir / name
    try:
        copy = temp / BACKUP_DB
        try:
            source = sqlite3.connect(db_path, timeout=30.0)
            try:
                target = sqlite3.connect(copy)
                try:
                    source.backup(target, pages=_BACKUP_PAGES)
                    # One self-contained file: no WAL beside it.
                    target.execute("PRAGMA journal_mode=DELETE")
                    items, live, generations = _counts(target)
                finally:
                    target.close()
            finally:
                source.close()
        except sqlite3.Error as exc:
            raise _sqlite_errors(f"backup of {db_path}")(exc) from exc
        crash_point("backup.copied")
        info = BackupInfo(
            name=name,
            path=final,
            items=items,
            live_items=live,
            generations=generations,
            bytes=copy.stat().st_size,
            sha256=_sha256(copy),
        )
        manifest = {
            "format": _MANIFEST_FORMAT,
            "name": name,
            "created_at": datetime.now(UTC).isoformat(),
            "items": items,
            "live_items": live,
            "generations": generations,
            "database_bytes": info.bytes,
            "database_sha256": info.sha256,
        }
        (temp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        for path in (copy, temp / MANIFEST, temp):
            fsync_path(path)
        crash_point("backup.before_rename")
        try:
            os.rename(temp, final)
        except OSError as exc:
            # Another process took the name meanwhile (rename onto a non-empty directory).
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise _taken(name) from exc
            raise
        fsync_path(backups_dir)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        raise DependencyUnavailable("disk", f"backup {name!r} failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return BackupInfo(
        name=name,
        path=final,
        items=info.items,
        live_items=info.live_items,
        generations=info.generations,
        bytes=_dir_bytes(final),
        sha256=info.sha256,
    )


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def verify_backup(backup_dir: Path) -> BackupInfo:
    """Re-read a backup: manifest, digest, integrity check and counts must all agree.

    `404 not_found` when there is no backup there; `409 invalid_state` naming what
    differs when it is damaged."""
    manifest_path = backup_dir / MANIFEST
    copy = backup_dir / BACKUP_DB
    if not manifest_path.is_file() or not copy.is_file():
        raise OrreryError(ErrorCode.NOT_FOUND, f"no backup at {backup_dir}")
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise OrreryError(ErrorCode.INVALID_STATE, f"unreadable manifest: {exc}") from exc
    problems: list[str] = []
    if manifest.get("format") != _MANIFEST_FORMAT:
        problems.append(f"manifest format {manifest.get('format')!r}")
    digest = _sha256(copy)
    if digest != manifest.get("database_sha256"):
        problems.append("the database file's sha256 differs from the manifest")
    try:
        conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                problems.append(f"integrity_check: {check}")
            items, live, generations = _counts(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise OrreryError(ErrorCode.INVALID_STATE, f"the backup does not open: {exc}") from exc
    for key, value in (("items", items), ("live_items", live), ("generations", generations)):
        if manifest.get(key) != value:
            problems.append(f"{key}: manifest {manifest.get(key)}, database {value}")
    if problems:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"backup {backup_dir.name!r} does not verify: {'; '.join(problems)}",
            {"problems": problems},
        )
    return BackupInfo(
        name=str(manifest.get("name", backup_dir.name)),
        path=backup_dir,
        items=items,
        live_items=live,
        generations=generations,
        bytes=_dir_bytes(backup_dir),
        sha256=digest,
    )


def restore_database(backup_dir: Path, data_dir: Path, *, overwrite: bool = False) -> BackupInfo:
    """Restore a verified backup as `data_dir`'s database (see the module docstring).

    `409 invalid_state` when `data_dir` holds anything but `backups/` and lock files,
    and `overwrite` is not set; the caller makes sure no process uses `data_dir`
    meanwhile."""
    info = verify_backup(backup_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in data_dir.iterdir() if p.name not in _KEPT_ENTRIES)
    if present and not overwrite:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"{data_dir} is not empty ({', '.join(present[:5])}); restore only into an empty "
            "directory, or pass --overwrite to replace its data",
            {"present": present[:20]},
        )
    target = data_dir / BACKUP_DB
    temp = data_dir / f".{BACKUP_DB}.restore-{uuid.uuid4().hex[:12]}"
    try:
        shutil.copyfile(backup_dir / BACKUP_DB, temp)
        conn = sqlite3.connect(temp)
        try:
            tables = _tables(conn)
            conn.execute("BEGIN IMMEDIATE")
            for table in _DERIVED_TABLES:
                if table in tables:
                    conn.execute(f"DELETE FROM {table}")
            conn.execute("COMMIT")
        finally:
            conn.close()
        fsync_path(temp)
        if overwrite:
            for entry in _DATA_ENTRIES:
                path = data_dir / entry
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        os.rename(temp, target)
        fsync_path(data_dir)
    except sqlite3.Error as exc:
        temp.unlink(missing_ok=True)
        raise _sqlite_errors(f"restore into {data_dir}")(exc) from exc
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return info


def compact_database(db_path: Path, *, log_is_outbox: bool) -> CompactInfo:
    """Drop what no reader needs any more, then `VACUUM`. Call it holding the generation
    writer lock (no projector batch or snapshot in flight).

    An outbox row is *consumed* when the relay published it, or (`log_is_outbox`: the
    embedded log) the projector's position passed it. Dropped: every revision that is
    not its document's head, that no generation lists and whose outbox row is consumed
    (for a deleted document that is all its content), and consumed outbox rows of
    non-head revisions. Kept: the head revision of every document with its outbox row (a
    restore replays them) and, for a deleted document, its tombstone (one small row, no
    payload): it is the revision floor that makes a re-created item continue above the
    deleted revision, which every engine needs (OpenSearch's external versions remember
    a delete, and would silently ignore a lower revision)."""
    before = database_bytes(db_path)
    try:
        conn = sqlite3.connect(db_path, timeout=30.0, isolation_level=None)
    except sqlite3.Error as exc:
        raise _sqlite_errors(f"open {db_path}")(exc) from exc
    try:
        tables = _tables(conn)
        consumed_to = 0
        if log_is_outbox and "projector_positions" in tables:
            row = conn.execute(
                "SELECT position FROM projector_positions WHERE consumer = ?", (_OUTBOX_CONSUMER,)
            ).fetchone()
            consumed_to = 0 if row is None else int(row[0])
        consumed = "(published_at IS NOT NULL OR position <= :upto)"
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TEMP TABLE pinned (document_id TEXT, revision INTEGER, "
                "PRIMARY KEY (document_id, revision)) WITHOUT ROWID"
            )
            conn.execute(
                "INSERT OR IGNORE INTO temp.pinned SELECT document_id, revision FROM outbox "
                f"WHERE NOT {consumed}",
                {"upto": consumed_to},
            )
            if "generation_documents" in tables:
                conn.execute(
                    "INSERT OR IGNORE INTO temp.pinned SELECT document_id, revision "
                    "FROM generation_documents"
                )
            superseded = conn.execute(
                "DELETE FROM records WHERE NOT EXISTS (SELECT 1 FROM heads h WHERE "
                "h.document_id = records.document_id AND h.revision = records.revision) "
                "AND NOT EXISTS (SELECT 1 FROM temp.pinned p WHERE p.document_id = "
                "records.document_id AND p.revision = records.revision)"
            ).rowcount
            outbox = conn.execute(
                f"DELETE FROM outbox WHERE {consumed} AND NOT EXISTS (SELECT 1 FROM heads h "
                "WHERE h.document_id = outbox.document_id AND h.revision = outbox.revision)",
                {"upto": consumed_to},
            ).rowcount
            conn.execute("DROP TABLE temp.pinned")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        items, live, _ = _counts(conn)
        tombstones = int(conn.execute("SELECT COUNT(*) FROM heads WHERE deleted = 1").fetchone()[0])
    except sqlite3.Error as exc:
        raise _sqlite_errors(f"compact {db_path}")(exc) from exc
    finally:
        conn.close()
    return CompactInfo(
        before_bytes=before,
        after_bytes=database_bytes(db_path),
        items=items,
        live_items=live,
        tombstones=tombstones,
        dropped_revisions=superseded,
        dropped_outbox_rows=outbox,
    )


class SqliteStoreMaintenance:
    """`StoreMaintenance` over `DATA_DIR/orrery.sqlite`, backups in `DATA_DIR/backups`.

    `exclusive` is the generation writer lock (held around a compaction so no projector
    batch or snapshot is in flight); `log_is_outbox`: the embedded deployment, whose
    projector reads the outbox table itself."""

    def __init__(
        self,
        db_path: Path,
        backups_dir: Path,
        *,
        exclusive: Callable[[], AbstractContextManager[None]],
        log_is_outbox: bool,
    ) -> None:
        self._db_path = db_path
        self._backups_dir = backups_dir
        self._exclusive = exclusive
        self._log_is_outbox = log_is_outbox

    def backup(self, name: str) -> BackupResponse:
        return _response(backup_database(self._db_path, self._backups_dir, name), verified=False)

    def verify(self, name: str) -> BackupResponse:
        problem = backup_name_problem(name)
        if problem is not None:
            raise OrreryError(ErrorCode.INVALID_REQUEST, problem, {"name": name[:200]})
        return _response(verify_backup(self._backups_dir / name), verified=True)

    def compact(self) -> CompactResponse:
        with self._exclusive():
            info = compact_database(self._db_path, log_is_outbox=self._log_is_outbox)
        return CompactResponse(
            beforeBytes=info.before_bytes,
            afterBytes=info.after_bytes,
            items=info.items,
            liveItems=info.live_items,
            tombstones=info.tombstones,
            droppedRevisions=info.dropped_revisions,
            droppedOutboxRows=info.dropped_outbox_rows,
        )


def _response(info: BackupInfo, *, verified: bool) -> BackupResponse:
    return BackupResponse(
        name=info.name,
        path=str(info.path),
        items=info.items,
        liveItems=info.live_items,
        generations=info.generations,
        bytes=info.bytes,
        verified=verified,
    )
