#!/usr/bin/env python3
"""Local real-server harness: Kafka (KRaft), OpenSearch, Qdrant, Redis and PostgreSQL on
127.0.0.1, no Docker.

Command line::

    python tests/harness/servers.py up [--only kafka,opensearch,qdrant,redis,postgres]
    python tests/harness/servers.py status
    python tests/harness/servers.py env        # prints servers.env; eval "$(... env)"
    python tests/harness/servers.py down [--only ...]

Library use (stdlib only, so it runs before the project venv exists)::

    from tests.harness.servers import start_all, stop_all, server_urls

What is guaranteed
------------------
* Every server binds to 127.0.0.1 only and writes only under ``$ORRERY_SERVERS_DIR``
  (default ``/tmp/orrery-servers``): one subdirectory per server holding its data, its log
  (``<name>.log``), a ``setup.log`` (downloads/compilation/format), ``state.json`` and, while
  it runs, ``<name>.pid``. The base directory also holds ``servers.json`` and ``servers.env``.
* Downloaded artifacts (Maven repository, copied jars, compiled launcher) live in
  ``$ORRERY_CACHE_DIR`` (default ``~/.cache/orrery``) and are reused by later runs.
* ``up`` returns only after each started server answered a real protocol request
  (Kafka ApiVersions + Metadata listing this broker, OpenSearch cluster health yellow/green,
  Qdrant /readyz 200 + gRPC port open, Redis PING -> PONG, PostgreSQL startup ->
  ReadyForQuery), or after it was declared failed
  (timeout ``$ORRERY_SERVERS_TIMEOUT`` seconds, default 180, or the process died). A failure
  prints the last 40 lines of that server's log, names the server, and stops whatever of it
  was still running.
* ``up`` is idempotent: a server from an earlier ``up`` in the same base directory whose
  recorded pid is alive (and is really that server, checked via /proc cmdline) and which
  answers its probe is reused as is, data included. Anything else is (re)started with an
  empty data directory; logs are appended to, never deleted.
* ``down`` signals by pid only (SIGTERM, then SIGKILL after ``$ORRERY_SERVERS_GRACE``
  seconds, default 30), waits until the process is gone, and deletes only the pid files.
* With ``ORRERY_REQUIRE_SERVERS=1`` any server failure makes ``up`` exit non-zero
  (``start_all`` raises :class:`ServersUnavailable`). Without it, failures are reported on
  stderr, recorded in ``servers.json`` (``available: false`` plus ``error``), and ``up``
  exits 0 so tests can skip with that reason.
* Concurrent ``up``/``down`` calls on one base directory are serialised by a file lock.
* ``$ORRERY_SERVERS`` selects how servers run: ``local`` (the default, and the only mode
  implemented) starts local processes; ``docker`` is refused with an explanation (see
  ``tests/harness/README.md``), never silently replaced by ``local``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import glob
import hashlib
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "compose" / "local"
HOST = "127.0.0.1"

SERVER_NAMES: tuple[str, ...] = ("kafka", "opensearch", "qdrant", "redis", "postgres")
ENV_VARS: dict[str, str] = {
    "kafka": "ORRERY_KAFKA_BOOTSTRAP",
    "opensearch": "ORRERY_OPENSEARCH_URL",
    "qdrant": "ORRERY_QDRANT_URL",
    "redis": "ORRERY_REDIS_URL",
    "postgres": "ORRERY_DATABASE_URL",
}

LOG_TAIL_LINES = 40
PROBE_INTERVAL_S = 0.25
DEFAULT_TIMEOUT_S = 180.0
DEFAULT_GRACE_S = 30.0
SETUP_TIMEOUT_S = 1200.0


class HarnessError(RuntimeError):
    """A server could not be prepared, started or stopped. The message names the server;
    ``log`` is the file whose tail explains it (setup.log or the server log), if known."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


class ServersUnavailable(HarnessError):
    """Raised by :func:`start_all` with ``require=True`` when any requested server failed."""


# --------------------------------------------------------------------------- locations


def default_base_dir() -> Path:
    """``$ORRERY_SERVERS_DIR`` or ``/tmp/orrery-servers``."""
    return Path(os.environ.get("ORRERY_SERVERS_DIR") or "/tmp/orrery-servers")


def default_cache_dir() -> Path:
    """``$ORRERY_CACHE_DIR`` or ``~/.cache/orrery`` (survives between runs)."""
    return Path(os.environ.get("ORRERY_CACHE_DIR") or Path.home() / ".cache" / "orrery")


def _resolve(given: str | Path | None, default: Callable[[], Path]) -> Path:
    """Absolute, symlink-free path: process ownership is checked against /proc/<pid>/cwd."""
    return (Path(given) if given else default()).expanduser().resolve()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


SERVER_MODES_IMPLEMENTED = ("local",)


def _check_server_mode() -> None:
    """Refuse `ORRERY_SERVERS` values other than `local` instead of ignoring them."""
    mode = (os.environ.get("ORRERY_SERVERS") or "local").strip().lower()
    if mode in SERVER_MODES_IMPLEMENTED:
        return
    if mode == "docker":
        raise HarnessError(
            "ORRERY_SERVERS=docker is not implemented: the harness starts local processes "
            "only (no Docker engine runs on the machines it was built on, so container "
            "start-up could not be tested). Where Docker runs, use "
            "`docker compose -f compose/docker-compose.yml up` and point the ORRERY_*_URL "
            "variables at it, or unset ORRERY_SERVERS."
        )
    raise HarnessError(f"ORRERY_SERVERS={mode!r}: choose local (docker is not implemented)")


def _require_from_env() -> bool:
    return os.environ.get("ORRERY_REQUIRE_SERVERS", "").strip().lower() in {"1", "true", "yes"}


_print_lock = threading.Lock()

# Popen objects of servers started by this process. Holding them keeps Python from warning
# "subprocess N is still running" (a ResourceWarning pytest may turn into an error) when a
# Popen is garbage-collected while its server, by design, keeps running.
_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}


def _say(message: str) -> None:
    """Progress line on stderr. Never raises: a closed pipe must not abort a start or stop."""
    with _print_lock, contextlib.suppress(OSError, ValueError):
        print(f"[servers] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    """Single-letter state from /proc/<pid>/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return "?"
    # Format: "pid (comm) S ..."; comm may contain spaces/parentheses, so split at the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process. Reaps it if it is our dead child."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    state = _proc_state(pid)
    if state is None:
        return False
    return state not in {"Z", "X"}


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _terminate(pid: int, grace_s: float) -> None:
    """SIGTERM ``pid``, SIGKILL it after ``grace_s``, and return once it is gone."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if pid_alive(pid):
        raise HarnessError(f"pid {pid} survived SIGKILL")
    proc = _SPAWNED.pop(pid, None)
    if proc is not None:
        # Records the exit status. A JVM's main thread can be a zombie (what `pid_alive`
        # reads) while its other threads still shut down: wait for the whole process.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers must not count as "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def pick_ports(preferred: Sequence[int]) -> list[int]:
    """The preferred ports where they are free on 127.0.0.1, free ephemeral ports otherwise."""
    chosen: list[int] = []
    for port in preferred:
        candidate = port if _port_free(port) else _ephemeral_port()
        while candidate in chosen:
            candidate = _ephemeral_port()
        chosen.append(candidate)
    return chosen


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


def _run_logged(
    cmd: Sequence[str],
    log: Path,
    what: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = SETUP_TIMEOUT_S,
) -> None:
    """Run a setup command, appending its output to ``log``; raise HarnessError on failure."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(
                list(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise HarnessError(f"{what}: {cmd[0]} not found ({exc})", log) from exc
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"{what}: timed out after {timeout:.0f}s", log) from exc
    if proc.returncode != 0:
        raise HarnessError(f"{what}: exit code {proc.returncode}", log)


def _which_or_fail(tool: str, server: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise HarnessError(f"{server}: `{tool}` is not on PATH")
    return found


def _file_digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


_thread_locks: dict[Path, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes (flock) and across threads of this process."""
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(path, threading.Lock())
    path.parent.mkdir(parents=True, exist_ok=True)
    with thread_lock, path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pom_property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if not match:
        raise HarnessError(f"{pom}: no <{name}> property")
    return match.group(1).strip()


def _maven_libs(pom: Path, cache_dir: Path, kind: str, version: str, setup_log: Path) -> Path:
    """Copy the runtime dependencies of ``pom`` into a cached lib dir and return it.

    The directory is keyed by the POM's content, filled via a temporary directory and renamed
    into place, so a present directory is always complete.
    """
    lib = cache_dir / kind / f"{version}-{_file_digest(pom)}" / "lib"
    if lib.is_dir():
        return lib
    mvn = _which_or_fail("mvn", kind)
    partial = lib.with_name(f"lib.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _say(f"{kind}: resolving jars with Maven (first run only) -> {lib}")
    # One Maven at a time per cache: parallel runs would download the same plugin jars into
    # the same local repository.
    with _file_lock(cache_dir / ".maven.lock"):
        _run_logged(
            [
                mvn,
                "-q",
                "-B",
                f"-Dmaven.repo.local={cache_dir / 'm2'}",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={partial}",
            ],
            setup_log,
            f"{kind}: mvn dependency:copy-dependencies",
        )
    if not any(partial.glob("*.jar")):
        raise HarnessError(f"{kind}: Maven copied no jars into {partial}")
    try:
        partial.rename(lib)
    except OSError:
        if not lib.is_dir():  # Someone else won the race only if lib now exists.
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return lib


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return _which_or_fail("java", "java")


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").exists():
        return str(Path(home) / "bin" / "javac")
    return _which_or_fail("javac", "opensearch")


# --------------------------------------------------------------------------- probes


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks.extend(chunk)
    return bytes(chunks)


def _kafka_call(
    sock: socket.socket, api_key: int, api_version: int, correlation_id: int, body: bytes
) -> bytes:
    """Send one request with a v1 (non-flexible) header; return the response body."""
    client_id = b"orrery-harness"
    message = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id))
    message += client_id + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    payload = _recv_exact(sock, size)
    (got_id,) = struct.unpack_from(">i", payload, 0)
    if got_id != correlation_id:
        raise ConnectionError(f"correlation id {got_id} != {correlation_id}")
    return payload[4:]


def kafka_probe(port: int, timeout: float = 2.0) -> bool:
    """True when the broker answers ApiVersions v0 without error and, through Metadata v1,
    lists itself at 127.0.0.1:``port`` with a known controller, i.e. it is unfenced and serving.
    """
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            body = _kafka_call(sock, 18, 0, 1, b"")
            error_code, count = struct.unpack_from(">hi", body, 0)
            if error_code != 0 or count <= 0:
                return False
            versions = {}
            for i in range(count):
                key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * i)
                versions[key] = (low, high)
            low, high = versions.get(3, (1, 0))
            if not low <= 1 <= high:
                return True  # ApiVersions is all we can check on a broker without Metadata v1.
            # Metadata v1 with an empty topic array: brokers and controller only.
            body = _kafka_call(sock, 3, 1, 2, struct.pack(">i", 0))
            (brokers,) = struct.unpack_from(">i", body, 0)
            offset = 4
            found = False
            for _ in range(brokers):
                _node_id, host_len = struct.unpack_from(">ih", body, offset)
                offset += 6
                host = body[offset : offset + host_len].decode()
                offset += host_len
                (broker_port, rack_len) = struct.unpack_from(">ih", body, offset)
                offset += 6 + max(rack_len, 0)
                found = found or (host == HOST and broker_port == port)
            (controller_id,) = struct.unpack_from(">i", body, offset)
            return found and controller_id >= 0
    except (OSError, struct.error, UnicodeDecodeError):
        return False


def opensearch_probe(port: int, timeout: float = 5.0) -> bool:
    """True when ``GET /_cluster/health?wait_for_status=yellow&timeout=1s`` says yellow/green."""
    url = f"http://{HOST}:{port}/_cluster/health?wait_for_status=yellow&timeout=1s"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            health = json.load(response)
    except (OSError, ValueError, http.client.HTTPException):
        return False
    return health.get("status") in {"yellow", "green"} and not health.get("timed_out", False)


def redis_probe(port: int, timeout: float = 2.0) -> bool:
    """True when ``PING`` is answered with ``+PONG``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply == b"+PONG\r\n"
    except OSError:
        return False


def postgres_probe(port: int, timeout: float = 2.0) -> bool:
    """True when a protocol-3.0 startup as user ``postgres`` reaches ReadyForQuery.

    A server still starting up, recovering or shutting down answers with an ErrorResponse.
    """
    params = b"user\0postgres\0database\0postgres\0\0"
    startup = struct.pack(">ii", 8 + len(params), 196608) + params
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(startup)
            while True:
                kind = _recv_exact(sock, 1)
                (size,) = struct.unpack(">i", _recv_exact(sock, 4))
                body = _recv_exact(sock, size - 4)
                if kind == b"R" and struct.unpack_from(">i", body, 0)[0] != 0:
                    return False  # A password is asked for: not the harness's trust setup.
                if kind == b"E":
                    return False
                if kind == b"Z":
                    sock.sendall(b"X" + struct.pack(">i", 4))
                    return True
    except (OSError, struct.error):
        return False


def qdrant_probe(http_port: int, grpc_port: int, timeout: float = 2.0) -> bool:
    """True when ``GET /readyz`` answers 200 (collections loaded, consensus up) and the gRPC
    port accepts a connection (the server adapter may use either)."""
    url = f"http://{HOST}:{http_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status != 200:
                return False
        with socket.create_connection((HOST, grpc_port), timeout=timeout):
            return True
    except (OSError, http.client.HTTPException):
        return False


# --------------------------------------------------------------------------- servers


@dataclass
class Launch:
    """Everything needed to spawn one server process."""

    argv: list[str]
    ports: dict[str, int]
    version: str
    env: dict[str, str] | None = None


@dataclass
class Server:
    """One local server kind. Subclasses provide preparation, command line, URL and probe."""

    base_dir: Path
    cache_dir: Path
    name: str = ""
    preferred_ports: dict[str, int] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.base_dir / self.name

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def setup_log_path(self) -> Path:
        return self.dir / "setup.log"

    @property
    def pid_path(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def prepare(self) -> Launch:
        """Fetch/compile what is needed (cached), write configs with fresh ports, return argv."""
        raise NotImplementedError

    def url(self, ports: dict[str, int]) -> str:
        raise NotImplementedError

    def probe(self, ports: dict[str, int]) -> bool:
        raise NotImplementedError

    def owns(self, pid: int) -> bool:
        """True if ``pid`` is this server's process: its working directory (we start it in
        ``self.dir``; redis chdirs to ``self.dir/data``) or its command line is under our dir.
        Guards against signalling an unrelated process that reused a stale pid.
        """
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        mine = str(self.dir)
        return cwd == mine or cwd.startswith(mine + os.sep) or mine in _cmdline(pid)

    def reset_data(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True)
        (self.dir / "tmp").mkdir(exist_ok=True)

    def jvm_base_args(self) -> list[str]:
        return [
            _java(),
            "-Xms512m",
            "-Xmx512m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            "-Dfile.encoding=UTF-8",
            f"-Djava.io.tmpdir={self.dir / 'tmp'}",
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            "-Dlog4j2.shutdownHookEnabled=false",
            "-Dlog4j2.formatMsgNoLookups=true",
        ]

    def write_log4j2(self, pattern: str, extra: str = "") -> None:
        (self.dir / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.console.type = Console\n"
            "appender.console.name = console\n"
            "appender.console.layout.type = PatternLayout\n"
            f"appender.console.layout.pattern = {pattern}\n"
            "rootLogger.level = info\n"
            "rootLogger.appenderRef.console.ref = console\n" + extra
        )


class KafkaServer(Server):
    """Apache Kafka 4.x, one combined broker+controller node in KRaft mode."""

    def __init__(self, base_dir: Path, cache_dir: Path) -> None:
        super().__init__(base_dir, cache_dir, "kafka", {"broker": 19092, "controller": 19093})

    def prepare(self) -> Launch:
        pom = COMPOSE_DIR / "kafka" / "pom.xml"
        version = _pom_property(pom, "kafka.version")
        lib = _maven_libs(pom, self.cache_dir, "kafka", version, self.setup_log_path)
        broker, controller = pick_ports(list(self.preferred_ports.values()))
        self.reset_data()
        self.write_log4j2(
            "[%d] %p %m (%c)%n",
            "logger.config.name = org.apache.kafka.common.config.AbstractConfig\n"
            "logger.config.level = warn\n"
            "logger.statechange.name = state.change.logger\n"
            "logger.statechange.level = warn\n",
        )
        props = self.dir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"listeners=PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller}",
                    f"advertised.listeners=PLAINTEXT://{HOST}:{broker}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"controller.quorum.bootstrap.servers={HOST}:{controller}",
                    f"log.dirs={self.data_dir}",
                    "num.partitions=1",
                    "auto.create.topics.enable=true",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "",
                ]
            )
        )
        classpath = f"{lib}/*"
        # Kafka 4.x: the storage tool is the Scala object kafka.tools.StorageTool (kafka_2.13
        # jar). --standalone formats a single-voter dynamic quorum from
        # controller.quorum.bootstrap.servers; controller.quorum.voters must not be set.
        _run_logged(
            [
                *self.jvm_base_args(),
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "--config",
                str(props),
                "--cluster-id",
                _kafka_cluster_id(),
                "--standalone",
            ],
            self.setup_log_path,
            "kafka: kafka.tools.StorageTool format",
        )
        return Launch(
            argv=[*self.jvm_base_args(), "-cp", classpath, "kafka.Kafka", str(props)],
            ports={"broker": broker, "controller": controller},
            version=version,
        )

    def url(self, ports: dict[str, int]) -> str:
        return f"{HOST}:{ports['broker']}"

    def probe(self, ports: dict[str, int]) -> bool:
        return kafka_probe(ports["broker"])


def _kafka_cluster_id() -> str:
    """A Kafka Uuid string: 16 random bytes, URL-safe base64 without padding, no leading '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class OpenSearchServer(Server):
    """OpenSearch 2.19 single node via compose/local/opensearch/src/OrreryOpenSearchNode.java."""

    def __init__(self, base_dir: Path, cache_dir: Path) -> None:
        super().__init__(base_dir, cache_dir, "opensearch", {"http": 19200, "transport": 19300})

    @property
    def data_dir(self) -> Path:
        return self.dir / "home" / "data"

    def _classes(self, lib: Path) -> Path:
        sources = sorted((COMPOSE_DIR / "opensearch" / "src").rglob("*.java"))
        if not sources:
            raise HarnessError("opensearch: no launcher sources in compose/local/opensearch/src")
        classes = lib.parent / f"classes-{_file_digest(*sources)}"
        if classes.is_dir():
            return classes
        partial = classes.with_name(f"{classes.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _run_logged(
            [_javac(), "-nowarn", "-d", str(partial), "-cp", f"{lib}/*", *map(str, sources)],
            self.setup_log_path,
            "opensearch: javac launcher",
        )
        try:
            partial.rename(classes)
        except OSError:
            if not classes.is_dir():
                raise
            shutil.rmtree(partial, ignore_errors=True)
        return classes

    def prepare(self) -> Launch:
        pom = COMPOSE_DIR / "opensearch" / "pom.xml"
        version = _pom_property(pom, "opensearch.version")
        lib = _maven_libs(pom, self.cache_dir, "opensearch", version, self.setup_log_path)
        classes = self._classes(lib)
        http, transport = pick_ports(list(self.preferred_ports.values()))
        self.reset_data()
        self.write_log4j2(
            "[%d{ISO8601}][%-5p][%-25c{1.}] %marker%m%n",
            # Deprecation warnings are per request; keep them out of the way.
            "logger.deprecation.name = org.opensearch.deprecation\n"
            "logger.deprecation.level = error\n",
        )
        return Launch(
            argv=[
                *self.jvm_base_args(),
                "-cp",
                f"{classes}:{lib}/*",
                "OrreryOpenSearchNode",
                str(self.dir / "home"),
                str(http),
                str(transport),
            ],
            ports={"http": http, "transport": transport},
            version=version,
        )

    def url(self, ports: dict[str, int]) -> str:
        return f"http://{HOST}:{ports['http']}"

    def probe(self, ports: dict[str, int]) -> bool:
        return opensearch_probe(ports["http"])


class OpenSearchClusterNode(OpenSearchServer):
    """Node ``index`` (from 1) of a loopback OpenSearch cluster: the same jars and launcher
    as the single node, its own home under ``<base>/opensearch-<index>``, the cluster's
    transport ports as ``discovery.seed_hosts``. Node 1 is the only cluster-manager-eligible
    node, so stopping any other node leaves the cluster its manager."""

    def __init__(
        self, base_dir: Path, cache_dir: Path, index: int, ports: dict[str, int], seeds: str
    ) -> None:
        Server.__init__(self, base_dir, cache_dir, f"opensearch-{index}", dict(ports))
        self.node_name = f"orrery-node-{index}"
        self.seeds = seeds

    def prepare(self) -> Launch:
        pom = COMPOSE_DIR / "opensearch" / "pom.xml"
        version = _pom_property(pom, "opensearch.version")
        lib = _maven_libs(pom, self.cache_dir, "opensearch", version, self.setup_log_path)
        classes = self._classes(lib)
        self.reset_data()
        self.write_log4j2(
            "[%d{ISO8601}][%-5p][%-25c{1.}] %marker%m%n",
            "logger.deprecation.name = org.opensearch.deprecation\n"
            "logger.deprecation.level = error\n",
        )
        http, transport = self.preferred_ports["http"], self.preferred_ports["transport"]
        return Launch(
            argv=[
                *self.jvm_base_args(),
                "-cp",
                f"{classes}:{lib}/*",
                "OrreryOpenSearchNode",
                str(self.dir / "home"),
                str(http),
                str(transport),
                self.node_name,
                self.seeds,
                "orrery-node-1",
            ],
            ports={"http": http, "transport": transport},
            version=version,
        )

    def probe(self, ports: dict[str, int]) -> bool:
        # Node 1 is healthy on its own; every other node once it joined a cluster.
        return opensearch_probe(ports["http"]) and _opensearch_nodes(ports["http"]) >= 1


def _opensearch_nodes(http_port: int, timeout: float = 5.0) -> int:
    """How many nodes the cluster that answers on ``http_port`` has (0: no answer)."""
    url = f"http://{HOST}:{http_port}/_cluster/health?timeout=1s"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(json.load(response).get("number_of_nodes", 0))
    except (OSError, ValueError, http.client.HTTPException):
        return 0


def _cluster_nodes(base: Path, cache: Path, nodes: int) -> list[OpenSearchClusterNode]:
    """The cluster's nodes with fresh free ports (the seeds name every transport port)."""
    ports = pick_ports([_ephemeral_port() for _ in range(2 * nodes)])
    seeds = ",".join(f"{HOST}:{ports[2 * i + 1]}" for i in range(nodes))
    return [
        OpenSearchClusterNode(
            base, cache, i + 1, {"http": ports[2 * i], "transport": ports[2 * i + 1]}, seeds
        )
        for i in range(nodes)
    ]


def start_opensearch_cluster(
    base_dir: str | Path, nodes: int = 2, *, timeout_s: float | None = None
) -> dict[str, Any]:
    """Start a fresh ``nodes``-node OpenSearch cluster on loopback under ``base_dir`` (a
    private directory: never the shared servers'), wait until every node joined, and
    return ``{"url": node 1's URL, "urls": [...], "nodes": [{name, pid, url, dir}]}``
    (also written to ``base_dir/opensearch-cluster.json``). Nodes of an earlier cluster
    in ``base_dir`` are stopped first. Raises ``HarnessError``."""
    if nodes < 1:
        raise ValueError("a cluster has at least one node")
    base = _resolve(base_dir, default_base_dir)
    if base == _resolve(None, default_base_dir):
        raise ValueError("a cluster needs its own --base-dir, not the shared servers' one")
    cache = default_cache_dir()
    timeout = (
        timeout_s
        if timeout_s is not None
        else _env_float("ORRERY_SERVERS_TIMEOUT", DEFAULT_TIMEOUT_S)
    )
    grace = _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S)
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / ".lock"):
        _stop_cluster_nodes(base, grace)
        members = _cluster_nodes(base, cache, nodes)
        # Node 1 is the one cluster manager; the others keep asking the seeds until it
        # answers, so all start at once.
        with ThreadPoolExecutor(max_workers=nodes) as pool:
            futures = [pool.submit(_start_server, m, timeout, grace) for m in members]
        failures = [f.exception() for f in futures if f.exception() is not None]
        if failures:
            for member in members:
                _stop_server(member, grace)
            raise HarnessError(f"opensearch cluster: {failures[0]}")
        records = [f.result() for f in futures]
        deadline = time.monotonic() + timeout
        while _opensearch_nodes(members[0].preferred_ports["http"]) < nodes:
            if time.monotonic() > deadline:
                for member in members:
                    _stop_server(member, grace)
                raise HarnessError(f"opensearch cluster: {nodes} nodes did not join in time")
            time.sleep(PROBE_INTERVAL_S)
        summary = {
            "url": records[0]["url"],
            "urls": [r["url"] for r in records],
            "nodes": [
                {"name": m.node_name, "pid": r["pid"], "url": r["url"], "dir": str(m.dir)}
                for m, r in zip(members, records, strict=True)
            ],
        }
        _write_atomic(base / "opensearch-cluster.json", json.dumps(summary, indent=2) + "\n")
    return summary


def stop_opensearch_node(base_dir: str | Path, index: int) -> bool:
    """Stop node ``index`` of the cluster under ``base_dir`` (SIGTERM, then SIGKILL after
    the grace period); whether it was running."""
    base = _resolve(base_dir, default_base_dir)
    grace = _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S)
    node = OpenSearchClusterNode(base, default_cache_dir(), index, {}, "")
    return _stop_server(node, grace)


def stop_opensearch_cluster(base_dir: str | Path) -> None:
    """Stop every node of the cluster under ``base_dir``."""
    base = _resolve(base_dir, default_base_dir)
    if base.exists():
        with _file_lock(base / ".lock"):
            _stop_cluster_nodes(base, _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S))


def _stop_cluster_nodes(base: Path, grace: float) -> None:
    for path in sorted(base.glob("opensearch-*/")):
        suffix = path.name.removeprefix("opensearch-")
        if suffix.isdigit():
            node = OpenSearchClusterNode(base, default_cache_dir(), int(suffix), {}, "")
            _stop_server(node, grace)


class QdrantServer(Server):
    """The Qdrant server binary (``$ORRERY_QDRANT_BIN``, else ``../shared/bin/qdrant`` next to
    the repository; see that directory's README), one node, storage under its dir."""

    def __init__(self, base_dir: Path, cache_dir: Path) -> None:
        super().__init__(base_dir, cache_dir, "qdrant", {"http": 16333, "grpc": 16334})

    @staticmethod
    def binary() -> Path:
        given = os.environ.get("ORRERY_QDRANT_BIN")
        path = Path(given) if given else REPO_ROOT.parent / "shared" / "bin" / "qdrant"
        if not path.is_file() or not os.access(path, os.X_OK):
            how = "ORRERY_QDRANT_BIN" if given else "the default (set ORRERY_QDRANT_BIN)"
            raise HarnessError(f"qdrant: no executable server binary at {path} ({how})")
        return path.resolve()

    def prepare(self) -> Launch:
        binary = self.binary()
        version_out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, check=False, timeout=30
        ).stdout
        match = re.search(r"qdrant (\S+)", version_out)
        http, grpc = pick_ports(list(self.preferred_ports.values()))
        self.reset_data()
        # Qdrant marks its working directory as initialised; a fresh start has fresh storage.
        (self.dir / ".qdrant-initialized").unlink(missing_ok=True)
        config = self.dir / "config.yaml"
        # JSON is YAML: no YAML writer needed in a stdlib-only harness. Everything the server
        # writes goes under data/ (storage, snapshots, temp files); it runs with cwd = self.dir.
        config.write_text(
            json.dumps(
                {
                    "log_level": "INFO",
                    "telemetry_disabled": True,
                    "storage": {
                        "storage_path": str(self.data_dir / "storage"),
                        "snapshots_path": str(self.data_dir / "snapshots"),
                        "temp_path": str(self.dir / "tmp"),
                    },
                    "service": {"host": HOST, "http_port": http, "grpc_port": grpc},
                },
                indent=2,
            )
            + "\n"
        )
        return Launch(
            argv=[str(binary), "--config-path", str(config), "--disable-telemetry"],
            ports={"http": http, "grpc": grpc},
            version=match.group(1) if match else "unknown",
        )

    def url(self, ports: dict[str, int]) -> str:
        return f"http://{HOST}:{ports['http']}"

    def probe(self, ports: dict[str, int]) -> bool:
        return qdrant_probe(ports["http"], ports["grpc"])


class QdrantClusterPeer(QdrantServer):
    """Peer ``index`` (from 1) of a loopback Qdrant cluster: the same binary with
    ``cluster.enabled``, its own P2P port and storage under ``<base>/qdrant-<index>``.
    Peer 1 starts the cluster (``--uri`` its P2P address); the others join it
    (``--bootstrap`` peer 1's)."""

    def __init__(
        self,
        base_dir: Path,
        cache_dir: Path,
        index: int,
        ports: dict[str, int],
        first_p2p: int,
        storage: dict[str, Any] | None = None,
    ) -> None:
        Server.__init__(self, base_dir, cache_dir, f"qdrant-{index}", dict(ports))
        self.index = index
        self.first_p2p = first_p2p
        self.storage = dict(storage or {})

    def prepare(self) -> Launch:
        binary = self.binary()
        version_out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, check=False, timeout=30
        ).stdout
        match = re.search(r"qdrant (\S+)", version_out)
        ports = dict(self.preferred_ports)
        self.reset_data()
        (self.dir / ".qdrant-initialized").unlink(missing_ok=True)
        config = self.dir / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "log_level": "INFO",
                    "telemetry_disabled": True,
                    "storage": {
                        "storage_path": str(self.data_dir / "storage"),
                        "snapshots_path": str(self.data_dir / "snapshots"),
                        "temp_path": str(self.dir / "tmp"),
                        **self.storage,
                    },
                    "service": {
                        "host": HOST,
                        "http_port": ports["http"],
                        "grpc_port": ports["grpc"],
                    },
                    "cluster": {"enabled": True, "p2p": {"port": ports["p2p"]}},
                },
                indent=2,
            )
            + "\n"
        )
        argv = [str(binary), "--config-path", str(config), "--disable-telemetry"]
        argv += ["--uri", f"http://{HOST}:{ports['p2p']}"]
        if self.index != 1:
            argv += ["--bootstrap", f"http://{HOST}:{self.first_p2p}"]
        return Launch(argv=argv, ports=ports, version=match.group(1) if match else "unknown")


def _qdrant_peers(base_dir: str | Path, http_port: int, timeout: float = 5.0) -> int:
    """How many peers the cluster answering on ``http_port`` knows (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{http_port}/cluster", timeout=timeout) as r:
            return len(json.load(r).get("result", {}).get("peers", {}))
    except (OSError, ValueError, http.client.HTTPException):
        return 0


def start_qdrant_cluster(
    base_dir: str | Path,
    peers: int = 3,
    *,
    timeout_s: float | None = None,
    storage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start a fresh ``peers``-peer Qdrant cluster on loopback under ``base_dir`` (a
    private directory) and wait until every peer joined. Returns ``{"url": peer 1's URL,
    "urls": [...], "peers": [{name, pid, url, dir}]}`` (also written to
    ``base_dir/qdrant-cluster.json``). Peers of an earlier cluster there are stopped.
    ``storage``: extra keys of every peer's ``storage`` config (e.g. the defaults of new
    collections: ``{"optimizers": {"indexing_threshold_kb": 1}}``)."""
    base = _resolve(base_dir, default_base_dir)
    if base == _resolve(None, default_base_dir):
        raise ValueError("a cluster needs its own --base-dir, not the shared servers' one")
    timeout = (
        timeout_s
        if timeout_s is not None
        else _env_float("ORRERY_SERVERS_TIMEOUT", DEFAULT_TIMEOUT_S)
    )
    grace = _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S)
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / ".lock"):
        _stop_qdrant_peers(base, grace)
        ports = pick_ports([_ephemeral_port() for _ in range(3 * peers)])
        members = [
            QdrantClusterPeer(
                base,
                default_cache_dir(),
                i + 1,
                {"http": ports[3 * i], "grpc": ports[3 * i + 1], "p2p": ports[3 * i + 2]},
                ports[2],
                storage,
            )
            for i in range(peers)
        ]
        records = []
        # Peer 1 first: the others bootstrap from it.
        for member in members:
            try:
                records.append(_start_server(member, timeout, grace))
            except Exception as exc:
                _report_failure(member, exc)
                for started in members:
                    _stop_server(started, grace)
                raise
        deadline = time.monotonic() + timeout
        while _qdrant_peers(base, members[0].preferred_ports["http"]) < peers:
            if time.monotonic() > deadline:
                for member in members:
                    _stop_server(member, grace)
                raise HarnessError(f"qdrant cluster: {peers} peers did not join in time")
            time.sleep(PROBE_INTERVAL_S)
        summary = {
            "url": records[0]["url"],
            "urls": [r["url"] for r in records],
            "peers": [
                {"name": m.name, "pid": r["pid"], "url": r["url"], "dir": str(m.dir)}
                for m, r in zip(members, records, strict=True)
            ],
        }
        _write_atomic(base / "qdrant-cluster.json", json.dumps(summary, indent=2) + "\n")
    return summary


def stop_qdrant_peer(base_dir: str | Path, index: int) -> bool:
    """Stop peer ``index`` of the Qdrant cluster under ``base_dir``; whether it ran."""
    base = _resolve(base_dir, default_base_dir)
    peer = QdrantClusterPeer(base, default_cache_dir(), index, {}, 0)
    return _stop_server(peer, _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S))


class _ResumedQdrantPeer(QdrantClusterPeer):
    """A peer of an existing cluster started again on its own storage, config and ports
    (it knows the cluster from its stored Raft state: no ``--bootstrap``)."""

    def prepare(self) -> Launch:
        state = _read_json(self.state_path)
        if state is None:
            raise RuntimeError(f"{self.state_path}: no state of the peer to resume")
        ports = dict(state["ports"])
        argv = [str(self.binary()), "--config-path", str(self.dir / "config.yaml")]
        argv += ["--disable-telemetry", "--uri", f"http://{HOST}:{ports['p2p']}"]
        return Launch(argv=argv, ports=ports, version="resumed")


def resume_qdrant_peer(base_dir: str | Path, index: int, *, timeout_s: float = 180) -> str:
    """Start peer ``index`` of the Qdrant cluster under ``base_dir`` again, keeping its
    data (after `stop_qdrant_peer`, or after every peer stopped); its URL. A running
    peer is reused."""
    base = _resolve(base_dir, default_base_dir)
    peer = _ResumedQdrantPeer(base, default_cache_dir(), index, {}, 0)
    record = _start_server(peer, timeout_s, _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S))
    return str(record["url"])


def stop_qdrant_cluster(base_dir: str | Path) -> None:
    """Stop every peer of the Qdrant cluster under ``base_dir``."""
    base = _resolve(base_dir, default_base_dir)
    if base.exists():
        with _file_lock(base / ".lock"):
            _stop_qdrant_peers(base, _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S))


def _stop_qdrant_peers(base: Path, grace: float) -> None:
    for path in sorted(base.glob("qdrant-*/")):
        suffix = path.name.removeprefix("qdrant-")
        if suffix.isdigit():
            _stop_server(QdrantClusterPeer(base, default_cache_dir(), int(suffix), {}, 0), grace)


class RedisServer(Server):
    """Debian's redis-server, no persistence."""

    def __init__(self, base_dir: Path, cache_dir: Path) -> None:
        super().__init__(base_dir, cache_dir, "redis", {"port": 16379})

    def _binary(self) -> str:
        found = shutil.which("redis-server")
        if found:
            return found
        if os.geteuid() != 0:
            raise HarnessError(
                "redis: redis-server is not installed and we are not root; "
                "run `apt-get install -y redis-server`"
            )
        _say("redis: redis-server missing, installing it with apt-get (first run only)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "redis-server"]
        try:
            _run_logged(install, self.setup_log_path, "redis: apt-get install", env=env)
        except HarnessError:
            _run_logged(
                ["apt-get", "update"], self.setup_log_path, "redis: apt-get update", env=env
            )
            _run_logged(install, self.setup_log_path, "redis: apt-get install", env=env)
        found = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if not found:
            raise HarnessError("redis: apt-get installed redis-server but it is not on PATH")
        return found

    def prepare(self) -> Launch:
        binary = self._binary()
        version_out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False
        ).stdout
        match = re.search(r"v=(\S+)", version_out)
        (port,) = pick_ports([self.preferred_ports["port"]])
        self.reset_data()
        return Launch(
            argv=[
                binary,
                "--port",
                str(port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.data_dir),
                "--logfile",
                "",
            ],
            ports={"port": port},
            version=match.group(1) if match else "unknown",
        )

    def url(self, ports: dict[str, int]) -> str:
        return f"redis://{HOST}:{ports['port']}/0"

    def probe(self, ports: dict[str, int]) -> bool:
        return redis_probe(ports["port"])


POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class PostgresServer(Server):
    """Debian's PostgreSQL (``/usr/lib/postgresql/<major>/bin``): a fresh cluster under the
    harness dir, TCP on 127.0.0.1 only (no Unix socket), trust authentication for the
    ``postgres`` superuser (test-only), ``synchronous_commit=off`` (like SQLite's WAL with
    ``synchronous=NORMAL``: a crash may lose the last commits, never corrupts).

    ``initdb`` and ``postgres`` refuse to run as root: as root they run as the ``postgres``
    user (``runuser`` for initdb; ``setpriv`` for the server, because it execs instead of
    forking, so the recorded pid is the postmaster's and SIGTERM reaches it directly).
    """

    def __init__(self, base_dir: Path, cache_dir: Path) -> None:
        super().__init__(base_dir, cache_dir, "postgres", {"port": 15432})

    @staticmethod
    def _find_bin() -> Path | None:
        def major(path: Path) -> tuple[int, ...]:
            return tuple(int(p) for p in re.findall(r"\d+", path.parent.name))

        found = [
            Path(p)
            for p in sorted(glob.glob(POSTGRES_BIN_GLOB))
            if (Path(p) / "postgres").exists() and (Path(p) / "initdb").exists()
        ]
        return max(found, key=major) if found else None

    def _bin_dir(self) -> Path:
        found = self._find_bin()
        if found:
            return found
        if os.geteuid() != 0:
            raise HarnessError(
                "postgres: no server under /usr/lib/postgresql/*/bin and we are not root; "
                "run `apt-get install -y postgresql`"
            )
        _say("postgres: server missing, installing Debian's postgresql with apt-get (first run)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
        try:
            _run_logged(install, self.setup_log_path, "postgres: apt-get install", env=env)
        except HarnessError:
            _run_logged(
                ["apt-get", "update"], self.setup_log_path, "postgres: apt-get update", env=env
            )
            _run_logged(install, self.setup_log_path, "postgres: apt-get install", env=env)
        found = self._find_bin()
        if not found:
            raise HarnessError(
                f"postgres: apt-get installed postgresql but {POSTGRES_BIN_GLOB} "
                "holds no postgres/initdb"
            )
        return found

    def _as_postgres(self, tool: str) -> list[str]:
        """Prefix that runs a command as the ``postgres`` user when we are root."""
        if os.geteuid() != 0:
            return []
        if tool == "server":
            # setpriv execs (no fork): the pid we record and signal is the postmaster's.
            return [
                _which_or_fail("setpriv", "postgres"),
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--reset-env",
                "--",
            ]
        return [_which_or_fail("runuser", "postgres"), "-u", "postgres", "--"]

    def prepare(self) -> Launch:
        bin_dir = self._bin_dir()
        version_out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=False
        ).stdout
        match = re.search(r"(\d+(?:\.\d+)+)", version_out)
        (port,) = pick_ports([self.preferred_ports["port"]])
        self.reset_data()
        if os.geteuid() == 0:
            shutil.chown(self.data_dir, "postgres", "postgres")
            self.data_dir.chmod(0o700)
            probe = subprocess.run(
                ["runuser", "-u", "postgres", "--", "test", "-w", str(self.data_dir)],
                check=False,
            )
            if probe.returncode != 0:
                raise HarnessError(
                    f"postgres: user postgres cannot write {self.data_dir}; a parent "
                    "directory is not traversable for it (choose a base dir under /tmp)"
                )
        _run_logged(
            [
                *self._as_postgres("initdb"),
                str(bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ],
            self.setup_log_path,
            "postgres: initdb",
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )
        return Launch(
            argv=[
                *self._as_postgres("server"),
                str(bin_dir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(port),
                "-c",
                f"listen_addresses={HOST}",
                "-c",
                "unix_socket_directories=",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=200",
                "-c",
                "log_min_messages=warning",
            ],
            ports={"port": port},
            version=match.group(1) if match else "unknown",
        )

    def url(self, ports: dict[str, int]) -> str:
        return f"postgresql://postgres@{HOST}:{ports['port']}/postgres"

    def probe(self, ports: dict[str, int]) -> bool:
        return postgres_probe(ports["port"])


SERVER_CLASSES: dict[str, type[Server]] = {
    "kafka": KafkaServer,
    "opensearch": OpenSearchServer,
    "qdrant": QdrantServer,
    "redis": RedisServer,
    "postgres": PostgresServer,
}


# --------------------------------------------------------------------------- state files


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _read_pid(server: Server) -> int | None:
    try:
        return int(server.pid_path.read_text().strip())
    except (OSError, ValueError):
        return None


def _running_pid(server: Server) -> int | None:
    """The pid from the pid file if that process is alive and is this server; else None."""
    pid = _read_pid(server)
    if pid is not None and pid_alive(pid) and server.owns(pid):
        return pid
    return None


def _unavailable(name: str, reason: str) -> dict[str, Any]:
    """servers.json record of a server that cannot be used; ``error`` starts with its name."""
    error = reason if reason.startswith(f"{name}:") else f"{name}: {reason}"
    return {"available": False, "url": None, "env": ENV_VARS[name], "error": error}


def _current_record(server: Server) -> dict[str, Any]:
    """Record for a server we are not (re)starting now: as stored, if its process still runs."""
    state = _read_json(server.state_path)
    if state and _running_pid(server) == state.get("pid"):
        return {**state, "reused": True}
    return _unavailable(server.name, "not running (not started by this `up`, or stopped)")


def _write_summary(base_dir: Path, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    summary = {
        "base_dir": str(base_dir),
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "servers": records,
    }
    _write_atomic(base_dir / "servers.json", json.dumps(summary, indent=2) + "\n")
    lines = [
        "# Written by tests/harness/servers.py; source it or eval `servers.py env`.",
        f"export ORRERY_SERVERS_DIR={shlex.quote(str(base_dir))}",
    ]
    for name in SERVER_NAMES:
        record = records.get(name) or _unavailable(name, "unknown")
        if record.get("available"):
            lines.append(f"export {ENV_VARS[name]}={shlex.quote(record['url'])}")
        else:
            lines.append(f"unset {ENV_VARS[name]}  # {record.get('error') or name + ': down'}")
    _write_atomic(base_dir / "servers.env", "\n".join(lines) + "\n")
    return summary


# --------------------------------------------------------------------------- start / stop


def _stop_server(server: Server, grace_s: float) -> bool:
    """Stop the server's recorded process (if it is ours) and delete its pid file."""
    pid = _running_pid(server)
    if pid is not None:
        _say(f"{server.name}: stopping pid {pid}")
        _terminate(pid, grace_s)
    with contextlib.suppress(FileNotFoundError):
        server.pid_path.unlink()
    return pid is not None


def _start_server(server: Server, timeout_s: float, grace_s: float) -> dict[str, Any]:
    """Reuse or start one server; return its servers.json record. Raises HarnessError."""
    server.dir.mkdir(parents=True, exist_ok=True)
    state = _read_json(server.state_path)
    pid = _running_pid(server)
    if pid is not None and state and state.get("pid") == pid:
        if server.probe(state["ports"]):
            _say(f"{server.name}: reusing pid {pid} at {state['url']}")
            return {**state, "reused": True}
        _say(f"{server.name}: pid {pid} does not answer; restarting it")
    if pid is not None:
        _stop_server(server, grace_s)

    setup_started = time.monotonic()
    try:
        launch = server.prepare()
    except HarnessError as exc:
        raise HarnessError(str(exc), exc.log or server.setup_log_path) from exc
    except OSError as exc:
        raise HarnessError(f"{server.name}: setup failed: {exc}", server.setup_log_path) from exc
    setup_s = time.monotonic() - setup_started
    with server.log_path.open("ab") as log:
        log.write(
            f"\n===== orrery harness: starting {server.name} at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode()
        )
        log.flush()
        started = time.monotonic()
        proc = subprocess.Popen(
            launch.argv,
            cwd=server.dir,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _SPAWNED[proc.pid] = proc
    server.pid_path.write_text(f"{proc.pid}\n")
    _say(
        f"{server.name}: started pid {proc.pid}, waiting until it answers "
        f"(timeout {timeout_s:.0f}s)"
    )

    deadline = started + timeout_s
    while True:
        if proc.poll() is not None:
            problem = f"exited with code {proc.returncode} before becoming ready"
            break
        if server.probe(launch.ports):
            startup_s = time.monotonic() - started
            record = {
                "available": True,
                "url": server.url(launch.ports),
                "env": ENV_VARS.get(server.name, ""),
                "pid": proc.pid,
                "ports": launch.ports,
                "version": launch.version,
                "dir": str(server.dir),
                "log": str(server.log_path),
                "setup_seconds": round(setup_s, 2),
                "startup_seconds": round(startup_s, 2),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "error": None,
            }
            _write_atomic(server.state_path, json.dumps(record, indent=2) + "\n")
            _say(
                f"{server.name} {launch.version}: ready at {record['url']} in {startup_s:.1f}s"
                f" (setup {setup_s:.1f}s)"
            )
            return {**record, "reused": False}
        if time.monotonic() >= deadline:
            problem = f"did not answer within {timeout_s:.0f}s"
            break
        time.sleep(PROBE_INTERVAL_S)
    _stop_server(server, grace_s)
    raise HarnessError(f"{server.name}: {problem}", server.log_path)


def _report_failure(server: Server, exc: BaseException) -> str:
    """Print the failure and the tail of the log that explains it; return a one-line reason."""
    log = (exc.log if isinstance(exc, HarnessError) else None) or server.log_path
    message = str(exc) if str(exc).startswith(server.name) else f"{server.name}: {exc!r}"
    _say(
        f"FAILED {message}\n[servers] last {LOG_TAIL_LINES} lines of {log}:\n"
        f"{_tail(log)}\n[servers] ---- end of {server.name} log ----"
    )
    return message


def _parse_only(only: str | Sequence[str] | None) -> list[str]:
    if only is None:
        return list(SERVER_NAMES)
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = sorted(set(names) - set(SERVER_NAMES))
    if unknown:
        raise ValueError(f"unknown server(s) {unknown}; choose from {list(SERVER_NAMES)}")
    return [n for n in SERVER_NAMES if n in names]


def start_all(
    base_dir: str | Path | None = None,
    only: str | Sequence[str] | None = None,
    *,
    require: bool | None = None,
    cache_dir: str | Path | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Make the selected servers (default: all) run and answer; return the servers.json dict.

    Servers are prepared and started in parallel. Servers not selected keep running if they
    were (and are then listed as available). ``require`` defaults to ``$ORRERY_REQUIRE_SERVERS``;
    when true, any failure raises :class:`ServersUnavailable` after servers.json is written.
    """
    _check_server_mode()
    base = _resolve(base_dir, default_base_dir)
    cache = _resolve(cache_dir, default_cache_dir)
    selected = _parse_only(only)
    require = _require_from_env() if require is None else require
    timeout = (
        timeout_s
        if timeout_s is not None
        else _env_float("ORRERY_SERVERS_TIMEOUT", DEFAULT_TIMEOUT_S)
    )
    grace = _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S)
    servers = {name: SERVER_CLASSES[name](base, cache) for name in SERVER_NAMES}
    failures: list[str] = []
    with _file_lock(base / ".lock"):
        records = {
            name: _current_record(servers[name]) for name in SERVER_NAMES if name not in selected
        }

        def run(name: str) -> tuple[str, dict[str, Any]]:
            try:
                return name, _start_server(servers[name], timeout, grace)
            except Exception as exc:  # Every failure is reported, per server.
                message = _report_failure(servers[name], exc)
                failures.append(message)
                return name, _unavailable(name, message)

        with ThreadPoolExecutor(max_workers=len(selected) or 1) as pool:
            for name, record in pool.map(run, selected):
                records[name] = record
        summary = _write_summary(base, {n: records[n] for n in SERVER_NAMES})
    if failures:
        if require:
            raise ServersUnavailable("; ".join(failures))
        _say(
            "some servers are unavailable (ORRERY_REQUIRE_SERVERS is not set, so this is not "
            "an error): " + "; ".join(failures)
        )
    return summary


def stop_all(base_dir: str | Path | None = None, only: str | Sequence[str] | None = None) -> None:
    """Stop the selected servers (default: all) by pid and delete their pid files only.

    Returns once every stopped process is gone; servers.json/servers.env mark them unavailable.
    """
    base = _resolve(base_dir, default_base_dir)
    if not base.exists():
        return
    selected = _parse_only(only)
    grace = _env_float("ORRERY_SERVERS_GRACE", DEFAULT_GRACE_S)
    servers = {name: SERVER_CLASSES[name](base, default_cache_dir()) for name in SERVER_NAMES}
    with _file_lock(base / ".lock"):
        with ThreadPoolExecutor(max_workers=len(selected) or 1) as pool:
            list(pool.map(lambda n: _stop_server(servers[n], grace), selected))
        records = {
            name: (
                _unavailable(name, "stopped by `servers.py down`")
                if name in selected
                else _current_record(servers[name])
            )
            for name in SERVER_NAMES
        }
        _write_summary(base, records)


def server_status(base_dir: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Live view per server: recorded state plus ``running`` (pid alive) and ``answering``."""
    base = _resolve(base_dir, default_base_dir)
    result: dict[str, dict[str, Any]] = {}
    for name in SERVER_NAMES:
        server = SERVER_CLASSES[name](base, default_cache_dir())
        state = _read_json(server.state_path) or {}
        pid = _running_pid(server)
        running = pid is not None and state.get("pid") == pid
        result[name] = {
            "running": running,
            "answering": bool(running and server.probe(state["ports"])),
            "pid": pid,
            "url": state.get("url") if running else None,
            "version": state.get("version"),
            "log": str(server.log_path),
        }
    return result


def server_urls(base_dir: str | Path | None = None) -> dict[str, str | None]:
    """For test fixtures: {"kafka": "127.0.0.1:P" | None, "opensearch": url | None,
    "qdrant": url | None, "redis": url | None, "postgres": url | None} from servers.json;
    None if the server is missing, failed, stopped, or its recorded process is no longer
    alive. Cheap (no network calls); never raises.
    """
    base = _resolve(base_dir, default_base_dir)
    summary = _read_json(base / "servers.json") or {}
    records = summary.get("servers") or {}
    urls: dict[str, str | None] = {}
    for name in SERVER_NAMES:
        record = records.get(name) or {}
        pid = record.get("pid")
        alive = isinstance(pid, int) and pid_alive(pid)
        urls[name] = record.get("url") if record.get("available") and alive else None
    return urls


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Exit codes: 0 ok; 1 a required server failed / status found one down;
    2 usage error."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-dir",
        type=Path,
        default=None,
        help="state directory (default $ORRERY_SERVERS_DIR or /tmp/orrery-servers)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start (or reuse) servers and wait until they answer")
    up.add_argument(
        "--only", default=None, help="comma-separated subset of " + ",".join(SERVER_NAMES)
    )
    down = sub.add_parser("down", help="stop servers by pid")
    down.add_argument("--only", default=None)
    sub.add_parser("status", help="show which servers run and answer; exit 1 if any does not")
    sub.add_parser("env", help="print servers.env (shell export lines)")
    cluster = sub.add_parser(
        "opensearch-cluster", help="start a loopback OpenSearch cluster (needs --base-dir)"
    )
    cluster.add_argument("--nodes", type=int, default=2)
    sub.add_parser("opensearch-cluster-down", help="stop the cluster under --base-dir")
    qcluster = sub.add_parser(
        "qdrant-cluster", help="start a loopback Qdrant cluster (needs --base-dir)"
    )
    qcluster.add_argument("--peers", type=int, default=3)
    sub.add_parser("qdrant-cluster-down", help="stop the Qdrant cluster under --base-dir")
    args = parser.parse_args(argv)
    base = _resolve(args.base_dir, default_base_dir)

    try:
        if args.command == "up":
            summary = start_all(base, args.only)
            for name, record in summary["servers"].items():
                print(
                    f"{name:<11} {'up' if record['available'] else 'DOWN':<5} "
                    f"{record.get('url') or record.get('error')}"
                )
            print(f"# env file: {base / 'servers.env'}")
        elif args.command == "down":
            stop_all(base, args.only)
        elif args.command == "status":
            states = server_status(base)
            for name, st in states.items():
                word = "up" if st["answering"] else ("STUCK" if st["running"] else "down")
                print(
                    f"{name:<11} {word:<5} pid={st['pid'] or '-':<8} {st['url'] or '-':<28} "
                    f"{st['version'] or ''}"
                )
            return 0 if all(st["answering"] for st in states.values()) else 1
        elif args.command == "opensearch-cluster":
            if args.base_dir is None:
                raise ValueError("opensearch-cluster needs --base-dir (a private directory)")
            summary = start_opensearch_cluster(base, args.nodes)
            for node in summary["nodes"]:
                print(f"{node['name']:<14} up    {node['url']}  pid={node['pid']}")
        elif args.command == "opensearch-cluster-down":
            stop_opensearch_cluster(base)
        elif args.command == "qdrant-cluster":
            if args.base_dir is None:
                raise ValueError("qdrant-cluster needs --base-dir (a private directory)")
            summary = start_qdrant_cluster(base, args.peers)
            for peer in summary["peers"]:
                print(f"{peer['name']:<14} up    {peer['url']}  pid={peer['pid']}")
        elif args.command == "qdrant-cluster-down":
            stop_qdrant_cluster(base)
        elif args.command == "env":
            env_file = base / "servers.env"
            if not env_file.exists():
                print(f"no {env_file}; run `up` first", file=sys.stderr)
                return 1
            sys.stdout.write(env_file.read_text())
    except ServersUnavailable as exc:
        print(f"[servers] required servers unavailable: {exc}", file=sys.stderr)
        return 1
    except HarnessError as exc:
        print(f"[servers] {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"[servers] {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
