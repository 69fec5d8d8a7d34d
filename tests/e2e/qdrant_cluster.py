"""One server-mode `orrery serve` over a private 3-peer Qdrant cluster, for the shard tests
(`test_qdrant_shards.py`, `test_qdrant_hnsw_receipt.py`).

The cluster runs on loopback (`tests/harness/servers.py`, peer 1 the one Orrery talks
to); Kafka, OpenSearch and Redis come from the shared harness (they must be up: a test
that needs them fails in CI, never skips); the registry is SQLite under the server's
data dir, so a test can qualify in-process and store the receipt. The scope's records
are posted and projected before the deployment is handed out: its first generation (1
shard, no replica) is the projector's, the exact reference of the spread ones.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_shards import ADMIN_KEY, KIND, NS, PROFILES, ClusterDeployment
from tests.harness.servers import start_qdrant_cluster, stop_qdrant_cluster

__all__ = ["PEERS", "QdrantClusterDeployment", "qdrant_cluster_deployment"]

PEERS = 3
# Records per `POST /v1/records`.
_BATCH = 500


@dataclass
class QdrantClusterDeployment(ClusterDeployment):
    """Over a 3-peer Qdrant cluster; `env` is the server's environment (a restart
    starts the same one, with any changes the test names)."""

    env: dict[str, str]

    def collection(self, generation_id: str) -> str:
        return f"{self.prefix}-{generation_id}"

    def qdrant(self, path: str) -> Any:
        """The `result` of a GET on the cluster's peer 1."""
        response = httpx.get(f"{self.cluster['url']}{path}", timeout=30)
        response.raise_for_status()
        return response.json()["result"]

    def restart(self, **env: str) -> None:
        """Stop the server and start it again on its data with `env` over its own."""
        self.server.stop()
        self.server = start_server(self.data_dir, env={**self.env, **env})


Deployed = TypeVar("Deployed", bound=QdrantClusterDeployment)


@contextmanager
def qdrant_cluster_deployment(
    kind: type[Deployed],
    tmp_path_factory: pytest.TempPathFactory,
    records: Sequence[Mapping[str, Any]],
    *,
    name: str,
    storage: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    first_env: Mapping[str, str] | None = None,
    project_timeout_s: float = 300,
) -> Iterator[Deployed]:
    """A `kind` deployment with `records` (all of scope `NS`/`KIND`) projected.

    `storage`: the peers' storage settings (e.g. indexing thresholds); `env`: the
    server's settings beyond the harness's (the response cache is always off: every
    answer compared is searched); `first_env`: settings of the first server process only
    (a later `restart()` drops them). The cluster and its data are removed afterwards,
    and the last server the test left in the deployment is stopped.
    """
    from tests.e2e.test_servers_http import server_env

    for needed in ("kafka", "opensearch", "redis"):
        require_server(needed)
    cluster_dir = Path(tempfile.mkdtemp(prefix=f"orrery-{name}-", dir="/tmp"))
    server: Server | None = None
    deployed: Deployed | None = None
    try:
        cluster = start_qdrant_cluster(
            cluster_dir, PEERS, timeout_s=180, storage=dict(storage) if storage else None
        )
        tag = run_tag()
        data_dir = tmp_path_factory.mktemp(name) / "data"
        environment = server_env(
            tag,
            database=False,
            ORRERY_QDRANT_URL=cluster["url"],
            ORRERY_ADMIN_KEY=ADMIN_KEY,
            ORRERY_QUALIFY_PROFILES=",".join(PROFILES),
            ORRERY_CACHE_RESPONSES="false",
            **dict(env or {}),
        )
        server = start_server(data_dir, env={**environment, **dict(first_env or {})})
        for start in range(0, len(records), _BATCH):
            posted = server.post_records(list(records[start : start + _BATCH]))
            assert posted.status_code == 200, posted.text
        server.wait_projected(timeout=project_timeout_s, documents={(NS, KIND): len(records)})
        ready = server.client.get("/v1/readiness").json()
        first = next(s["generation_id"] for s in ready["scopes"] if s["namespace"] == NS)
        deployed = kind(
            server, cluster, cluster_dir, f"orrery-test-{tag}", data_dir, first, environment
        )
        yield deployed
    finally:
        last = deployed.server if deployed is not None else server
        if last is not None and last.process.poll() is None:
            last.stop()
        stop_qdrant_cluster(cluster_dir)
        shutil.rmtree(cluster_dir, ignore_errors=True)
