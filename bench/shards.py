"""What sharding costs and what the receipt sees, at 100k on a real cluster (issue 23).

    .venv/bin/python bench/shards.py [--data-root /tmp/orrery-bench-shards]
        [--phase build|measure|all] [--documents 100000] [--queries 200]
        [--qualify-shape n3r1] [--qualify-workers 1,4] [--py-spy FILE]
        [--skip topk,lexical,qualify,caps,peer_down] [--shapes n1r0,n2r0,n3r1,n4r0]
        [--out docs/bench/shards.json]

One deployment, built once under `--data-root` and reused by every later run (`build`
skips what `state.json` there says is done; `measure` only measures): a private 3-peer
Qdrant cluster (`tests/harness/servers.py`), the harness's Kafka, OpenSearch and Redis,
and a server-mode `orrery serve` (response cache off) on `<root>/data`.

Build: the corpus of `bench/topk.py` (seeded; titles of 3-7 pseudo-words, bodies of
30-60, 384-d unit vectors clustered around 1,000 embedded topics whose words the text
shares, `bench/synthetic.py`) is POSTed and projected (the projector's generation: 1 shard,
no replica), then generations of 2 and 4 shards without a replica and of 3 shards with
one replica are built and verified through the admin API. The bench then waits until
every peer reports the collections green with their HNSW graphs built (indexed vectors
= points: every key holds far more points than Qdrant's indexing threshold, so searches
use HNSW, not exact scans).

Measure (each figure with `/proc/loadavg` before and after; the machine is shared):
1. `topk_records` over HTTP, pinned to each generation (`scope_ref@generation`), the
   queries of `bench/topk.py` (2-5 words, every second one filtered on status and
   galaxy), interleaved query by query over the shapes (the order rotating each query)
   after one untimed pass that warms the query-vector cache: p50/p95 per shape, the
   stage latencies `query_plan.latency_ms` reports (means and p95) and the engines' own
   times (`engine_ms`); the ratio of each shape's p95 to the 1-shard one.
2. DFS against `query_then_fetch`: the query side's `OpenSearchLexicalSearch` on each
   generation's index with both search types, interleaved: latency, and inclusion and
   top-10 order agreement against the 1-shard DFS lists.
3. Qualification: `POST /v1/admin/generations/{id}/qualify` of the 3-shard, 1-replica
   generation (the default 200 queries): wall time and the receipt's figures.
With `--ef 128,256,…` first (and `--acorn 0,0.4`: ACORN settings to cross them with): the
vector adapter alone, each shard key searched at exactly each HNSW ef (cap 100) on every
shape, interleaved, against exact search — inclusion per filter kind (none; the bench's
status + galaxy; the receipt's status + visibility) and latency per setting — and with
`--ef-receipts Q` an in-process receipt of Q queries per setting.
4. Per-shard vector caps with HNSW on the 4-shard generation: each shard asked for
   D, D/2 and D/N candidates (D = the production cap) and the lists merged by score,
   qualified in process against the exact reference (the receipt's vector inclusion).
5. Peer 3 of 3 stopped: `topk_records` p50/p95 of the 3-shard, 1-replica generation
   (each shard then answered by its eligible copy) interleaved with the 1-shard one;
   the peer is started again afterwards.

Writes `docs/bench/shards.json` and a PNG next to it and prints a table. Figures are
reported, never asserted; the targets of issue 23 are printed next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as `python bench/shards.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    ServeProcess,
    harness_servers_env,
    ingest_env,
    latency_summary,
    run_and_publish,
    start_serve,
)
from bench.topk import (
    NAMESPACE,
    SCOPE_REF,
    SNAPSHOT_KIND,
    QuerySpec,
    Vocabulary,
    corpus_batches,
    ingest,
    make_queries,
)

ADMIN_KEY = "bench-admin-key"
ADMIN = "/v1/admin/generations"
TOPK = "/v1/external/retrieve/topk_records"
# (shards, replicas) of every generation; the first is the projector's.
SHAPES: tuple[tuple[int, int], ...] = ((1, 0), (2, 0), (3, 1), (4, 0))
LATENCY_SHAPES = SHAPES
QUALIFIED = (3, 1)
CAPPED = (4, 0)
PEERS = 3
# `--serve-env`: settings of every server this run starts (e.g. to measure with one off).
SERVE_ENV: dict[str, str] = {}
LEXICAL_CAP = 100
TOP = 10
SEED = 42


def shape_name(shape: Sequence[int]) -> str:
    return f"n{shape[0]}r{shape[1]}"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- the deployment -------------------------------------------------------------------------


class Deployment:
    """The state of `--data-root`: the cluster, the server's environment and the
    generation of every shape, kept in `state.json` so a later run reuses them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "state.json"
        self.state: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.state, indent=2) + "\n")

    @property
    def cluster_dir(self) -> Path:
        return self.root / "qdrant"

    @property
    def env(self) -> dict[str, str]:
        return dict(self.state["env"])

    @property
    def prefix(self) -> str:
        return self.env["ORRERY_QDRANT_COLLECTION_PREFIX"]

    @property
    def qdrant_url(self) -> str:
        return self.env["ORRERY_QDRANT_URL"]

    def generation(self, shape: Sequence[int]) -> str:
        return str(self.state["generations"][shape_name(shape)])

    def cluster_up(self) -> None:
        """Start the cluster, or start its stopped peers again on their own data."""
        from tests.harness.servers import resume_qdrant_peer, start_qdrant_cluster

        if "env" not in self.state:
            cluster = start_qdrant_cluster(self.cluster_dir, PEERS, timeout_s=300)
            env = harness_servers_env("shards")
            env["ORRERY_QDRANT_URL"] = cluster["url"]
            self.state["env"] = env
            self.state["peer_urls"] = cluster["urls"]
            self.save()
            return
        for peer in range(1, PEERS + 1):
            resume_qdrant_peer(self.cluster_dir, peer)
        _wait_peers(self.qdrant_url, PEERS)

    @contextmanager
    def server(self, **extra: str) -> Iterator[ServeProcess]:
        env = {
            **self.env,
            **ingest_env(2_000),
            "ORRERY_ADMIN_KEY": ADMIN_KEY,
            "ORRERY_CACHE_RESPONSES": "false",
            # Short, so that the peer-down phase sees a stopped peer at once.
            "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "2",
            **SERVE_ENV,
            **extra,
        }
        server = start_serve(self.root / "data", self.root / "serve.log", env, startup_s=600)
        try:
            yield server
        finally:
            server.stop()


def _wait_peers(url: str, peers: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            known = httpx.get(f"{url}/cluster", timeout=10).json()["result"]["peers"]
            if len(known) >= peers:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Qdrant cluster at {url} did not show {peers} peers")
        time.sleep(1)


def admin(client: httpx.Client, method: str, path: str, body: Any = None) -> dict[str, Any]:
    response = client.request(
        method, ADMIN + path, json=body, headers={"x-admin-key": ADMIN_KEY}, timeout=3600
    )
    if response.status_code >= 300:
        raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
    return dict(response.json())


def build_generation(client: httpx.Client, shards: int, replicas: int) -> dict[str, Any]:
    """Build, seal and verify one generation of the bench scope; its id and timings."""
    body = {
        "namespace": NAMESPACE,
        "snapshot_kind": SNAPSHOT_KIND,
        "shards": shards,
        "replicas": replicas,
    }
    started = time.perf_counter()
    generation_id = str(admin(client, "POST", "/build", body)["row"]["generation_id"])
    while True:
        view = admin(client, "GET", f"/{generation_id}")
        if view["row"]["state"] != "building":
            break
        time.sleep(2)
    if view["row"]["state"] != "sealed":
        raise RuntimeError(f"build of {generation_id}: {view['row']}")
    built_s = time.perf_counter() - started
    check = admin(client, "POST", f"/{generation_id}/verify")
    if not check["verified"]:
        raise RuntimeError(f"verify of {generation_id}: {check}")
    return {
        "generation_id": generation_id,
        "build_seconds": round(built_s, 1),
        "verify_seconds": round(time.perf_counter() - started - built_s, 1),
    }


def indexed(dep: Deployment, shape: Sequence[int]) -> dict[str, Any]:
    """Per peer: the collection's status and how many of its points are in HNSW."""
    collection = f"{dep.prefix}-{dep.generation(shape)}"
    out = {}
    for url in dep.state["peer_urls"]:
        info = httpx.get(f"{url}/collections/{collection}", timeout=30).json()["result"]
        out[url] = {
            "status": info["status"],
            "optimizer": str(info["optimizer_status"]),
            "points": info.get("points_count") or 0,
            "indexed_vectors": info.get("indexed_vectors_count") or 0,
            "segments": info.get("segments_count") or 0,
        }
    return out


def wait_indexed(dep: Deployment, timeout_s: float = 3600) -> dict[str, Any]:
    """Every collection green on every peer with an idle optimizer, twice in a row 10 s
    apart (the optimizer starts a few seconds after the last write). A segment under
    Qdrant's indexing threshold (~6.5k 384-d vectors) is never given a graph, so
    `indexed_vectors` can stay below `points` (20k in one shard: 14,288 of 20,000); the
    counts are reported, not waited for."""
    deadline = time.monotonic() + timeout_s
    steady = 0
    while True:
        seen = {shape_name(s): indexed(dep, s) for s in SHAPES}
        done = all(
            p["status"] == "green" and p["optimizer"] == "ok"
            for peers in seen.values()
            for p in peers.values()
        )
        steady = steady + 1 if done else 0
        if steady >= 2:
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"collections not indexed in time: {seen}")
        print(f"waiting for HNSW: {json.dumps(seen)[:400]}", flush=True)
        time.sleep(10)


def build(dep: Deployment, documents: int) -> None:
    dep.root.mkdir(parents=True, exist_ok=True)
    dep.state.setdefault("load_build_before", loadavg())
    dep.cluster_up()
    with dep.server() as server, server.client(timeout_s=600) as client:
        generations = dep.state.setdefault("generations", {})
        if shape_name(SHAPES[0]) not in generations:
            vocab = Vocabulary.build(random.Random(SEED))
            figures = ingest(
                server, client, corpus_batches(documents, 2_000, SEED, vocab), documents
            )
            ready = client.get("/v1/readiness").json()
            first = next(s for s in ready["scopes"] if s["namespace"] == NAMESPACE)
            generations[shape_name(SHAPES[0])] = first["generation_id"]
            dep.state["documents"] = documents
            dep.state["corpus"] = "clustered"
            dep.state["ingest"] = {
                k: v for k, v in figures.items() if isinstance(v, int | float | str)
            }
            dep.save()
        builds = dep.state.setdefault("builds", {})
        for shape in SHAPES[1:]:
            if shape_name(shape) in generations:
                continue
            print(f"building {shape_name(shape)}", flush=True)
            made = build_generation(client, *shape)
            generations[shape_name(shape)] = made["generation_id"]
            builds[shape_name(shape)] = made
            dep.save()
            print(f"built {shape_name(shape)}: {made}", flush=True)
    dep.state["indexed"] = wait_indexed(dep)
    dep.state["load_build_after"] = loadavg()
    dep.save()


# -- measuring ------------------------------------------------------------------------------


def topk_body(generation_id: str, query: QuerySpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": NAMESPACE,
        "scope_ref": f"{SCOPE_REF}@{generation_id}",
        "query_text": query.text,
        "result_limit": TOP,
        "timeout_seconds": 60,
        "include": {"query_plan": True, "payload": False},
    }
    if query.filters:
        body["filters"] = query.filters
    return body


def interleaved_topk(
    client: httpx.Client,
    dep: Deployment,
    shapes: Sequence[Sequence[int]],
    queries: Sequence[QuerySpec],
) -> dict[str, Any]:
    """`topk_records` of every query on every shape, the order rotating per query."""
    names = [shape_name(s) for s in shapes]
    ids = {shape_name(s): dep.generation(s) for s in shapes}
    seconds: dict[str, list[float]] = {n: [] for n in names}
    stages: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    engines: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    searched: dict[str, Any] = {}
    before = loadavg()
    for i, query in enumerate(queries):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            response = client.post(TOPK, json=topk_body(ids[name], query))
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {response.status_code} {response.text[:300]}")
            plan = response.json()["query_plan"]
            seconds[name].append(elapsed)
            for stage, ms in plan["latency_ms"].items():
                stages[name].setdefault(stage, []).append(float(ms))
            for engine, ms in plan.get("engine_ms", {}).items():
                engines[name].setdefault(engine, []).append(float(ms))
            searched.setdefault(name, plan.get("shards"))
    return {
        "load_before": before,
        "load_after": loadavg(),
        "shapes": {
            name: {
                "latency_ms": latency_summary(seconds[name]),
                "stages_ms": {
                    stage: {"mean": round(statistics.fmean(v), 3), "p95": _p95(v)}
                    for stage, v in stages[name].items()
                },
                "engine_ms": {
                    engine: {"mean": round(statistics.fmean(v), 3), "p95": _p95(v)}
                    for engine, v in engines[name].items()
                },
                "query_plan_shards": searched.get(name),
            }
            for name in names
        },
    }


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3)


def lexical_search_types(dep: Deployment, queries: Sequence[QuerySpec]) -> dict[str, Any]:
    """DFS against query_then_fetch on every generation's OpenSearch index."""
    from contracts.index import SearchFilter
    from query.adapters.opensearch_lexical import OpenSearchLexicalSearch

    env = dep.env
    readers = {
        kind: OpenSearchLexicalSearch(
            env["ORRERY_OPENSEARCH_URL"],
            index_prefix=env["ORRERY_OPENSEARCH_INDEX_PREFIX"],
            search_type=kind,
        )
        for kind in ("dfs_query_then_fetch", "query_then_fetch")
    }
    paths = [(s, k) for s in LATENCY_SHAPES for k in readers]
    seconds: dict[tuple[Any, str], list[float]] = {p: [] for p in paths}
    ranked: dict[tuple[Any, str], list[list[str]]] = {p: [] for p in paths}
    before = loadavg()
    try:
        for shape, kind in paths:  # warm-up
            for query in queries[:10]:
                readers[kind].search(dep.generation(shape), query.text, SearchFilter(), LEXICAL_CAP)
        for i, query in enumerate(queries):
            for shape, kind in paths[i % len(paths) :] + paths[: i % len(paths)]:
                started = time.perf_counter()
                found = readers[kind].search(
                    dep.generation(shape), query.text, SearchFilter(), LEXICAL_CAP
                )
                seconds[(shape, kind)].append(time.perf_counter() - started)
                ranked[(shape, kind)].append([c.document_id for c in found])
    finally:
        for reader in readers.values():
            reader.close()
    reference = ranked[(SHAPES[0], "dfs_query_then_fetch")]
    rows = []
    for (shape, kind), lists in ranked.items():
        inclusion, agreement = [], []
        for made, exact in zip(lists, reference, strict=True):
            if exact:
                inclusion.append(len(set(made) & set(exact)) / len(exact))
                top = exact[:TOP]
                agreement.append(
                    sum(1 for r, d in enumerate(top) if r < len(made) and made[r] == d) / len(top)
                )
        rows.append(
            {
                "shape": shape_name(shape),
                "search_type": kind,
                "latency_ms": latency_summary(seconds[(shape, kind)]),
                "inclusion_mean": round(statistics.fmean(inclusion), 6),
                "inclusion_min": round(min(inclusion), 6),
                "top10_order_agreement_mean": round(statistics.fmean(agreement), 6),
                "top10_order_agreement_min": round(min(agreement), 6),
            }
        )
    return {"cap": LEXICAL_CAP, "load_before": before, "load_after": loadavg(), "rows": rows}


def qualify(
    dep: Deployment, workers: int, py_spy: Path | None, shape: Sequence[int] = QUALIFIED
) -> dict[str, Any]:
    """`POST …/qualify` of the generation of `shape` (3 shards, 1 replica) on a server
    whose `ORRERY_QUALIFY_WORKERS` is `workers` (with `py_spy`: sampled into that file)."""
    import subprocess

    generation_id = dep.generation(shape)
    with (
        # The default re-check interval: at 2 s the gate re-scrolls the live generation
        # back to back in the server whose CPU is measured.
        dep.server(
            ORRERY_QUALIFY_WORKERS=str(workers), ORRERY_ELIGIBILITY_INTERVAL_SECONDS="60"
        ) as server,
        server.client(timeout_s=600) as client,
    ):
        spy = None
        if py_spy is not None:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "-o",
                    str(py_spy),
                    "-p",
                    str(server.pid),
                    "--threads",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        before = loadavg()
        started = time.perf_counter()
        cpu_before = server.cpu_seconds()
        receipt = admin(client, "POST", f"/{generation_id}/qualify", {})["receipt"]
        wall = time.perf_counter() - started
        cpu = server.cpu_seconds() - cpu_before
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=120)
        # Again at the same position: the reference copy is reused (it is kept after a
        # failed receipt; a passing one drops it).
        started = time.perf_counter()
        cpu_before = server.cpu_seconds()
        again = admin(client, "POST", f"/{generation_id}/qualify", {})["receipt"]
        again_wall = time.perf_counter() - started
        again_cpu = server.cpu_seconds() - cpu_before
    return {
        "workers": workers,
        "shape": shape_name(shape),
        "cpu_seconds_server": round(cpu, 1),
        "wall_seconds": round(wall, 2),
        "receipt_seconds": receipt["seconds"],
        "again": {
            "cpu_seconds_server": round(again_cpu, 1),
            "wall_seconds": round(again_wall, 2),
            "receipt_seconds": again["seconds"],
            "same_figures": again["slices"] == receipt["slices"]
            and again["sample_digest"] == receipt["sample_digest"],
        },
        "sample_size": receipt["sample_size"],
        "passed": receipt["passed"],
        "failures": receipt["failures"],
        "caps": receipt["caps"],
        "search": receipt.get("search", {}),
        "slices": _slice_figures(receipt["slices"]),
        "load_before": before,
        "load_after": loadavg(),
    }


def _slice_figures(slices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        s["slice"]: {
            "queries": s["queries"],
            "sources": {
                name: {k: f[k] for k in ("cap", "inclusion_mean", "inclusion_min")}
                for name, f in s["sources"].items()
            },
            "profiles": {
                name: {k: f[k] for k in ("overlap_mean", "overlap_min", "order_agreement_mean")}
                for name, f in s["profiles"].items()
            },
        }
        for s in slices
        if s["queries"]
    }


def per_shard_caps(dep: Deployment, sample_size: int) -> dict[str, Any]:
    """Receipts of the 4-shard generation whose vector source asks each shard for
    D / divisor candidates (merged by score, the first D kept), for divisors 1, 2, N —
    each shard key searched through HNSW as production searches it (the spread ef rule
    at D / divisor + 1 points, ACORN for filtered searches, the default settings)."""
    from qdrant_client import models

    from contracts.index import Candidate, SearchFilter
    from contracts.qualification import QualifyRequest
    from contracts.shards import copy_key
    from contracts.vector_payload import (
        DEFAULT_SPREAD_ACORN_SELECTIVITY,
        RETURNED_FIELDS,
        VECTOR_NAME,
        best_first,
        candidate_of,
    )
    from query.adapters.qdrant_vectors import QdrantServerVectorSearch, qdrant_filter
    from query.settings import QuerySettings
    from tests.e2e.test_shards import in_process_qualifier

    shards = CAPPED[0]
    env = dep.env
    out: dict[str, Any] = {"shape": shape_name(CAPPED), "sample_size": sample_size, "caps": {}}
    acorn = models.AcornSearchParams(enable=True, max_selectivity=DEFAULT_SPREAD_ACORN_SELECTIVITY)

    def capped(divisor: int) -> Callable[[Any, Any], Any]:
        def production(ports: Any, qdrant: Any) -> Any:
            class PerShardCap(QdrantServerVectorSearch):
                def search(
                    self,
                    generation_id: str,
                    vector: Sequence[float],
                    filter: SearchFilter,
                    limit: int,
                ) -> list[Candidate]:
                    found: list[Candidate] = []
                    each = max(1, limit // divisor)
                    where = qdrant_filter(filter)
                    params = models.SearchParams(
                        hnsw_ef=self.ef(each + 1, spread=True),
                        acorn=acorn if where is not None and where.must else None,
                    )
                    for shard in range(shards):
                        points = qdrant.query_points(
                            f"{dep.prefix}-{generation_id}",
                            query=list(vector),
                            using=VECTOR_NAME,
                            query_filter=where,
                            limit=each,
                            with_payload=list(RETURNED_FIELDS),
                            search_params=params,
                            shard_key_selector=copy_key(shard, 0),
                        ).points
                        found += [candidate_of(p.payload or {}, p.score) for p in points]
                    return best_first(found, limit)

            return replace(ports, vectors=PerShardCap(qdrant, collection_prefix=dep.prefix))

        return production

    with in_process_qualifier(
        dep.root / "data",
        env["ORRERY_OPENSEARCH_INDEX_PREFIX"],
        opensearch_url=env["ORRERY_OPENSEARCH_URL"],
        qdrant_url=dep.qdrant_url,
    ) as run:
        for label, divisor in (("D", 1), ("D/2", 2), (f"D/{shards}", shards)):
            before = loadavg()
            receipt = run(
                dep.generation(CAPPED),
                capped(divisor),
                QualifyRequest(sample_size=sample_size),
                {**QuerySettings().vector_search(), "vector_per_shard_divisor": divisor},
            )
            out["caps"][label] = {
                "per_shard_divisor": divisor,
                "passed": receipt.passed,
                "failures": list(receipt.failures),
                "seconds": receipt.seconds,
                "search": receipt.search,
                "vector_inclusion": {
                    s.slice: {
                        "cap": s.sources["vector"].cap,
                        "mean": s.sources["vector"].inclusion_mean,
                        "min": s.sources["vector"].inclusion_min,
                    }
                    for s in receipt.slices
                    if s.queries and "vector" in s.sources
                },
                "slices": _slice_figures([s.model_dump(mode="json") for s in receipt.slices]),
                "load_before": before,
                "load_after": loadavg(),
            }
            print(f"caps {label}: {out['caps'][label]}", flush=True)
    return out


def sweep_filters(queries: Sequence[QuerySpec]) -> list[tuple[str, Any]]:
    """Each query's filter in the ef sweep, by kind: the bench's own (status any-of +
    galaxy, every second query), and on every fourth query instead the receipt's status +
    visibility slice (one status drawn by the corpus's weights, one or two visibility
    labels: a conjunction over two fields, no tenant)."""
    from bench.topk import STATUS_WEIGHTS, STATUSES, VISIBILITY
    from contracts.index import SearchFilter

    rng = random.Random(11)
    out: list[tuple[str, Any]] = []
    for i, query in enumerate(queries):
        status = rng.choices(STATUSES, weights=STATUS_WEIGHTS)[0]
        visibility = tuple(sorted(rng.sample(VISIBILITY, rng.randint(1, 2))))
        if i % 4 == 2:
            out.append(("status_visibility", SearchFilter(status=(status,), visibility=visibility)))
        elif query.filters:
            where = SearchFilter(
                galaxy=query.filters["galaxy"], status=tuple(query.filters["status"])
            )
            out.append(("status_galaxy", where))
        else:
            out.append(("unfiltered", SearchFilter()))
    return out


def ef_sweep(
    dep: Deployment,
    efs: Sequence[int],
    acorns: Sequence[float],
    queries: Sequence[QuerySpec],
    receipts: int,
) -> dict[str, Any]:
    """Vector inclusion@cap and search latency per HNSW `ef` and ACORN setting, at the
    adapter: every query's vector (embedded once) searched on every shape with every
    (ef, acorn) (each shard key asked for cap + 1 points at exactly that ef:
    `spread_ef_factor` 1; `acorn` the largest filter selectivity Qdrant may use ACORN at,
    0: never), interleaved query by query (the order rotating), against exact search on
    the same collection, per filter kind (`sweep_filters`). With `receipts` > 0, then an
    in-process qualification receipt of the qualified shape per (ef, acorn) (that many
    queries; the production vector source at those settings) — the figures the gate
    reads."""
    from contracts.qualification import QualifyRequest
    from projector.adapters.qdrant_vectors import open_qdrant_client
    from projector.bootstrap import default_embedder
    from query.adapters.qdrant_vectors import QdrantServerVectorSearch
    from tests.e2e.test_shards import in_process_qualifier

    cap = 100
    client = open_qdrant_client(url=dep.qdrant_url)
    settings = [(ef, acorn) for ef in efs for acorn in acorns]
    # ef 0: exact search (what a brute-force scan of every key costs).
    searchers = {
        (ef, acorn): QdrantServerVectorSearch(
            client,
            collection_prefix=dep.prefix,
            hnsw_ef=max(1, ef),
            spread_ef_factor=1,
            spread_acorn_selectivity=acorn,
            exact=ef == 0,
        )
        for ef, acorn in settings
    }
    exact = QdrantServerVectorSearch(client, collection_prefix=dep.prefix, exact=True)
    vectors = default_embedder(1).embed([q.text for q in queries])
    filters = sweep_filters(queries)
    paths = [(s, ef, acorn) for s in SHAPES for ef, acorn in settings]
    seconds: dict[tuple[Any, int, float], list[float]] = {p: [] for p in paths}
    inclusion: dict[tuple[Any, int, float, str], list[float]] = {}
    by_kind: dict[tuple[Any, int, float, str], list[float]] = {}
    before = loadavg()
    for i, (vector, (kind, where)) in enumerate(zip(vectors, filters, strict=True)):
        reference = {
            s: {c.document_id for c in exact.search(dep.generation(s), vector, where, cap)}
            for s in SHAPES
        }
        for shape, ef, acorn in paths[i % len(paths) :] + paths[: i % len(paths)]:
            started = time.perf_counter()
            found = searchers[(ef, acorn)].search(dep.generation(shape), vector, where, cap)
            seconds[(shape, ef, acorn)].append(time.perf_counter() - started)
            by_kind.setdefault((shape, ef, acorn, kind), []).append(time.perf_counter() - started)
            if reference[shape]:
                got = {c.document_id for c in found}
                share = len(got & reference[shape]) / len(reference[shape])
                inclusion.setdefault((shape, ef, acorn, kind), []).append(share)
    rows = []
    for shape, ef, acorn in paths:
        row: dict[str, Any] = {
            "shape": shape_name(shape),
            "ef": ef,
            "acorn": acorn,
            "latency_ms": latency_summary(seconds[(shape, ef, acorn)]),
        }
        for kind in ("unfiltered", "status_galaxy", "status_visibility"):
            values = inclusion.get((shape, ef, acorn, kind), [])
            if values:
                row[kind] = {
                    "queries": len(values),
                    "inclusion_mean": round(statistics.fmean(values), 4),
                    "inclusion_min": round(min(values), 4),
                    "latency_ms": latency_summary(by_kind[(shape, ef, acorn, kind)]),
                }
        rows.append(row)
        lat = row["latency_ms"]
        print(
            f"ef {ef:>5} acorn {acorn} {row['shape']}: p50 {lat['p50']:.1f} p95 "
            f"{lat['p95']:.1f} ms, inclusion unfiltered {row.get('unfiltered')} status+galaxy "
            f"{row.get('status_galaxy')} status+visibility {row.get('status_visibility')}",
            flush=True,
        )
    out: dict[str, Any] = {
        "cap": cap,
        "queries": len(queries),
        "load_before": before,
        "load_after": loadavg(),
        "rows": rows,
    }
    client.close()
    if receipts <= 0:
        return out
    env = dep.env
    out["receipts"] = {}
    with in_process_qualifier(
        dep.root / "data",
        env["ORRERY_OPENSEARCH_INDEX_PREFIX"],
        opensearch_url=env["ORRERY_OPENSEARCH_URL"],
        qdrant_url=dep.qdrant_url,
    ) as run:
        for ef, acorn in settings:
            if ef == 0:
                continue
            before = loadavg()

            def production(ports: Any, qdrant: Any, ef: int = ef, acorn: float = acorn) -> Any:
                vectors = QdrantServerVectorSearch(
                    qdrant,
                    collection_prefix=dep.prefix,
                    hnsw_ef=ef,
                    spread_ef_factor=1,
                    spread_acorn_selectivity=acorn,
                )
                return replace(ports, vectors=vectors)

            receipt = run(
                dep.generation(QUALIFIED),
                production,
                QualifyRequest(sample_size=receipts),
                {
                    "vector_hnsw_ef": ef,
                    "vector_spread_ef_factor": 1,
                    "vector_spread_acorn_permille": round(acorn * 1000),
                },
            )
            label = f"ef {ef}, acorn {acorn}"
            out["receipts"][label] = {
                "ef": ef,
                "acorn": acorn,
                "passed": receipt.passed,
                "seconds": receipt.seconds,
                "failures": list(receipt.failures),
                "slices": _slice_figures([s.model_dump(mode="json") for s in receipt.slices]),
                "load_before": before,
                "load_after": loadavg(),
            }
            print(f"receipt at {label}: {out['receipts'][label]}", flush=True)
    return out


def peer_down(
    client: httpx.Client, dep: Deployment, queries: Sequence[QuerySpec]
) -> dict[str, Any]:
    from tests.harness.servers import resume_qdrant_peer, stop_qdrant_peer

    stop_qdrant_peer(dep.cluster_dir, PEERS)
    try:
        # The first queries find the peer's copies unreachable; the eligibility loop
        # (every 2 s) then sets them aside.
        for query in queries[:5]:
            client.post(TOPK, json=topk_body(dep.generation(QUALIFIED), query))
        time.sleep(5)
        figures = interleaved_topk(client, dep, [SHAPES[0], QUALIFIED], queries)
    finally:
        resume_qdrant_peer(dep.cluster_dir, PEERS)
        _wait_peers(dep.qdrant_url, PEERS)
    return figures


def measure(
    dep: Deployment,
    count: int,
    cap_sample: int,
    skip: set[str],
    qualify_workers: Sequence[int],
    py_spy: Path | None,
    qualify_shape: Sequence[int] = QUALIFIED,
    efs: Sequence[int] = (),
    ef_receipts: int = 0,
    acorns: Sequence[float] = (0.0,),
) -> dict[str, Any]:
    dep.cluster_up()
    out: dict[str, Any] = {
        "documents": dep.state["documents"],
        "corpus": dep.state.get("corpus", "uniform"),
        "queries": count,
        "shapes": [shape_name(s) for s in SHAPES],
        "generations": dep.state["generations"],
        "builds": dep.state.get("builds"),
        "ingest": dep.state.get("ingest"),
        "indexed": indexed_all(dep),
        "load_build": [dep.state.get("load_build_before"), dep.state.get("load_build_after")],
        "load_before": loadavg(),
    }
    rng = random.Random(SEED)
    vocab = Vocabulary.build(rng)
    queries = make_queries(random.Random(7), vocab, count)
    if efs:
        out["ef"] = ef_sweep(dep, efs, acorns, queries, ef_receipts)
    if "qualify" not in skip:
        out["qualify"] = []
        for workers in qualify_workers:
            spy = py_spy if workers == qualify_workers[0] else None
            out["qualify"].append(qualify(dep, workers, spy, qualify_shape))
            row = out["qualify"][-1]
            print(f"qualify, {workers} worker(s): {row['wall_seconds']} s {row}", flush=True)
    if "lexical" not in skip:
        out["lexical"] = lexical_search_types(dep, queries)
    if "caps" not in skip:
        out["caps"] = per_shard_caps(dep, cap_sample)
    # Only the HTTP phases need the server (the others search through the adapters).
    if {"topk", "peer_down"} - skip:
        with dep.server() as server, server.client(timeout_s=600) as client:
            for shape in SHAPES:  # warm the query-vector cache and every connection
                for query in queries:
                    client.post(TOPK, json=topk_body(dep.generation(shape), query))
            if "topk" not in skip:
                out["topk"] = interleaved_topk(client, dep, LATENCY_SHAPES, queries)
                print_topk(out["topk"])
            if "peer_down" not in skip:
                out["peer_down"] = peer_down(client, dep, queries)
                print_topk(out["peer_down"])
    out["load_after"] = loadavg()
    return out


def indexed_all(dep: Deployment) -> dict[str, Any]:
    return {shape_name(s): indexed(dep, s) for s in SHAPES}


# -- output ---------------------------------------------------------------------------------


def print_topk(figures: Mapping[str, Any]) -> None:
    shapes = figures["shapes"]
    base = shapes[shape_name(SHAPES[0])]["latency_ms"]["p95"]
    for name, f in shapes.items():
        lat = f["latency_ms"]
        stages = ", ".join(f"{k} {v['mean']:.1f}" for k, v in f["stages_ms"].items())
        print(
            f"{name}: p50 {lat['p50']:.1f} ms p95 {lat['p95']:.1f} ms "
            f"({lat['p95'] / base:.2f}x N=1 p95); stages (mean ms) {stages}"
        )
    print(f"load {figures['load_before']} -> {figures['load_after']}", flush=True)


def table(report: Mapping[str, Any]) -> None:
    if "topk" in report:
        print("topk_records, interleaved (target: n3 p95 <= 1.3x n1):")
        print_topk(report["topk"])
    for row in report.get("lexical", {}).get("rows", []):
        lat = row["latency_ms"]
        print(
            f"lexical {row['shape']} {row['search_type']:<21} p50 {lat['p50']:.1f} "
            f"p95 {lat['p95']:.1f} ms inclusion {row['inclusion_mean']:.4f} "
            f"order {row['top10_order_agreement_mean']:.4f} "
            f"(min {row['top10_order_agreement_min']:.2f})"
        )
    for q in report.get("qualify", []):
        print(
            f"qualify {q['shape']}, {q['workers']} worker(s): {q['sample_size']} queries in "
            f"{q['wall_seconds']} s (target <= 60 s), passed {q['passed']}"
        )
    for label, c in report.get("caps", {}).get("caps", {}).items():
        means = [v["mean"] for v in c["vector_inclusion"].values()]
        mins = [v["min"] for v in c["vector_inclusion"].values()]
        print(f"per-shard cap {label}: vector inclusion mean {means} min {mins}")
    if "peer_down" in report:
        print("peer 3 of 3 down:")
        print_topk(report["peer_down"])


def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in (("topk", "all peers up"), ("peer_down", "peer 3 of 3 down"))]
    panels = [(k, t) for k, t in panels if k in report]
    receipts = [
        (f"{shape_name(QUALIFIED)} {label}", figures["slices"])
        for label, figures in report.get("ef", {}).get("receipts", {}).items()
    ]
    receipts += [
        (f"{report['caps']['shape']} per-shard cap {label}", figures["slices"])
        for label, figures in report.get("caps", {}).get("caps", {}).items()
    ]
    count = len(panels) + (1 if receipts else 0)
    fig, axes = plt.subplots(1, max(1, count), figsize=(5.5 * max(1, count), 4.4))
    axes = list(axes) if count > 1 else [axes]
    for ax, (key, title) in zip(axes, panels, strict=False):
        shapes = report[key]["shapes"]
        names = list(shapes)
        for k, stat in enumerate(("p50", "p95")):
            values = [shapes[n]["latency_ms"][stat] for n in names]
            bars = ax.bar(
                [i + (k - 0.5) * 0.38 for i in range(len(names))], values, 0.38, label=stat
            )
            ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("topk_records ms, client-side")
        load = report[key]["load_before"], report[key]["load_after"]
        ax.set_title(
            f"{report['documents']:,} docs, {title}\nload {load[0][0]} -> {load[1][0]}", fontsize=8
        )
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    if receipts:
        ax = axes[-1]
        slice_names = ("unfiltered", "tenant", "status_visibility")
        width = 0.8 / len(slice_names)
        for k, name in enumerate(slice_names):
            values = [
                slices.get(name, {}).get("sources", {}).get("vector", {}).get("inclusion_min")
                or 0.0
                for _label, slices in receipts
            ]
            bars = ax.bar(
                [i + (k - 1) * width for i in range(len(receipts))], values, width, label=name
            )
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=6)
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(receipts)), [label for label, _ in receipts], fontsize=6)
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_ylim(0.8, 1.01)
        ax.set_ylabel("receipt vector inclusion min (cap 100)")
        ax.set_title(f"{report['documents']:,} docs, receipts (line: threshold 0.95)", fontsize=8)
        ax.legend(fontsize=6)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    global SHAPES, LATENCY_SHAPES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, default=Path("/tmp/orrery-bench-shards"))
    parser.add_argument("--phase", choices=("build", "measure", "all"), default="all")
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--cap-sample", type=int, default=200, help="queries per cap receipt")
    parser.add_argument(
        "--skip", default="", help="comma-separated: topk,lexical,qualify,caps,peer_down"
    )
    parser.add_argument(
        "--qualify-workers", default="1,4", help="ORRERY_QUALIFY_WORKERS values to time"
    )
    parser.add_argument(
        "--py-spy", type=Path, help="py-spy raw profile of the first --qualify-workers run"
    )
    parser.add_argument(
        "--qualify-shape",
        default=shape_name(QUALIFIED),
        choices=[shape_name(s) for s in SHAPES[1:]],
        help="the generation qualified",
    )
    parser.add_argument(
        "--shapes",
        default=",".join(shape_name(s) for s in SHAPES),
        help="generations built and measured (n1r0 always first: the projector's)",
    )
    parser.add_argument(
        "--ef",
        default="",
        help="HNSW ef values to sweep at the adapter (e.g. 128,256,512,1024; 0: exact search; "
        "empty: none)",
    )
    parser.add_argument(
        "--acorn",
        default="0.4",
        help="with --ef: ACORN max selectivities to sweep too (0: off; e.g. 0,0.4)",
    )
    parser.add_argument(
        "--ef-receipts",
        type=int,
        default=0,
        help="queries of an in-process receipt of the qualified shape per --ef value (0: none)",
    )
    parser.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="ORRERY_X=VALUE",
        help="a setting of every server the run starts (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "shards.json")
    args = parser.parse_args()
    chosen = [s for s in SHAPES if shape_name(s) in args.shapes.split(",")]
    if not chosen or chosen[0] != SHAPES[0]:
        parser.error("--shapes must include n1r0")
    SHAPES = LATENCY_SHAPES = tuple(chosen)
    for setting in args.serve_env:
        name, _, value = setting.partition("=")
        if not name.startswith("ORRERY_") or not _:
            parser.error(f"--serve-env takes ORRERY_X=VALUE, not {setting!r}")
        SERVE_ENV[name] = value
    dep = Deployment(args.data_root)
    if args.phase in ("build", "all"):
        build(dep, args.documents)
        if args.phase == "build":
            print(f"built under {args.data_root}: {json.dumps(dep.state['generations'])}")
            return 0
    skip = {s for s in args.skip.split(",") if s}
    command = " ".join(["bench/shards.py", *sys.argv[1:]])
    return run_and_publish(
        "shards",
        lambda: {
            "command": command,
            **measure(
                dep,
                args.queries,
                args.cap_sample,
                skip,
                [int(w) for w in args.qualify_workers.split(",") if w],
                args.py_spy,
                next(s for s in SHAPES if shape_name(s) == args.qualify_shape),
                [int(e) for e in args.ef.split(",") if e],
                args.ef_receipts,
                [float(a) for a in args.acorn.split(",") if a],
            ),
        },
        timeout_s=4 * 3600,
        out=args.out,
        plot=plot,
        table=table,
    )


if __name__ == "__main__":
    sys.exit(main())
