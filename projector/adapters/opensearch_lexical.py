"""BM25 indexes in OpenSearch: one index per generation, named `{index_prefix}-{generation_id}`.

The text analyzer reproduces `contracts.index_fields.TEXT_ANALYZER` (what
`projector.adapters.tantivy_lexical` registers in tantivy) with built-in OpenSearch
components, no scripts:

- tokens are maximal runs of Unicode alphanumerics (`\\p{IsAlphabetic}` or `\\p{N}`, which is
  Rust's `char::is_alphanumeric`);
- a token of `TEXT_TOKEN_MAX_BYTES` or more UTF-8 bytes is dropped. OpenSearch counts
  UTF-16 units, not bytes, so char filters first append one private-use marker (U+E000) per
  extra UTF-8 byte of every non-ASCII alphanumeric; the `length` filter then sees the byte
  length, and the markers are removed again before lowercasing (an U+E000 in the text is a
  separator, as in tantivy);
- `İ` (U+0130) becomes `i̇` (Rust's full lowercase mapping; Java's simple mapping gives `i`),
  then `lowercase` and `asciifolding`;
- version 2 analyzers end with Lucene's `snowball` filter for their language (the
  Snowball algorithms of tantivy's rust-stemmers, in an older release: see below; the
  `stemmer` filter would not do, its "english" is Porter 1).

Each index is created with the analyzer of its generation (`create(..., text_analyzer=)`),
registered under that name and named in the mapping's `_meta`; every text field's
`search_analyzer` is its query-side twin, so a search analyzes query text as the
generation's index says, without the query side knowing the language.

Known divergences: characters that Java 17's Unicode 13 does not know (Unicode 14 and later
additions, e.g. Vithkuqi, Toto, U+0870-U+088E) are separators here and letters in tantivy;
Lucene's Snowball stemmers are an older release than rust-stemmers', so a few words stem
differently (English: "biologists" -> "biologist" here, "biolog" in tantivy; "added" ->
"ad" here, "add" in tantivy; 75 of SciFact's 35,711 distinct words).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import OpenSearchException, TransportError
from pydantic_core import to_json

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import IndexDocument
from contracts.index_fields import (
    BODY,
    DEFAULT_TEXT_ANALYZER,
    DOCUMENT_ID,
    FACET_SEPARATOR,
    FACETS,
    GALAXY,
    ITEM_ID,
    NO_STEMMING,
    REVISION,
    RING,
    RING_PATH,
    SOURCE_TEXT_FIELDS,
    STATUS,
    TAGS,
    TEXT,
    TEXT_ANALYZER_V1,
    TEXT_FIELDS,
    TEXT_TOKEN_MAX_BYTES,
    TITLE,
    UPDATED_AT,
    UPDATED_AT_MICROS,
    VISIBILITY,
    combined_text,
    has_combined_field,
    ring_path,
    text_analyzer_language,
)
from contracts.pacing import Pace, no_pace
from projector.model import check_keywords, newest_operations
from projector.ports import CopyRead, IndexEvidence

__all__ = [
    "DEFAULT_BULK_ACTIONS",
    "DEFAULT_INDEX_PREFIX",
    "DEFAULT_REFRESH_INTERVAL",
    "OpenSearchLexicalIndex",
    "RefreshPolicy",
    "index_body",
]

log = logging.getLogger(__name__)

DEFAULT_INDEX_PREFIX = "orrery"
# Operations per `_bulk` request; an `apply` larger than this is sent in several requests.
DEFAULT_BULK_ACTIONS = 1_000
# How often OpenSearch refreshes on its own. With the `wait_for` policy, `apply` returns
# after the next scheduled refresh: at most this long, on average half of it.
DEFAULT_REFRESH_INTERVAL = "1s"
REQUEST_TIMEOUT_S = 10
# One page of a reference copy (thousands of documents) on a loaded node.
_COPY_REQUEST_TIMEOUT_S = 120
MAX_RETRIES = 2

RefreshPolicy = Literal["wait_for", "true"]

_ENGINE = "opensearch"
# Index names must be lowercase and free of `\\/*?"<>|,# ` (so a name is never a pattern).
_GENERATION_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_INDEX_PREFIX = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_ALIAS = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}")
# OpenSearch rejects an `_id` longer than 512 bytes.
_MAX_ID_BYTES = 512
_HASHED_ID_MARK = "~"
_SCROLL_KEEPALIVE = "1m"
_SCROLL_PAGE = 5_000
# A reference copy's bulks: the engine's cost is analysis (every text field of every
# document, on one write thread per bulk), so two bulks in flight keep two write threads
# busy; 1,000 documents apiece, so the pair stays small on a node with a small heap.
# (100k documents on the harness node: 18.7-32.6 s with one bulk of 5,000 in flight,
# 11.8-18.9 s with two of 1,000.)
_COPY_BULK_DOCUMENTS = 1_000
_COPY_BULKS_IN_FLIGHT = 2
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Bulk item statuses that leave the index as the port promises: a stale write (409, the
# external version is not newer) and a delete of a document that is not there (404).
_NO_OP_STATUSES = frozenset({409})
_NO_OP_DELETE_STATUSES = frozenset({404, 409})

_ALNUM = r"\p{IsAlphabetic}\p{N}"
_MARKER = "\ue000"


def _marker_filter(low: int, high: int, markers: int) -> dict[str, str]:
    """Appends `markers` U+E000 after every alphanumeric in [low, high].

    The range comes first in the class intersection: it is the cheap test, and fails for
    every ASCII character.
    """
    return {
        "type": "pattern_replace",
        "pattern": rf"([\x{{{low:X}}}-\x{{{high:X}}}&&[{_ALNUM}]])",
        "replacement": "$1" + _MARKER * markers,
    }


def _query_analyzer(text_analyzer: str) -> str:
    """The name of the query-side twin of `text_analyzer` (repeated words count once)."""
    return f"{text_analyzer}_query"


def _analysis(text_analyzer: str) -> dict[str, Any]:
    """The `analysis` settings: `text_analyzer` and its query-side twin (deduplicated)."""
    language = text_analyzer_language(text_analyzer)
    char_filters = ["orrery_marker_as_separator", "orrery_utf8_2", "orrery_utf8_3_4"]
    token_filters = ["orrery_max_bytes", "orrery_unmark", "orrery_dotted_i", "lowercase"]
    token_filters.append("asciifolding")
    stemmers: dict[str, Any] = {}
    if language is not None and language != NO_STEMMING:
        stemmers[f"orrery_stem_{language}"] = {
            "type": "snowball",
            "language": language.capitalize(),
        }
        token_filters.append(f"orrery_stem_{language}")
    return {
        "char_filter": {
            "orrery_marker_as_separator": {
                "type": "mapping",
                "mappings": [f"{_MARKER} => \\u0020"],
            },
            "orrery_utf8_2": _marker_filter(0x80, 0x7FF, 1),
            # 3 UTF-8 bytes in the BMP; a supplementary character (4 bytes) is already 2
            # UTF-16 units, so both get 2 markers.
            "orrery_utf8_3_4": _marker_filter(0x800, 0x10FFFF, 2),
        },
        "tokenizer": {
            "orrery_alphanumeric_runs": {
                "type": "pattern",
                "pattern": rf"[^{_ALNUM}\x{{E000}}]+",
            }
        },
        "filter": {
            # tantivy's `remove_long(n)` keeps tokens shorter than n bytes.
            "orrery_max_bytes": {"type": "length", "min": 0, "max": TEXT_TOKEN_MAX_BYTES - 1},
            "orrery_unmark": {"type": "pattern_replace", "pattern": r"\x{E000}", "replacement": ""},
            "orrery_dotted_i": {
                "type": "pattern_replace",
                "pattern": r"\x{130}",
                "replacement": "i\u0307",
            },
            "orrery_unique": {"type": "unique", "only_on_same_position": False},
            **stemmers,
        },
        "analyzer": {
            text_analyzer: {
                "type": "custom",
                "char_filter": char_filters,
                "tokenizer": "orrery_alphanumeric_runs",
                "filter": token_filters,
            },
            # Repeated query words (after stemming) count once, as in tantivy.
            _query_analyzer(text_analyzer): {
                "type": "custom",
                "char_filter": char_filters,
                "tokenizer": "orrery_alphanumeric_runs",
                "filter": [*token_filters, "orrery_unique"],
            },
        },
    }


def _mappings(text_analyzer: str) -> dict[str, Any]:
    text = {
        "type": "text",
        "analyzer": text_analyzer,
        "search_analyzer": _query_analyzer(text_analyzer),
        "similarity": "BM25",
    }
    keyword = {"type": "keyword"}
    text_fields = TEXT_FIELDS if has_combined_field(text_analyzer) else SOURCE_TEXT_FIELDS
    properties: dict[str, Any] = {name: dict(text) for name in text_fields}
    for name in (DOCUMENT_ID, ITEM_ID, GALAXY, RING, RING_PATH, STATUS, VISIBILITY, FACETS):
        properties[name] = dict(keyword)
    properties[REVISION] = {"type": "long"}
    # Millisecond precision, for outside readers; filters use the exact microseconds.
    properties[UPDATED_AT] = {"type": "date", "format": "strict_date_optional_time"}
    properties[UPDATED_AT_MICROS] = {"type": "long"}
    return {
        "dynamic": "strict",
        "_meta": {"orrery": {"text_analyzer": text_analyzer, "document": "index-document@1"}},
        "properties": properties,
    }


def index_body(
    *,
    shards: int = 1,
    replicas: int = 0,
    refresh_interval: str = DEFAULT_REFRESH_INTERVAL,
    text_analyzer: str = DEFAULT_TEXT_ANALYZER,
) -> dict[str, Any]:
    """The body of `PUT /{index}` for one generation: settings, analysis, strict mapping.

    `ValueError` for an unknown `text_analyzer`.
    """
    return {
        "settings": {
            "index": {
                "number_of_shards": shards,
                "number_of_replicas": replicas,
                # Set explicitly, so a shard never goes "search idle" and skips refreshes.
                "refresh_interval": refresh_interval,
            },
            "analysis": _analysis(text_analyzer),
        },
        "mappings": _mappings(text_analyzer),
    }


class OpenSearchLexicalIndex:
    """`LexicalIndex` over OpenSearch, one index `{index_prefix}-{generation_id}` per generation.

    Guarantees, beyond the port's:
    - Revisions are OpenSearch external versions: an upsert is indexed with
      `version_type=external` (applied only if its revision is newer than the stored one),
      a delete with `version_type=external_gte` (applied only if its revision is at least
      the stored one). Stale writes come back as 409 and are treated as the no-ops they are,
      so replaying any batch, or a retry of a timed-out request, is harmless.
    - A delete leaves a tombstone for `index.gc_deletes` (60 s by default): within that time
      an upsert at a revision not newer than the delete's is refused too; after it, only
      the projector's own state stops a stale upsert from resurrecting the document.
    - Visibility: with `refresh="wait_for"` (the default) each bulk request returns after the
      refresh that makes it searchable, so `apply` takes up to `refresh_interval` but makes
      no extra segments; `refresh="true"` refreshes at once (low latency, one small segment
      per call, more merging). An `apply` of more than `bulk_actions` operations is sent in
      several requests followed by one explicit `_refresh`.
    - `apply` is not atomic across documents (OpenSearch has no multi-document commit): if
      it raises, some documents may be written; applying the same call again converges.
    - Keywords and facet names are checked before anything is written (`INVALID_REQUEST`);
      a document the engine rejects raises `INVALID_REQUEST` naming it, an overloaded or
      unreachable engine `DependencyUnavailable("opensearch", ...)`.
    - `_id` is the `document_id`, or `~` + its sha256 when it is longer than 512 bytes or
      starts with `~`; the `document_id` field always holds the id itself.
    - Generation ids must be lowercase (`[a-z0-9][a-z0-9._-]*`, index names cannot hold
      capitals); an index that does not exist raises `OrreryError(COVERAGE_UNAVAILABLE)`.
      `apply` checks that the index exists first, so that OpenSearch does not auto-create
      a dropped generation (a `drop` racing that check can still lose).
    - No I/O at construction; the client uses a 10 s timeout and retries twice.
    """

    def __init__(
        self,
        client_url: str,
        *,
        index_prefix: str = DEFAULT_INDEX_PREFIX,
        refresh: RefreshPolicy = "wait_for",
        refresh_interval: str = DEFAULT_REFRESH_INTERVAL,
        bulk_actions: int = DEFAULT_BULK_ACTIONS,
    ) -> None:
        if not _INDEX_PREFIX.fullmatch(index_prefix):
            raise ValueError(f"index prefix must match {_INDEX_PREFIX.pattern}: {index_prefix!r}")
        if refresh not in ("wait_for", "true"):
            raise ValueError(f"refresh must be 'wait_for' or 'true', not {refresh!r}")
        if bulk_actions < 1:
            raise ValueError("bulk_actions must be positive")
        self._prefix = index_prefix
        self._refresh: RefreshPolicy = refresh
        self._bulk_actions = bulk_actions
        self._refresh_interval = refresh_interval
        # Text analyzer by index name: fixed for an index's life, read once per process.
        self._analyzers: dict[str, str] = {}
        # (shards, routing shards) by index name: fixed for an index's life too.
        self._routing: dict[str, tuple[int, int]] = {}
        self._client = OpenSearch(
            hosts=[client_url],
            timeout=REQUEST_TIMEOUT_S,
            max_retries=MAX_RETRIES,
            retry_on_timeout=True,
        )

    def index_name(self, generation_id: str) -> str:
        """The OpenSearch index of `generation_id` (`INVALID_REQUEST` for an invalid id)."""
        if not _GENERATION_ID.fullmatch(generation_id):
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                "generation id must be 1-128 of [a-z0-9._-], starting alphanumeric",
                {"engine": _ENGINE, "generation_id": generation_id},
            )
        return f"{self._prefix}-{generation_id}"

    # -- LexicalIndex ----------------------------------------------------------------

    def create(
        self,
        generation_id: str,
        *,
        text_analyzer: str = DEFAULT_TEXT_ANALYZER,
        shards: int = 1,
        replicas: int = 0,
    ) -> None:
        index = self.index_name(generation_id)
        try:
            body = index_body(
                shards=shards,
                replicas=replicas,
                refresh_interval=self._refresh_interval,
                text_analyzer=text_analyzer,
            )
        except ValueError as exc:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                str(exc),
                {"engine": _ENGINE, "generation_id": generation_id, "text_analyzer": text_analyzer},
            ) from exc
        try:
            self._client.indices.create(index=index, body=body)
            self._analyzers[index] = text_analyzer
        except TransportError as exc:
            if exc.error == "resource_already_exists_exception":
                self._analyzers.pop(index, None)  # Its own analyzer, read when needed.
                return
            raise _translate(exc, "cannot create index", generation_id) from exc
        except OpenSearchException as exc:
            raise _translate(exc, "cannot create index", generation_id) from exc

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        check_keywords(upserts, deletes)
        index = self.index_name(generation_id)
        operations: list[_Operation] = [
            operation if isinstance(operation, IndexDocument) else (document_id, operation)
            for document_id, operation in newest_operations(upserts, deletes).items()
        ]
        try:
            if not self._client.indices.exists(index=index):
                raise _unknown(generation_id)
            if not operations:
                return
            combined = has_combined_field(self._text_analyzer(index))
            chunks = list(_chunks(operations, self._bulk_actions))
            for chunk in chunks:
                refresh = self._refresh if len(chunks) == 1 else None
                self._bulk(index, generation_id, chunk, refresh, combined)
            if len(chunks) > 1:
                self._client.indices.refresh(index=index)
        except OpenSearchException as exc:
            raise _translate(exc, "apply failed", generation_id) from exc

    def evidence(self, generation_id: str) -> IndexEvidence:
        index = self.index_name(generation_id)
        try:
            pairs = list(self._stored_pairs(index))
        except OpenSearchException as exc:
            raise _translate(exc, "cannot read index", generation_id) from exc
        try:
            digest = id_set_digest(pairs)
        except ValueError as exc:
            raise OrreryError(
                ErrorCode.INTERNAL, str(exc), {"engine": _ENGINE, "generation_id": generation_id}
            ) from exc
        return IndexEvidence(document_count=len(pairs), id_set_digest=digest)

    def stored_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the index holds, scrolled from doc values
        (`pace` between pages)."""
        index = self.index_name(generation_id)
        try:
            return list(self._stored_pairs(index, pace))
        except OpenSearchException as exc:
            raise _translate(exc, "cannot read index", generation_id) from exc

    def drop(self, generation_id: str) -> None:
        index = self.index_name(generation_id)
        self._analyzers.pop(index, None)
        self._routing.pop(index, None)
        try:
            self._drop_reference(index)
            self._client.indices.delete(index=index)
        except TransportError as exc:
            if exc.status_code == 404:
                return
            raise _translate(exc, "cannot delete index", generation_id) from exc
        except OpenSearchException as exc:
            raise _translate(exc, "cannot delete index", generation_id) from exc

    def drop_reference(self, generation_id: str) -> None:
        """Delete the generation's qualification reference (`reference_copy`), if any;
        a failure is logged, not raised (the copy is only a cache: the next
        qualification makes or checks it anyway)."""
        try:
            self._drop_reference(self.index_name(generation_id))
        except OpenSearchException as exc:
            log.warning("cannot delete the reference copy of %s: %s", generation_id, exc)

    def _drop_reference(self, index: str) -> None:
        target = f"{index}.qref"
        self._analyzers.pop(target, None)
        self._routing.pop(target, None)
        self._client.indices.delete(index=target, ignore_unavailable=True)

    def close(self) -> None:
        """Close the client's connections. The object is not used afterwards."""
        self._client.close()

    # -- aliases ---------------------------------------------------------------------

    def mirror_alias(self, alias: str, generation_id: str) -> None:
        """Point `alias` at this generation's index, and at nothing else, atomically.

        One `POST /_aliases` call removes `alias` from every index that holds it and adds it
        to `{index_prefix}-{generation_id}`: readers of the alias never see zero or two
        generations. Idempotent. The alias is only a mirror for outside readers; Orrery's
        own routing record stays the live pointer.
        """
        if not _ALIAS.fullmatch(alias):
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"alias must match {_ALIAS.pattern}",
                {"engine": _ENGINE, "alias": alias},
            )
        index = self.index_name(generation_id)
        actions = [
            {"remove": {"index": "*", "alias": alias}},
            {"add": {"index": index, "alias": alias}},
        ]
        try:
            self._client.indices.update_aliases(body={"actions": actions})
        except OpenSearchException as exc:
            raise _translate(exc, f"cannot point alias {alias!r}", generation_id) from exc

    # -- internals -------------------------------------------------------------------

    @contextlib.contextmanager
    def reference_copy(self, generation_id: str) -> Iterator[str]:
        """A copy of the generation's index in one shard with no replica, the same
        mapping and analyzer and the same documents (as of one scroll snapshot): the
        global BM25 reference a qualification compares the generation with. Yields the
        copy's generation id (`{generation_id}.qref`, searchable like a generation).
        Being fresh, it holds no deleted documents.

        The copy is kept for the next qualification of the generation and reused while
        the source took no write since: before copying, every primary's `max_seq_no` is
        read (with the source's uuid) and, when each equals its `local_checkpoint` (no
        write in flight), the source is refreshed — so everything up to those sequence
        numbers is visible to the scroll — and the copy is tagged with them in its
        mapping's `_meta` once complete. A later call whose source shows the same uuid
        and sequence numbers holds exactly the documents copied then (any index or
        delete raises a primary's `max_seq_no`), so it yields the copy as is; otherwise
        it copies again. An untagged copy (one that failed or was interrupted, or made
        while writes were in flight) is never reused. `drop_reference` deletes it, and
        `drop` with its generation's index."""
        source = self.index_name(generation_id)
        reference_id = f"{generation_id}.qref"
        target = self.index_name(reference_id)
        try:
            mark = self._write_mark(source)
            if mark is None or self._reference_tag(target) != mark:
                self._copy_reference(source, target, mark)
        except OpenSearchException as exc:
            with contextlib.suppress(OpenSearchException):
                self._client.indices.delete(index=target, ignore_unavailable=True)
            raise _translate(exc, "cannot copy index", generation_id) from exc
        except OrreryError:
            with contextlib.suppress(OpenSearchException):
                self._client.indices.delete(index=target, ignore_unavailable=True)
            raise
        yield reference_id

    def _copy_reference(self, source: str, target: str, mark: dict[str, Any] | None) -> None:
        """`target` made anew as the 1-shard copy of `source`, tagged with `mark`."""
        analyzer = self._text_analyzer(source)
        self._client.indices.delete(index=target, ignore_unavailable=True)
        if mark is not None:
            self._client.indices.refresh(index=source)
        # No scheduled refresh while the copy is written (nothing else writes to it): one
        # refresh after it, the segments made once.
        body = index_body(shards=1, replicas=0, refresh_interval="-1", text_analyzer=analyzer)
        self._client.indices.create(index=target, body=body)
        self._analyzers[target] = analyzer
        self._copy_documents(source, target)
        self._client.indices.refresh(index=target)
        if mark is not None:
            meta = dict(body["mappings"]["_meta"])
            meta["orrery"] = {**meta["orrery"], "reference_of": mark}
            self._client.indices.put_mapping(index=target, body={"_meta": meta})

    def _write_mark(self, index: str) -> dict[str, Any] | None:
        """`{uuid, max_seq_no: [per primary]}` of `index`, or None while a primary has
        a write in flight (`max_seq_no` above its `local_checkpoint`) or lacks the
        figures."""
        stats = self._client.indices.stats(
            index=index,
            metric="docs",
            params={
                "level": "shards",
                "filter_path": "indices.*.uuid,indices.*.shards.*.routing.primary,"
                "indices.*.shards.*.seq_no",
            },
        )
        found = stats.get("indices", {}).get(index)
        if not found:
            return None
        sequence: list[int] = []
        for shard in sorted(found.get("shards", {}), key=int):
            primaries = [c for c in found["shards"][shard] if c.get("routing", {}).get("primary")]
            seq_no = primaries[0].get("seq_no", {}) if primaries else {}
            if "max_seq_no" not in seq_no or seq_no["max_seq_no"] != seq_no.get("local_checkpoint"):
                return None
            sequence.append(int(seq_no["max_seq_no"]))
        return {"uuid": found.get("uuid"), "max_seq_no": sequence}

    def _reference_tag(self, target: str) -> Any:
        """The `_meta.orrery.reference_of` a complete reference copy was tagged with
        (None: no copy, or not tagged)."""
        mapping = self._client.indices.get_mapping(index=target, ignore_unavailable=True)
        found = mapping.get(target, {}).get("mappings", {}).get("_meta", {})
        return found.get("orrery", {}).get("reference_of")

    def _copy_documents(self, source: str, target: str) -> None:
        """Every stored document of `source` into `target` (scrolled `_source`, the same
        `_id` and external version). Pages are bulked into the target in parts of
        `_COPY_BULK_DOCUMENTS`, up to `_COPY_BULKS_IN_FLIGHT` at once, while the next page
        is scrolled: the copy waits on the engine's indexing, on as many write threads
        as there are bulks in flight."""
        body = {"size": _SCROLL_PAGE, "sort": ["_doc"], "version": True}
        page = self._client.search(
            index=source,
            body=body,
            params={"scroll": _SCROLL_KEEPALIVE},
            request_timeout=_COPY_REQUEST_TIMEOUT_S,
        )
        scroll_id = page.get("_scroll_id")
        pending: deque[Future[None]] = deque()
        try:
            with ThreadPoolExecutor(
                max_workers=_COPY_BULKS_IN_FLIGHT, thread_name_prefix="qref-bulk"
            ) as bulks:
                try:
                    while True:
                        hits = page["hits"]["hits"]
                        for start in range(0, len(hits), _COPY_BULK_DOCUMENTS):
                            while len(pending) >= _COPY_BULKS_IN_FLIGHT:
                                pending.popleft().result()
                            part = hits[start : start + _COPY_BULK_DOCUMENTS]
                            pending.append(bulks.submit(self._copy_page, source, target, part))
                        if len(hits) < _SCROLL_PAGE or scroll_id is None:
                            break
                        page = self._client.scroll(
                            body={"scroll": _SCROLL_KEEPALIVE, "scroll_id": scroll_id},
                            request_timeout=_COPY_REQUEST_TIMEOUT_S,
                        )
                        scroll_id = page.get("_scroll_id", scroll_id)
                    while pending:
                        pending.popleft().result()
                finally:
                    # On a failure, the bulks already sent finish before the error leaves.
                    for future in pending:
                        future.cancel()
        finally:
            if scroll_id is not None:
                with contextlib.suppress(OpenSearchException):
                    self._client.clear_scroll(body={"scroll_id": [scroll_id]})

    def _copy_page(self, source: str, target: str, hits: Sequence[Mapping[str, Any]]) -> None:
        lines: list[Mapping[str, Any]] = []
        for hit in hits:
            action = {
                "_index": target,
                "_id": hit["_id"],
                "version": hit["_version"],
                "version_type": "external",
            }
            lines += ({"index": action}, hit["_source"])
        response = self._client.bulk(
            body=lines,
            params={"filter_path": "errors,items.*.status,items.*.error"},
            request_timeout=_COPY_REQUEST_TIMEOUT_S,
        )
        # A 409 is this very version copied already: the client retried a bulk that
        # timed out while the engine still applied it.
        refused = [
            item["index"]
            for item in response.get("items", [])
            if item.get("index", {}).get("error")
            and item["index"].get("status") not in _NO_OP_STATUSES
        ]
        if refused:
            raise OrreryError(
                ErrorCode.INTERNAL,
                f"copying {source} to {target}: the engine refused documents",
                {"engine": _ENGINE, "index": target, "first_error": refused[0]},
            )

    def _text_analyzer(self, index: str) -> str:
        """The text analyzer `index` was created with (its mapping's `_meta`; indexes
        made before analyzers were named there used version 1)."""
        analyzer = self._analyzers.get(index)
        if analyzer is None:
            mapping = self._client.indices.get_mapping(index=index)
            meta = next(iter(mapping.values()))["mappings"].get("_meta", {})
            analyzer = str(meta.get("orrery", {}).get("text_analyzer", TEXT_ANALYZER_V1))
            self._analyzers[index] = analyzer
        return analyzer

    def _bulk(
        self,
        index: str,
        generation_id: str,
        operations: Sequence[_Operation],
        refresh: RefreshPolicy | None,
        combined: bool,
    ) -> None:
        params = {"refresh": refresh} if refresh is not None else {}
        body = _bulk_body(index, operations, combined)
        response = self._client.bulk(
            body=body, params={**params, "filter_path": "errors,items.*.status,items.*.error"}
        )
        if response.get("errors"):
            _raise_item_errors(response.get("items", []), operations, generation_id)

    def copy_layout(self, generation_id: str) -> tuple[int, int]:
        """`(number_of_shards, number_of_replicas + 1)` of the generation's index."""
        shards, replicas, _ = self._shape(generation_id)
        return shards, replicas + 1

    def document_shard(self, generation_id: str, document_id: str) -> int:
        """The shard OpenSearch routes `document_id` to (its default routing on `_id`:
        murmur3 of the UTF-16 id, scaled through `number_of_routing_shards`)."""
        shards, routing_shards = self._routing_of(generation_id)
        return opensearch_shard(_engine_id(document_id), shards, routing_shards)

    def copy_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[CopyRead]:
        """Every copy of every shard read by itself: a scroll with
        `preference=_shards:i|_only_nodes:<node>`, one per started copy (`_cat/shards`);
        a copy not started, or whose read fails, comes back with `pairs=None`. Keys are
        `s{shard}@{node}` (copy 0 the primary)."""
        index = self.index_name(generation_id)
        try:
            rows = self._client.cat.shards(index=index, format="json", h="shard,prirep,state,node")
        except OpenSearchException as exc:
            raise _translate(exc, "cannot list shards", generation_id) from exc
        ordered = sorted(
            rows, key=lambda r: (int(r["shard"]), r["prirep"] != "p", str(r.get("node") or ""))
        )
        out: list[CopyRead] = []
        counts: dict[int, int] = {}
        for row in ordered:
            shard = int(row["shard"])
            copy = counts.get(shard, 0)
            counts[shard] = copy + 1
            node = row.get("node")
            key = f"s{shard}@{node or f'unassigned-{copy}'}"
            if not node or row.get("state") != "STARTED":
                out.append(CopyRead(shard, copy, key, None, f"copy is {row.get('state')}"))
                continue
            preference = f"_shards:{shard}|_only_nodes:{node}"
            try:
                pairs = list(self._stored_pairs(index, pace, preference=preference))
            except OpenSearchException as exc:
                out.append(CopyRead(shard, copy, key, None, str(exc)[:300]))
                continue
            out.append(CopyRead(shard, copy, key, pairs))
        return out

    def _shape(self, generation_id: str) -> tuple[int, int, int]:
        """`(shards, replicas, routing shards)` of the generation's index, read now (the
        replica count is the one an operator may change)."""
        index = self.index_name(generation_id)
        try:
            settings = self._client.indices.get_settings(index=index)
        except OpenSearchException as exc:
            raise _translate(exc, "cannot read settings", generation_id) from exc
        values = next(iter(settings.values()))["settings"]["index"]
        shards = int(values["number_of_shards"])
        routing = values.get("number_of_routing_shards")
        routing_shards = int(routing) if routing else default_routing_shards(shards)
        self._routing[index] = (shards, routing_shards)
        return shards, int(values.get("number_of_replicas", 0)), routing_shards

    def _routing_of(self, generation_id: str) -> tuple[int, int]:
        """`(shards, routing shards)` of the generation's index: fixed for the index's
        life, read once (a document's shard is asked for every document a read-back
        compares, so not one settings request each)."""
        index = self.index_name(generation_id)
        known = self._routing.get(index)
        if known is None:
            shards, _, routing_shards = self._shape(generation_id)
            known = (shards, routing_shards)
        return known

    def _stored_pairs(
        self, index: str, pace: Pace = no_pace, *, preference: str | None = None
    ) -> Iterator[tuple[str, int]]:
        """`(document_id, revision)` of every document, read from doc values by scrolling
        (from the copies `preference` names, else any copy of each shard)."""
        body = {
            "size": _SCROLL_PAGE,
            "sort": ["_doc"],
            "_source": False,
            "docvalue_fields": [DOCUMENT_ID, REVISION],
            "query": {"match_all": {}},
        }
        params = {"scroll": _SCROLL_KEEPALIVE}
        if preference is not None:
            params["preference"] = preference
        page = self._client.search(index=index, body=body, params=params)
        scroll_id = page.get("_scroll_id")
        try:
            while True:
                hits = page["hits"]["hits"]
                for hit in hits:
                    yield _stored_pair(hit)
                if len(hits) < _SCROLL_PAGE or scroll_id is None:
                    return
                pace()
                page = self._client.scroll(
                    body={"scroll": _SCROLL_KEEPALIVE, "scroll_id": scroll_id}
                )
                scroll_id = page.get("_scroll_id", scroll_id)
        finally:
            # An abandoned scroll expires after its keep-alive anyway.
            if scroll_id is not None:
                with contextlib.suppress(OpenSearchException):
                    self._client.clear_scroll(body={"scroll_id": [scroll_id]})


def default_routing_shards(shards: int) -> int:
    """OpenSearch's default `number_of_routing_shards` of an index with `shards` shards
    (room for splitting up to 1024 shards: shards × 2^(10 - ⌈log2 shards⌉), at least ×2)."""
    if shards <= 1:
        return 1
    return shards << max(1, 10 - (shards - 1).bit_length())


def opensearch_shard(engine_id: str, shards: int, routing_shards: int) -> int:
    """The shard OpenSearch's default routing puts `_id` `engine_id` in: murmur3 (x86,
    32-bit, seed 0) of the id's UTF-16LE bytes, floor-mod the routing shards, divided by
    the routing factor (`OperationRouting.calculateScaledShardId`)."""
    if shards <= 1:
        return 0
    return (murmur3_32(engine_id.encode("utf-16-le")) % routing_shards) // (
        routing_shards // shards
    )


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of `data`, as a signed 32-bit integer (Java's `int`)."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    blocks = len(data) // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        h ^= (k * c2) & mask
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[4 * blocks :]
    k = 0
    for position in range(len(tail) - 1, -1, -1):
        k ^= tail[position] << (8 * position)
    if tail:
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        h ^= (k * c2) & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


# A pending operation on one document: the revision to write, or `(document_id, revision)`
# to delete.
_Operation = IndexDocument | tuple[str, int]


def _document_id(operation: _Operation) -> str:
    return operation.document_id if isinstance(operation, IndexDocument) else operation[0]


def _chunks(operations: list[_Operation], size: int) -> Iterator[list[_Operation]]:
    for start in range(0, len(operations), size):
        yield operations[start : start + size]


def _engine_id(document_id: str) -> str:
    """The `_id` of a document: its id, unless too long for OpenSearch or ambiguous."""
    if document_id.startswith(_HASHED_ID_MARK) or len(document_id.encode()) > _MAX_ID_BYTES:
        return _HASHED_ID_MARK + hashlib.sha256(document_id.encode()).hexdigest()
    return document_id


def _epoch_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


def _analyzed(text: str) -> str:
    """`text` with anything that is not valid Unicode replaced by a separator ("?")."""
    if text.isascii():  # no surrogate: nothing to replace (and no copy made)
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def _bulk_body(index: str, operations: Sequence[_Operation], combined: bool) -> bytes:
    """The NDJSON body of a bulk request writing `operations` to `index`: per document
    an action line (`index` with an external version, or `delete` with external_gte)
    and, for an upsert, its source.

    Byte for byte what pydantic-core's `to_json` makes of each line's dict (the client's
    own serializer is `json.dumps` per line: ~6 % of a projector's CPU in the scale-out
    ingest, session 17); the action lines are filled into a template, with only the
    id serialized (a dict and a `to_json` call per line cost ~4-8 µs a record)."""
    index_json = to_json(index)
    upsert = b'{"index":{"_index":' + index_json + b',"_id":'
    delete = b'{"delete":{"_index":' + index_json + b',"_id":'
    lines: list[bytes] = []
    for operation in operations:
        if isinstance(operation, IndexDocument):
            lines.append(
                b'%s%s,"version":%d,"version_type":"external"}}'
                % (upsert, to_json(_engine_id(operation.document_id)), operation.revision)
            )
            lines.append(to_json(_source(operation, combined)))
        else:
            document_id, revision = operation
            lines.append(
                b'%s%s,"version":%d,"version_type":"external_gte"}}'
                % (delete, to_json(_engine_id(document_id)), revision)
            )
    return b"\n".join(lines) + b"\n"


def _source(document: IndexDocument, combined: bool) -> dict[str, Any]:
    updated_at = document.updated_at.astimezone(UTC)
    source: dict[str, Any] = {
        DOCUMENT_ID: document.document_id,
        REVISION: document.revision,
        ITEM_ID: document.item_id,
        GALAXY: document.galaxy,
        RING: document.ring,
        RING_PATH: list(ring_path(document.ring)),
        STATUS: document.status,
        UPDATED_AT: updated_at.isoformat(),
        UPDATED_AT_MICROS: _epoch_micros(updated_at),
        VISIBILITY: list(document.visibility),
        FACETS: [
            f"{name}{FACET_SEPARATOR}{value}"
            for name, values in sorted(document.facets.items())
            for value in values
        ],
    }
    # Empty text fields are left out, as in tantivy, so that they do not count in the
    # field's BM25 statistics.
    if document.title:
        source[TITLE] = _analyzed(document.title)
    if document.body:
        source[BODY] = _analyzed(document.body)
    if document.tags:
        source[TAGS] = [_analyzed(tag) for tag in document.tags]
    text = combined_text(document.title, document.body, document.tags) if combined else ""
    if text:
        source[TEXT] = _analyzed(text)
    return source


def _raise_item_errors(
    items: Iterable[dict[str, Any]], operations: Sequence[_Operation], generation_id: str
) -> None:
    """Raise for bulk items that failed, ignoring the statuses that mean "no-op"."""
    rejected: list[dict[str, Any]] = []
    unavailable = False
    for item, operation in zip(items, operations, strict=False):
        ((action, result),) = item.items()
        status = int(result.get("status", 500))
        if status < 300:
            continue
        allowed = _NO_OP_DELETE_STATUSES if action == "delete" else _NO_OP_STATUSES
        if status in allowed:
            continue
        error = result.get("error") or {}
        unavailable = unavailable or status == 429 or status >= 500
        rejected.append(
            {
                "document_id": _document_id(operation),
                "status": status,
                "type": error.get("type", ""),
                "reason": str(error.get("reason", ""))[:300],
            }
        )
    if not rejected:
        return
    details = {"generation_id": generation_id, "documents": rejected[:20], "failed": len(rejected)}
    if unavailable:
        raise DependencyUnavailable(_ENGINE, f"{len(rejected)} bulk item(s) failed", details)
    raise OrreryError(
        ErrorCode.INVALID_REQUEST,
        f"opensearch rejected {len(rejected)} document(s)",
        {"engine": _ENGINE, **details},
    )


def _stored_pair(hit: dict[str, Any]) -> tuple[str, int]:
    fields = hit.get("fields") or {}
    document_ids = fields.get(DOCUMENT_ID) or []
    revisions = fields.get(REVISION) or []
    if not document_ids or not revisions:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks a document_id or revision",
            {"engine": _ENGINE, "_id": hit.get("_id")},
        )
    return str(document_ids[0]), int(revisions[0])


def _unknown(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"no lexical index for generation {generation_id!r}",
        {"engine": _ENGINE, "generation_id": generation_id},
    )


def _translate(exc: OpenSearchException, what: str, generation_id: str) -> OrreryError:
    """The `contracts.errors` form of a driver error."""
    if isinstance(exc, OpenSearchConnectionError):
        return DependencyUnavailable(_ENGINE, f"{what}: {exc}", {"generation_id": generation_id})
    if isinstance(exc, TransportError):
        status = exc.status_code
        if exc.error == "index_not_found_exception":
            return _unknown(generation_id)
        if not isinstance(status, int) or status in (401, 403, 429) or status >= 500:
            return DependencyUnavailable(
                _ENGINE, f"{what}: {exc}", {"generation_id": generation_id, "status": status}
            )
        if exc.error in ("invalid_alias_name_exception", "invalid_index_name_exception"):
            return OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"{what}: {exc}",
                {"engine": _ENGINE, "generation_id": generation_id},
            )
    return OrreryError(
        ErrorCode.INTERNAL, f"{what}: {exc}", {"engine": _ENGINE, "generation_id": generation_id}
    )
