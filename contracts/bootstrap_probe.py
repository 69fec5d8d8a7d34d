"""Whether a broker's bootstrap address accepts a TCP connection, asked with a plain socket.

Shared by the relay's publishers (`ingest.adapters`) and the projector's event logs
(`projector.adapters`), whichever Kafka client they drive: kafka-python leaks the socket
of every refused connection and the IO thread of a client whose bootstrap failed, and
librdkafka waits out its message timeout for a broker that is down; a plain socket check
first answers at once.
"""

from __future__ import annotations

import socket

__all__ = ["unreachable"]


def unreachable(bootstrap_servers: str, timeout_s: float) -> str | None:
    """Why no bootstrap server accepts a TCP connection, or None if one does.

    Both clients wait for a broker that is simply down (kafka-python also leaks the
    socket of every refused connection); a plain socket check first answers at once.
    """
    reasons: list[str] = []
    for server in (s.strip() for s in bootstrap_servers.split(",")):
        host, sep, port = server.rpartition(":")
        if not sep or not port.isdigit():
            return None  # not host:port: let the client interpret it
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return None
        except OSError as exc:
            reasons.append(f"{server}: {exc.strerror or exc}")
    return "; ".join(reasons) or "no bootstrap servers configured"
