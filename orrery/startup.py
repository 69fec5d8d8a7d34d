"""What `orrery` says when it cannot start: one line and exit code 2.

A person's first minutes meet expected failures — a malformed setting, a data dir
another server holds, a port in use, a bind address that needs API keys. Each is an
`ExpectedFailure` (or an `OrreryError` raised while starting) and `report` prints it as
one line on stderr; only `--debug` (or `ORRERY_DEBUG=1`) shows the traceback. Anything
else is a bug and keeps its traceback.

The checks here run before anything is opened: settings parse (`load_settings`), every
setting that is parsed later at startup (`check_config`), the bind address
(`check_bind`) and the port (`bind_socket`, a socket handed to uvicorn, so "serving" is
never printed for a port that another process holds).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from pydantic import ValidationError

from contracts.auth import parse_api_keys
from contracts.errors import OrreryError
from query.bootstrap import profile_registry, scope_registry, vocabulary_registry
from query.cursors import parse_cursor_keys
from query.settings import QuerySettings

__all__ = [
    "EXIT_EXPECTED",
    "ExpectedFailure",
    "bind_socket",
    "check_bind",
    "check_config",
    "debug_enabled",
    "load_settings",
    "one_line",
    "report",
]

# Exit code of every expected failure (typer's own usage errors use 2 as well).
EXIT_EXPECTED = 2
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_ENV_PREFIX = "ORRERY_"


class ExpectedFailure(Exception):
    """A condition a person can fix, said in one line (no traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def debug_enabled() -> bool:
    """Tracebacks for expected failures too: `orrery --debug …` or `ORRERY_DEBUG=1`."""
    return os.environ.get("ORRERY_DEBUG", "").strip().lower() in ("1", "true", "yes")


def _setting_name(loc: tuple[Any, ...]) -> str:
    return _ENV_PREFIX + "_".join(str(part) for part in loc).upper() if loc else "settings"


def load_settings(**overrides: object) -> QuerySettings:
    """`QuerySettings` from the environment with the command line's `overrides` (None:
    not given); a malformed value is an `ExpectedFailure` naming its variable."""
    try:
        # Validated with the overrides (not copied over): `--mode servers` changes the
        # deployment's defaults (ORRERY_MAX_RECORD_BYTES) and their checks.
        values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return QuerySettings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        value = first.get("input")
        shown = "" if isinstance(value, dict) else f" (got {str(value)[:80]!r})"
        raise ExpectedFailure(
            f"{_setting_name(tuple(first['loc']))}: {first['msg']}{shown}"
        ) from exc


def check_config(settings: QuerySettings) -> None:
    """Parse every setting the stack parses while it starts (API keys, scopes, profiles
    and the default profile, vocabularies, cursor keys), so a mistake is one line
    before anything is opened."""
    checks: tuple[tuple[str, Callable[[], object]], ...] = (
        ("ORRERY_API_KEYS", lambda: parse_api_keys(settings.api_keys)),
        ("ORRERY_SCOPES", lambda: scope_registry(settings)),
        ("ORRERY_PROFILES", lambda: profile_registry(settings)),
        ("ORRERY_VOCABULARIES", lambda: vocabulary_registry(settings)),
        ("ORRERY_CURSOR_KEYS", lambda: parse_cursor_keys(settings.cursor_keys)),
    )
    for setting, check in checks:
        try:
            check()
        except ValueError as exc:
            message = " ".join(str(exc).split()) or type(exc).__name__
            if message.startswith("default profile"):
                setting = "ORRERY_DEFAULT_PROFILE"
            raise ExpectedFailure(
                message if message.startswith("ORRERY_") else f"{setting}: {message}"
            ) from exc


def check_bind(settings: QuerySettings) -> None:
    """Refuse a non-loopback bind address without API keys (the API would be open)."""
    if not settings.api_keys.strip() and settings.host not in _LOOPBACK:
        raise ExpectedFailure(
            f"refusing to bind {settings.host}: no API keys are configured; set "
            "ORRERY_API_KEYS=key=namespace[/galaxy],… or bind 127.0.0.1"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` for uvicorn (`Server.run(sockets=…)`); a port
    in use or not allowed is an `ExpectedFailure`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ExpectedFailure(f"cannot bind {host}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(2048)
    except OverflowError as exc:
        sock.close()
        raise ExpectedFailure(f"port {port} is not a port number (1-65535)") from exc
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ExpectedFailure(
                f"port {port} on {host} is already in use (another `orrery serve`?): stop "
                "it or pick another port with --port or ORRERY_PORT"
            ) from exc
        if exc.errno == errno.EACCES:
            raise ExpectedFailure(
                f"not allowed to bind {host}:{port} (ports below 1024 need privileges)"
            ) from exc
        raise ExpectedFailure(f"cannot bind {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


def one_line(exc: BaseException) -> str | None:
    """The line an expected failure is reported with; None for anything else."""
    if isinstance(exc, ExpectedFailure):
        text = exc.message
    elif isinstance(exc, OrreryError):
        text = f"{exc.code.value}: {exc.message}"
    else:
        return None
    # A driver's message may span lines (psycopg's hint): one line all the same.
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def report(exc: BaseException) -> NoReturn:
    """Print `exc` as one line and exit 2 when it is expected; re-raise it otherwise."""
    line = one_line(exc)
    if line is None or debug_enabled():
        raise exc
    print(f"orrery: {line}", file=sys.stderr)
    raise SystemExit(EXIT_EXPECTED)
