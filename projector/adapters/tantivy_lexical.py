"""Embedded BM25 indexes in tantivy: one index directory per generation under a root.

The same process's query worker searches the very `tantivy.Index` objects written here
(`TantivyLexicalIndex.searchable`), so a search sees a commit as soon as `apply` returns.

Each index records its text analyzer as the tokenizer of its text fields (`meta.json`):
tantivy does not persist tokenizers, so an index opened again registers the analyzer its
schema names, and the query side analyzes query text with that same analyzer.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import tantivy
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.flat_lexical import FlatLexical, LexicalRow
from contracts.fsync import fsync_path
from contracts.index import Candidate, IndexDocument
from contracts.index_fields import (
    BODY,
    DEFAULT_TEXT_ANALYZER,
    DOCUMENT_ID,
    DOCUMENT_KEY_HIGH,
    DOCUMENT_KEY_LOW,
    FACET_SEPARATOR,
    FACETS,
    GALAXY,
    HIDDEN_FACET,
    ITEM_ID,
    NO_STEMMING,
    REVISION,
    RING,
    RING_PATH,
    SOURCE_TEXT_FIELDS,
    STATUS,
    STATUS_KEY,
    TAGS,
    TEXT,
    TEXT_FIELDS,
    TEXT_TOKEN_MAX_BYTES,
    TITLE,
    UPDATED_AT,
    UPDATED_AT_MICROS,
    VISIBILITY,
    combined_text,
    document_ids_of_keys,
    document_key,
    has_combined_field,
    ring_path,
    status_key,
    text_analyzer_language,
)
from contracts.pacing import Pace, no_pace
from projector.model import IndexOperation, check_keywords, check_single_copy, newest_operations
from projector.ports import IndexEvidence

__all__ = [
    "DEFAULT_COMPACT_HEAP_BYTES",
    "DEFAULT_FLAT_MAX_ROWS",
    "DEFAULT_FLAT_OPEN_MAX_ROWS",
    "DEFAULT_WRITER_HEAP_BYTES",
    "DEFAULT_WRITER_THREADS",
    "DocumentSource",
    "TantivyLexicalIndex",
]

# Per writer; tantivy needs at least 15 MB per indexing thread.
DEFAULT_WRITER_HEAP_BYTES = 64_000_000
# One thread: the projector writes small batches; more threads only make more segments.
DEFAULT_WRITER_THREADS = 1
# The documents a generation may hold and keep its in-memory copy (`flat_for`): those a
# query scores faster in numpy than through tantivy's two calls (SciFact's 5,183: 0.33 ms
# against ~1.4). About 2 MB of postings per thousand SciFact-sized documents.
DEFAULT_FLAT_MAX_ROWS = 10_000
# The documents a generation may hold for `build_flat` to make it a copy from the
# canonical store (one it did not create here, or whose copy was dropped): at 100k
# synthetic documents the copy scores a query in numpy about as fast as tantivy's top-k
# and makes its id lookups array reads (tantivy: ~1.3 ms for ~100 ids); building it
# reads and analyzes every document once (seconds).
DEFAULT_FLAT_OPEN_MAX_ROWS = 100_000
# ... and all copies of an index together (~200 MB of SciFact-sized documents); a copy
# never starts past it, so a larger generation (1M) never gets one.
DEFAULT_FLAT_MAX_TOTAL_ROWS = 100_000
# The compaction writer's budget: tantivy flushes a segment when its arena reaches it, so
# one commit under it is one segment. The arena grows with the data, not to the budget
# (SciFact's 5k documents, 100k synthetic ones: well under it); tantivy's ceiling is 4 GB.
DEFAULT_COMPACT_HEAP_BYTES = 3_000_000_000

# The documents of the given `(document_id, revision)` pairs, exactly those revisions.
DocumentSource = Callable[[Sequence[tuple[str, int]]], Sequence[IndexDocument]]

# A generation id becomes a directory name: no separators, no dot-dot.
_GENERATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_META_FILE = "meta.json"
# Siblings of a generation's directory during a compaction (never generation ids: a
# generation id starts alphanumeric): the new index being written, the old one swapped out.
_COMPACT_PREFIX = ".compact."
_RETIRED_PREFIX = ".retired."
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# tantivy-py raises these for engine failures (I/O, lock, schema, consumed writer).
_DRIVER_ERRORS = (ValueError, OSError, RuntimeError)
# Fast fields of schema version 5; an index created before has none (and takes none).
_HIT_KEYS = (DOCUMENT_KEY_HIGH, DOCUMENT_KEY_LOW, STATUS_KEY)
_PAIRS_CHUNK = 1_000  # stored documents read between two `pace` calls
# Documents one key-range search of a read-back lists at most (`_every_address`).
_RANGE_HITS = 16_384
# Rounds of replaying a compaction's journal outside the registry lock before the swap
# replays what is left under it (writes keep coming: the swap must not wait forever).
_REPLAY_ROUNDS = 3


def _text_analyzer(name: str) -> tantivy.TextAnalyzer:
    """The text analyzer `name` of `contracts.index_fields` (any version); `ValueError`
    for an unknown name."""
    language = text_analyzer_language(name)
    builder = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(TEXT_TOKEN_MAX_BYTES))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
    )
    if language is not None and language != NO_STEMMING:
        builder = builder.filter(tantivy.Filter.stemmer(language))
    return builder.build()


def _build_schema(text_analyzer: str, *, hit_keys: bool = True) -> tantivy.Schema:
    """The schema of a generation's index whose text fields use `text_analyzer`.

    Text fields keep positions so that phrase queries stay possible without a rebuild.
    Keyword fields use the `raw` tokenizer (one exact term per value). `hit_keys=False`
    is the schema before version 5 (tests build such indexes).
    """
    builder = tantivy.SchemaBuilder()
    text_fields = TEXT_FIELDS if has_combined_field(text_analyzer) else SOURCE_TEXT_FIELDS
    for name in text_fields:
        builder.add_text_field(name, tokenizer_name=text_analyzer, index_option="position")
    builder.add_text_field(
        DOCUMENT_ID, stored=True, fast=True, tokenizer_name="raw", index_option="basic"
    )
    for name in (ITEM_ID, GALAXY, RING, STATUS, VISIBILITY, FACETS):
        builder.add_text_field(name, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(RING_PATH, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field(REVISION, stored=True, fast=True)
    builder.add_date_field(UPDATED_AT, stored=True, indexed=True, fast=True)
    builder.add_integer_field(UPDATED_AT_MICROS, indexed=True, fast=True)
    # Schema version 5: what a hit reports, as fast fields (no stored-document read).
    for name in _HIT_KEYS if hit_keys else ():
        builder.add_unsigned_field(name, fast=True)
    return builder.build()


def _epoch_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


@dataclass(eq=False)
class _Generation:
    index: tantivy.Index
    # The analyzer of the text fields (`contracts.index_fields`), as the schema names it.
    text_analyzer: str
    # That analyzer, as registered with the index (the query side analyzes with it too).
    analyzer: tantivy.TextAnalyzer
    # Serializes writes (and writer lifecycle); searches never take it.
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    writer: tantivy.IndexWriter | None = None
    # Set by `drop` and `close`: a writer that still holds this object must look again.
    retired: bool = False
    # Whether the schema has the `_HIT_KEYS` (version 5 and later).
    hit_keys: bool = True
    # The in-memory copy the query side scores small generations from
    # (`contracts.flat_lexical`): only for a generation this process created and has
    # only added to; dropped for good at the first replacement or deletion, or past
    # its size.
    flat: FlatLexical | None = None
    # Ids written while a compaction copies the index (`compact`), to replay in the copy.
    journal: set[str] | None = None
    # Commits made through this object: `build_flat` keeps its copy only if none came
    # while it read the documents.
    commits: int = 0
    # `commits` when a `build_flat` that read the documents kept no copy: not tried again
    # before the next commit (a failure that repeats would cost a full read every round).
    flat_failed_at: int | None = None
    # When the last write was (`time.monotonic`): a compaction waits for quiet.
    written_at: float = 0.0


class TantivyLexicalIndex:
    """`LexicalIndex` over tantivy, one index per generation at `root / generation_id`.

    Guarantees, beyond the port's:
    - One `IndexWriter` per generation, opened on first write and kept until `drop` or
      `close`; writes to one generation are serialized by a lock, searches take no lock.
    - `apply` commits once (or not at all when nothing changes) and reloads the reader
      before returning, so `index_for(g).searcher()` sees the commit at once.
    - A generation directory left by an earlier process is opened again on first use,
      with the text analyzer its schema names (version 1 indexes included).
    - `create` takes the generation's text analyzer (default `DEFAULT_TEXT_ANALYZER`);
      version 2 indexes also hold `TEXT` (title, body and tags in one field).
    - Facet names must not contain `FACET_SEPARATOR`, keyword values must be valid Unicode
      (`INVALID_REQUEST` otherwise, nothing written); text fields are made valid.
    - Unknown generations raise `OrreryError(COVERAGE_UNAVAILABLE)`; a document tantivy
      refuses (its values) raises `INVALID_REQUEST` naming it, deterministic; engine
      failures (I/O, the writer) raise `DependencyUnavailable("tantivy", ...)`, transient;
      both after rolling back the uncommitted batch.
    """

    def __init__(
        self,
        root: Path,
        *,
        writer_heap_bytes: int = DEFAULT_WRITER_HEAP_BYTES,
        writer_threads: int = DEFAULT_WRITER_THREADS,
        flat_max_rows: int = 0,
        flat_max_total_rows: int = DEFAULT_FLAT_MAX_TOTAL_ROWS,
        flat_open_max_rows: int = 0,
    ) -> None:
        self._root = root
        self._writer_heap_bytes = writer_heap_bytes
        self._writer_threads = writer_threads
        # Generations created here keep an in-memory copy up to this many documents
        # (`flat_for`; 0: none), all copies together up to `flat_max_total_rows`.
        self._flat_max_rows = flat_max_rows
        self._flat_max_total_rows = flat_max_total_rows
        # ... and `build_flat` makes one for a generation of up to this many (0: never).
        self._flat_open_max_rows = flat_open_max_rows
        self._flat_lock = threading.Lock()
        self._flat_rows = 0
        self._schemas: dict[str, tantivy.Schema] = {}
        # Guards `_generations`; held only briefly, never while waiting on a commit
        # except by `drop` and `close`.
        self._registry_lock = threading.Lock()
        self._generations: dict[str, _Generation] = {}

    # -- provider for the query side -------------------------------------------------

    def index_for(self, generation_id: str) -> tantivy.Index:
        """The live, shared index of `generation_id`; `KeyError` if there is none."""
        return self.searchable(generation_id)[0]

    def searchable(self, generation_id: str) -> tuple[tantivy.Index, str, tantivy.TextAnalyzer]:
        """The live, shared index of `generation_id`, the name of its text analyzer and
        that analyzer as registered (what query text must be analyzed with); `KeyError`
        if there is none."""
        with self._registry_lock:
            generation = self._load(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        return generation.index, generation.text_analyzer, generation.analyzer

    def flat_for(self, generation_id: str) -> FlatLexical | None:
        """The generation's in-memory copy, if it keeps one (`contracts.flat_lexical`);
        `KeyError` if there is no such generation."""
        with self._registry_lock:
            generation = self._load(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        return generation.flat

    # -- LexicalIndex ----------------------------------------------------------------

    def create(
        self,
        generation_id: str,
        *,
        text_analyzer: str = DEFAULT_TEXT_ANALYZER,
        shards: int = 1,
        replicas: int = 0,
    ) -> None:
        check_single_copy("tantivy", generation_id, shards, replicas)
        path = self._path(generation_id)
        analyzer = _checked_analyzer(text_analyzer, generation_id)
        with self._registry_lock:
            if self._load(generation_id) is not None:
                return
            try:
                path.mkdir(parents=True, exist_ok=True)
                index = tantivy.Index(self._index_schema(text_analyzer), str(path))
                index.register_tokenizer(text_analyzer, analyzer)
            except _DRIVER_ERRORS as exc:
                raise _unavailable("cannot create index", generation_id, exc) from exc
            self._generations[generation_id] = _Generation(
                index,
                text_analyzer,
                analyzer,
                hit_keys=_schema_has_hit_keys(path / _META_FILE),
                # The combined field only, what the default profile (`weighted@3`) and
                # `rrf@2` score; a query boosting another field asks tantivy.
                flat=(
                    FlatLexical((TEXT,), max_rows=self._flat_max_rows)
                    if self._flat_max_rows > 0 and has_combined_field(text_analyzer)
                    else None
                ),
            )

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        check_keywords(upserts, deletes)
        operations = newest_operations(upserts, deletes)
        while True:
            generation = self._require(generation_id)
            with generation.write_lock:
                if generation.retired:
                    continue  # Dropped (now unknown) or closed (reopened) meanwhile.
                if operations:
                    if generation.journal is not None:
                        # Before the write: a write that fails half way is replayed too
                        # (a replay copies whatever the index then holds for the id).
                        generation.journal.update(operations)
                    self._apply_locked(generation, generation_id, operations)
                    generation.written_at = time.monotonic()
                return

    def evidence(self, generation_id: str) -> IndexEvidence:
        index = self._require(generation_id).index
        try:
            pairs = _stored_pairs(index.searcher(), index.schema)
        except _DRIVER_ERRORS as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc
        try:
            digest = id_set_digest(pairs)
        except ValueError as exc:
            raise OrreryError(
                ErrorCode.INTERNAL, str(exc), {"engine": "tantivy", "generation_id": generation_id}
            ) from exc
        return IndexEvidence(document_count=len(pairs), id_set_digest=digest)

    def stored_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the index holds, from its stored fields
        (`pace` after every `_PAIRS_CHUNK` documents read)."""
        index = self._require(generation_id).index
        try:
            return _stored_pairs(index.searcher(), index.schema, pace)
        except _DRIVER_ERRORS as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc

    def pairs_of(self, generation_id: str, document_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the index holds for `document_ids`, from its
        stored fields (one term-set search; an id held twice comes back twice)."""
        index = self._require(generation_id).index
        try:
            searcher = index.searcher()
            query = tantivy.Query.term_set_query(index.schema, DOCUMENT_ID, list(document_ids))
            hits = _all_hits(searcher, query, len(document_ids))
            return _read_pairs(searcher, [address for _score, address in hits])
        except _DRIVER_ERRORS as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc

    def segment_count(self, generation_id: str) -> int:
        """How many segments the generation's index searches now."""
        index = self._require(generation_id).index
        try:
            return int(index.searcher().num_segments)
        except _DRIVER_ERRORS as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc

    def generation_ids(self) -> list[str]:
        """The generations open in this process (opened on first use)."""
        with self._registry_lock:
            return list(self._generations)

    def compaction_due(self, generation_id: str, *, quiet_s: float, growth: float) -> bool:
        """Whether `compact` would pay now: nothing was written for `quiet_s`, and the
        documents outside the index's largest segment (in the others, or deleted) reach
        `growth` times that segment's (at least one). A trickle of writes after a
        compaction leaves small segments that are not worth rewriting everything for; the
        tail of an ingest that outgrew the last compaction is."""
        generation = self._require(generation_id)
        if generation.journal is not None:
            return False
        if time.monotonic() - generation.written_at < quiet_s:
            return False
        sizes = self._segment_sizes(generation_id)
        if not sizes:
            return False
        largest = max(sizes, key=lambda size: size[0])
        outside = sum(size[0] for size in sizes) - largest[0] + sum(d for _, d in sizes)
        return outside >= max(1.0, growth * (largest[0] - largest[1]))

    def flat_due(self, generation_id: str, *, quiet_s: float) -> bool:
        """Whether `build_flat` would make the generation a copy now: it has none, nothing
        was written to it for `quiet_s`, and its index holds no deleted document and at
        most `flat_open_max_rows` documents (within the copies' shared bound), and no
        build that read its documents failed since its last commit."""
        if self._flat_open_max_rows <= 0:
            return False
        generation = self._require(generation_id)
        if generation.flat is not None or generation.journal is not None:
            return False
        if generation.flat_failed_at == generation.commits:
            return False
        if not has_combined_field(generation.text_analyzer):
            return False
        if time.monotonic() - generation.written_at < quiet_s:
            return False
        sizes = self._segment_sizes(generation_id)
        documents = sum(size[0] for size in sizes)
        with self._flat_lock:
            room = self._flat_max_total_rows - self._flat_rows
        return 0 < documents <= min(self._flat_open_max_rows, room) and not any(
            deleted for _, deleted in sizes
        )

    def build_flat(
        self, generation_id: str, documents: DocumentSource, *, pace: Pace = no_pace
    ) -> bool:
        """Make the generation's in-memory copy (`flat_for`, `contracts.flat_lexical`)
        from `documents` (the canonical store's revisions the index holds); whether it
        did.

        Guarantees:
        - Only for an index without deleted documents (its BM25 statistics are then its
          documents' own, what the copy computes) of at most `flat_open_max_rows`
          documents, within the copies' shared bound (reserved before reading, given
          back if no copy results); not while a compaction copies the index.
        - The copy holds exactly the `(document_id, revision)` pairs of the index: it is
          kept only if no commit came while the documents were read (else nothing is
          kept: `False`, try again when quiet; reading stops at the next chunk after
          such a commit), and later writes treat it as they treat
          the copy of a generation created here (additions kept, anything else drops it).
        - Reads and analyzes without the write lock (`pace` between chunks of
          `_PAIRS_CHUNK` documents); searches and writes go on meanwhile.
        - `documents` must return exactly the requested revisions (`INTERNAL` otherwise).
        """
        generation = self._require(generation_id)
        if self._flat_open_max_rows <= 0 or not has_combined_field(generation.text_analyzer):
            return False
        with generation.write_lock:
            if generation.retired or generation.flat is not None or generation.journal is not None:
                return False
            sizes = self._segment_sizes(generation_id)
            count = sum(size[0] for size in sizes)
            if any(deleted for _, deleted in sizes) or not 0 < count <= self._flat_open_max_rows:
                return False
            commits = generation.commits
            searcher = generation.index.searcher()
        with self._flat_lock:
            if self._flat_rows + count > self._flat_max_total_rows:
                return False
            self._flat_rows += count  # reserved
        kept = False

        def paced() -> None:
            pace()
            if generation.commits != commits:
                # Writes flowing: what was read would be thrown away at the end, and at
                # 100k a build is ~20 s of interpreter time (a fifth of it during a
                # flat-out ingest): give way now, due again once quiet.
                raise _Superseded

        try:
            flat = FlatLexical((TEXT,), max_rows=self._flat_open_max_rows)
            pairs = _stored_pairs(searcher, generation.index.schema, paced)
            if len(pairs) != count:
                return False  # a merge or commit the meta file did not show yet
            for start in range(0, len(pairs), _PAIRS_CHUNK):
                paced()
                chunk = _fetched(documents, pairs[start : start + _PAIRS_CHUNK])
                rows = (_flat_row(document, generation.analyzer, flat.fields) for document in chunk)
                if not flat.add(rows):
                    return False
            with generation.write_lock:
                if (
                    generation.retired
                    or generation.commits != commits
                    or generation.flat is not None
                    or generation.journal is not None
                ):
                    return False
                generation.flat = flat
                kept = True
            return True
        except _Superseded:
            return False
        except _DRIVER_ERRORS as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc
        finally:
            if not kept:
                generation.flat_failed_at = commits
                self._flat_release(count)

    def compact(
        self,
        generation_id: str,
        documents: DocumentSource,
        *,
        heap_bytes: int = DEFAULT_COMPACT_HEAP_BYTES,
        pace: Pace = no_pace,
        max_journal: int | None = None,
    ) -> bool:
        """Rewrite the generation's index as one segment without deleted documents;
        whether it did (`False`: already one segment without deletes, or a compaction of
        it is under way).

        tantivy-py exposes no merge: this copies the live documents, which the index does
        not store whole (text is indexed, not stored), from `documents` (the canonical
        store's revisions the index holds) into a new index beside the generation's, with
        one writer and one commit, then swaps the two directories.

        Guarantees:
        - The copy holds exactly the `(document_id, revision)` pairs the index holds at the
          swap: writes applied meanwhile are journaled (ids) and replayed into the copy
          under the write lock before its one big commit, which runs without a lock;
          writes made during that commit are replayed after it (one small segment more),
          the last ones under the registry lock with the swap (searches wait only for
          that small replay, the renames and opening the new index).
        - Answers are the old index's, except that deleted documents no longer count in
          BM25's statistics (document count, document frequencies, average length): they
          are those of an index built afresh from the same documents. Exception: a
          document written meanwhile after its chunk was copied is deleted and added
          again in the copy, which keeps it as a deleted document (statistics as in the
          live index) until the next compaction (the copy then has deletes, so the next
          call does not return early).
        - Crash safe: the new index is committed whole before the swap; the swap renames
          the old directory aside, then the new one in, and syncs their parent directory.
          A process that stops between the two renames finds the old index again on the
          next open (the copy is removed); after them, the new one (the old is removed).
        - The in-memory copy (`flat_for`) is kept when the compacted index has no deleted
          document (`_swap`), dropped for good otherwise.
        - With `max_journal`, a copy during which more documents than that were written
          is abandoned (False, nothing swapped): writes are flowing again, and the
          compaction would take CPU from them for a copy that is stale at once.
        - `documents` must return exactly the requested revisions (`INTERNAL` otherwise,
          nothing swapped); it is called without the write lock while copying and with
          it for the replay.
        """
        path = self._path(generation_id)
        generation = self._require(generation_id)
        with generation.write_lock:
            if generation.retired or generation.journal is not None:
                return False
            if _compact_already(path / _META_FILE):
                return False
            generation.journal = set()
            searcher = generation.index.searcher()
        copy = path.with_name(_COMPACT_PREFIX + generation_id)
        writer: tantivy.IndexWriter | None = None
        swapping = False
        try:
            _remove_tree(copy)
            copy.mkdir(parents=True)
            fresh = tantivy.Index(generation.index.schema, str(copy))
            fresh.register_tokenizer(generation.text_analyzer, generation.analyzer)
            writer = fresh.writer(heap_size=heap_bytes, num_threads=1)
            pairs = _stored_pairs(searcher, generation.index.schema, pace)
            for start in range(0, len(pairs), _PAIRS_CHUNK):
                if start:
                    pace()
                chunk = _fetched(documents, pairs[start : start + _PAIRS_CHUNK])
                with generation.write_lock:
                    # Written since the copy began: copied by the replay (not twice).
                    skip = frozenset(generation.journal or ())
                if max_journal is not None and len(skip) > max_journal:
                    return False
                _add_documents(writer, generation, chunk, skip)
            # The copy's one big commit runs without a lock (searches and writes go on);
            # what was written until it starts is in it.
            with generation.write_lock:
                _replay(writer, generation, documents)
            writer.commit()
            rounds = 0
            while True:
                with self._registry_lock, generation.write_lock:
                    if generation.retired or self._generations.get(generation_id) is not generation:
                        return False  # Dropped or closed meanwhile.
                    if not generation.journal or rounds >= _REPLAY_ROUNDS:
                        # Searches wait for this (the registry lock): a small replay at most.
                        if _replay(writer, generation, documents):
                            writer.commit()
                        writer.wait_merging_threads()  # Consumes the writer (and its lock).
                        writer = None
                        swapping = True
                        self._swap(generation_id, generation, path, copy)
                        break
                rounds += 1
                with generation.write_lock:  # Writes made during the commit: searches go on.
                    if _replay(writer, generation, documents):
                        writer.commit()
            _remove_tree(path.with_name(_RETIRED_PREFIX + generation_id))
            return True
        except _DRIVER_ERRORS as exc:
            if generation.retired and not swapping:
                return False  # Dropped (the copy with it) or closed meanwhile.
            raise _unavailable("compaction failed", generation_id, exc) from exc
        finally:
            generation.journal = None
            if writer is not None:
                with contextlib.suppress(*_DRIVER_ERRORS):
                    writer.rollback()
                    writer.wait_merging_threads()
            # Never the old index here: a swap that failed half way left it to recover.
            with contextlib.suppress(OSError):
                _remove_tree(copy)

    def _swap(self, generation_id: str, generation: _Generation, path: Path, copy: Path) -> None:
        """Put the committed copy in the generation's place. Registry and write locks held.

        The generation is retired first, so that a failure half way leaves it to be
        reopened (and recovered, `_recover_compaction`) on next use. Both renames are
        made durable (the parent directory synced) before the new index is opened.

        The in-memory copy (`flat_for`) moves to the new index when the copy has no
        deleted documents: the live generation had only additions (else it has no copy),
        so the copy's statistics are then exactly the documents' own, as before. A
        compaction that left a deleted document (see `compact`) drops it for good."""
        self._close_writer(generation)
        del self._generations[generation_id]
        flat, generation.flat = generation.flat, None
        if flat is not None and _has_deletes(copy / _META_FILE):
            self._flat_release(len(flat))
            flat = None
        retired = path.with_name(_RETIRED_PREFIX + generation_id)
        try:
            _remove_tree(retired)
            path.rename(retired)
            copy.rename(path)
            fsync_path(path.parent)
        except OSError:
            if flat is not None:
                self._flat_release(len(flat))
            raise
        index = tantivy.Index.open(str(path))
        index.register_tokenizer(generation.text_analyzer, generation.analyzer)
        self._generations[generation_id] = _Generation(
            index,
            generation.text_analyzer,
            generation.analyzer,
            hit_keys=generation.hit_keys,
            written_at=generation.written_at,
            flat=flat,
        )

    def drop(self, generation_id: str) -> None:
        path = self._path(generation_id)
        # The registry stays locked so that no one reopens the directory while it goes.
        with self._registry_lock:
            generation = self._generations.pop(generation_id, None)
            if generation is not None:
                with generation.write_lock:
                    self._close_writer(generation)
                    self._forget_flat(generation)
            try:
                for prefix in (_COMPACT_PREFIX, _RETIRED_PREFIX):
                    _remove_tree(path.with_name(prefix + generation_id))
                _remove_tree(path)
            except OSError as exc:
                raise _unavailable("cannot remove index", generation_id, exc) from exc

    def close(self) -> None:
        """Wait for merges and release every writer. Later calls reopen lazily."""
        with self._registry_lock:
            generations = list(self._generations.values())
            self._generations.clear()
            for generation in generations:
                with generation.write_lock:
                    self._close_writer(generation)
                    self._forget_flat(generation)

    # -- internals -------------------------------------------------------------------

    def _path(self, generation_id: str) -> Path:
        if not _GENERATION_ID.fullmatch(generation_id):
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                "generation id must be 1-128 of [A-Za-z0-9._-], starting alphanumeric",
                {"generation_id": generation_id},
            )
        return self._root / generation_id

    def _segment_sizes(self, generation_id: str) -> list[tuple[int, int]]:
        """`_segment_sizes` of the generation's last commit; `DependencyUnavailable` if
        its meta file cannot be read."""
        try:
            return _segment_sizes(self._path(generation_id) / _META_FILE)
        except (OSError, ValueError, KeyError) as exc:
            raise _unavailable("cannot read index", generation_id, exc) from exc

    def _index_schema(self, text_analyzer: str) -> tantivy.Schema:
        schema = self._schemas.get(text_analyzer)
        if schema is None:
            schema = self._schemas[text_analyzer] = _build_schema(text_analyzer)
        return schema

    def _load(self, generation_id: str) -> _Generation | None:
        """The open generation, opening its directory if needed. Registry lock held."""
        generation = self._generations.get(generation_id)
        if generation is not None:
            return generation
        if not _GENERATION_ID.fullmatch(generation_id):
            return None
        path = self._root / generation_id
        try:
            _recover_compaction(path)
        except OSError as exc:
            raise _unavailable("cannot recover index", generation_id, exc) from exc
        if not (path / _META_FILE).is_file():
            return None
        try:
            text_analyzer = _schema_analyzer(path / _META_FILE)
            hit_keys = _schema_has_hit_keys(path / _META_FILE)
            index = tantivy.Index.open(str(path))
            # Tokenizers are not persisted: without this, writes fail on the text fields.
            analyzer = _text_analyzer(text_analyzer)
            index.register_tokenizer(text_analyzer, analyzer)
        except (*_DRIVER_ERRORS, KeyError, TypeError) as exc:
            raise _unavailable("cannot open index", generation_id, exc) from exc
        generation = _Generation(index, text_analyzer, analyzer, hit_keys=hit_keys)
        self._generations[generation_id] = generation
        return generation

    def _require(self, generation_id: str) -> _Generation:
        self._path(generation_id)
        with self._registry_lock:
            generation = self._load(generation_id)
        if generation is None:
            raise _unknown(generation_id)
        return generation

    def _apply_locked(
        self, generation: _Generation, generation_id: str, operations: dict[str, IndexOperation]
    ) -> None:
        """Write the operations that change the index, in one commit. Write lock held."""
        index = generation.index
        combined = has_combined_field(generation.text_analyzer)
        writer = self._writer(generation, generation_id)
        changed = False
        previous = flat = generation.flat
        added: list[IndexDocument] = []
        try:
            held = _held_revisions(index, list(operations))
            for document_id, operation in operations.items():
                present = held.get(document_id)
                if isinstance(operation, IndexDocument):
                    if present is not None and present >= operation.revision:
                        continue
                    if present is not None:
                        flat = None  # a replaced document still counts in tantivy's stats
                    added.append(operation)
                    # Deleting first keeps the id unique even if `held` were stale.
                    writer.delete_documents_by_term(DOCUMENT_ID, document_id)
                    try:
                        document = _to_document(operation, combined, generation.hit_keys)
                        writer.add_document(document)
                    except (ValueError, TypeError) as exc:
                        # This document's values, not the index: the same document fails
                        # the same way on every attempt (deterministic, `INVALID_REQUEST`).
                        self._discard_writer(generation)
                        raise _refused(generation_id, document_id, exc) from exc
                else:
                    if present is None or present > operation:
                        continue
                    flat = None  # so does a deleted one, until a merge drops it
                    writer.delete_documents_by_term(DOCUMENT_ID, document_id)
                changed = True
            if changed:
                generation.commits += 1  # before the commit: a failed one counts too
                writer.commit()
                index.reload()
                if flat is not None and added and not self._flat_add(flat, generation, added):
                    flat = None
                if previous is not None and flat is None:
                    self._flat_release(len(previous))
                generation.flat = flat
        except _DRIVER_ERRORS as exc:
            self._discard_writer(generation)
            raise _unavailable("apply failed", generation_id, exc) from exc

    def _flat_add(
        self, flat: FlatLexical, generation: _Generation, added: Sequence[IndexDocument]
    ) -> bool:
        """Add `added` to `flat` within the copies' shared bound; False: drop the copy."""
        with self._flat_lock:
            if self._flat_rows + len(added) > self._flat_max_total_rows:
                return False
            self._flat_rows += len(added)  # reserved
        if flat.add(_flat_row(document, generation.analyzer, flat.fields) for document in added):
            return True
        self._flat_release(len(added))
        return False

    def _forget_flat(self, generation: _Generation) -> None:
        """Give a closed or dropped generation's copy back to the shared bound."""
        if generation.flat is not None:
            self._flat_release(len(generation.flat))
            generation.flat = None

    def _flat_release(self, rows: int) -> None:
        with self._flat_lock:
            self._flat_rows -= rows

    def _writer(self, generation: _Generation, generation_id: str) -> tantivy.IndexWriter:
        """The generation's writer, opened on first use. Write lock held."""
        if generation.writer is None:
            try:
                generation.writer = generation.index.writer(
                    heap_size=self._writer_heap_bytes, num_threads=self._writer_threads
                )
            except _DRIVER_ERRORS as exc:
                raise _unavailable("cannot open writer", generation_id, exc) from exc
        return generation.writer

    @staticmethod
    def _discard_writer(generation: _Generation) -> None:
        """Roll back and drop a writer that failed: a failed writer may be poisoned."""
        writer, generation.writer = generation.writer, None
        if writer is not None:
            # Dropping the writer discards uncommitted operations even if this fails.
            with contextlib.suppress(*_DRIVER_ERRORS):
                writer.rollback()

    @staticmethod
    def _close_writer(generation: _Generation) -> None:
        generation.retired = True
        writer, generation.writer = generation.writer, None
        if writer is not None:
            # The writer's lock is released either way once it is dropped.
            with contextlib.suppress(*_DRIVER_ERRORS):
                writer.wait_merging_threads()


class _Superseded(Exception):
    """A commit came while `build_flat` read: its copy could not be kept."""


@retry(
    retry=retry_if_exception(lambda exc: isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY),
    stop=stop_after_attempt(5),
    wait=wait_exponential(multiplier=0.02, max=0.5),
    reraise=True,
)
def _remove_tree(path: Path) -> None:
    """`rmtree`, again when a file appeared meanwhile: tantivy's directory threads may
    still finish a write (a merge's files, `meta.json`) just after the writer closed."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def _segment_sizes(meta_file: Path) -> list[tuple[int, int]]:
    """`(max_doc, deleted documents)` of each segment the index's last commit names."""
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    return [
        (int(segment["max_doc"]), int((segment.get("deletes") or {}).get("num_deleted_docs", 0)))
        for segment in meta["segments"]
    ]


def _has_deletes(meta_file: Path) -> bool:
    """Whether any segment the index's last commit names has deleted documents."""
    return any(deleted for _, deleted in _segment_sizes(meta_file))


def _compact_already(meta_file: Path) -> bool:
    """Whether the index is one segment (or none) without deleted documents."""
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    segments = meta["segments"]
    return len(segments) == 0 or (len(segments) == 1 and not segments[0].get("deletes"))


def _recover_compaction(path: Path) -> None:
    """Finish or undo a compaction a stopped process left (see `compact`)."""
    retired = path.with_name(_RETIRED_PREFIX + path.name)
    copy = path.with_name(_COMPACT_PREFIX + path.name)
    if not (path / _META_FILE).is_file() and (retired / _META_FILE).is_file():
        # Stopped between the two renames: the old index is whole, the copy may not be.
        _remove_tree(path)
        retired.rename(path)
        fsync_path(path.parent)
    _remove_tree(retired)
    _remove_tree(copy)


def _replay(
    writer: tantivy.IndexWriter, generation: _Generation, documents: DocumentSource
) -> bool:
    """Bring the journaled ids of the copy to what the live index holds now (deleting
    and adding again), and empty the journal; whether there were any. Write lock held."""
    journaled = sorted(generation.journal or ())
    if not journaled:
        return False
    generation.journal = set()
    for document_id in journaled:
        writer.delete_documents_by_term(DOCUMENT_ID, document_id)
    held = _held_pairs(generation.index, journaled)
    _add_documents(writer, generation, _fetched(documents, held), frozenset())
    return True


def _fetched(documents: DocumentSource, pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
    """The documents of exactly `pairs`, from `documents`; `INTERNAL` if it returns others."""
    if not pairs:
        return []
    got = list(documents(pairs))
    if sorted((d.document_id, d.revision) for d in got) != sorted(pairs):
        raise OrreryError(
            ErrorCode.INTERNAL,
            "the document source did not return exactly the requested revisions",
            {"engine": "tantivy", "requested": len(pairs), "returned": len(got)},
        )
    return got


def _add_documents(
    writer: tantivy.IndexWriter,
    generation: _Generation,
    documents: Sequence[IndexDocument],
    skip: frozenset[str],
) -> None:
    combined = has_combined_field(generation.text_analyzer)
    for document in documents:
        if document.document_id not in skip:
            writer.add_document(_to_document(document, combined, generation.hit_keys))


def _held_pairs(index: tantivy.Index, document_ids: list[str]) -> list[tuple[str, int]]:
    """Every `(document_id, revision)` the index holds for `document_ids`."""
    searcher = index.searcher()
    query = tantivy.Query.term_set_query(index.schema, DOCUMENT_ID, document_ids)
    hits = _all_hits(searcher, query, len(document_ids))
    return _read_pairs(searcher, [address for _score, address in hits])


def _checked_analyzer(text_analyzer: str, generation_id: str) -> tantivy.TextAnalyzer:
    """The analyzer named `text_analyzer`; `INVALID_REQUEST` for an unknown name."""
    try:
        return _text_analyzer(text_analyzer)
    except ValueError as exc:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            str(exc),
            {"engine": "tantivy", "generation_id": generation_id, "text_analyzer": text_analyzer},
        ) from exc


def _schema_analyzer(meta_file: Path) -> str:
    """The tokenizer of the `BODY` field, as the index's persisted schema names it."""
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    for entry in meta["schema"]:
        if entry["name"] == BODY:
            return str(entry["options"]["indexing"]["tokenizer"])
    raise KeyError(f"no {BODY!r} field in {meta_file}")


def _schema_has_hit_keys(meta_file: Path) -> bool:
    """Whether the index's persisted schema has the fast fields of schema version 5."""
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    return {entry["name"] for entry in meta["schema"]} >= set(_HIT_KEYS)


def _analyzed(text: str) -> str:
    """`text` with anything that is not valid Unicode replaced by a separator ("?")."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _to_document(source: IndexDocument, combined: bool, hit_keys: bool) -> tantivy.Document:
    document = tantivy.Document()
    document.add_text(DOCUMENT_ID, source.document_id)
    document.add_integer(REVISION, source.revision)
    document.add_text(ITEM_ID, source.item_id)
    document.add_text(GALAXY, source.galaxy)
    document.add_text(RING, source.ring)
    for ring in ring_path(source.ring):
        document.add_text(RING_PATH, ring)
    document.add_text(STATUS, source.status)
    if hit_keys:
        document.add_unsigned(STATUS_KEY, status_key(source.status))
        key = document_key(source.document_id)
        if key is not None:
            document.add_unsigned(DOCUMENT_KEY_HIGH, key[0])
            document.add_unsigned(DOCUMENT_KEY_LOW, key[1])
    updated_at = source.updated_at.astimezone(UTC)
    document.add_date(UPDATED_AT, updated_at)
    document.add_integer(UPDATED_AT_MICROS, _epoch_micros(updated_at))
    for label in source.visibility:
        document.add_text(VISIBILITY, label)
    for name, values in sorted(source.facets.items()):
        for value in values:
            document.add_text(FACETS, f"{name}{FACET_SEPARATOR}{value}")
    if source.title:
        document.add_text(TITLE, _analyzed(source.title))
    if source.body:
        document.add_text(BODY, _analyzed(source.body))
    for tag in source.tags:
        document.add_text(TAGS, _analyzed(tag))
    text = combined_text(source.title, source.body, source.tags) if combined else ""
    if text:
        document.add_text(TEXT, _analyzed(text))
    return document


def _flat_row(
    source: IndexDocument, analyzer: tantivy.TextAnalyzer, fields: Sequence[str]
) -> LexicalRow:
    """`source` as `FlatLexical` keeps it: the tokens of each text field it holds exactly
    as the index analyzes the values `_to_document` writes (a multi-valued field's tokens
    in a row: tantivy counts a field's length over all its values). The combined field's
    tokens are its parts' in order: it joins them with a newline, a separator, and every
    filter of the analyzer works token by token. A copy of the combined field alone (the
    embedded default) analyzes that one value, as `_to_document` writes it: one call
    instead of one per part (~8 µs a corpus document)."""
    tokens: dict[str, list[str]] = {}
    if len(fields) == 1 and fields[0] == TEXT:
        text = combined_text(source.title, source.body, source.tags)
        tokens = {TEXT: analyzer.analyze(_analyzed(text)) if text else []}
    elif TITLE in fields or BODY in fields or TAGS in fields or TEXT in fields:
        title = analyzer.analyze(_analyzed(source.title)) if source.title else []
        body = analyzer.analyze(_analyzed(source.body)) if source.body else []
        tags = [token for tag in source.tags for token in analyzer.analyze(_analyzed(tag))]
        parts = {TITLE: title, BODY: body, TAGS: tags, TEXT: [*title, *body, *tags]}
        tokens = {name: parts[name] for name in fields}
    return LexicalRow(
        # Positionally: a named tuple built by keyword costs twice as much.
        candidate=Candidate(
            source.document_id,
            source.revision,
            0.0,
            source.updated_at.astimezone(UTC),
            source.status,
        ),
        galaxy=source.galaxy,
        ring=source.ring,
        hidden="lexical" in source.facets.get(HIDDEN_FACET, ()),
        tokens=tokens,
    )


def _held_revisions(index: tantivy.Index, document_ids: list[str]) -> dict[str, int]:
    """Revisions the index holds for `document_ids`, read with one term-set search."""
    searcher = index.searcher()
    query = tantivy.Query.term_set_query(index.schema, DOCUMENT_ID, document_ids)
    held: dict[str, int] = {}
    hits = _all_hits(searcher, query, len(document_ids))
    for document_id, revision in _read_pairs(searcher, [address for _score, address in hits]):
        held[document_id] = max(revision, held.get(document_id, revision))
    return held


def _stored_pairs(
    searcher: tantivy.Searcher, schema: tantivy.Schema, pace: Pace = no_pace
) -> list[tuple[str, int]]:
    """Every document's `(document_id, revision)`, `_PAIRS_CHUNK` documents between two
    `pace` calls (`_read_pairs`), their addresses listed a key range at a time
    (`_every_address`)."""
    pairs: list[tuple[str, int]] = []
    first = True
    for addresses in _every_address(searcher, schema):
        for start in range(0, len(addresses), _PAIRS_CHUNK):
            if not first:
                pace()
            first = False
            pairs.extend(_read_pairs(searcher, addresses[start : start + _PAIRS_CHUNK]))
    return pairs


def _every_address(
    searcher: tantivy.Searcher, schema: tantivy.Schema
) -> Iterator[list[tantivy.DocAddress]]:
    """The address of every live document, in lists of at most `2 * _RANGE_HITS`
    (unless one key is held by more): one search per range of the document-key column,
    a range that holds more split in two, then the documents without a key (ids that
    are not UUIDs). An index of schema version 4 or older (no key column) is listed by
    one search.

    One search for all 1M documents handed back 1M `(score, DocAddress)` pairs that
    tantivy-py builds holding the interpreter: a 153-367 ms wait for every query beside
    it, at the start of every eligibility re-check (session 34). By ranges the longest
    wait was 9-31 ms, for ~0.5 s more CPU per 1M read-back (the range searches scan the
    key column, without the interpreter)."""
    everything = tantivy.Query.all_query()
    try:
        keyless = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, everything),
                (tantivy.Occur.MustNot, tantivy.Query.exists_query(DOCUMENT_KEY_HIGH)),
            ]
        )

        def key_range(low: int, high: int) -> tantivy.Query:
            return tantivy.Query.range_query(
                schema, DOCUMENT_KEY_HIGH, tantivy.FieldType.Unsigned, low, high
            )

        key_range(0, 0)
    except ValueError:  # schema version 4 and older: no key column
        yield [address for _score, address in _all_hits(searcher, everything, searcher.num_docs)]
        return
    ranges = max(1, -(-searcher.num_docs // _RANGE_HITS))
    width = -(-(1 << 64) // ranges)
    pending = [(low, min(low + width, 1 << 64) - 1) for low in range(0, 1 << 64, width)][::-1]
    while pending:
        low, high = pending.pop()
        hits = searcher.search(key_range(low, high), 2 * _RANGE_HITS + 1, count=False).hits
        if len(hits) > 2 * _RANGE_HITS:
            if low < high:  # ids crowded into this range (time-ordered UUIDs): halve it
                middle = low + (high - low) // 2
                pending += [(middle + 1, high), (low, middle)]
                continue
            hits = _all_hits(searcher, key_range(low, high), len(hits))
        yield [address for _score, address in hits]
    yield [address for _score, address in _all_hits(searcher, keyless, 0)]


def _read_pairs(
    searcher: tantivy.Searcher, addresses: list[tantivy.DocAddress]
) -> list[tuple[str, int]]:
    """The `(document_id, revision)` of each address from the columns the query side
    reads its hits from (the document-key and revision fast fields), and from the stored
    document where they hold none: an id that is not a canonical UUID has no key, and an
    index of schema version 4 or older has no key fields. Every read of held pairs goes
    through here: a read-back (`stored_pairs`), an apply's held revisions, a re-read by
    id. A read-back of 1M documents under cProfile (session 31, one hour): 6.0 s through
    their stored documents, 0.53 s through the columns (1,000 addresses a call, the ids
    formatted in numpy) — a third of an eligibility check before (docs/bench/README.md)."""
    if not addresses:
        return []
    try:
        highs = searcher.fast_field_values(DOCUMENT_KEY_HIGH, addresses)
        lows = searcher.fast_field_values(DOCUMENT_KEY_LOW, addresses)
        revisions = searcher.fast_field_values(REVISION, addresses)
    except ValueError:  # schema version 4 and older
        return [_stored_pair(searcher.doc(address)) for address in addresses]
    ids = document_ids_of_keys(highs, lows)  # type: ignore[arg-type]
    if None not in ids and None not in revisions:
        return list(zip(ids, revisions, strict=True))  # type: ignore[arg-type]
    return [
        (document_id, revision)
        if document_id is not None and type(revision) is int
        else _stored_pair(searcher.doc(address))
        for document_id, revision, address in zip(ids, revisions, addresses, strict=True)
    ]


def _all_hits(
    searcher: tantivy.Searcher, query: tantivy.Query, expected: int
) -> list[tuple[object, tantivy.DocAddress]]:
    """Every hit of `query`, asking for `expected` (+1 to detect more) and widening."""
    limit = max(expected, 0) + 1
    while True:
        hits = searcher.search(query, limit, count=False).hits
        if len(hits) < limit:
            return hits
        limit *= 2


def _stored_pair(document: tantivy.Document) -> tuple[str, int]:
    document_id = document.get_first(DOCUMENT_ID)
    revision = document.get_first(REVISION)
    if not isinstance(document_id, str) or not isinstance(revision, int):
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks a stored document_id or revision",
            {"engine": "tantivy"},
        )
    return document_id, revision


def _unknown(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"no lexical index for generation {generation_id!r}",
        {"engine": "tantivy", "generation_id": generation_id},
    )


def _refused(generation_id: str, document_id: str, exc: BaseException) -> OrreryError:
    return OrreryError(
        ErrorCode.INVALID_REQUEST,
        f"tantivy refused document {document_id!r}: {exc}",
        {"engine": "tantivy", "generation_id": generation_id, "document_id": document_id},
    )


def _unavailable(what: str, generation_id: str, exc: BaseException) -> DependencyUnavailable:
    return DependencyUnavailable("tantivy", f"{what}: {exc}", {"generation_id": generation_id})
