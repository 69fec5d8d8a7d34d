"""A Qdrant server as the projector's vector index: one collection per generation.

The collection of generation `g` is `f"{collection_prefix}-{g}"`, with one named dense
vector `"dense"` (cosine) and payload indexes on the filter fields. Points and payload
are those of the embedded qdrant-edge adapter (`contracts.vector_payload`), so the two
engines answer the same queries the same way and one conformance suite covers both.

The same class runs against qdrant-client's *local mode* (`path=` a directory, or
`":memory:"`), the stand-in for a server where none runs (CI). Local mode is exact brute
force in Python (100-1000x slower than a server), accepts `create_payload_index` and
ignores it, holds a lock on its directory (one client per path, a second one raises),
and is not thread-safe. Use it for contract tests only.

Revisions: `apply` reads the present revisions of the batch's points and skips stale
upserts, and then writes with server-side guards, all in one `batch_update_points`:
- every upsert carries `update_filter: revision <= r` (Qdrant >= 1.16 "conditional
  upsert"): an existing point is only replaced by a revision at least as new, a missing
  point is inserted;
- every delete is a filter `has_id AND revision <= r`.
So a concurrent writer cannot make an older revision replace a newer one. What remains
racy is *resurrection*: Qdrant keeps no tombstones, so an upsert at revision 2 that
reaches the server after another writer's delete at revision 3 inserts the document
again. Orrery avoids concurrent writers per document (the log is keyed by document id,
so one projector owns a document at a time); this adapter also serializes its own
`apply` calls per generation.

Spread generations (`shards` > 1 or `replicas` > 0) on a Qdrant *cluster* keep one
custom shard key per copy: `s{shard}c{copy}` (`contracts.shards.copy_key`), each a
one-replica shard placed on peer `(shard + copy) mod P` of the peers sorted by id, so a
shard's copies sit on distinct peers. A document goes to shard
`contracts.shards.shard_of(document_id, shards)` and is written to every copy of it in
the same `batch_update_points` with the same guards. Each copy is therefore read back
(`copy_pairs`, a scroll by its key) and searched by itself: per-copy evidence is real,
not a replica Qdrant picks. The collection's metadata records the layout
(`orrery_shards`, `orrery_copies`). Writes need every copy's peer up (the batch fails
and the projector retries). A standalone server refuses custom shard keys ("Distributed
mode disabled"): there a spread generation uses Qdrant's automatic sharding and counts
as one copy for evidence.

Aliases: `mirror_alias` points a native alias at a generation with one atomic
`update_collection_aliases` (delete + create). Orrery's live pointer is its own routing
record; the alias is a mirror for outside readers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import uuid
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import grpc  # type: ignore[import-untyped]
import httpx
import urllib3
from pydantic_core import to_json
from qdrant_client import QdrantClient, models
from qdrant_client.common.client_exceptions import QdrantException
from qdrant_client.http.exceptions import ApiException, UnexpectedResponse

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import IndexDocument
from contracts.index_fields import DOCUMENT_ID, REVISION, is_canonical_uuid
from contracts.pacing import Pace, no_pace
from contracts.qdrant_rest import RETRY_ONCE, RestTarget, rest_target
from contracts.shards import copy_key, shard_of
from contracts.stored_vectors import is_encoded
from contracts.vector_payload import (
    GRAPH_FIELDS,
    PAYLOAD_INDEXES,
    TENANT_FIELD,
    VECTOR_NAME,
    PayloadIndexKind,
    check_collection_prefix,
    check_generation_id,
    check_vector,
    payload_of,
    point_key,
)
from projector.ports import CopyRead, IndexEvidence

__all__ = ["DEPENDENCY", "QdrantServerVectorIndex", "open_qdrant_client"]

_log = logging.getLogger(__name__)

DEPENDENCY = "qdrant"
_SCROLL_PAGE = 1_000
# Collection metadata of a spread generation: its shard count and copies per shard.
_SHARDS_META = "orrery_shards"
_COPIES_META = "orrery_copies"
# Collection and alias names: what Qdrant accepts, kept to a portable subset.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def _index_params(
    field: str, kind: PayloadIndexKind
) -> models.KeywordIndexParams | models.IntegerIndexParams | models.DatetimeIndexParams:
    """The payload index of `field`: payload-aware HNSW links only for `GRAPH_FIELDS`."""
    graph = field in GRAPH_FIELDS
    if kind == "keyword":
        return models.KeywordIndexParams(
            type=models.KeywordIndexType.KEYWORD,
            is_tenant=field == TENANT_FIELD or None,
            enable_hnsw=graph,
        )
    if kind == "integer":
        return models.IntegerIndexParams(
            type=models.IntegerIndexType.INTEGER, lookup=True, range=True, enable_hnsw=graph
        )
    return models.DatetimeIndexParams(type=models.DatetimeIndexType.DATETIME, enable_hnsw=graph)


class _RestError(Exception):
    """A write of the REST path (`_RestWrites`) the server refused (`status_code`, its
    body in the message) or could not be reached for (`status_code` None)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


# What qdrant-client raises: HTTP errors and responses (`ApiException`), transport errors
# (httpx, grpc), and in local mode plain `ValueError` / `RuntimeError` / `KeyError`; and
# `_RestError` from the REST write path.
_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    _RestError,
    ApiException,
    QdrantException,
    httpx.HTTPError,
    grpc.RpcError,
    ValueError,
    RuntimeError,
    KeyError,
    OSError,
)


class QdrantServerVectorIndex:
    """Vector indexes in a Qdrant server (or qdrant-client local mode), one collection each.

    Construct with exactly one of `client` (taken over: `close` closes it), `url` (a
    server) or `path` (local mode: a directory, or `":memory:"`). Collections are named
    `f"{collection_prefix}-{generation_id}"` and generation ids may contain '-', so two
    deployments sharing a server need prefixes that do not nest (not `a` and `a-b`).

    Guarantees (those of `projector.ports.VectorIndex`):
    - `apply` is one `batch_update_points(wait=True)`: visible to searches when it
      returns. The server applies its operations in order; should it fail half-way,
      re-applying the same call converges (every operation is idempotent).
    - An upsert never replaces a newer revision already present; a delete at revision r
      removes the document only if its present revision is <= r. Within one call a
      document's upserts are resolved first (highest revision wins), then its deletes.
      Both are enforced by the server per point (see the module docstring for the one
      race left with concurrent writers of the same document).
    - Every upserted vector has the generation's dimension, is finite and non-zero;
      anything else rejects the whole call with `EMBEDDER_MISMATCH` before any write.
    - `create` is idempotent and rejects another dimension for an existing generation
      (`EMBEDDER_MISMATCH`); it (re)creates missing payload indexes.
    - `evidence` is read back from a full scroll of the collection.
    - Generations created by an earlier process or another worker are used as found.

    Thread-safe against a server (local mode is not). Driver failures surface as
    `DependencyUnavailable`; an unknown generation is `NOT_FOUND`; after `close`, every
    call is `INTERNAL`.
    """

    def __init__(
        self,
        client: QdrantClient | None = None,
        *,
        url: str | None = None,
        path: str | None = None,
        collection_prefix: str = "orrery",
    ) -> None:
        check_collection_prefix(collection_prefix)
        self._client = _open_client(client, url=url, path=path)
        self._local = _is_local(self._client)
        # Writes and their revision reads go over kept-alive urllib3 with the body built
        # here when the client is a plain REST one (`_RestWrites.of`); else the client.
        self._rest = None if self._local else _RestWrites.of(self._client)
        self._prefix = collection_prefix
        self._lock = threading.Lock()
        self._dimensions: dict[str, int] = {}
        self._layouts: dict[str, tuple[int, int]] = {}
        self._write_locks: dict[str, threading.Lock] = {}
        self._closed = False

    # -- VectorIndex -----------------------------------------------------------------

    def create(
        self, generation_id: str, dimension: int, *, shards: int = 1, replicas: int = 0
    ) -> None:
        """Create the generation's collection (no-op if it exists with the same dimension)
        with `shards` shards (Qdrant's automatic sharding: a search merges every shard's
        exact cosine scores into one global top-k) and `replicas + 1` copies of each."""
        if dimension <= 0:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST, "dimension must be positive", {"dimension": dimension}
            )
        name = self.collection_name(generation_id)
        self._check_open()
        with _translated(f"create {generation_id}", generation_id):
            # Qdrant resolves aliases wherever a collection name goes: an alias named like
            # this collection would send the generation's writes to another collection.
            for alias in self._client.get_aliases().aliases:
                if alias.alias_name == name:
                    raise OrreryError(
                        ErrorCode.INVALID_REQUEST,
                        f"{name!r} is an alias of {alias.collection_name!r}, not a collection",
                        {"generation_id": generation_id, "alias": name},
                    )
            info = self._info(name)
            peers = self._peers() if (shards, replicas) != (1, 0) and info is None else []
            if info is None:
                layout: dict[str, Any] = {
                    "shard_number": shards,
                    "replication_factor": replicas + 1,
                }
                if peers:
                    # One shard key per copy (see the module docstring): each copy is
                    # written, read back and searched by itself.
                    layout = {
                        "sharding_method": models.ShardingMethod.CUSTOM,
                        "shard_number": 1,
                        "replication_factor": 1,
                        "metadata": {_SHARDS_META: shards, _COPIES_META: replicas + 1},
                    }
                try:
                    self._client.create_collection(
                        name,
                        vectors_config={
                            VECTOR_NAME: models.VectorParams(
                                size=dimension, distance=models.Distance.COSINE
                            )
                        },
                        **layout,
                    )
                except _DRIVER_ERRORS as error:
                    if "already exists" not in str(error):
                        raise
                    # Another worker created it meanwhile: check what it created.
                    info = self._info(name)
            present = _dense_dimension(info, generation_id) if info is not None else dimension
            if present != dimension:
                raise OrreryError(
                    ErrorCode.EMBEDDER_MISMATCH,
                    f"generation {generation_id!r} holds {present}-d vectors",
                    {"expected": present, "got": dimension},
                )
            if info is not None and _layout_of(info) != (1, 1):
                peers = self._peers()
            if peers:
                self._create_copies(name, shards, replicas + 1, peers)
            indexed = set(info.payload_schema) if info is not None else set()
            self._create_payload_indexes(name, indexed)
        with self._lock:
            self._dimensions[generation_id] = dimension

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        """Write upserts, then deletes, in one request; stale ones are skipped."""
        name = self.collection_name(generation_id)
        dimension = self._dimension(generation_id)
        for document in upserts:
            check_vector(document, dimension)
        newest: dict[str, IndexDocument] = {}
        for document in upserts:
            pid = point_key(document.document_id)
            kept = newest.get(pid)
            if kept is None or kept.revision <= document.revision:
                newest[pid] = document
        delete_at: dict[str, int] = {}
        for document_id, revision in deletes:
            pid = point_key(document_id)
            delete_at[pid] = max(revision, delete_at.get(pid, revision))
        if not newest and not delete_at:
            return
        with self._write_lock(generation_id):
            shards, copies = self.copy_layout(generation_id)
            with _translated(f"read revisions of {generation_id}", generation_id):
                present = self._present_revisions(name, list(newest), _all_keys(shards, copies))
            writes: dict[str, IndexDocument] = {}
            for pid, document in newest.items():
                stale = present.get(pid, document.revision) > document.revision
                deleted_in_call = delete_at.get(pid, document.revision - 1) >= document.revision
                if not stale and not deleted_in_call:
                    writes[pid] = document
            # (upserts, deletes, shard key) per target: the collection, or every copy.
            parts: list[tuple[Mapping[str, IndexDocument], Mapping[str, int], Any]]
            if (shards, copies) == (1, 1):
                parts = [(writes, delete_at, None)]
            else:
                # Every copy of a document's shard gets the same guarded operations: a
                # re-applied batch (after a crash) converges on every copy alike.
                routes = {pid: shard_of(d.document_id, shards) for pid, d in newest.items()}
                routes.update({point_key(d): shard_of(d, shards) for d, _ in deletes})
                parts = []
                for shard in range(shards):
                    mine = {p: d for p, d in writes.items() if routes[p] == shard}
                    gone = {p: r for p, r in delete_at.items() if routes[p] == shard}
                    parts += [(mine, gone, copy_key(shard, copy)) for copy in range(copies)]
            if self._rest is not None:
                body = [
                    operation
                    for upserted, deleted, key in parts
                    for operation in (*_upsert_json(upserted, key), *_delete_json(deleted, key))
                ]
                if body:
                    with _translated(f"apply to {generation_id}", generation_id):
                        self._rest.batch_update(name, body)
                return
            operations: list[models.UpdateOperation] = []
            for upserted, deleted, key in parts:
                operations += _upsert_operations(upserted, key)
                operations += _delete_operations(deleted, key)
            if not operations:
                return
            with _translated(f"apply to {generation_id}", generation_id):
                self._client.batch_update_points(name, operations, wait=True)

    def evidence(self, generation_id: str) -> IndexEvidence:
        """Count and `id_set_digest` of the `(document_id, revision)` pairs the collection holds."""
        pairs = self.stored_pairs(generation_id)
        return IndexEvidence(document_count=len(pairs), id_set_digest=id_set_digest(pairs))

    def stored_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the collection holds, from a full scroll
        (`pace` between pages); of a spread generation, copy 0 of every shard (each
        copy by itself: `copy_pairs`)."""
        shards, copies = self.copy_layout(generation_id)
        if (shards, copies) == (1, 1):
            return self._scroll_pairs(generation_id, None, pace)
        pairs: list[tuple[str, int]] = []
        for shard in range(shards):
            pairs += self._scroll_pairs(generation_id, copy_key(shard, 0), pace)
        return pairs

    def copy_layout(self, generation_id: str) -> tuple[int, int]:
        """`(shards, copies per shard)` of the generation: `(1, 1)` for one collection
        of Qdrant's own sharding, else what its metadata records (immutable, cached)."""
        with self._lock:
            known = self._layouts.get(generation_id)
        if known is not None:
            return known
        self._check_open()
        with _translated(f"read {generation_id}", generation_id):
            info = self._info(self.collection_name(generation_id))
        if info is None:
            raise _not_found(generation_id)
        layout = _layout_of(info)
        with self._lock:
            self._layouts[generation_id] = layout
        return layout

    def document_shard(self, generation_id: str, document_id: str) -> int:
        """The shard of `document_id` (`contracts.shards.shard_of`)."""
        return shard_of(document_id, self.copy_layout(generation_id)[0])

    def copy_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[CopyRead]:
        """Every copy of every shard read by itself (a scroll with its shard key); a copy
        that cannot be read comes back with `pairs=None` and the error."""
        shards, copies = self.copy_layout(generation_id)
        out: list[CopyRead] = []
        for shard in range(shards):
            for copy in range(copies):
                key = copy_key(shard, copy) if (shards, copies) != (1, 1) else None
                try:
                    pairs = self._scroll_pairs(generation_id, key, pace)
                except DependencyUnavailable as error:
                    out.append(CopyRead(shard, copy, key or "", None, error.message[:300]))
                    continue
                out.append(CopyRead(shard, copy, key or "", pairs))
        return out

    def _scroll_pairs(
        self, generation_id: str, key: str | None, pace: Pace
    ) -> list[tuple[str, int]]:
        name = self.collection_name(generation_id)
        self._check_open()
        pairs: list[tuple[str, int]] = []
        offset: models.ExtendedPointId | None = None
        while True:
            with _translated(f"scroll {generation_id}", generation_id):
                records, next_offset = self._client.scroll(
                    name,
                    limit=_SCROLL_PAGE,
                    offset=offset,
                    with_payload=[DOCUMENT_ID, REVISION],
                    with_vectors=False,
                    shard_key_selector=key,
                )
            for record in records:
                payload = record.payload or {}
                pairs.append((str(payload[DOCUMENT_ID]), int(payload[REVISION])))
            if next_offset is None:
                break
            offset = next_offset
            pace()
        return pairs

    def drop(self, generation_id: str) -> None:
        """Delete the generation's collection and its aliases (no-op if absent)."""
        name = self.collection_name(generation_id)
        self._check_open()
        with self._lock:
            self._dimensions.pop(generation_id, None)
            self._layouts.pop(generation_id, None)
        with _translated(f"drop {generation_id}"):
            try:
                self._client.delete_collection(name)
            except _DRIVER_ERRORS as error:
                if not _is_not_found(error):
                    raise

    def close(self) -> None:
        """Close the client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._rest is not None:
            self._rest.close()
        try:
            self._client.close()
        except _DRIVER_ERRORS as error:
            _log.warning("closing the qdrant client: %s", error)

    # -- aliases and names -------------------------------------------------------------

    def collection_name(self, generation_id: str) -> str:
        """The collection that holds `generation_id` (`INVALID_REQUEST` for unsafe ids)."""
        check_generation_id(generation_id)
        return f"{self._prefix}-{generation_id}"

    def mirror_alias(self, alias: str, generation_id: str) -> None:
        """Point the native alias `alias` at the generation's collection, atomically.

        One `update_collection_aliases` call (delete + create): readers of the alias see
        the previous collection or this one, never none. An unknown generation is
        `NOT_FOUND` and leaves the alias as it was; an alias named like an existing
        collection is `INVALID_REQUEST`.
        """
        _check_alias(alias)
        name = self.collection_name(generation_id)
        self._check_open()
        # A Qdrant server (1.16) applies the delete even when the create then fails on a
        # missing collection, which would leave no alias at all: refuse before changing it.
        with _translated(f"find generation {generation_id}", generation_id):
            if not self._client.collection_exists(name):
                raise _not_found(generation_id)
        operations: list[models.AliasOperations] = [
            models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias)),
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=name, alias_name=alias)
            ),
        ]
        try:
            with _translated(f"point alias {alias} at {generation_id}", generation_id):
                self._client.update_collection_aliases(change_aliases_operations=operations)
        except DependencyUnavailable as error:
            if "already exists" not in error.message:
                raise
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"alias {alias!r} is the name of an existing collection",
                {"alias": alias},
            ) from error

    def resolve_alias(self, alias: str) -> str | None:
        """The generation `alias` points at; None if it does not exist or points elsewhere.

        "Elsewhere" is any collection that is not one of this prefix's generations.
        """
        self._check_open()
        with _translated(f"read alias {alias}"):
            aliases = self._client.get_aliases().aliases
        marker = f"{self._prefix}-"
        for description in aliases:
            if description.alias_name == alias:
                collection = description.collection_name
                return collection[len(marker) :] if collection.startswith(marker) else None
        return None

    # -- internals ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OrreryError(ErrorCode.INTERNAL, "vector index is closed")

    def _info(self, name: str) -> models.CollectionInfo | None:
        """The collection's info, None if it does not exist (other errors propagate)."""
        try:
            return self._client.get_collection(name)
        except _DRIVER_ERRORS as error:
            if _is_not_found(error):
                return None
            raise

    def _dimension(self, generation_id: str) -> int:
        """The generation's dimension: remembered from `create`, else read from the engine."""
        self._check_open()
        with self._lock:
            dimension = self._dimensions.get(generation_id)
        if dimension is not None:
            return dimension
        with _translated(f"read {generation_id}", generation_id):
            info = self._info(self.collection_name(generation_id))
        if info is None:
            raise _not_found(generation_id)
        dimension = _dense_dimension(info, generation_id)
        with self._lock:
            self._dimensions[generation_id] = dimension
        return dimension

    def _write_lock(self, generation_id: str) -> threading.Lock:
        with self._lock:
            return self._write_locks.setdefault(generation_id, threading.Lock())

    def _create_payload_indexes(self, name: str, indexed: set[str]) -> None:
        for field, kind in PAYLOAD_INDEXES.items():
            if field in indexed:
                continue
            schema = _index_params(field, kind)
            with warnings.catch_warnings():
                if self._local:
                    # Local mode warns that payload indexes do nothing there; we know.
                    warnings.simplefilter("ignore", UserWarning)
                self._client.create_payload_index(name, field, field_schema=schema, wait=True)

    def _present_revisions(
        self, name: str, pids: list[str], keys: list[str] | None
    ) -> dict[str, int]:
        """The newest revision any copy holds of each point (`keys`: every copy), by
        point key (`point_key`: the canonical UUID text)."""
        if not pids:
            return {}
        if self._rest is not None:
            points = self._rest.revisions(name, pids, keys)
            found: dict[str, int] = {}
            for answered, revision in points:
                pid = _canonical(answered)
                found[pid] = max(revision, found.get(pid, revision))
            return found
        records = self._client.retrieve(
            name,
            pids,
            with_payload=[REVISION],
            with_vectors=False,
            shard_key_selector=cast(Any, keys),
        )
        present: dict[str, int] = {}
        for record in records:
            pid = _canonical(str(record.id))
            revision = int((record.payload or {})[REVISION])
            present[pid] = max(revision, present.get(pid, revision))
        return present

    def _peers(self) -> list[int]:
        """The cluster's peer ids, sorted; [] without a cluster (or in local mode)."""
        if self._local:
            return []
        status = self._client.http.distributed_api.cluster_status().result
        return sorted(int(p) for p in (getattr(status, "peers", None) or {}))

    def _create_copies(self, name: str, shards: int, copies: int, peers: list[int]) -> None:
        """One shard key per copy, copy c of shard s on peer (s + c) mod P of the peers
        sorted by id: the copies of a shard on distinct peers. Keys present already are
        kept."""
        if copies > len(peers):
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"{copies} copies of a shard need {copies} Qdrant peers, the cluster has "
                f"{len(peers)}",
                {"copies": copies, "peers": len(peers)},
            )
        for shard in range(shards):
            for copy in range(copies):
                placement = [peers[(shard + copy) % len(peers)]] if peers else None
                try:
                    self._client.create_shard_key(name, copy_key(shard, copy), placement=placement)
                except _DRIVER_ERRORS as error:
                    if "already exists" not in str(error):
                        raise


def open_qdrant_client(*, url: str | None = None, path: str | None = None) -> QdrantClient:
    """A client for the server at `url`, or local mode on `path` (a directory or `":memory:"`).

    Exactly one of the two (`INVALID_REQUEST` otherwise). No network call here (no
    version probe); a local directory already open in another client is
    `DependencyUnavailable`. Share the result between `QdrantServerVectorIndex` and the
    query side's `QdrantServerVectorSearch` in one process: local mode allows one client
    per path. Local mode is not thread-safe, so a local client comes wrapped: every call
    is serialized by one lock (the projector writes while query threads search).
    """
    client = _open_client(None, url=url, path=path)
    if url is None:
        return cast(QdrantClient, _SerializedClient(client))
    return client


class _SerializedClient:
    """Forwards to a client, one call at a time (qdrant-client's local mode keeps plain
    Python structures that concurrent calls would corrupt)."""

    def __init__(self, client: QdrantClient) -> None:
        self._client = client
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attribute(*args, **kwargs)

        return call


def _open_client(client: QdrantClient | None, *, url: str | None, path: str | None) -> QdrantClient:
    if sum(option is not None for option in (client, url, path)) != 1:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST, "give exactly one of client, url or path (local mode)"
        )
    if client is not None:
        return client
    try:
        if url is not None:
            # No version probe at construction: it is a network call that only warns.
            return QdrantClient(url=url, check_compatibility=False)
        if path == ":memory:":
            return QdrantClient(location=":memory:")
        return QdrantClient(path=path)
    except _DRIVER_ERRORS as error:  # local mode: the directory is locked by another client
        raise DependencyUnavailable(DEPENDENCY, f"open client: {error}") from error


def _is_local(client: QdrantClient) -> bool:
    options = client.init_options
    return options.get("location") == ":memory:" or options.get("path") is not None


def _check_alias(alias: str) -> None:
    if not _NAME.fullmatch(alias):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "aliases are 1-128 letters, digits, '_', '.', '-'",
            {"alias": alias},
        )


def _dense_dimension(info: models.CollectionInfo, generation_id: str) -> int:
    vectors = info.config.params.vectors
    params = vectors.get(VECTOR_NAME) if isinstance(vectors, Mapping) else None
    if params is None:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"collection of generation {generation_id!r} has no {VECTOR_NAME!r} vector",
            {"generation_id": generation_id},
        )
    return int(params.size)


def _revision_at_most(revision: int) -> models.FieldCondition:
    return models.FieldCondition(key=REVISION, range=models.Range(lte=revision))


def _layout_of(info: models.CollectionInfo) -> tuple[int, int]:
    metadata = info.config.metadata or {}
    if _SHARDS_META not in metadata:
        return (1, 1)
    return (int(metadata[_SHARDS_META]), int(metadata[_COPIES_META]))


def _all_keys(shards: int, copies: int) -> list[str] | None:
    if (shards, copies) == (1, 1):
        return None
    return [copy_key(s, c) for s in range(shards) for c in range(copies)]


def _upsert_operations(
    writes: Mapping[str, IndexDocument], key: str | None = None
) -> list[models.UpsertOperation]:
    """One conditional upsert per distinct revision: replaces only older-or-equal points."""
    by_revision: dict[int, list[models.PointStruct]] = defaultdict(list)
    for pid, document in writes.items():
        assert document.vector is not None  # checked by check_vector
        by_revision[document.revision].append(
            models.PointStruct(
                id=pid,
                vector={VECTOR_NAME: list(document.vector)},
                payload=payload_of(document),
            )
        )
    return [
        models.UpsertOperation(
            upsert=models.PointsList(
                points=points,
                update_filter=models.Filter(must=[_revision_at_most(revision)]),
                shard_key=key,
            )
        )
        for revision, points in sorted(by_revision.items())
    ]


def _delete_operations(
    delete_at: Mapping[str, int], key: str | None = None
) -> list[models.DeleteOperation]:
    """One filtered delete per distinct revision: removes only older-or-equal points."""
    by_revision: dict[int, list[models.ExtendedPointId]] = defaultdict(list)
    for pid, revision in delete_at.items():
        by_revision[revision].append(pid)
    return [
        models.DeleteOperation(
            delete=models.FilterSelector(
                filter=models.Filter(
                    must=[models.HasIdCondition(has_id=pids), _revision_at_most(revision)]
                ),
                shard_key=key,
            )
        )
        for revision, pids in sorted(by_revision.items())
    ]


def _revision_at_most_json(revision: int) -> dict[str, Any]:
    return {"key": REVISION, "range": {"lte": revision}}


def _canonical(point: str) -> str:
    """A point id Qdrant answered, as `point_key` spells it (Qdrant writes UUIDs in the
    canonical form already: parsed only when it did not)."""
    return point if is_canonical_uuid(point) else str(uuid.UUID(point))


def _upsert_json(
    writes: Mapping[str, IndexDocument], key: str | None = None
) -> list[dict[str, Any]]:
    """`_upsert_operations` as the JSON qdrant-client sends for them (the REST path), to
    be serialized by `_body_json`: a vector that carries its JSON text
    (`contracts.stored_vectors.is_encoded`) stands as the `_SPLICE` token in its point,
    its text kept beside the points (`_Points.texts`)."""
    by_revision: dict[int, list[tuple[dict[str, Any], bytes | None]]] = defaultdict(list)
    for pid, document in writes.items():
        vector = document.vector
        assert vector is not None  # checked by check_vector
        text = vector.json if is_encoded(vector) else None
        point = {
            "id": pid,
            "vector": {VECTOR_NAME: vector if text is None else _SPLICE},
            "payload": payload_of(document),
        }
        by_revision[document.revision].append((point, text))
    operations: list[dict[str, Any]] = []
    for revision, entries in sorted(by_revision.items()):
        points = _Points(point for point, _ in entries)
        points.texts = [(i, text) for i, (_, text) in enumerate(entries) if text is not None]
        upsert: dict[str, Any] = {
            "points": points,
            "update_filter": {"must": [_revision_at_most_json(revision)]},
        }
        if key is not None:
            upsert["shard_key"] = key
        operations.append({"upsert": upsert})
    return operations


def _delete_json(delete_at: Mapping[str, int], key: str | None = None) -> list[dict[str, Any]]:
    """`_delete_operations` as the JSON qdrant-client sends for them (the REST path)."""
    by_revision: dict[int, list[str]] = defaultdict(list)
    for pid, revision in delete_at.items():
        by_revision[revision].append(pid)
    operations: list[dict[str, Any]] = []
    for revision, pids in sorted(by_revision.items()):
        delete: dict[str, Any] = {
            "filter": {"must": [{"has_id": pids}, _revision_at_most_json(revision)]}
        }
        if key is not None:
            delete["shard_key"] = key
        operations.append({"delete": delete})
    return operations


# qdrant-client's REST timeout when the client was given none (httpx's default, seconds).
# Connections kept alive: one per writing thread (a projector applies a batch at a time;
# a generation build writes beside it).
_REST_CONNECTIONS = 8


class _RestWrites:
    """A server client's point writes (`POST .../points/batch?wait=true`) and revision
    reads (`POST .../points`) over urllib3 with kept-alive connections, the body
    serialized once by pydantic-core from plain dicts.

    Why not through qdrant-client: it builds and validates a pydantic `PointStruct` per
    point (its vector float by float), serializes those models again, and closes every
    connection to a server on 127.0.0.1 after one request; measured in the scale-out
    ingest (session 16), that was ~22 % of a projector's CPU. The request is the one
    the client sends for the same operations (`tests/unit/test_qdrant_rest_writes.py`
    compares them). Only for a client made with a `url` and nothing this path does not
    reproduce (a token provider, gRPC, extra headers): otherwise `of` returns None and
    the client is used. Every write is guarded by revision (see the module docstring),
    so the one retry of a call on a dropped kept-alive connection is harmless.
    """

    def __init__(self, rest_uri: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self._pool = urllib3.connection_from_url(
            rest_uri,
            maxsize=_REST_CONNECTIONS,
            timeout=urllib3.Timeout(total=timeout_s),
            retries=urllib3.Retry(**RETRY_ONCE),
        )
        self._prefix = RestTarget(rest_uri, headers, timeout_s).prefix
        self._headers = {"content-type": "application/json", **headers}

    @classmethod
    def of(cls, client: QdrantClient) -> _RestWrites | None:
        target = rest_target(client)
        return None if target is None else cls(target.uri, target.headers, target.timeout_s)

    def batch_update(self, collection: str, operations: list[dict[str, Any]]) -> None:
        self._post(
            f"/collections/{quote(collection, safe='')}/points/batch?wait=true",
            {"operations": operations},
        )

    def revisions(
        self, collection: str, ids: list[str], keys: list[str] | None
    ) -> list[tuple[str, int]]:
        """`(point id, revision)` of each point of `ids` that any copy (`keys`) holds."""
        body: dict[str, Any] = {"ids": ids, "with_payload": [REVISION], "with_vector": False}
        if keys is not None:
            body["shard_key"] = keys
        answer = self._post(f"/collections/{quote(collection, safe='')}/points", body)
        try:
            return [
                (str(point["id"]), int((point.get("payload") or {})[REVISION]))
                for point in answer["result"]
            ]
        except (KeyError, TypeError, ValueError) as error:
            raise _RestError(f"unexpected answer: {error!r}") from error

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        try:
            response = self._pool.urlopen(
                "POST",
                f"{self._prefix}{path}",
                body=_body_json(body),
                headers=self._headers,
            )
        except urllib3.exceptions.HTTPError as error:
            raise _RestError(f"qdrant unreachable: {error}") from error
        text = response.data
        if response.status != 200:
            raise _RestError(
                f"Unexpected Response: {response.status}: {text.decode('utf-8', 'replace')}",
                response.status,
            )
        try:
            return json.loads(text)
        except ValueError as error:
            raise _RestError(f"unexpected answer: {error}") from error

    def close(self) -> None:
        self._pool.close()


# Where an encoded vector's text goes while pydantic-core serializes a body (`_Points`): a
# string no other JSON here holds (a random token per process; should it occur anyway,
# the count below differs and the values are serialized instead).
_SPLICE = "orrery-vector-text-" + uuid.uuid4().hex
_SPLICE_JSON = to_json(_SPLICE)


class _Points(list[dict[str, Any]]):
    """An upsert's points (`_upsert_json`); `texts`: `(index of a point, its vector's JSON
    text)` for each point whose vector stands as `_SPLICE`, in order. The body holds
    plain strings only: an object pydantic-core does not know went through its type
    checks and the fallback, ~4 of the ~5 us a point's body cost (a `str` subclass ~2)."""

    __slots__ = ("texts",)

    texts: list[tuple[int, bytes]]


def _body_json(body: Mapping[str, Any]) -> bytes:
    """`to_json(body)`, with each `_Points` vector text in its place: a decoded event's
    vector goes to Qdrant as the canonical store's decimals, not formatted again from
    floats (24 us a 384-d point). The bytes are those of the floats' own JSON. Unless the
    splice token occurs exactly once for each text, the body is serialized again with
    those vectors as their values."""
    data = to_json(body, fallback=_number)
    texts = [text for points in _upserted_points(body) for _, text in points.texts]
    if not texts:
        return data
    parts = data.split(_SPLICE_JSON)
    if len(parts) != len(texts) + 1:
        return to_json(_vector_values(body), fallback=_number)
    pieces = [parts[0]]
    for text, part in zip(texts, parts[1:], strict=True):
        pieces += (text, part)
    return b"".join(pieces)


def _upserted_points(body: Mapping[str, Any]) -> Iterator[_Points]:
    """The `_Points` of `body["operations"]`, in the order they are serialized."""
    operations = body.get("operations")
    if type(operations) is not list:
        return
    for operation in operations:
        for action in operation.values() if type(operation) is dict else ():
            points = action.get("points") if type(action) is dict else None
            if type(points) is _Points:
                yield points


def _vector_values(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` with the vectors of its `_Points` as their values (lists of floats)."""
    operations = []
    for operation in body["operations"]:
        copied = {}
        for name, action in operation.items():
            points = action.get("points") if type(action) is dict else None
            if type(points) is _Points and points.texts:
                valued = list(points)
                for index, text in points.texts:
                    valued[index] = {
                        **valued[index],
                        "vector": {VECTOR_NAME: json.loads(text)},
                    }
                action = {**action, "points": valued}
            copied[name] = action
        operations.append(copied)
    return {**body, "operations": operations}


def _number(value: Any) -> float:
    """A vector value of another numeric type than `float` (the client's model converted
    it to one too); anything else is not JSON here."""
    return float(value)


def _is_not_found(error: BaseException) -> bool:
    """Whether a driver error says the collection (or alias target) does not exist."""
    if isinstance(error, UnexpectedResponse | _RestError):
        return error.status_code == 404
    if isinstance(error, grpc.RpcError):
        code = getattr(error, "code", None)
        return callable(code) and code() == grpc.StatusCode.NOT_FOUND
    message = str(error)
    # Local mode: ValueError(f"Collection {name} not found").
    return (
        isinstance(error, ValueError)
        and message.startswith("Collection ")
        and message.endswith(" not found")
    )


def _not_found(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.NOT_FOUND,
        f"vector index generation {generation_id!r} does not exist",
        {"generation_id": generation_id},
    )


@contextlib.contextmanager
def _translated(action: str, generation_id: str | None = None) -> Iterator[None]:
    """Turn qdrant-client, httpx and grpc errors into `contracts.errors`.

    A missing collection is `NOT_FOUND` when `generation_id` names the one concerned; a
    vector the engine finds of the wrong dimension is `EMBEDDER_MISMATCH`; another 4xx
    refusal of the request's content is `INVALID_REQUEST` (deterministic: the same
    request fails again); anything else is `DependencyUnavailable` (transient).
    """
    try:
        yield
    except OrreryError:
        raise
    except _DRIVER_ERRORS as error:
        if generation_id is not None and _is_not_found(error):
            raise _not_found(generation_id) from error
        message = str(error)
        if "dimension error" in message.lower():
            raise OrreryError(
                ErrorCode.EMBEDDER_MISMATCH, f"{action}: {message}", {"engine": DEPENDENCY}
            ) from error
        status = _refusal_status(error)
        if status is not None:
            # The request itself was refused (a 4xx other than throttling, auth or a
            # timeout): the same request fails the same way again — deterministic.
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"{action}: {message}",
                {"engine": DEPENDENCY, "status": status},
            ) from error
        raise DependencyUnavailable(DEPENDENCY, f"{action}: {message}") from error


# 4xx statuses that say nothing about the request's content: retried like a 5xx.
_TRANSIENT_CLIENT_STATUSES = frozenset({401, 403, 404, 408, 409, 425, 429})


def _refusal_status(error: BaseException) -> int | None:
    """The HTTP status of a Qdrant answer that refused the request for its content
    (400, 413, 422, …), else None (unreachable, a 5xx, a throttle: transient)."""
    status = getattr(error, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500:
        return None if status in _TRANSIENT_CLIENT_STATUSES else status
    return None
