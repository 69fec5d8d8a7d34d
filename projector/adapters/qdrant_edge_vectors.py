"""qdrant-edge (embedded Qdrant) as the projector's vector index: one shard per generation.

Layout: `root / generation_id` is one `EdgeShard` directory holding one named dense vector
("dense", cosine) and the payload the query side filters on; once an optimize swapped
in an optimized copy, the generation lives in `root / f"{generation_id}+{n}"`, the
directory the pointer file `root / f"{generation_id}+live"` names. qdrant-edge allows one
process per shard directory (a second `EdgeShard.load` fails on the WAL lock), so the
query side searches through `QdrantEdgeVectorIndex.shard_for` of this same object.

Payload of a point: `contracts.vector_payload.payload_of(document, singletons=True)` (the
contract with `query.adapters.qdrant_edge_vectors`; a list of one value stored as the
value; in generations created since session 26 also `micros=True, implied_id=True`:
`updated_at` as integer microseconds, no `document_id` when it is the point id's text).
Payload indexes: every field queries filter on (`PAYLOAD_INDEXES`) but
`revision` (read, never filtered on) and `document_id` (listed documents are matched by
point id); generations created before session 25 also index `document_id`, and before
session 24 `revision` (unused).

Point ids: in generations created since session 27, `contracts.point_ids` (a 63-bit
BLAKE2b of the document id, an `int`: qdrant-edge-py hands a plain `int` for it where it
builds a `uuid.UUID` in Python on every read of a UUID id), every payload holding its
`document_id`. `apply` reads the `document_id` of the point at a document's integer id
before it writes or deletes there (`_resolve`): a document whose id another document's
point holds keeps its UUID id (`point_id`) for the generation's life, listed in
`root / f"{generation_id}+ids"` (written and fsynced before the write that uses it;
beside the versioned directories, so swaps keep it; `drop` removes it), whose presence
marks the scheme. Generations without that file (every one created before) keep UUID ids.

`updated_at` is stored as integer microseconds since the epoch (`payload_of(...,
micros=True)`) under an integer range index: exact, the resolution of Python's
`datetime`. Generations created before session 26 hold RFC 3339 text under a datetime
index (Qdrant keeps datetimes as those same integers); `_micros_layout` tells them apart.

HNSW: qdrant-edge builds graphs only in `optimize()`, and only for segments above the
indexing threshold (10 MB of vectors by default, ~6.5k vectors at 384-d). Until then a
segment is searched by brute force, which qdrant-edge picks on its own, so search stays
exact (the same results as `SearchParams(exact=True)`).

Optimizing without downtime. `EdgeShard.optimize()` holds the GIL for its whole run
(qdrant-edge-py 0.9: 4.5-6.5 s at 10k 384-d vectors, 13 s at 20k, 100+ s at 100k), so
run here it would stop every Python thread of the process. `optimize` therefore never
runs it in this process; it copies, optimizes the copy in a child and swaps:

1. Copy. Under the generation's write lock the live shard is flushed and its directory
   copied file by file (holes kept) to `root/.<generation>.optimizing`. A copy of a
   flushed shard, WAL included, loads like the original (qdrant-edge's snapshot calls
   only consume snapshots a Qdrant server made; they cannot make one). From then on
   every `apply`, once it has written, also appends to an in-memory journal what it
   did to the live shard: the engine operations themselves (`UpdateOperation`s, the
   very objects the live shard took: upserts with their converted vectors and
   payloads, deletes), up to `max_journal_bytes` (256 MiB) of them; past that, or for
   an `apply` that failed half way, the ids of the points it touched (16 bytes each).
   The live shard keeps serving searches and taking writes.
2. Optimize. A child process (`python -c`, niced) loads the copy, optimizes, flushes and
   closes it. This process only waits for it, so its GIL stays free.
3. Catch up. The old shard's resident pages are handed back to the kernel first (see
   "One shard in memory" below). The optimized copy is renamed to the directory it will
   be served from, `root/<generation>+<n>`, and loaded here. Journal entries are applied
   to it in the order the writes reached the live shard: operations replayed as they
   are (resolved under the revision rules already, they do to the copy what they did to
   the live shard, and nothing is read or converted again), ids copied from the live
   shard as it holds them then (or deleted from the copy). Rounds run without the write lock,
   each applying what the journal gained during the round before, until at most
   `_CATCH_UP_SLACK` (256) points are left (`_CATCH_UP_ROUNDS` at most); the rest is
   applied under the lock, and the copy must then hold as many points as the live
   shard.
4. Swap. Still under the write lock, the pointer file `root/<generation>+live` is
   replaced (written, fsynced, renamed over: the one durable step; a restart opens
   the directory it names) and the generation serves the copy from then on: two
   assignments under the gate's lock, nothing loaded, flushed or closed meanwhile, so
   no search waits for the swap. The old shard is closed (and its directory removed)
   after the lock is released, once no caller holds it any more: at once, or by the
   next optimize, `drop` or `close`.

One shard in memory. qdrant-edge maps a shard's files (vectors, HNSW links, payload
indexes, WAL: all shared mappings) and reads them in on load, so loading the copy beside
the old shard held both in this process's RSS until the old one closed (at 1M points
10 GB at the peak of a 6.7 GB server). Closing the old shard first would stop searches
and writes for the load and the whole catch-up (minutes at 1M), and the catch-up reads
the old shard. So before the load the old shard's mapped pages are reclaimed instead
(`madvise(MADV_PAGEOUT)` on every mapping of a file under its directory, Linux 5.4+):
the old shard stays open and keeps answering every search and taking every write,
exactly as before, each page it touches read back from its file (dirty pages are not
reclaimed, so no write is lost; the advice is non-destructive, so a range remapped
meanwhile loses nothing either). The process then holds one shard's pages plus what
the old one touches until the swap: the declared cost is slower searches of the old
shard during the catch-up (page faults, from disk for pages the kernel dropped), never
a wrong or failed one. Elsewhere (no `/proc/self/maps`) nothing is reclaimed. Once the
old shard is closed (its in-memory structures and the journal gone), malloc's free pages
are handed back to the kernel (`contracts.malloc.trim`, `trim` in the log line): left
in malloc's arenas they would sit idle beside the next build's child.

The child holds the shard twice too: qdrant-edge reads the copy's files in on load and
the build reads the input segments again (vectors through a second, sequential mapping)
while it writes the new segment, and every page stays in the child's RSS until the build
ends (at 1M points 4.9 of the child's 6.5 GiB were file pages). The child cannot hand
them back (`optimize` holds its GIL throughout), so while it builds the optimizer
reclaims the child's pages of the files the copy held when the child started
(`_ChildPager`: `process_madvise(MADV_PAGEOUT)`, Linux 5.10+ with CAP_SYS_NICE, every
`_CHILD_PAGE_OUT_S`); the new segment's pages are left alone (the graph build reads its
vectors at random). The cost: input pages the build touches again are read back from
disk. Where the call is refused the child keeps its pages, as before. `MADV_PAGEOUT`
passes over a page mapped twice (even twice in one process), and qdrant-edge maps each
vector chunk of an appendable segment twice (read-write, read in on load for
`InRamChunkedMmap`, and read-only for the build's sequential read): at 1M points 2.5 GiB
of the child's input stayed resident through the build. So the child opens the copy's
appendable segments as `ChunkedMmap` (the same files, not read in on load): each page
the build reads is mapped once, in the sequential mapping, and the pager reclaims it.
A segment the build keeps gets its `InRamChunkedMmap` back before the swap.

Reopening. qdrant-edge holds ~1 KB a point more anonymous memory for points written
into a shard in process (its mutable segment's structures grown by inserts) than for the
same points loaded from disk, and the catch-up writes every point journaled during a
build into the copy (at 1M: 774k points after the third build, held through the whole
last one beside its child). So once a generation is quiet and holds `reopen_min_points`
such points (`REOPEN_MIN_POINTS`, 50k), the background optimizer, before it builds,
flushes the shard, closes it and loads it again from its directory (`reopen`): under the
write lock and with the gate closed, so writes and searches wait (qdrant-edge holds the
GIL for much of the flush, the close and the load anyway) and then get the reloaded shard,
which holds the same points. Appendable segments are reloaded without reading their
vector chunks in (`_unread_on_load`), and the WAL's pages the load read are reclaimed.

When to optimize. An optimize rebuilds the HNSW of the whole shard (qdrant-edge merges it
into one indexed segment, reusing the old graph in part: 20k points 35 CPU s, then
+10k 28 s, then +20k 60 s), so the background optimizer waits, while a generation takes
writes, until the unindexed points reach a fraction (`growth`, 0.25) of the indexed
ones (`optimize_threshold`): the builds of an ingest then add up to a multiple of its
size, not its square. Before the first build of a flow it waits for the flow to end,
for about as long as that build would take (`deferral_limit`, at most 600 s): a bulk
ingest is then built once, after it. Past some size a build outlasts the time the
ingest takes to pass that threshold again (at 1M on 2 cores, 874k points took 2,531 s
while 594k more came), and the builds would run back to back: every point written
during one is written twice (the catch-up) and the child takes a CPU from the writers
all along. So after a build
of t seconds, while writes keep flowing, the generation waits `optimize_pause` (t · (1 -
share) / share, `share` 0.5) before the next: building takes at most that share of the
ingest's wall time and the points a build covers grow with the shard. Once the
generation is quiet the rest is built, with no pause. A point written again or deleted
after a build leaves its old vector in the HNSW segment (a tombstone the engine still
counts as indexed) and the new one in the plain segment: those count as unindexed, and
tombstones past the engine's vacuum rule (`vacuum_due`) are reason enough to build.

Pauses that remain: qdrant-edge holds the GIL in `load`, `flush` and `close` too, so
each stalls the whole process. The optimize loads the copy once (`load` in its log
line; 0.3-0.5 s at 30k 384-d points, about half of it reading the WAL, the rest the
payload indexes and the vector pages) and closes the old shard once (`close_old`);
`apply` waits for the copy (`copy`) and for the round under the write lock
(`writes_blocked`: at most 256 points replayed, two `info` calls and the pointer
file).

Spare shard. Creating a generation's shard and its payload indexes is engine file I/O
with the GIL held (0.4-0.7 s wall, ~45 ms CPU, on a loaded machine): every search and
write of the process would wait for it, once per new generation. With `spare_dimension`
the index keeps one empty shard of that dimension ready, made by a niced child process
(`_SPARE_SCRIPT`: this module's own `_create_empty`, so the same config and payload
layout as an in-process create) in `root/.spare-<pid>-<token>-<key>` (`_SpareMaker`; a
name no generation can have, and nothing lists `root`). `create` renames it into the
generation's place and loads it (~35-75 ms wall, ~20 ms CPU), then a new spare is
started. When no spare of that config is ready (another dimension, still being made, the
child failed) `create` makes the shard in process as before: it never waits. `close`
kills a child still at work and removes the spare; a crashed process's spares go when the
next index with spares starts on the root.

A failure anywhere (copy, child exit status or signal, unexpected child output, load,
replay, point count, pointer file) discards the copy and keeps the old shard, which
holds every write throughout, so the journal is simply dropped; then `optimize`
raises `DependencyUnavailable`. However much is written meanwhile, an optimize is not
thrown away for it: past `max_journal_bytes` the journal keeps ids, and only past
`max_journal_ids` of them (8M by default: a bound no 1M-point ingest reaches) is the
optimize abandoned. An `apply` that fails on the live shard abandons nothing either: its
points are journaled by id all the same, so the catch-up copies whatever it left there.
A crash before the pointer file names the copy leaves the old shard live on disk; a
crash after it leaves the copy live, complete with every write (its WAL); either way
the directories the pointer file does not name (and the staging copy) are removed when
the generation is next opened. (A generation still in the layout of the previous
swap, which renamed directories, is put back from `.<generation>.retired` if a crash
left it there.)

Draining callers. A qdrant-edge shard can be closed under a caller, who then fails with
"not initialized", and `shard_for` hands shards out. So before closing a shard (the old
one after a swap, `drop`, `close`) the closer waits until nothing else references the
shard object: its CPython reference count drops to the closer's own references. A
caller that fetches the shard per request, as `query.adapters.qdrant_edge_vectors`
does, lets go when its request ends. A reference held by garbage (the frames of a failed
search, kept in a cycle by its stored exception) goes with one `gc.collect()` after
`_DRAIN_COLLECT_AFTER_S`. The old shard of a swap that a caller keeps longer than
`_DRAIN_TIMEOUT_S` stays open for it, closed by the next optimize, `drop` or `close`;
`drop` and `close` close the gate (new searches wait) and go ahead anyway after
`_DRAIN_TIMEOUT_S`.

One optimize per generation at a time; `drop` and `close` cancel a running one (its
child is killed) and wait for it to clean up.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import gc
import glob
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from qdrant_edge import (
    DatetimeIndexParams,
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
    HnswIndexConfig,
    IntegerIndexParams,
    KeywordIndexParams,
    PayloadSchemaType,
    Point,
    ScrollRequest,
    UpdateOperation,
)

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.flat_vectors import FlatVectors, flat_capacity
from contracts.fsync import fsync_path
from contracts.index import IndexDocument
from contracts.index_fields import DOCUMENT_ID, REVISION, UPDATED_AT
from contracts.malloc import trim as trim_malloc
from contracts.pacing import Pace, no_pace
from contracts.point_ids import INT_ID_SCHEME, PointIds, int_point_id, table_key
from contracts.point_table import PointTable
from contracts.stored_vectors import PackedVector
from contracts.vector_payload import (
    GRAPH_FIELDS,
    PAYLOAD_INDEXES,
    RETURNED_FIELDS,
    TENANT_FIELD,
    VECTOR_NAME,
    PayloadIndexKind,
    check_generation_id,
    check_vector,
    payload_of,
    point_id,
    utc_timestamp,
    with_id,
)
from projector.model import check_single_copy
from projector.ports import IndexEvidence

if TYPE_CHECKING:
    from qdrant_edge import NamedVector, PayloadSchemaParams, PointId, Record

__all__ = [
    "OPTIMIZE_SHARE",
    "REOPEN_MIN_POINTS",
    "VECTOR_NAME",
    "QdrantEdgeTuning",
    "QdrantEdgeVectorIndex",
    "deferral_limit",
    "optimize_pause",
    "optimize_threshold",
    "payload_of",
    "point_id",
    "utc_timestamp",
]

_log = logging.getLogger(__name__)

DEPENDENCY = "qdrant-edge"
_CONFIG_FILE = "edge_config.json"
# Points per scroll page of a read-back: one page is one GIL-held engine call (~2 ms at
# 250 points, ~8 ms at 1,000 with the same total), the longest a paced read-back can
# stall a query sharing the interpreter.
_SCROLL_PAGE = 250
# Points a page when a generation is copied for flat scans (`flat_for`).
_FLAT_COPY_PAGE = 1_000
# What the flat copies of all generations may hold: each reserves its generation's
# capacity (at most Qdrant's 10 MB indexing threshold of vectors), so 51 copies at most.
DEFAULT_FLAT_MAX_BYTES = 512 << 20
# The largest generation that gets a point table (`points_for`): ~250-350 bytes a point.
DEFAULT_POINT_TABLE_MAX_POINTS = 2_000_000
# How long after a failed (or refused) point table build `points_for` tries again.
_POINTS_RETRY_S = 60.0
# Points retrieved by id per call (`pairs_of`).
_RETRIEVE_PAGE = 1_000
# Run by `optimize` in a child process with the copy's path as argv[1]; its last line of
# output says whether segments changed. Niced: the HNSW build must not starve serving.
# The copy's appendable segments are opened as `ChunkedMmap`, not `InRamChunkedMmap`
# (same files; only whether the load reads them in): qdrant-edge maps every vector chunk
# twice (a read-write mapping, which `InRamChunkedMmap` reads in on load, and a
# sequential read-only one, which the build reads), and `MADV_PAGEOUT` passes over a page
# mapped twice, so `_ChildPager` could reclaim none of them (1M: 2.5 GiB of the child's
# RSS). Not read in on load, each page the build reads is mapped once. A segment the
# build leaves in place gets its storage type back before the copy is swapped in.
# The first lines of every child script here: the child is killed when the thread that
# started it ends (`PR_SET_PDEATHSIG`; that thread waits for it, so: when the server
# dies). A crashed server's optimizer or spare child went on writing into files the next
# start removes (session 32) and on using a core. Linux only; elsewhere a no-op.
_DIES_WITH_PARENT = """
import ctypes as _ctypes
import signal as _signal
try:
    _ctypes.CDLL(None, use_errno=True).prctl(1, _signal.SIGKILL)
except (AttributeError, OSError):
    pass
"""
_OPTIMIZE_SCRIPT = (
    _DIES_WITH_PARENT
    + """
import json
import os
import sys
from pathlib import Path
from qdrant_edge import EdgeShard
os.nice(10)

def storage_types(state, old, new):
    vectors = state["config"]["vector_data"].values()
    changed = [v for v in vectors if v.get("storage_type") == old]
    for vector in changed:
        vector["storage_type"] = new
    return bool(changed)

def rewrite(path, old, new):
    state = json.loads(path.read_text(encoding="utf-8"))
    if not storage_types(state, old, new):
        return False
    spare = path.with_name(path.name + ".orrery")
    spare.write_text(json.dumps(state), encoding="utf-8")
    os.replace(spare, path)
    return True

segments = sorted(Path(sys.argv[1]).glob("segments/*/segment.json"))
unread = [p for p in segments if rewrite(p, "InRamChunkedMmap", "ChunkedMmap")]
shard = EdgeShard.load(sys.argv[1])
changed = shard.optimize()
shard.flush()
shard.close()
for path in unread:
    if path.exists():
        rewrite(path, "ChunkedMmap", "InRamChunkedMmap")
print("optimized" if changed else "unchanged")
"""
)
# Run by `_SpareMaker` in a child process: creates an empty shard with its payload
# indexes (`_create_empty`, this very module: argv[3] is its file, checked after the
# import) at argv[1], flushed and closed. Niced: it runs beside serving.
_SPARE_SCRIPT = (
    _DIES_WITH_PARENT
    + """
import json
import os
import sys
os.nice(10)
sys.path[:0] = json.loads(sys.argv[4])
import projector.adapters.qdrant_edge_vectors as module
if os.path.realpath(module.__file__) != os.path.realpath(sys.argv[3]):
    sys.exit(f"imported {module.__file__}, not {sys.argv[3]}")
settings = json.loads(sys.argv[2])
tuning = module.QdrantEdgeTuning(**settings["tuning"])
module._create_empty(sys.argv[1], settings["dimension"], tuning)
print("ready")
"""
)
_SPARE_PREFIX = ".spare-"
# Tokens of this process's `_SpareMaker`s (their spares are not stale).
_SPARE_TOKENS: set[str] = set()
_SPARE_TOKENS_LOCK = threading.Lock()
# madvise(2) advice (Linux 5.4+): reclaim the pages of a range, non-destructively.
_MADV_PAGEOUT = 21
# process_madvise(2)'s system call number (Linux 5.10+; one number on every architecture).
_SYS_PROCESS_MADVISE = 440
# How often the optimizer reclaims its child's pages of the copy's input files
# (`_ChildPager`). A page reclaimed before the child is done with it is read back from
# disk: at 200k points (`bench/optimize_memory.py`) every 1 s read 1,979 MiB back, every
# 5 s 1,028 MiB, both with the same peak (693 MiB against 1,442 without a pager).
_CHILD_PAGE_OUT_S = 5.0
# How often the optimizer looks at cancellation while its child runs.
_CHILD_POLL_S = 0.1
# While its child runs, the optimizer hands malloc's free pages back to the kernel every
# this many seconds if this process's anonymous RSS grew by `_TRIM_GROWTH_KB` since the
# last time. Searches during a long build (at 1M every one brute-forces the points
# without a graph) leave ~1 GB free in the arenas (session 29's 1M build: 1,104 MiB
# handed back after the swap, the tree at 10.0 GiB RSS meanwhile); a trim holds the
# arenas' locks ~0.2 s at that size, so not more often.
_CHILD_TRIM_S = 60.0
_TRIM_GROWTH_KB = 256 * 1024
# How long closing a shard waits for callers still holding it (see the module docstring).
_DRAIN_TIMEOUT_S = 5.0
# After this long a garbage collection runs once, in case the holder is cyclic garbage.
_DRAIN_COLLECT_AFTER_S = 0.05
_COPY_CHUNK = 1 << 20
# The catch-up runs rounds without the write lock, each replaying what the journal
# gained during the round before, until at most `_CATCH_UP_SLACK` points are left for
# the round under the lock (or after `_CATCH_UP_ROUNDS` rounds: writes that outpace the
# replay leave a longer tail, never an unbounded one, as a round replays faster than
# writers write).
_CATCH_UP_ROUNDS = 16
_CATCH_UP_SLACK = 256
# Points read from the live shard and written into the copy per engine call of the
# catch-up of journaled ids (each call holds the GIL, as a scroll page does).
_CATCH_UP_PAGE = 250
# Journal ids de-duplicated at a time by the catch-up (bounds its transient memory).
_CATCH_UP_WINDOW = 65_536
# A journal entry: one point id, its kind (`_INT_MARK` or `_UUID_MARK`) then 16 bytes
# (`uuid.UUID.bytes`, or the integer big-endian).
_ID_BYTES = 17
_INT_MARK = b"i"
_UUID_MARK = b"u"
# Point ids one optimize's journal holds at most. A bound no 1M-point ingest reaches
# (it would rewrite every point eight times over during one optimize); past it the
# optimize is abandoned (old shard kept).
_MAX_JOURNAL_IDS = 8_000_000
# Bytes of engine operations one optimize's journal keeps for replay (`_Journal`);
# writes past it are journaled as point ids only, 16 bytes each.
_MAX_JOURNAL_BYTES = 256 << 20
# What one journaled point of an operation costs beside its vector (payload, ids and
# the engine's own structures, measured ~1.1-2 KB at 384-d in qdrant-edge-py 0.9).
_POINT_OVERHEAD_BYTES = 2_048
# The live directory of a generation is `root/<generation>` until its first optimize,
# then `root/<generation>+<n>`, named by the pointer file `root/<generation>+live`.
# '+' is never part of a generation id, so none of these names a generation.
_VERSION_MARK = "+"
_POINTER = "+live"
# A generation with integer point ids (`contracts.point_ids`, since session 27) has the
# file `root/<generation>+ids` beside its directories: its first line names the mapping
# (`INT_ID_SCHEME`), each further line (a JSON string) a document that keeps its UUID
# point id (the fallback set). Absent: UUID point ids, as every generation before.
_IDS = "+ids"
# The background optimizer puts off a generation that keeps taking writes for about as
# long as a build of it would take (`deferral_limit`), at least `_MIN_DEFERRAL_S` and at
# most `_MAX_DEFERRAL_S` (`QdrantEdgeVectorIndex._writes_flowing`). The cap bounds how
# long points of a flow that never pauses wait for their graph (searched by brute force
# meanwhile: exact, slower as they pile up).
_MIN_DEFERRAL_S = 60.0
_MAX_DEFERRAL_S = 600.0
# ... and only while fewer than this many of its points lack a graph: every search of
# the generation brute-forces those (qdrant-edge's plain segment), every tenant's alike,
# so the wait is bounded in the search cost it adds, not only in time (a 1M ingest at
# ~1,000 rec/s would otherwise hold ~600k points without a graph for the 600 s cap).
# Above a 100k bulk ingest (built once, after it) and twice what the fixed 60 s let a
# 1,250 rec/s ingest pile up before session 28.
_MAX_DEFERRED_POINTS = 150_000
# ... unless the writes come faster than a build of the shard would keep up with: a build
# takes the shard's points times the learned seconds per point, and every point written
# meanwhile is journaled and written into the copy a second time, in this process (the
# catch-up). While the write rate times the seconds per point exceeds this share (the
# journal would hold more than this fraction of the shard's points) the build waits for
# the flow to pause, for at most `_MAX_OUTRUN_DEFERRAL_S` (session 28's late 1M probe:
# the first build started at 150k points, its child took ~13 min beside a 716 rec/s
# ingest, and the catch-up replayed ~850k journaled points for 12+ min, the serving
# process at VmHWM 8.51 GiB with both copies of those points, before the final build
# rebuilt all of them again).
_MAX_JOURNAL_SHARE = 0.5
_MAX_OUTRUN_DEFERRAL_S = 3_600.0
# A generation whose writes come that fast is quiet only after this long without one
# (at least): a stall of a few seconds in a bulk ingest (twice its ~2 s gaps) otherwise
# reads as its end, and the build it starts is outrun as above (session 29's 1M run:
# quiet at 280k points, 06:51 UTC, a build started beside the ingest).
_OUTRUN_QUIET_S = 10.0
# Writes (their end time and points) a generation's write rate is taken over.
_RATE_WRITES = 16
# A generation is quiet once it took no write for twice the longest of its last this
# many gaps between writes (`QdrantEdgeVectorIndex._quiet`).
_QUIET_GAPS = 8
# Wall seconds a build takes per point of the shard, until this index timed one of its
# own (`deferral_limit`). Measured on the 2-core machine: session 27's 100k anchor ~75k
# 384-d points in ~135 s beside its ingest (1.8 ms), session 19's 1M 874k in 2,531 s
# (2.9 ms), session 28 at load 12-35 68k in 598 s and 22k in 242 s (8.8-11 ms; with 3 ms
# a 50k ingest slowed to 295 rec/s by that load still built twice). Erring high costs a
# flow that goes on a longer wait for its graph (at most `_MAX_DEFERRAL_S`), erring low
# a wasted build: any flow faster than 200 points a second is held to one build (until
# the cap) until a build was timed.
_BUILD_S_PER_POINT = 5e-3
# Optimize thresholds: at least this many unindexed points, and while a generation takes
# writes at least this fraction of its indexed points (`optimize_threshold`).
MIN_UNINDEXED = 1_000
OPTIMIZE_GROWTH = 0.25
# qdrant-edge's vacuum defaults (`EdgeOptimizersConfig` left unset): an HNSW segment is
# rebuilt once more than this share of its vectors, and at least this many, are deleted.
VACUUM_DELETED_THRESHOLD = 0.2
VACUUM_MIN_VECTORS = 1_000
# The share of the wall time the background optimizer spends building a generation that
# keeps taking writes (`optimize_pause`).
OPTIMIZE_SHARE = 0.5
# Points written in process since a shard was loaded at which the background optimizer
# reopens a quiet generation (`QdrantEdgeVectorIndex.reopen`): ~1 KB a point of
# qdrant-edge's memory goes, for a pause of every search and write (a close and a load).
REOPEN_MIN_POINTS = 50_000
# How long the background optimizer waits before it tries a reopen again that a caller
# holding the shard refused (each try closes the gate for up to `_DRAIN_TIMEOUT_S`).
_REOPEN_RETRY_S = 60.0


def optimize_threshold(indexed: int, *, min_unindexed: int, growth: float) -> int:
    """Unindexed points at which a shard holding `indexed` HNSW-indexed points is worth
    an optimize: `min_unindexed`, or `growth` times `indexed` if that is more.

    An optimize rebuilds the HNSW of the whole shard (qdrant-edge merges it into one
    indexed segment), so a fixed threshold makes an ingest of N points rebuild about
    N² / (2 · min_unindexed) points in all. Growing with the shard, each build is at
    least (1 + growth) times the one before: the builds of an ingest of N points add up
    to at most N · (1 + growth) / growth points (5 N at 0.25).
    """
    return max(1, min_unindexed, math.ceil(growth * indexed))


def deferral_limit(points: int, build_s_per_point: float, *, floor_s: float, cap_s: float) -> float:
    """Seconds the background optimizer puts off building a generation of `points`
    points while writes keep flowing into it: the time a build of them is expected to
    take (`points * build_s_per_point`), at least `floor_s`, at most `cap_s`.

    A build started during a bulk ingest is followed by a second one once it ends (an
    optimize merges the whole shard into one indexed segment), and costs its own copy,
    load and child (a CPU taken from the writers) and a catch-up that writes every point
    written meanwhile a second time; the final build reuses most of the first graph in
    CPU (session 28: two builds of a 50k ingest 105 children CPU s, one 101) but still
    starts at the ingest's end. A fixed bound (60 s until session 28) made every ingest
    longer than it build twice (100k at 1,250 rec/s: ~75k points, then all 100k; 50k at
    load 12: built 328 s after the first write, against 283 with one build). Waiting
    about as long as a build would take is the rent-or-buy rule: a flow that stops
    within it gets one build, right after, and nothing is wasted; one that goes on gets
    its build after a wait that cost no more than the build it may have wasted, so the
    building and waiting together stay within about twice what the best schedule in
    hindsight spends; its points wait at most about twice a build's time for their
    graph, as `optimize_pause` already lets them after each build. Read with the shard
    growing: while writes arrive faster than a build indexes them (rate times
    `build_s_per_point` over 1) the bound outruns the time waited, and a bulk ingest is
    put off until it pauses or `cap_s` is reached; a trickle is built after `floor_s`
    once it passes the growth threshold (`optimize_threshold`), as before.
    """
    return min(cap_s, max(floor_s, points * max(0.0, build_s_per_point)))


def vacuum_due(tombstones: int, segment_vectors: int, rule: tuple[float, int]) -> bool:
    """Whether an HNSW segment of `segment_vectors` holding `tombstones` deleted or
    superseded vectors is rebuilt by qdrant-edge's vacuum optimizer: `rule` is its
    `(deleted_threshold, vacuum_min_vector_number)`, Qdrant's defaults (0.2, 1000).
    Tombstones still cost every search through the graph (visited, then skipped), and
    the points written again sit in the plain segment, brute-forced."""
    threshold, minimum = rule
    return tombstones >= minimum and tombstones > threshold * segment_vectors


def optimize_pause(build_seconds: float, *, share: float) -> float:
    """Seconds the background optimizer waits, after a build of `build_seconds` that
    ended while writes flowed, before it builds that generation again while they still
    flow: `build_seconds * (1 - share) / share`, so building takes at most `share` of
    the wall time of an ingest (1.0: no pause).

    Past some size a build runs longer than the ingest takes to pass the growth
    threshold again (at 1M on 2 cores a build of 874k points ran 2,531 s while 594k more
    arrived), so the threshold alone no longer spaces the builds: they run back to back,
    every point written during one is written twice (the catch-up) and the child takes a
    CPU from the writers all along. Pausing in proportion to the last build makes each
    build cover about `1 / share` times the points the last one lasted for: the points
    per build grow with the shard (fewer, larger builds), whatever the machine's speed.
    Searches stay exact meanwhile (unindexed points are searched by brute force).
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], not {share}")
    return max(0.0, build_seconds) * (1.0 - share) / share


def _index_params(field: str, kind: PayloadIndexKind) -> PayloadSchemaParams:
    """The payload index of `field`: payload-aware HNSW links only for `GRAPH_FIELDS`."""
    graph = field in GRAPH_FIELDS
    if kind == "keyword":
        return KeywordIndexParams(is_tenant=field == TENANT_FIELD or None, enable_hnsw=graph)
    if kind == "integer":
        return IntegerIndexParams(lookup=True, range=True, enable_hnsw=graph)
    return DatetimeIndexParams(enable_hnsw=graph)


# Not `revision`: no query filters on it, and this adapter resolves revisions by
# retrieving points by id (`_present`), never by a range filter (the Qdrant
# server adapter's conditional writes do: it keeps the index). The integer index (lookup
# and range) cost ~4 us of `EdgeShard.update` a point, with the GIL held (an optimize of
# 10k points took the same CPU with or without it). Not `document_id` (since session
# 25): every query matches listed documents by point id (`HasIdCondition`: a point's id
# is a function of its document's id), never through this index; its keyword index, one
# distinct value per point, cost ~3 us of `EdgeShard.update` a point. Generations
# created before keep theirs (unused).
_UNINDEXED = frozenset({REVISION, DOCUMENT_ID})
# `updated_at` (since session 26): integer microseconds (`payload_of(micros=True)`) with an
# integer range index, instead of RFC 3339 text with a datetime index. The binding tries
# bool, u64, i64 and f64 before a string (a Python exception each), and the datetime
# index parses the text again: together ~8 us of a point's write with the GIL held.
# Generations created before keep the text and the datetime index (`_micros_layout`).
_PAYLOAD_INDEXES: dict[str, PayloadSchemaParams] = {
    field: (
        IntegerIndexParams(lookup=False, range=True, enable_hnsw=False)
        if field == UPDATED_AT
        else _index_params(field, kind)
    )
    for field, kind in PAYLOAD_INDEXES.items()
    if field not in _UNINDEXED
}


def _micros_layout(shard: EdgeShard) -> bool:
    """Whether `shard` stores `updated_at` as integer microseconds (an integer index on
    it: generations created since session 26) rather than RFC 3339 text."""
    schema = shard.info().payload_schema.get(UPDATED_AT)
    return schema is not None and schema.data_type == PayloadSchemaType.Integer


@dataclass(frozen=True)
class QdrantEdgeTuning:
    """Engine knobs fixed when a generation's shard is created (defaults are Qdrant's).

    `indexing_threshold_kb`: segments with fewer KB of vectors stay unindexed (exact).
    `full_scan_threshold_kb`: an HNSW segment this small is still searched by brute force.
    `max_search_threads`: size of the shard's search pool, applied whenever a shard is
    loaded (a generation created with another size is loaded with this one); `None`
    leaves each shard's own (the engine derives it from the CPUs). 1 by default:
    qdrant-edge-py holds the GIL while its pool searches, so one process's searches run
    one at a time whatever the pool's size, and a pool of two only splits one search's
    segments — taking the core the lexical search beside it runs on (`lexical_first`).
    At 1M documents (two segments) one thread made the vector search 6.0-6.6 -> 4.2-4.5
    ms and both sources together 9.6-10.7 -> 8.0-8.1 ms at p50 (docs/bench/README.md,
    session 35).
    `vacuum_deleted_threshold`, `vacuum_min_vectors`: an HNSW segment is rebuilt once
    more than that share of its vectors, and at least that many, are tombstones (`None`:
    the engine's defaults, `VACUUM_DELETED_THRESHOLD` and `VACUUM_MIN_VECTORS`).
    """

    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    full_scan_threshold_kb: int = 10_000
    indexing_threshold_kb: int = 10_000
    max_search_threads: int | None = 1
    vacuum_deleted_threshold: float | None = None
    vacuum_min_vectors: int | None = None

    def vacuum_rule(self) -> tuple[float, int]:
        return (
            VACUUM_DELETED_THRESHOLD
            if self.vacuum_deleted_threshold is None
            else self.vacuum_deleted_threshold,
            VACUUM_MIN_VECTORS if self.vacuum_min_vectors is None else self.vacuum_min_vectors,
        )

    def edge_config(self, dimension: int) -> EdgeConfig:
        return EdgeConfig(
            vectors={VECTOR_NAME: EdgeVectorParams(size=dimension, distance=Distance.Cosine)},
            hnsw_config=HnswIndexConfig(
                m=self.hnsw_m,
                ef_construct=self.hnsw_ef_construct,
                full_scan_threshold=self.full_scan_threshold_kb,
            ),
            optimizers=EdgeOptimizersConfig(
                indexing_threshold=self.indexing_threshold_kb,
                deleted_threshold=self.vacuum_deleted_threshold,
                vacuum_min_vector_number=self.vacuum_min_vectors,
            ),
            max_search_threads=self.max_search_threads,
        )


# A point id as this adapter writes it: a 63-bit `int` (integer-id generations) or a
# `uuid.UUID`.
_Pid = int | uuid.UUID
# Resolved writes of one `apply` call (`_resolve`): the newest upsert per point, the
# highest delete revision per point, the revision each of those points holds now.
_Resolved = tuple[dict[_Pid, IndexDocument], dict[_Pid, int], dict[_Pid, int]]


@dataclass
class _OptimizeReport:
    """Where one optimize spent its time, for the log."""

    seconds: dict[str, float] = field(default_factory=dict)
    # Points the journal recorded; of those, replayed from recorded engine operations
    # and copied from the live shard (journaled ids); rounds of the catch-up without the
    # write lock, and the points left for the round under it.
    journaled: int = 0
    replayed: int = 0
    mirrored: int = 0
    rounds: int = 0
    tail: int = 0
    searches_paused: float = 0.0
    # The old shard's pages reclaimed before the load: mappings advised, and KiB of
    # file-backed RSS this process held fewer right after (None where unsupported).
    paged_out: tuple[int, int] | None = None
    # KiB of anonymous RSS this process held fewer after malloc's free pages were handed
    # back once the old shard was closed (None where unknown).
    trimmed_kb: int | None = None
    # The same while the child ran (`_CHILD_TRIM_S`): KiB, and how many trims.
    trimmed_during_kb: int = 0
    trims_during: int = 0
    # What the optimizer reclaimed of its child's pages of the input (`_ChildPager`).
    child_pager: _ChildPager | None = None

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.seconds[phase] = self.seconds.get(phase, 0.0) + elapsed
            _log.debug("optimize phase %s took %.3f s", phase, elapsed)

    def add(self, caught_up: tuple[int, int]) -> None:
        self.replayed += caught_up[0]
        self.mirrored += caught_up[1]

    def __str__(self) -> str:
        phases = ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.seconds.items())
        return (
            f"{phases}; {self.journaled} point writes journaled, {self.replayed} replayed "
            f"and {self.mirrored} copied from the live shard in {self.rounds} rounds, "
            f"{self.tail} left for the round under the write lock; "
            f"searches paused {self.searches_paused * 1000:.3f} ms; "
            + (
                "old shard's pages not reclaimed (unsupported here)"
                if self.paged_out is None
                else f"old shard's pages reclaimed before the load: {self.paged_out[1] / 1024:.1f} "
                f"MiB of RSS, {self.paged_out[0]} mappings"
            )
            + (
                ""
                if self.trimmed_kb is None
                else f"; malloc's free pages handed back after closing it: "
                f"{self.trimmed_kb / 1024:.1f} MiB of RSS"
            )
            + (
                f"; during the build: {self.trimmed_during_kb / 1024:.1f} MiB in "
                f"{self.trims_during} trims"
                if self.trims_during
                else ""
            )
            + self._child_pages()
        )

    def _child_pages(self) -> str:
        pager = self.child_pager
        if pager is None:
            return ""
        reclaimed = (
            f"; the child's input pages reclaimed: {pager.reclaimed_kb / 1024:.1f} MiB of "
            f"RSS in {pager.rounds} rounds"
        )
        return reclaimed + ("" if pager.refused is None else f" (then refused: {pager.refused})")


class _GrowthTrim:
    """Hands malloc's free pages back (`trim_malloc`) at most every `_CHILD_TRIM_S`, and
    only once this process's anonymous RSS grew `_TRIM_GROWTH_KB` since the last look
    that trimmed (or the first); what it gave back goes into `report`."""

    def __init__(self, report: _OptimizeReport | None) -> None:
        self._report = report
        self._next = time.monotonic() + _CHILD_TRIM_S
        self._base = _rss_kb("RssAnon")

    def poll(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + _CHILD_TRIM_S
        before = _rss_kb("RssAnon")
        if before is None or self._base is None:
            return
        if before - self._base < _TRIM_GROWTH_KB:
            self._base = min(self._base, before)
            return
        trim_malloc()
        after = _rss_kb("RssAnon")
        self._base = before if after is None else after
        if self._report is not None:
            self._report.trims_during += 1
            self._report.trimmed_during_kb += max(0, before - self._base)


class _Cancelled(Exception):
    """The generation was dropped or the index closed while an optimize ran."""


# One journal entry: the engine operations one `apply` made on the live shard, in
# order (replayed as they are), or the ids of the points it touched (copied from the
# live shard as they are there at the catch-up).
_Entry = tuple["UpdateOperation", ...] | bytes


class _Journal:
    """What `apply` did to a live shard since it was copied for an optimize, in order.

    An entry per `apply`: the `UpdateOperation`s it made, kept whole so the catch-up
    replays them into the copy without reading or converting a point again, or, past
    `max_bytes` of those (and for an `apply` that failed half way, whose effect is
    unknown), the ids of the points it touched, 17 bytes each, which the catch-up copies
    from the live shard as they are then. Appended under the generation's write lock,
    in the order the writes reached the live shard; read by the catch-up without it
    (only appended to; a broken journal rebinds `_entries` rather than clearing it).
    `limit` bounds the point ids recorded, `max_bytes` the operations kept.
    """

    def __init__(self, limit: int, max_bytes: int, point_bytes: int) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._point_bytes = point_bytes
        self._entries: list[_Entry] = []
        # Points recorded up to each entry (prefix sums: `points_between`).
        self._points: list[int] = [0]
        self.bytes = 0
        # Why the journal cannot bring the copy up to date (the optimize is abandoned).
        self.broken: str | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def points(self) -> int:
        """Point ids recorded so far, repeats included."""
        return self._points[-1]

    def points_between(self, start: int, end: int) -> int:
        return self._points[end] - self._points[start]

    def record(
        self,
        operations: Sequence[tuple[UpdateOperation, int, int]],
        pids: Iterable[_Pid],
        *,
        failed: bool,
    ) -> None:
        """An `apply` that touched `pids` and made `operations` on the live shard (each
        with its upserted and deleted point counts), all of them unless it `failed`."""
        if self.broken is not None or (not failed and not operations):
            return
        cost = sum(up * self._point_bytes + down * _ID_BYTES for _, up, down in operations)
        entry: _Entry
        if not failed and self.bytes + cost <= self.max_bytes:
            entry = tuple(operation for operation, _, _ in operations)
            points = sum(up + down for _, up, down in operations)
            self.bytes += cost
        else:
            entry = b"".join(map(_pid_bytes, pids))
            points = len(entry) // _ID_BYTES
        if self.points + points > self.limit:
            self.broken = f"more than {self.limit} point ids were written meanwhile"
            self._entries = []  # the memory goes; `_points` (an int per entry) stays
            return
        # Counts first: a reader that sees the entry finds its count.
        self._points.append(self.points + points)
        self._entries.append(entry)

    def entries(self, start: int, end: int) -> list[_Entry]:
        return self._entries[start:end]


@dataclass
class _Retired:
    """A shard swapped out by an optimize, closed (and its directory removed) once no
    caller of `shard_for` holds it any more."""

    shard: EdgeShard
    path: Path


@dataclass
class _Generation:
    """One open shard and what coordinates its users.

    `shard` (open from `path`) is replaced only under `write_lock` and the gate's lock,
    so writers (under `write_lock`) and readers (through `reader_shard`) always get the
    current, open one.
    """

    shard: EdgeShard
    path: Path
    dimension: int | None
    indexing_threshold_kb: int
    # qdrant-edge's vacuum rule for this shard (`vacuum_due`).
    vacuum: tuple[float, int] = (VACUUM_DELETED_THRESHOLD, VACUUM_MIN_VECTORS)
    # `updated_at` stored as integer microseconds (`_micros_layout`); fixed at creation.
    micros: bool = False
    # How documents map to point ids (`contracts.point_ids`): fixed at creation, but for
    # the fallback set, which `apply` adds to (under `write_lock`, written down in
    # `ids_file` first). UUID ids unless the generation has that file.
    ids: PointIds = field(default_factory=lambda: PointIds(False))
    ids_file: Path | None = None
    # `apply` reads present revisions and then writes: one writer at a time per shard.
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    # One optimize at a time per shard; `drop` and `close` wait for a running one.
    optimize_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set by `drop` / `close`: a running optimize stops (kills its child) and cleans up.
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Readers wait while `gated`; `closed` once the shard is closed for good.
    gate: threading.Condition = field(default_factory=threading.Condition)
    gated: bool = False
    closed: bool = False
    # Set while an optimize works on a copy: the writes the copy lacks.
    journal: _Journal | None = None
    # Shards swapped out, still held by a caller (closed under `optimize_lock`).
    retired: list[_Retired] = field(default_factory=list)
    # The exact in-memory copy searches scan instead of the shard (`flat_for`): kept
    # equal to the shard under `write_lock`; decided (built or refused) on first use.
    flat: FlatVectors | None = None
    flat_decided: bool = False
    # Bytes of the flat budget this generation's copy holds (`_FlatBudget`).
    flat_reserved: int = 0
    # The points' candidate fields searches read instead of payloads (`points_for`):
    # kept equal to the shard under `write_lock` once built. While a build reads the
    # shard, `points_dirty` collects the ids `apply` touches (read again at its end);
    # None when no build runs. `points_retry_at`: when a failed build may run again.
    points: PointTable | None = None
    points_dirty: set[_Pid] | None = None
    points_retry_at: float = 0.0
    # Points the shard held when written again (`rewritten`) or deleted (`deleted`)
    # since the copy of its last build: qdrant-edge leaves their old vectors in the HNSW
    # segment as tombstones (still counted in `indexed_vectors_count`) and moves a
    # rewritten point to the plain segment, searched by brute force. Under `write_lock`.
    # While a build runs, those taken before its copy wait in `tombstones_copied` (put
    # back if the build does not swap in).
    rewritten: set[object] = field(default_factory=set)
    deleted: set[object] = field(default_factory=set)
    tombstones_copied: tuple[set[object], set[object]] | None = None
    # Points this process upserted into `shard` since it was loaded (its writes, and the
    # catch-up of the optimize that swapped it in): qdrant-edge holds ~1 KB a point more
    # for those than for points it loads (`QdrantEdgeVectorIndex.reopen`). Under
    # `write_lock`. `reopen_after`: when a reopen refused by a caller holding the shard
    # may be tried again (monotonic seconds).
    written_since_load: int = 0
    reopen_after: float = 0.0

    def tombstones(self) -> tuple[int, int]:
        """Rewritten and deleted points since the last build's copy, including those
        taken before a build still running."""
        rewritten, deleted = self.rewritten, self.deleted
        if self.tombstones_copied is not None:
            rewritten = rewritten | self.tombstones_copied[0]
            deleted = deleted | self.tombstones_copied[1]
        return len(rewritten - deleted), len(deleted)

    def reader_shard(self) -> EdgeShard | None:
        """The open shard (None once closed); waits while the gate is closed."""
        with self.gate:
            while self.gated:
                self.gate.wait()
            return None if self.closed else self.shard

    def swap_in(self, shard: EdgeShard, path: Path) -> float:
        """Under `write_lock`: serve `shard` (open from `path`) from now on; the old one
        joins `retired`. Returns the seconds readers could not get a shard: those of
        two assignments under the gate's lock, nothing is closed or loaded meanwhile."""
        started = time.perf_counter()
        with self.gate:
            self.retired.append(_Retired(self.shard, self.path))
            self.shard, self.path = shard, path
        return time.perf_counter() - started

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Close the gate and wait for callers to let go of `shard`.

        Yields whether they did within `_DRAIN_TIMEOUT_S`; the gate reopens on exit.
        """
        with self.gate:
            self.gated = True
        try:
            yield _drained(self, time.monotonic() + _DRAIN_TIMEOUT_S)
        finally:
            with self.gate:
                self.gated = False
                self.gate.notify_all()


def _drained(holder: _Generation | _Retired, deadline: float) -> bool:
    """Whether every other reference to `holder.shard` is gone before `deadline`."""
    collect_at: float | None = time.monotonic() + _DRAIN_COLLECT_AFTER_S
    delay = 0.0002
    # Two references are ours: the attribute and getrefcount's argument. Any other is a
    # caller still using the shard (readers hold it for the length of a request).
    while sys.getrefcount(holder.shard) > 2:
        now = time.monotonic()
        if now >= deadline:
            return False
        if collect_at is not None and now >= collect_at:
            # Longer than a search: the reference may be garbage in a cycle, such as
            # the frames of a failed search kept by its stored exception.
            gc.collect()
            collect_at = None
            continue
        time.sleep(delay)
        delay = min(2 * delay, 0.005)
    return True


class QdrantEdgeVectorIndex:
    """Vector indexes in qdrant-edge shards under `root`, one directory per generation.

    Guarantees (those of `projector.ports.VectorIndex`):
    - `apply` is visible to searches through `shard_for` when it returns. Upserts and
      deletes are two engine operations; a crash between them leaves the upserts only,
      and re-applying the same call converges (every step is idempotent).
    - An upsert never replaces a newer revision already present; a delete at revision r
      removes the document only if its present revision is <= r. Within one call a
      document's upserts are resolved first (highest revision wins), then its deletes.
    - Every upserted vector has the generation's dimension, is finite and non-zero;
      anything else rejects the whole call with `EMBEDDER_MISMATCH` before any write.
    - `evidence` is read back from a full scroll of the shard.
    - Generations created by an earlier process are opened lazily on first use.
    - HNSW is built by `optimize` / `optimize_if_needed` / `start_background_optimizer`
      in a child process, on a copy swapped in when done (module docstring): the
      generation keeps serving and taking writes, none is lost, and no search waits
      for the swap (writes wait for its last catch-up round, at most
      `_CATCH_UP_SLACK` points). Until then (and for points written since) search is
      exact. A failed optimize leaves the generation as it was, every write included.
    - A shard swapped out is closed only once every caller of `shard_for` has let go
      of it; searches from the swap on get the new shard. `drop` and `close` wait up
      to `_DRAIN_TIMEOUT_S` for callers to let go.

    Thread-safe. Driver failures surface as `DependencyUnavailable`; an unknown
    generation is `NOT_FOUND` (`shard_for` raises `KeyError` instead).
    """

    def __init__(
        self,
        root: Path | str,
        *,
        tuning: QdrantEdgeTuning | None = None,
        max_journal_ids: int = _MAX_JOURNAL_IDS,
        max_journal_bytes: int = _MAX_JOURNAL_BYTES,
        flat_scan: bool = True,
        flat_max_bytes: int = DEFAULT_FLAT_MAX_BYTES,
        flat_max_points: int | None = None,
        point_table_max_points: int = DEFAULT_POINT_TABLE_MAX_POINTS,
        point_tables_inline: bool = False,
        spare_dimension: int | None = None,
        reopen_min_points: int = REOPEN_MIN_POINTS,
        integer_ids: bool = True,
        point_hash: Callable[[str], int] = int_point_id,
    ) -> None:
        """`max_journal_ids`: point ids journaled during one optimize, at most (past it
        the optimize is abandoned, see `_MAX_JOURNAL_IDS`). `max_journal_bytes`: engine
        operations kept for replay during one optimize, at most (writes past it are
        journaled by point id, 16 bytes each, and copied from the live shard). `flat_scan`:
        whether `flat_for` offers in-memory copies of small generations, together at most
        `flat_max_bytes` of vectors (each reserves its generation's capacity), a copy
        holding at most `flat_max_points` points (by default those under the indexing
        threshold, `flat_capacity`). `point_table_max_points`: the largest generation
        `points_for` builds a point table for (0: none), on a thread of its own unless
        `point_tables_inline` (then on the caller's). `spare_dimension`: keep an empty
        shard of that dimension ready for the next `create` (module docstring, "Spare
        shard"); the spares of processes gone are removed now. `reopen_min_points`: the
        background optimizer reopens a quiet generation whose shard holds that many
        points written in process since its load (`reopen`; 0: never). `integer_ids`:
        generations created from now on key their points by `point_hash` of the document
        id (`contracts.point_ids`; `int_point_id`, the only mapping a generation on disk
        can name; another is for tests, which must pass it to every index opening the
        root); False: by UUID, as generations created before session 27 (which keep
        theirs)."""
        self._root = Path(root)
        self._reopen_min_points = reopen_min_points
        self._integer_ids = integer_ids
        self._point_hash = point_hash
        self._point_table_max_points = point_table_max_points
        self._point_tables_inline = point_tables_inline
        self._flat_scan = flat_scan
        self._flat_max_points = flat_max_points
        self._flat_budget = _FlatBudget(flat_max_bytes)
        self._tuning = tuning or QdrantEdgeTuning()
        self._max_journal_ids = max_journal_ids
        self._max_journal_bytes = max_journal_bytes
        self._lock = threading.RLock()
        self._generations: dict[str, _Generation] = {}
        # Unindexed count at which optimize last changed nothing: retried only above it.
        self._idle_at: dict[str, int] = {}
        # Per generation: when `apply` last wrote, and since when the background
        # optimizer has put it off because writes kept coming (monotonic seconds).
        self._written_at: dict[str, float] = {}
        self._deferred_since: dict[str, float] = {}
        # Per generation: the times between its last writes (`_QUIET_GAPS` of them), and
        # how many `apply` calls are under way (`_quiet`).
        self._write_gaps: dict[str, deque[float]] = {}
        self._writing: dict[str, int] = {}
        # Per generation: (end, points) of its last `_RATE_WRITES` writes (`_write_rate`).
        self._recent_writes: dict[str, deque[tuple[float, int]]] = {}
        # Whether writes wait to be applied (`start_background_optimizer`).
        self._backlog: Callable[[], bool] | None = None
        # Per generation: until when the background optimizer pauses its builds while
        # writes flow (`optimize_pause`, monotonic seconds).
        self._paused_until: dict[str, float] = {}
        # Wall seconds per point of the shard the last build of the background optimizer
        # took (`deferral_limit`).
        self._build_s_per_point = _BUILD_S_PER_POINT
        # How many `optimize` calls are under way (`building`). A lock of its own: `drop`
        # and `close` wait for a cancelled optimize while holding `_lock`.
        self._builds = 0
        self._builds_lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._optimizer: threading.Thread | None = None
        self._spares: _SpareMaker | None = None
        if spare_dimension is not None:
            self._spares = _SpareMaker(self._root, spare_dimension, self._tuning)
            self._spares.prepare()

    # -- VectorIndex -----------------------------------------------------------------

    def create(
        self, generation_id: str, dimension: int, *, shards: int = 1, replicas: int = 0
    ) -> None:
        """Create the generation's shard (no-op if it exists with the same dimension)."""
        check_single_copy("qdrant-edge", generation_id, shards, replicas)
        if dimension <= 0:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST, "dimension must be positive", {"dimension": dimension}
            )
        with self._lock:
            generation = self._open(generation_id)
            if generation is None:
                path = self._path(generation_id)
                if path.exists():
                    # A directory without a shard config is the rest of an interrupted
                    # create: nothing in it is a shard yet.
                    shutil.rmtree(path)
                self._root.mkdir(parents=True, exist_ok=True)
                spare = self._spares.take(path, dimension) if self._spares else None
                if spare is not None:
                    shard = spare
                else:
                    with _translated(f"create {generation_id}"):
                        shard = EdgeShard.create(str(path), self._tuning.edge_config(dimension))
                ids_file = self._ids_file(generation_id)
                if self._integer_ids:
                    # After the shard: a crash before this leaves a UUID-id generation
                    # (no file), empty and consistent.
                    _write_ids_file(ids_file)
                else:
                    _remove_tree(ids_file)  # an interrupted create's, if any
                generation = _Generation(
                    shard=shard,
                    path=path,
                    dimension=dimension,
                    indexing_threshold_kb=self._tuning.indexing_threshold_kb,
                    vacuum=self._tuning.vacuum_rule(),
                    ids=PointIds(self._integer_ids, hash=self._point_hash),
                    ids_file=ids_file if self._integer_ids else None,
                )
                self._generations[generation_id] = generation
            elif generation.dimension is None:
                generation.dimension = dimension
            elif generation.dimension != dimension:
                raise OrreryError(
                    ErrorCode.EMBEDDER_MISMATCH,
                    f"generation {generation_id!r} holds {generation.dimension}-d vectors",
                    {"expected": generation.dimension, "got": dimension},
                )
            with generation.write_lock:
                self._check_open(generation, generation_id)
                self._ensure_payload_indexes(generation.shard)
                generation.micros = _micros_layout(generation.shard)
        if self._spares is not None:
            self._spares.prepare()

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        """Write upserts, then deletes; stale ones (older than present) are skipped."""
        generation = self._require(generation_id)
        for document in upserts:
            check_vector(document, generation.dimension)
        newest: dict[str, IndexDocument] = {}
        for document in upserts:
            kept = newest.get(document.document_id)
            if kept is None or kept.revision <= document.revision:
                newest[document.document_id] = document
        delete_at: dict[str, int] = {}
        for document_id, revision in deletes:
            delete_at[document_id] = max(revision, delete_at.get(document_id, revision))
        if not newest and not delete_at:
            return
        with (
            self._writing_to(generation_id, len(newest) + len(delete_at)),
            generation.write_lock,
            _translated(f"apply to {generation_id}"),
        ):
            self._check_open(generation, generation_id)
            operations: list[tuple[UpdateOperation, int, int]] = []
            # Point id -> document id of every point the write may touch.
            touched: dict[_Pid, str] = {}
            written = False
            try:
                writes = _resolve(generation, newest, delete_at, touched)
                rewritten, deleted = _write(
                    generation.shard,
                    writes,
                    operations,
                    generation.points,
                    generation.micros,
                    generation.ids.integer,
                )
                written = True
                generation.written_since_load += len(newest)
                generation.rewritten.update(rewritten)
                generation.deleted.update(deleted)
                if generation.flat is not None:
                    self._sync_flat(generation, touched)
            except BaseException:
                # What the shard holds now is unknown: the copies are rebuilt on next use.
                generation.flat, generation.flat_decided = None, False
                generation.points = None
                raise
            finally:
                if generation.points_dirty is not None:
                    generation.points_dirty.update(touched)
                # After the write, never before: journaled ids are read from the live
                # shard without the lock, so their state must be final by then. A write
                # that fails half way is journaled too, by id (its effect is unknown).
                if generation.journal is not None:
                    generation.journal.record(operations, touched, failed=not written)

    @contextlib.contextmanager
    def _writing_to(self, generation_id: str, points: int) -> Iterator[None]:
        """An `apply` of `points` points under way: the generation is not `_quiet`
        meanwhile (waiting for the write lock included), and it counts as a write when
        it ends, however it ends."""
        with self._lock:
            self._writing[generation_id] = self._writing.get(generation_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._writing.get(generation_id, 1) - 1
                if left > 0:
                    self._writing[generation_id] = left
                else:
                    self._writing.pop(generation_id, None)
                if generation_id in self._generations:  # not re-added once dropped
                    self._note_write(generation_id, time.monotonic(), points)

    def _note_write(self, generation_id: str, now: float, points: int = 0) -> None:
        """Remember a write of `points` points to the generation that ended at `now`
        (monotonic seconds) for the background optimizer (`_quiet`, `_writes_flowing`)."""
        last = self._written_at.get(generation_id)
        if last is not None:
            gaps = self._write_gaps.setdefault(generation_id, deque(maxlen=_QUIET_GAPS))
            gaps.append(now - last)
        self._written_at[generation_id] = now
        recent = self._recent_writes.setdefault(generation_id, deque(maxlen=_RATE_WRITES))
        recent.append((now, points))

    def _write_rate(self, generation_id: str) -> float:
        """Points a second written to the generation over its last `_RATE_WRITES` writes
        (the first one's points left out: they came before the span measured); 0.0
        before two writes."""
        # One snapshot: writers append under `_lock`, this runs on the optimizer thread.
        recent = list(self._recent_writes.get(generation_id, ()))
        if len(recent) < 2:
            return 0.0
        span = recent[-1][0] - recent[0][0]
        if span <= 0.0:
            return 0.0
        return sum(points for _, points in recent[1:]) / span

    def _outrun(self, generation_id: str) -> bool:
        """Whether the generation's writes come faster than a build would keep up
        with: during a build (`_build_s_per_point` times the shard's points) they would
        journal more than `_MAX_JOURNAL_SHARE` of the shard's points for the catch-up."""
        return self._write_rate(generation_id) * self._build_s_per_point > _MAX_JOURNAL_SHARE

    def evidence(self, generation_id: str) -> IndexEvidence:
        """Count and `id_set_digest` of the `(document_id, revision)` pairs the shard holds."""
        generation = self._require(generation_id)
        pairs = self._scroll_pairs(generation, generation_id)
        return IndexEvidence(document_count=len(pairs), id_set_digest=id_set_digest(pairs))

    def stored_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the shard holds, from a full scroll (`pace`
        between pages)."""
        return self._scroll_pairs(self._require(generation_id), generation_id, pace)

    def pairs_of(self, generation_id: str, document_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Every `(document_id, revision)` the shard holds for `document_ids`, from their
        points' payloads (retrieved by point id, in pages; in an integer-id generation a
        point another document holds is left out)."""
        generation = self._require(generation_id)
        pairs: list[tuple[str, int]] = []
        of = generation.ids.of
        pids: list[PointId] = [of(d) for d in document_ids]
        wanted = set(document_ids)
        for start in range(0, len(pids), _RETRIEVE_PAGE):
            shard = generation.reader_shard()
            if shard is None:
                raise _not_found(generation_id)
            with _translated(f"retrieve from {generation_id}"):
                records = shard.retrieve(
                    pids[start : start + _RETRIEVE_PAGE],
                    with_payload=["document_id", "revision"],
                    with_vector=False,
                )
            del shard
            pairs.extend(pair for pair in _pairs(records) if pair[0] in wanted)
        return pairs

    def ids_for(self, generation_id: str) -> PointIds:
        """How `generation_id` maps document ids to point ids (`contracts.point_ids`), for
        the query side in this process: a live object (its fallback set grows as `apply`
        finds documents sharing an integer id). Raises `KeyError` for an unknown
        generation, as `shard_for` does."""
        generation = self._get(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        return generation.ids

    def drop(self, generation_id: str) -> None:
        """Close and delete the generation's shard (no-op if absent).

        A running optimize of it is cancelled (its child killed) and waited for.
        """
        check_generation_id(generation_id)
        with self._lock:
            self._idle_at.pop(generation_id, None)
            self._written_at.pop(generation_id, None)
            self._deferred_since.pop(generation_id, None)
            self._paused_until.pop(generation_id, None)
            self._write_gaps.pop(generation_id, None)
            self._recent_writes.pop(generation_id, None)
            generation = self._generations.pop(generation_id, None)
            if generation is not None:
                self._close_generation(generation_id, generation)
            for path in self._paths(generation_id):
                _remove_tree(path)

    def close(self) -> None:
        """Stop the optimizer, cancel running optimizes, flush and close every shard.

        Idempotent.
        """
        self._stop.set()
        with self._lock:
            self._closed = True
            generations, self._generations = self._generations, {}
        for generation in generations.values():
            generation.cancelled.set()
        optimizer = self._optimizer
        if optimizer is not None and optimizer is not threading.current_thread():
            optimizer.join()
        if self._spares is not None:
            self._spares.close()
        for generation_id, generation in generations.items():
            self._close_generation(generation_id, generation)

    # -- query side and maintenance ----------------------------------------------------

    def shard_for(self, generation_id: str) -> EdgeShard:
        """The open shard of `generation_id`, for the query side in this process.

        Raises `KeyError` if the generation does not exist; waits only while `drop` or
        `close` closes it. Callers must fetch the shard per request and drop it when
        the request ends: the object changes when the generation is swapped, and the
        old one is closed once every holder has let go.
        """
        generation = self._get(generation_id)
        shard = None if generation is None else generation.reader_shard()
        if shard is None:
            raise KeyError(generation_id)
        return shard

    def flat_for(self, generation_id: str) -> FlatVectors | None:
        """The exact in-memory copy of `generation_id`'s points searches may scan instead
        of its shard (`contracts.flat_vectors`), or None when they must ask the shard.

        Decided once per generation and process, on first call (so one query's pages
        are scored one way): a copy is built (a scroll of the shard, under the write
        lock: ~0.15 ms a point) when the flat scan is on and the generation holds at most
        `flat_capacity` points, those the engine itself brute-forces (below its indexing
        threshold). `apply` keeps it equal to the shard; past the capacity it is dropped
        for good (the shard answers from then on, HNSW once it is built). Raises
        `KeyError` for an unknown generation, as `shard_for` does."""
        generation = self._get(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        if generation.flat_decided:
            return generation.flat
        with generation.write_lock:
            if not generation.flat_decided:
                if generation.closed:
                    raise KeyError(generation_id)
                generation.flat = self._flat_copy(generation, generation_id)
                generation.flat_decided = True
                if generation.flat is None:
                    self._release_flat(generation)
            return generation.flat

    def points_for(self, generation_id: str) -> PointTable | None:
        """The candidate fields of `generation_id`'s points by point id
        (`contracts.point_table`), or None while there is none: then a build is started
        on a thread of its own (at most one per generation) unless tables are off, the
        generation holds more than `point_table_max_points`, or a build failed less than
        `_POINTS_RETRY_S` ago (with `point_tables_inline`, the build runs on the caller's
        thread and its table is returned). A build reads the shard page by page (~1 s of CPU at 100k
        points; nothing is locked meanwhile: the points `apply` touches are read again
        at its end, under the write lock), then `apply` keeps the table equal to the
        shard. Raises `KeyError` for an unknown generation, as `shard_for` does."""
        generation = self._get(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        table = generation.points
        if (
            table is not None
            or generation.points_dirty is not None
            or self._point_table_max_points <= 0
            or time.monotonic() < generation.points_retry_at
        ):
            return table
        with generation.write_lock:
            if generation.closed or generation.points is not None:
                return generation.points
            if generation.points_dirty is not None:
                return None
            with _translated(f"count {generation_id}"):
                too_many = generation.shard.info().points_count > self._point_table_max_points
            if too_many:
                generation.points_retry_at = time.monotonic() + _POINTS_RETRY_S
                return None
            generation.points_dirty = set()
        if self._point_tables_inline:
            self._build_points(generation_id, generation)
            return generation.points
        threading.Thread(
            target=self._build_points,
            args=(generation_id, generation),
            name=f"qdrant-edge-points-{generation_id}",
            daemon=True,
        ).start()
        return None

    def build_points(self, generation_id: str) -> bool:
        """Build `generation_id`'s point table now, on this thread (`points_for` does it
        on its own); whether the generation has one afterwards."""
        generation = self._require(generation_id)
        with generation.write_lock:
            if generation.points is not None:
                return True
            if generation.points_dirty is not None or generation.closed:
                return False
            generation.points_dirty = set()
        self._build_points(generation_id, generation)
        return generation.points is not None

    def _build_points(self, generation_id: str, generation: _Generation) -> None:
        """Read every point's candidate fields into a new table, then, under the write
        lock, read again those `apply` touched meanwhile and hand the table over."""
        integer = generation.ids.integer
        table = PointTable(integer_ids=integer)
        offset: PointId | None = None
        try:
            while True:
                shard = None if generation.cancelled.is_set() else generation.reader_shard()
                if shard is None:
                    return
                with _translated(f"read the points of {generation_id}"):
                    records, offset = shard.scroll(
                        ScrollRequest(
                            offset=offset,
                            limit=_SCROLL_PAGE,
                            with_payload=list(RETURNED_FIELDS),
                            with_vector=False,
                        )
                    )
                del shard
                with table.writing():
                    table.put((table_key(_pid(r.id), integer), r.payload or {}) for r in records)
                if offset is None:
                    break
            with generation.write_lock:
                if generation.closed:
                    return
                dirty = list(generation.points_dirty or ())
                with _translated(f"read the points of {generation_id}"), table.writing():
                    table.remove(table_key(pid, integer) for pid in dirty)
                    for start in range(0, len(dirty), _RETRIEVE_PAGE):
                        ids: list[PointId] = list(dirty[start : start + _RETRIEVE_PAGE])
                        records = generation.shard.retrieve(
                            ids, with_payload=list(RETURNED_FIELDS), with_vector=False
                        )
                        table.put(
                            (table_key(_pid(r.id), integer), r.payload or {}) for r in records
                        )
                generation.points = table
        except Exception as error:
            generation.points_retry_at = time.monotonic() + _POINTS_RETRY_S
            _log.warning("building the point table of %s failed: %s", generation_id, error)
        finally:
            with generation.write_lock:
                generation.points_dirty = None

    def flat_usage(self) -> tuple[int, int]:
        """How many generations hold a flat copy now, and the bytes of the budget they
        reserve (`flat_for`)."""
        with self._lock:
            copies = sum(1 for g in self._generations.values() if g.flat is not None)
        return copies, self._flat_budget.used

    def unindexed_count(self, generation_id: str) -> int:
        """Points of the generation not yet covered by an HNSW graph."""
        return self._index_counts(generation_id)[1]

    def optimize_needed(
        self,
        generation_id: str,
        *,
        min_unindexed: int = MIN_UNINDEXED,
        growth: float = OPTIMIZE_GROWTH,
    ) -> bool:
        """Whether `optimize` would build HNSW for enough points to be worth it.

        True when `optimize_threshold` points lack HNSW (`min_unindexed`, or `growth`
        times the indexed points if more) and they hold more vectors than the shard's
        indexing threshold (below it qdrant-edge leaves them unindexed anyway), or when
        the HNSW segment's tombstones (points written again or deleted since the build)
        reach the engine's own vacuum rule (`vacuum_due`) — in both cases unless the last
        optimize that changed nothing saw as many.
        """
        generation = self._require(generation_id)
        indexed, unindexed, stale = self._index_state(generation_id)
        vector_kb = unindexed * (generation.dimension or 1) * 4 / 1024
        threshold = optimize_threshold(indexed, min_unindexed=min_unindexed, growth=growth)
        grown = unindexed >= threshold and vector_kb >= generation.indexing_threshold_kb
        vacuum = vacuum_due(stale, indexed + stale, generation.vacuum)
        return (grown or vacuum) and unindexed + stale > self._idle_at.get(generation_id, -1)

    def optimize(self, generation_id: str) -> bool:
        """Merge segments and build HNSW (copy, child process, swap); whether they changed.

        Blocks the calling thread until done; every other thread keeps running and the
        generation keeps serving searches and taking writes (see the module docstring).
        Returns False at once if another optimize of the generation is running, and
        False if the generation is dropped or the index closed meanwhile. On failure the
        generation keeps its old shard with every write, and `DependencyUnavailable` is
        raised.
        """
        generation = self._require(generation_id)
        if not generation.optimize_lock.acquire(blocking=False):
            return False
        with self._builds_lock:
            self._builds += 1
        try:
            changed = self._copy_optimize_swap(generation_id, generation)
        except _Cancelled:
            return False
        finally:
            with self._builds_lock:
                self._builds -= 1
            generation.optimize_lock.release()
        if changed:
            self._idle_at.pop(generation_id, None)
        else:
            _, unindexed, stale = self._index_state(generation_id)
            self._idle_at[generation_id] = unindexed + stale
        return changed

    def building(self) -> bool:
        """Whether an `optimize` of any generation is under way in this process (its
        copy, the child's HNSW build, the catch-up or the swap). The background lexical
        compactor gives the cores to such a build first (`projector.bootstrap`)."""
        with self._builds_lock:
            return self._builds > 0

    def optimize_in_place(self, generation_id: str) -> bool:
        """Merge segments and build HNSW right here; whether segments changed.

        Blocks every thread of this process for the whole run (qdrant-edge holds the
        GIL), so only for a process that is the generation's sole user and serves
        nothing, such as a bulk-load child (`projector.entrypoints.bulk_load`). Flushes.
        """
        generation = self._require(generation_id)
        with generation.optimize_lock, generation.write_lock:
            self._check_open(generation, generation_id)
            with _translated(f"optimize {generation_id}"):
                changed = bool(generation.shard.optimize())
                generation.shard.flush()
        return changed

    def reopen(self, generation_id: str) -> bool:
        """Close the generation's shard and load it again from its directory; whether it
        did. What qdrant-edge holds for the points this process wrote into the shard
        (its mutable segment's structures grown by inserts, ~1 KB a point more than for
        the same points loaded) goes with the old shard object.

        The reloaded shard holds exactly the points the old one held (flushed first,
        under the write lock, which `apply` waits for throughout). Searches wait at the
        gate for the close and the load, then get the reloaded shard; none gets a closed
        one. The flush, the close and the load hold the GIL for much of their time, so
        every thread of the process waits for them too (at 80k points written, at load
        22-34: stalls of up to 3.7-4.4 s, about the load's time; a load at 1M took
        1.4-4.2 s in session 26's loaded optimize swaps). Does nothing and returns False while an
        optimize of the generation runs, or when a caller holds the shard past
        `_DRAIN_TIMEOUT_S` (`reopen_due` is then False for `_REOPEN_RETRY_S`). If the
        load fails the generation is closed and its next use loads it from disk again
        (as after a failed swap); `DependencyUnavailable` is raised.
        """
        generation = self._require(generation_id)
        if not generation.optimize_lock.acquire(blocking=False):
            return False
        try:
            return self._reopen(generation_id, generation)
        finally:
            generation.optimize_lock.release()

    def _reopen(self, generation_id: str, generation: _Generation) -> bool:
        seconds: dict[str, float] = {}
        anon_before = _rss_kb("RssAnon")
        with generation.write_lock:
            self._check_open(generation, generation_id)
            written = generation.written_since_load
            started = time.perf_counter()
            with _translated(f"flush {generation_id}"):
                generation.shard.flush()  # not gated (it holds the GIL all the same)
            seconds["flush"] = time.perf_counter() - started
            with generation.exclusive() as drained:
                if not drained:
                    _log.warning("not reopening %s: a caller holds its shard", generation_id)
                    # The gate stayed closed for the wait: not again at the next round.
                    generation.reopen_after = time.monotonic() + _REOPEN_RETRY_S
                    return False
                started = time.perf_counter()
                try:
                    generation.shard.close()
                except Exception as error:  # the driver raises bare Exception
                    _log.warning("closing %s to reopen it: %s", generation_id, error)
                seconds["close"] = time.perf_counter() - started
                started = time.perf_counter()
                unread = _unread_on_load(generation.path)
                try:
                    shard = _load_shard(
                        generation.path, f"reopen {generation_id}", self._tuning.max_search_threads
                    )
                except BaseException:
                    generation.closed = True  # `_open` starts over from disk
                    raise
                finally:
                    seconds["load"] = time.perf_counter() - started
                with generation.gate:
                    generation.shard = shard
                generation.written_since_load = 0
        # The load read the WAL's segments in; later writes only append to them.
        paged_out = _page_out(generation.path / "wal")
        started = time.perf_counter()
        trim_malloc()
        seconds["trim"] = time.perf_counter() - started
        anon_after = _rss_kb("RssAnon")
        _log.info(
            "reopened qdrant-edge generation %s (%d points written in process since its "
            "load; %d appendable segments not read in): %s; searches gated %.3f s (the "
            "close and the load); anonymous RSS %s; the WAL's pages reclaimed after the "
            "load: %s",
            generation_id,
            written,
            unread,
            ", ".join(f"{phase} {value:.2f} s" for phase, value in seconds.items()),
            seconds["close"] + seconds["load"],
            "unknown"
            if anon_before is None or anon_after is None
            else f"{anon_before / 1024:.1f} -> {anon_after / 1024:.1f} MiB",
            "unsupported here" if paged_out is None else f"{paged_out[1] / 1024:.1f} MiB",
        )
        return True

    def reopen_due(self, generation_id: str) -> bool:
        """Whether the generation's shard holds at least `reopen_min_points` points this
        process wrote into it since it was loaded (`reopen`), unless a reopen was refused
        less than `_REOPEN_RETRY_S` ago; never when that is 0."""
        generation = self._require(generation_id)
        if time.monotonic() < generation.reopen_after:
            return False
        return 0 < self._reopen_min_points <= generation.written_since_load

    def optimize_if_needed(
        self,
        generation_id: str,
        *,
        min_unindexed: int = MIN_UNINDEXED,
        growth: float = OPTIMIZE_GROWTH,
    ) -> bool:
        """`optimize` when `optimize_needed`; returns whether segments changed."""
        if not self.optimize_needed(generation_id, min_unindexed=min_unindexed, growth=growth):
            return False
        return self.optimize(generation_id)

    def start_background_optimizer(
        self,
        interval_s: float = 5.0,
        *,
        min_unindexed: int = MIN_UNINDEXED,
        growth: float = OPTIMIZE_GROWTH,
        share: float = OPTIMIZE_SHARE,
        backlog: Callable[[], bool] | None = None,
    ) -> None:
        """Every `interval_s`, `optimize_if_needed` each open generation, one at a time,
        except one written within the last `interval_s` (for about as long as a build of
        it would take, `deferral_limit`: an optimize during a stream of writes redoes
        them, see `_writes_flowing`).

        While a generation takes writes its threshold grows with it (`growth`, see
        `optimize_threshold`) and, after a build, it is not built again for
        `optimize_pause` of that build's seconds (`share`: building takes at most that
        share of the wall time of an ingest); once it was quiet (`_quiet`: for `interval_s`,
        or twice the time between its last two writes if longer) the
        rest is built as soon as `min_unindexed` points lack HNSW, with no pause.

        `backlog`: whether writes are waiting to be applied to the index (the
        projector's lag): a generation written within `_MIN_DEFERRAL_S` is not quiet
        while it says so, whatever the gap since its last write (a stall of the
        projector is no end of a flow).

        A daemon thread; `close()` stops it (cancelling a running optimize). A second
        call while it runs does nothing. Failures are logged and retried next round.
        """
        with self._lock:
            if self._closed:
                raise OrreryError(ErrorCode.INTERNAL, "vector index is closed")
            optimize_pause(0.0, share=share)  # a share out of range fails here, not later
            self._backlog = backlog
            if self._optimizer is not None and self._optimizer.is_alive():
                return
            self._stop.clear()
            self._optimizer = threading.Thread(
                target=self._optimize_loop,
                args=(interval_s, min_unindexed, growth, share),
                name="qdrant-edge-optimizer",
                daemon=True,
            )
            self._optimizer.start()

    # -- optimize: copy, child, catch up, swap -------------------------------------

    def _optimize_loop(
        self, interval_s: float, min_unindexed: int, growth: float, share: float
    ) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                generation_ids = list(self._generations)
            for generation_id in generation_ids:
                if self._stop.is_set():
                    return
                try:
                    quiet = self._schedule(generation_id, interval_s, time.monotonic())
                    if quiet is None:
                        continue
                    if quiet and self.reopen_due(generation_id):
                        # Before the next build: its child runs beside this process,
                        # which holds the written points' memory until a swap otherwise.
                        self.reopen(generation_id)
                    if not self.optimize_needed(
                        generation_id,
                        min_unindexed=min_unindexed,
                        growth=0.0 if quiet else growth,
                    ):
                        continue
                    points = sum(self._index_counts(generation_id))
                    started = time.monotonic()
                    changed = False
                    try:
                        changed = self.optimize(generation_id)
                    finally:
                        self._built(
                            generation_id, started, time.monotonic(), points, changed, share
                        )
                except OrreryError as error:
                    if error.code is not ErrorCode.NOT_FOUND and not self._stop.is_set():
                        _log.warning("optimizing %s failed: %s", generation_id, error.message)

    def _schedule(
        self,
        generation_id: str,
        interval_s: float,
        now: float,
        counts: Callable[[], tuple[int, int]] | None = None,
    ) -> bool | None:
        """The background optimizer's decision for the generation at `now` (monotonic
        seconds): None to put it off (`_writes_flowing`, or `optimize_pause` after a
        build while writes still flow), else whether it is `_quiet` (then the rest is
        built, with no growth threshold). `counts`: as for `_writes_flowing`."""
        if self._writes_flowing(generation_id, interval_s, now, counts):
            return None
        quiet = self._quiet(generation_id, interval_s, now, counts)
        if not quiet and now < self._paused_until.get(generation_id, 0.0):
            return None
        return quiet

    def _built(
        self,
        generation_id: str,
        started: float,
        ended: float,
        points: int,
        changed: bool,
        share: float,
    ) -> None:
        """Note a build of the background optimizer of a shard of `points` points,
        from `started` to `ended` (monotonic seconds): no other while writes flow for
        `optimize_pause` of it, and, if it built anything, its seconds per point for
        `deferral_limit`."""
        self._paused_until[generation_id] = ended + optimize_pause(ended - started, share=share)
        if changed and points > 0:
            self._build_s_per_point = max(0.0, ended - started) / points

    def _quiet(
        self,
        generation_id: str,
        interval_s: float,
        now: float,
        counts: Callable[[], tuple[int, int]] | None = None,
    ) -> bool:
        """Whether the generation has no `apply` under way and has taken no write for
        `interval_s`, or for twice the longest time between its last writes
        (`_QUIET_GAPS` of them) if that is longer (at most `_MIN_DEFERRAL_S`).

        An ingest writes a generation in batches (the projector's: 2,000 records every
        ~4.7 s at 428 rec/s), so a gap of one optimize interval (1 s in `bench/topk.py`)
        between two batches is no end of the writes: taken as one, the rest was built
        at once, with no growth threshold and no pause, and at 1M the builds ran back
        to back (session 19: 7 of them, two of 890 s and 2,531 s during the ingest).
        On a loaded machine one batch's `apply` can take longer than twice the last gap
        (session 28, load 12: a 100k ingest at 1,250 rec/s built 30k points at 35 s,
        then all 100k again): an `apply` under way is no end of the writes either, and
        the longest of the recent gaps, not the last one, sets how long to wait.
        Writes faster than a build keeps up with (`_outrun`) wait `_OUTRUN_QUIET_S` at
        least (or a tenth of the shard's expected build time if less: a small shard's
        wasted build costs little; `counts` as for `_writes_flowing`, asked only then),
        and a backlog of writes not applied yet (`start_background_optimizer`'s
        `backlog`) is no end either.
        """
        if self._writing.get(generation_id):
            return False
        written = self._written_at.get(generation_id)
        if written is None:
            return True
        longest = max(self._write_gaps.get(generation_id, ()), default=0.0)
        gap = max(interval_s, min(2.0 * longest, _MIN_DEFERRAL_S))
        if now - written < gap:
            return False
        if now - written < _OUTRUN_QUIET_S and self._outrun(generation_id):
            indexed, unindexed = (
                counts() if counts is not None else self._index_counts(generation_id)
            )
            build_s = (indexed + unindexed) * self._build_s_per_point
            if now - written < min(_OUTRUN_QUIET_S, 0.1 * build_s):
                return False
        backlog = self._backlog
        return not (now - written < _MIN_DEFERRAL_S and backlog is not None and backlog())

    def _writes_flowing(
        self,
        generation_id: str,
        interval_s: float,
        now: float | None = None,
        counts: Callable[[], tuple[int, int]] | None = None,
    ) -> bool:
        """Whether the background optimizer should put the generation off: it is not
        `_quiet`, has not been put off for `deferral_limit` of its points yet, and fewer
        than `_MAX_DEFERRED_POINTS` of them lack a graph — or, either way, the writes
        come faster than a build would keep up with (`_outrun`), for at most
        `_MAX_OUTRUN_DEFERRAL_S`. `counts`: the points with a graph and without (by
        default the shard's, `_index_counts`), asked only once `_MIN_DEFERRAL_S` has
        passed.

        An optimize started while writes stream in is mostly wasted: every point written
        meanwhile is written twice (live shard, then read back from it into the copy,
        both holding the GIL), loading the copy holds the GIL too, the child takes the
        other CPU from the writers, and the build after the flow rebuilds the whole
        shard again. Search stays exact meanwhile; under writes that never pause the
        optimize still runs once per `_MAX_DEFERRAL_S` at most, when the unindexed
        points reach the growing threshold — or once per `_MAX_OUTRUN_DEFERRAL_S` under
        writes faster than a build: a build they outrun only moves their points into a
        copy (written twice, held twice) for the next build to rebuild, so their points
        wait without a graph (searched by brute force: exact, slower as they pile up)
        until the flow pauses. The cure for such a flow is a build that takes a part of
        the shard (per-segment builds), not a whole-shard build at a point count.
        """
        now = time.monotonic() if now is None else now
        if self._quiet(generation_id, interval_s, now, counts):
            self._deferred_since.pop(generation_id, None)
            return False
        since = self._deferred_since.setdefault(generation_id, now)
        waited = now - since
        if waited < min(_MIN_DEFERRAL_S, _MAX_DEFERRAL_S):
            return True
        indexed, unindexed = counts() if counts is not None else self._index_counts(generation_id)
        limit = deferral_limit(
            indexed + unindexed,
            self._build_s_per_point,
            floor_s=_MIN_DEFERRAL_S,
            cap_s=_MAX_DEFERRAL_S,
        )
        if waited < limit and unindexed < _MAX_DEFERRED_POINTS:
            return True
        if waited < _MAX_OUTRUN_DEFERRAL_S and self._outrun(generation_id):
            return True
        self._deferred_since.pop(generation_id, None)
        return False

    def _copy_optimize_swap(self, generation_id: str, generation: _Generation) -> bool:
        staging = self._staging(generation_id)
        report = _OptimizeReport()
        _remove_tree(staging)
        self._close_retired(generation_id, generation, 0.0)
        swapped = False
        try:
            with report.timing("copy"):
                self._copy_live_shard(generation_id, generation, staging)
            with report.timing("child"):
                changed = self._optimize_in_child(generation_id, generation, staging, report)
            if changed:
                self._catch_up_and_swap(generation_id, generation, staging, report)
                swapped = True
                with report.timing("close_old"):
                    self._close_retired(generation_id, generation, _DRAIN_TIMEOUT_S)
                with report.timing("trim"):
                    # The old shard's structures and the journal just went: their pages
                    # back to the kernel now, not held idle through the next build.
                    before = _rss_kb("RssAnon")
                    trim_malloc()
                    after = _rss_kb("RssAnon")
                    if before is not None and after is not None:
                        report.trimmed_kb = max(0, before - after)
                _log.info("optimized qdrant-edge generation %s: %s", generation_id, report)
            return changed
        finally:
            with generation.write_lock:
                generation.journal = None
                copied, generation.tombstones_copied = generation.tombstones_copied, None
                if copied is not None and not swapped:
                    generation.rewritten |= copied[0]
                    generation.deleted |= copied[1]
            _remove_tree(staging)

    def _copy_live_shard(self, generation_id: str, generation: _Generation, staging: Path) -> None:
        """Step 1: flush and copy the shard; journal every write from then on."""
        with generation.write_lock:
            self._check_not_cancelled(generation)
            with _translated(f"flush {generation_id}"):
                generation.shard.flush()
            try:
                shutil.copytree(generation.path, staging, copy_function=_copy_file_keeping_holes)
            except (OSError, shutil.Error) as error:
                raise DependencyUnavailable(
                    DEPENDENCY, f"copy {generation_id} to optimize it: {error}"
                ) from error
            point_bytes = 4 * (generation.dimension or 0) + _POINT_OVERHEAD_BYTES
            generation.journal = _Journal(
                self._max_journal_ids, self._max_journal_bytes, point_bytes
            )
            # The build rebuilds from the copy: its tombstones go, the later ones stay.
            generation.tombstones_copied = (generation.rewritten, generation.deleted)
            generation.rewritten, generation.deleted = set(), set()

    def _optimize_in_child(
        self,
        generation_id: str,
        generation: _Generation,
        staging: Path,
        report: _OptimizeReport | None = None,
    ) -> bool:
        """Step 2: a child process optimizes the copy; whether segments changed. Its
        pages of the copy's input files are reclaimed as it goes (`_ChildPager`)."""
        process = subprocess.Popen(
            [sys.executable, "-c", _OPTIMIZE_SCRIPT, str(staging)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        pager = _ChildPager(process.pid, staging)
        next_page_out = time.monotonic() + _CHILD_PAGE_OUT_S
        trimmer = _GrowthTrim(report)
        try:
            while True:
                try:
                    stdout, stderr = process.communicate(timeout=_CHILD_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    self._check_not_cancelled(generation)
                    self._check_journal(generation, generation_id)
                    if time.monotonic() >= next_page_out:
                        pager.page_out()
                        next_page_out = time.monotonic() + _CHILD_PAGE_OUT_S
                    trimmer.poll(time.monotonic())
        finally:
            pager.close()
            if process.returncode is None:
                process.kill()
                process.communicate()
            if report is not None:
                report.child_pager = pager
        if process.returncode != 0:
            status = (
                f"was killed by signal {-process.returncode}"
                if process.returncode < 0
                else f"exited with status {process.returncode}"
            )
            raise DependencyUnavailable(
                DEPENDENCY,
                f"the optimizer child of {generation_id} {status}: {stderr.strip()[-2000:]}",
            )
        outcome = stdout.strip().rsplit("\n", 1)[-1]
        if outcome not in ("optimized", "unchanged"):
            raise DependencyUnavailable(
                DEPENDENCY, f"the optimizer child of {generation_id} printed {stdout[-200:]!r}"
            )
        return outcome == "optimized"

    def _catch_up_and_swap(
        self, generation_id: str, generation: _Generation, staging: Path, report: _OptimizeReport
    ) -> None:
        """Steps 3 and 4: load the optimized copy where it will live, catch it up with the
        live shard, then swap it in."""
        journal = generation.journal
        assert journal is not None  # set by _copy_live_shard, cleared only after us
        target = self._version_path(generation_id, _version_of(generation.path) + 1)
        _remove_tree(target)
        try:
            staging.rename(target)
        except OSError as error:
            raise DependencyUnavailable(
                DEPENDENCY, f"move optimized {generation_id} into place: {error}"
            ) from error
        swapped = False
        try:
            with report.timing("page_out_old"):
                report.paged_out = _page_out(generation.path)
            with report.timing("load"):
                staged = _load_shard(
                    target, f"load optimized {generation_id}", self._tuning.max_search_threads
                )
            try:
                done = 0
                while True:
                    with report.timing("catch_up"):
                        while report.rounds < _CATCH_UP_ROUNDS:
                            self._check_not_cancelled(generation)
                            end = len(journal)
                            report.add(
                                _catch_up(
                                    generation.shard,
                                    staged,
                                    journal,
                                    done,
                                    end,
                                    generation_id,
                                    lambda: self._check_not_cancelled(generation),
                                )
                            )
                            report.rounds += 1
                            done = end
                            if journal.points_between(done, len(journal)) <= _CATCH_UP_SLACK:
                                break
                    generation.write_lock.acquire()
                    if (
                        report.rounds < _CATCH_UP_ROUNDS
                        and journal.points_between(done, len(journal)) > _CATCH_UP_SLACK
                    ):
                        # Writes landed between the last round's check and the lock (an
                        # `apply` in flight): one more round without the lock, so the
                        # round under it stays within the slack.
                        generation.write_lock.release()
                        continue
                    break
                try:
                    with report.timing("writes_blocked"):
                        self._check_not_cancelled(generation)
                        end = len(journal)
                        report.tail = journal.points_between(done, end)
                        report.add(
                            _catch_up(generation.shard, staged, journal, done, end, generation_id)
                        )
                        report.journaled = journal.points
                        self._ensure_payload_indexes(staged)
                        with _translated(f"check optimized {generation_id}"):
                            expected = generation.shard.info().points_count
                            got = staged.info().points_count
                        if got != expected:
                            raise DependencyUnavailable(
                                DEPENDENCY,
                                f"optimized copy of {generation_id} holds {got} points, "
                                f"the live shard {expected}",
                            )
                        # The crash point: from here on a restart opens the copy (its WAL
                        # holds every write replayed into it), before it the old shard.
                        self._point_to(generation_id, target)
                        report.searches_paused = generation.swap_in(staged, target)
                        generation.written_since_load = report.replayed + report.mirrored
                        swapped = True
                        generation.journal = None
                finally:
                    generation.write_lock.release()
            finally:
                if not swapped:
                    with contextlib.suppress(Exception):  # the driver raises bare Exception
                        staged.close()
        finally:
            if not swapped:
                _remove_tree(target)

    def _close_retired(self, generation_id: str, generation: _Generation, wait_s: float) -> None:
        """Under `optimize_lock`: close the swapped-out shards no caller holds any more
        (waiting up to `wait_s` for them to let go) and remove their directories.

        One still held stays for the next call (the next optimize, `drop` or `close`).
        """
        deadline = time.monotonic() + wait_s
        kept: list[_Retired] = []
        while generation.retired:
            retired = generation.retired.pop()
            if not _drained(retired, deadline):
                kept.append(retired)
                continue
            try:
                retired.shard.close()
            except Exception as error:  # the driver raises bare Exception
                _log.warning("closing the old shard of %s: %s", generation_id, error)
            _remove_tree(retired.path)
        generation.retired.extend(kept)
        if kept:
            _log.warning(
                "the old shard of %s is still held by a caller: closed later", generation_id
            )

    def _point_to(self, generation_id: str, target: Path) -> None:
        """Make `target` the generation's live directory on disk, atomically (the pointer
        file is replaced by a rename; its directory entry is synced after)."""
        pointer = self._pointer(generation_id)
        scratch = pointer.with_name(pointer.name + ".tmp")
        try:
            with open(scratch, "w", encoding="utf-8") as out:
                out.write(target.name)
                out.flush()
                os.fsync(out.fileno())
            os.replace(scratch, pointer)
        except OSError as error:
            with contextlib.suppress(OSError):
                scratch.unlink()
            raise DependencyUnavailable(
                DEPENDENCY, f"point {generation_id} at its optimized copy: {error}"
            ) from error
        try:
            directory = os.open(self._root, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:  # the rename is done; only its durability is unknown
            _log.warning("syncing %s after pointing %s: %s", self._root, generation_id, error)

    @staticmethod
    def _check_not_cancelled(generation: _Generation) -> None:
        if generation.cancelled.is_set() or generation.closed:
            raise _Cancelled

    @staticmethod
    def _check_journal(generation: _Generation, generation_id: str) -> None:
        journal = generation.journal
        if journal is not None and journal.broken is not None:
            raise DependencyUnavailable(
                DEPENDENCY, f"optimize of {generation_id} abandoned: {journal.broken}"
            )

    # -- internals ------------------------------------------------------------------

    def _path(self, generation_id: str) -> Path:
        """The generation's first live directory (until an optimize swaps in another)."""
        return self._root / generation_id

    def _staging(self, generation_id: str) -> Path:
        """Where an optimize copies the live shard for its child (generation ids never
        start with '.', so this never names a generation)."""
        return self._root / f".{generation_id}.optimizing"

    def _version_path(self, generation_id: str, version: int) -> Path:
        return self._root / f"{generation_id}{_VERSION_MARK}{version}"

    def _pointer(self, generation_id: str) -> Path:
        return self._root / f"{generation_id}{_POINTER}"

    def _ids_file(self, generation_id: str) -> Path:
        return self._root / f"{generation_id}{_IDS}"

    def _live_path(self, generation_id: str) -> Path:
        """The live directory on disk: the one the pointer file names, else the first."""
        try:
            named = self._pointer(generation_id).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return self._path(generation_id)
        except OSError as error:
            raise DependencyUnavailable(
                DEPENDENCY, f"read the live directory of {generation_id}: {error}"
            ) from error
        prefix = f"{generation_id}{_VERSION_MARK}"
        if not (named.startswith(prefix) and named[len(prefix) :].isdigit()):
            raise DependencyUnavailable(
                DEPENDENCY, f"the pointer file of {generation_id} names {named!r}"
            )
        return self._root / named

    def _paths(self, generation_id: str) -> list[Path]:
        """Every file and directory of the generation: live, earlier and later versions,
        pointer, staging, the `.retired` directory of an older layout's swap and, last,
        the point id file."""
        versions = self._root.glob(f"{glob.escape(generation_id)}{_VERSION_MARK}*")
        files = (self._pointer(generation_id).name, self._ids_file(generation_id).name)
        return [
            self._path(generation_id),
            *(p for p in versions if p.name not in files),
            self._staging(generation_id),
            self._root / f".{generation_id}.retired",
            self._pointer(generation_id),
            self._ids_file(generation_id),
        ]

    def _get(self, generation_id: str) -> _Generation | None:
        generation = self._generations.get(generation_id)
        if generation is not None and not generation.closed:
            return generation
        with self._lock:
            return self._open(generation_id)

    def _require(self, generation_id: str) -> _Generation:
        generation = self._get(generation_id)
        if generation is None:
            raise _not_found(generation_id)
        return generation

    def _reader(self, generation_id: str) -> EdgeShard:
        shard = self._require(generation_id).reader_shard()
        if shard is None:
            raise _not_found(generation_id)
        return shard

    @staticmethod
    def _check_open(generation: _Generation, generation_id: str) -> None:
        """Under the write lock: the generation was not dropped or closed meanwhile."""
        if generation.closed:
            raise _not_found(generation_id)

    def _open(self, generation_id: str) -> _Generation | None:
        """The generation, loading its shard from disk if needed; None if there is none."""
        check_generation_id(generation_id)
        if self._closed:
            raise OrreryError(ErrorCode.INTERNAL, "vector index is closed")
        generation = self._generations.get(generation_id)
        if generation is not None:
            if not generation.closed:
                return generation
            # A swap failed and could not reopen the old shard: once its optimize has
            # finished, start over from disk.
            with generation.optimize_lock:
                del self._generations[generation_id]
        path = self._recover(generation_id)
        if not (path / _CONFIG_FILE).is_file():
            return None
        ids_file = self._ids_file(generation_id)
        ids = _read_ids_file(ids_file, self._point_hash)
        shard = _load_shard(path, f"load {generation_id}", self._tuning.max_search_threads)
        config = _stored_config(path)
        generation = _Generation(
            shard=shard,
            path=path,
            dimension=_stored_dimension(config, shard),
            indexing_threshold_kb=_stored_indexing_threshold(config, self._tuning),
            vacuum=_stored_vacuum_rule(config),
            micros=_micros_layout(shard),
            ids=ids,
            ids_file=ids_file if ids.integer else None,
        )
        self._generations[generation_id] = generation
        return generation

    def _recover(self, generation_id: str) -> Path:
        """Clean up after an optimize interrupted by a crash (no optimize of it runs now);
        returns the live directory.

        The pointer file decides: a copy it does not name was never swapped in, a
        directory it no longer names was swapped out; both go. A pointer naming nothing
        (its directory deleted by hand) goes too. In the older layout's swap (renames)
        only `.retired` held the shard between the two renames: it is put back.
        """
        live = self._live_path(generation_id)
        pointer = self._pointer(generation_id)
        if live != self._path(generation_id) and not (live / _CONFIG_FILE).is_file():
            _log.warning("%s names no shard: removed", pointer.name)
            pointer.unlink()
            live = self._path(generation_id)
        retired = self._root / f".{generation_id}.retired"
        if (retired / _CONFIG_FILE).is_file() and not (live / _CONFIG_FILE).is_file():
            _remove_tree(live)
            retired.rename(live)
            _log.warning("put %s back from an interrupted optimize", generation_id)
        for path in self._paths(generation_id):
            if path not in (live, pointer, self._ids_file(generation_id)):
                _remove_tree(path)
        with contextlib.suppress(FileNotFoundError):
            pointer.with_name(pointer.name + ".tmp").unlink()
        return live

    def _flat_capacity(self, generation: _Generation) -> int:
        if not self._flat_scan or generation.dimension is None:
            return 0
        if self._flat_max_points is not None:
            return self._flat_max_points
        return flat_capacity(generation.indexing_threshold_kb, generation.dimension)

    def _flat_copy(self, generation: _Generation, generation_id: str) -> FlatVectors | None:
        """Under the write lock: a copy of every point of the shard, or None if the
        generation is over `_flat_capacity` (or the flat scan is off)."""
        capacity = self._flat_capacity(generation)
        if capacity == 0:
            return None
        with _translated(f"count {generation_id}"):
            if generation.shard.info().points_count > capacity:
                return None
        assert generation.dimension is not None  # `_flat_capacity` is 0 without it
        if generation.flat_reserved == 0:
            reserved = capacity * generation.dimension * 4
            if not self._flat_budget.reserve(reserved):
                _log.info(
                    "generation %s: flat-scan budget spent, searched in the shard", generation_id
                )
                return None
            generation.flat_reserved = reserved
        flat = FlatVectors(generation.dimension)
        offset: PointId | None = None
        with _translated(f"copy {generation_id} for flat scans"):
            while True:
                records, offset = generation.shard.scroll(
                    ScrollRequest(
                        offset=offset, limit=_FLAT_COPY_PAGE, with_payload=True, with_vector=True
                    )
                )
                flat.put(_flat_rows(records))
                if offset is None:
                    return flat

    def _sync_flat(self, generation: _Generation, touched: dict[_Pid, str]) -> None:
        """Under the write lock, after a write: the copy's rows of `touched` (point id ->
        document id) made what the
        shard now holds (read back, so the vectors are the engine's own unit vectors);
        the copy is dropped for good once the generation outgrows `_flat_capacity`."""
        flat = generation.flat
        assert flat is not None
        ids: list[PointId] = list(touched)
        records = generation.shard.retrieve(ids, with_payload=True, with_vector=True)
        present = {_pid(record.id) for record in records}
        flat.put(_flat_rows(records))
        flat.remove(d for pid, d in touched.items() if pid not in present)
        if len(flat) > self._flat_capacity(generation):
            generation.flat = None
            self._release_flat(generation)

    def _release_flat(self, generation: _Generation) -> None:
        self._flat_budget.release(generation.flat_reserved)
        generation.flat_reserved = 0

    def _ensure_payload_indexes(self, shard: EdgeShard) -> None:
        with _translated("create payload indexes"):
            _ensure_payload_indexes(shard)

    def _index_counts(self, generation_id: str) -> tuple[int, int]:
        """Points of the generation covered by an HNSW graph, and points not."""
        indexed, unindexed, _ = self._index_state(generation_id)
        return indexed, unindexed

    def _index_state(self, generation_id: str) -> tuple[int, int, int]:
        """Live points covered by an HNSW graph, live points not, and tombstones.

        qdrant-edge's `indexed_vectors_count` keeps counting the old vectors of points
        written again or deleted since the build (tombstones in the HNSW segment), so
        those are taken off: a rewritten point is searched by brute force in the plain
        segment until the next build, like a new one. An upper bound where a point was
        added and then rewritten since the last build; after a restart the tombstones of
        before it are unknown (the next build, which rebuilds the whole shard, drops
        them anyway).
        """
        generation = self._require(generation_id)
        shard = self._reader(generation_id)
        with _translated(f"info of {generation_id}"):
            info = shard.info()
        with generation.write_lock:
            rewritten, deleted = generation.tombstones()
        # Only an indexed point leaves a tombstone in the HNSW segment.
        stale = min(info.indexed_vectors_count, rewritten + deleted)
        indexed = min(info.indexed_vectors_count - stale, info.points_count)
        return indexed, info.points_count - indexed, stale

    def _scroll_pairs(
        self, generation: _Generation, generation_id: str, pace: Pace = no_pace
    ) -> list[tuple[str, int]]:
        """Every `(document_id, revision)`; the shard is fetched per page, never held."""
        pairs: list[tuple[str, int]] = []
        offset: PointId | None = None
        while True:
            shard = generation.reader_shard()
            if shard is None:
                raise _not_found(generation_id)
            with _translated(f"scroll {generation_id}"):
                records, offset = shard.scroll(
                    ScrollRequest(
                        offset=offset,
                        limit=_SCROLL_PAGE,
                        with_payload=["document_id", "revision"],
                        with_vector=False,
                    )
                )
            del shard
            pairs.extend(_pairs(records))
            if offset is None:
                return pairs
            pace()

    def _close_generation(self, generation_id: str, generation: _Generation) -> None:
        """Cancel its optimize, wait for it and for readers, then flush and close."""
        generation.cancelled.set()
        with generation.optimize_lock, generation.write_lock, generation.exclusive() as drained:
            if not drained:
                _log.warning("closing %s while a caller still holds its shard", generation_id)
            generation.flat, generation.flat_decided = None, True
            generation.points = None
            self._release_flat(generation)
            if generation.closed:
                return
            generation.closed = True
            self._close_retired(generation_id, generation, _DRAIN_TIMEOUT_S)
            for retired in generation.retired:  # held all the same: closed anyway
                with contextlib.suppress(Exception):  # the driver raises bare Exception
                    retired.shard.close()
                _remove_tree(retired.path)
            generation.retired.clear()
            try:
                generation.shard.flush()
                generation.shard.close()
            except Exception as error:  # the driver raises bare Exception
                _log.warning("closing qdrant-edge generation %s: %s", generation_id, error)


def _ensure_payload_indexes(shard: EdgeShard) -> None:
    present = shard.info().payload_schema
    for name, schema in _PAYLOAD_INDEXES.items():
        if name not in present:
            shard.update(UpdateOperation.create_field_index(name, schema))


def _create_empty(path: str, dimension: int, tuning: QdrantEdgeTuning) -> None:
    """A new generation's empty shard at `path` (its payload indexes included), flushed
    and closed: what `_SPARE_SCRIPT` runs in the spare's child."""
    shard = EdgeShard.create(path, tuning.edge_config(dimension))
    try:
        _ensure_payload_indexes(shard)
        shard.flush()
    finally:
        shard.close()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


class _SpareMaker:
    """Keeps one empty shard ready (`root/.spare-<pid>-<key>`) for the next generation
    `QdrantEdgeVectorIndex.create` makes, prepared in a child process (module
    docstring, "Spare shard").

    `<key>` digests the dimension and the tuning the shard was created with: a spare
    is only ever taken by a generation of that same config. While a spare is made it
    lives in `<name>.tmp`, renamed to `<name>` once the child has flushed and closed it:
    a directory without `.tmp` is complete. `<pid>-<token>` is the owner's (the process,
    and the maker in it): another process or index on the same root (a bulk-load child)
    neither takes nor removes it, and the spares of a process that is gone are removed
    by the next maker to start on the root.
    """

    def __init__(self, root: Path, dimension: int, tuning: QdrantEdgeTuning) -> None:
        self._root = root
        self._dimension = dimension
        self._tuning = tuning
        settings = {"dimension": dimension, "tuning": dataclasses.asdict(tuning)}
        self._settings = json.dumps(settings, sort_keys=True)
        key = hashlib.sha256(self._settings.encode()).hexdigest()[:16]
        token = uuid.uuid4().hex[:8]
        self._ready = root / f"{_SPARE_PREFIX}{os.getpid()}-{token}-{key}"
        self._building = root / f"{self._ready.name}.tmp"
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[str] | None = None
        self.made = 0
        self.taken = 0
        with _SPARE_TOKENS_LOCK:
            _remove_stale_spares(root)
            _SPARE_TOKENS.add(token)

    def prepare(self) -> None:
        """Start making a spare in the background unless one is ready or under way."""
        with self._lock:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return
            if self._ready.is_dir():
                return
            self._thread = threading.Thread(
                target=self._make, name="qdrant-edge-spare", daemon=True
            )
            self._thread.start()

    def take(self, path: Path, dimension: int) -> EdgeShard | None:
        """The ready spare moved to `path` (which must not exist) and loaded; None if no
        spare of this config is ready (never waits for one)."""
        if dimension != self._dimension:
            return None
        with self._lock:
            if self._closed:
                return None
            try:
                self._ready.rename(path)
            except FileNotFoundError:
                return None
            except OSError as error:
                _log.warning("could not take spare shard %s: %s", self._ready.name, error)
                return None
        try:
            shard = EdgeShard.load(str(path))
        except Exception as error:  # the driver raises bare Exception
            _log.warning("spare shard %s did not load: %s", self._ready.name, error)
            _remove_tree(path)
            return None
        try:
            config = _stored_config(path)
            matches = _stored_dimension(config, shard) == dimension and set(
                _PAYLOAD_INDEXES
            ) <= set(shard.info().payload_schema)
        except Exception as error:  # the driver raises bare Exception
            _log.warning("spare shard %s unreadable: %s", self._ready.name, error)
            matches = False
        if not matches:
            with contextlib.suppress(Exception):
                shard.close()
            _remove_tree(path)
            return None
        self.taken += 1
        return shard

    def close(self) -> None:
        """Kill a child still making a spare, wait for it, remove this process's spares."""
        with self._lock:
            self._closed = True
            process, thread = self._process, self._thread
        if process is not None and process.poll() is None:
            process.kill()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for path in (self._ready, self._building):
            _remove_tree(path)

    def _make(self) -> None:
        try:
            _remove_tree(self._building)
            self._root.mkdir(parents=True, exist_ok=True)
            with self._lock:
                if self._closed:
                    return
                self._process = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _SPARE_SCRIPT,
                        str(self._building),
                        self._settings,
                        __file__,
                        json.dumps(sys.path),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            stdout, stderr = self._process.communicate()
            with self._lock:
                done = self._process.returncode == 0 and stdout.strip() == "ready"
                self._process = None
                if done and not self._closed:
                    self._building.rename(self._ready)
                    self.made += 1
                    return
            if not self._closed:
                _log.warning("spare shard child failed: %s", stderr.strip()[-2000:])
        except OSError as error:
            _log.warning("could not make a spare shard: %s", error)
        _remove_tree(self._building)


def _remove_stale_spares(root: Path) -> None:
    """Remove spares whose owner is gone (a crash), or that carry this process's id but
    no token of a `_SpareMaker` of it (left by an earlier process of that id)."""
    if not root.is_dir():
        return
    for path in root.glob(f"{_SPARE_PREFIX}*"):
        owner, _, rest = path.name[len(_SPARE_PREFIX) :].partition("-")
        if not owner.isdigit():
            continue
        pid, token = int(owner), rest.partition("-")[0]
        if (pid == os.getpid() and token not in _SPARE_TOKENS) or (
            pid != os.getpid() and not _process_alive(pid)
        ):
            try:
                _remove_tree(path)
            except OSError as error:
                # A crashed owner's spare-making child outlives it and may still be
                # writing into the directory ("Directory not empty"): a spare is only a
                # head start, so it is left for the next start to remove.
                _log.warning("could not remove stale spare shard %s yet: %s", path.name, error)
            else:
                _log.info("removed stale spare shard %s", path.name)


def _resolve(
    generation: _Generation,
    newest: dict[str, IndexDocument],
    delete_at: dict[str, int],
    touched: dict[_Pid, str],
) -> _Resolved:
    """Under the write lock: the point ids `apply`'s upserts and deletes go to, and the
    revision each of those points holds now; `touched` gets each of those point ids (->
    its document id).

    UUID ids: each document's `point_id`. Integer ids (`contracts.point_ids`): `ids.of`,
    read with the `document_id` of the point there, so a point another document holds is
    never written nor deleted for this one. An upsert of a document whose integer id
    another document's point holds (or an earlier upsert of this call took) makes it a
    fallback document (`_add_fallback`, written down before any write), upserted at its
    UUID id; a delete of a document whose integer id another document's point holds
    deletes nothing: a document outside the fallback set is only ever at its integer id.
    """
    shard = generation.shard
    ids = generation.ids
    of = ids.of
    up: dict[_Pid, IndexDocument] = {}
    down: dict[_Pid, int] = {}
    if not ids.integer:
        for document_id, document in newest.items():
            pid = of(document_id)
            up[pid] = document
            touched[pid] = document_id
        for document_id, revision in delete_at.items():
            pid = of(document_id)
            down[pid] = revision
            touched[pid] = document_id
        return up, down, _present(shard, list(touched))
    wanted = {document_id: of(document_id) for document_id in (*newest, *delete_at)}
    owners: dict[_Pid, str] = {}
    held = _present(shard, list(dict.fromkeys(wanted.values())), owners)
    collided: list[str] = []
    for document_id, document in newest.items():
        pid = wanted[document_id]
        if type(pid) is int and owners.setdefault(pid, document_id) != document_id:
            collided.append(document_id)
            continue
        up[pid] = document
        touched[pid] = document_id
    moved = set(collided)
    for document_id, revision in delete_at.items():
        if document_id in moved:
            pid = point_id(document_id)
        else:
            pid = wanted[document_id]
            if type(pid) is int and owners.get(pid, document_id) != document_id:
                continue
        down[pid] = revision
        touched[pid] = document_id
    if collided:
        _add_fallback(generation, collided)
        for document_id in collided:
            pid = point_id(document_id)
            up[pid] = newest[document_id]
            touched[pid] = document_id
        held.update(_present(shard, [point_id(d) for d in collided]))
    return up, down, held


def _write(
    shard: EdgeShard,
    writes: _Resolved,
    operations: list[tuple[UpdateOperation, int, int]],
    table: PointTable | None = None,
    micros: bool = False,
    integer: bool = False,
) -> tuple[list[object], list[object]]:
    """Apply resolved upserts, then deletes, to `shard` under the revision rules; the
    points it held before that were written again, and those deleted (as
    `contracts.point_ids.table_key`s: `integer` ids or not).

    The write path of `apply`; idempotent. Each engine operation made is appended to
    `operations` once it succeeded, with its upserted and deleted point counts: in that
    order they make any shard that held what `shard` held the same as `shard` now.
    With `table`, the same effect goes into it in one write window around the shard's
    updates (`PointTable.writing`; left open if an update fails). `micros`: the shard
    stores `updated_at` as integer microseconds (`_micros_layout`). An integer-id
    generation stores every point's `document_id` (its writes and listed lookups check
    it); a UUID-id one leaves out those that are their point id's text (`implied_id`).
    """
    newest, delete_at, present = writes
    upserted: dict[_Pid, IndexDocument] = {}
    revision_after = dict(present)
    for pid, document in newest.items():
        current = present.get(pid)
        if current is None or current <= document.revision:
            upserted[pid] = document
            revision_after[pid] = document.revision
    removals: list[_Pid] = []
    for pid, revision in delete_at.items():
        current = revision_after.get(pid)
        if current is not None and current <= revision:
            upserted.pop(pid, None)
            if pid in present:
                removals.append(pid)
    # A list of one value stored as the value: the binding converts a list as a value of
    # its own (~7 us a point, GIL held); every filter matches either form alike.
    implied = micros and not integer
    payloads = {
        pid: payload_of(document, singletons=True, micros=micros, implied_id=implied)
        for pid, document in upserted.items()
    }
    with contextlib.nullcontext() if table is None else table.writing():
        if upserted:
            points = [
                Point(pid, _named_vector(document), payloads[pid])
                for pid, document in upserted.items()
            ]
            operation = UpdateOperation.upsert_points(points)
            shard.update(operation)
            operations.append((operation, len(points), 0))
        if removals:
            removed: list[PointId] = list(removals)
            operation = UpdateOperation.delete_points(removed)
            shard.update(operation)
            operations.append((operation, 0, len(removals)))
        if table is not None:
            # The table holds every point's document id (`implied_id` left some out).
            table.put(
                (
                    table_key(pid, integer),
                    payload if DOCUMENT_ID in payload else with_id(payload, pid),
                )
                for pid, payload in payloads.items()
            )
            table.remove(table_key(pid, integer) for pid in removals)
    rewritten = [table_key(pid, integer) for pid in upserted if pid in present]
    return rewritten, [table_key(pid, integer) for pid in removals]


class _FlatBudget:
    """Bytes of vectors the flat copies of all generations may hold together."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._used = 0
        self._lock = threading.Lock()

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self._used + size > self._max_bytes:
                return False
            self._used += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._used -= size

    @property
    def used(self) -> int:
        return self._used


def _pairs(records: Iterable[Record]) -> Iterator[tuple[str, int]]:
    """`(document_id, revision)` of points read with those two payload fields. The point
    id is read only where the payload leaves the document id out (`with_id`): a
    read-back of every point (an eligibility check) spent ~0.4 µs a point on it."""
    for record in records:
        payload = record.payload or {}
        document_id = payload.get(DOCUMENT_ID)
        if document_id is None:
            document_id = with_id(payload, _pid(record.id))[DOCUMENT_ID]
        yield str(document_id), int(payload[REVISION])


def _flat_rows(records: Iterable[Record]) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """`(payload, stored vector)` of points read with both, for `FlatVectors.put`."""
    for record in records:
        vector = record.vector
        dense = vector.get(VECTOR_NAME) if isinstance(vector, dict) else None
        if not isinstance(dense, list):
            raise DependencyUnavailable(
                DEPENDENCY, f"point {record.id} came back without its vector"
            )
        yield dict(with_id(record.payload or {}, _pid(record.id))), dense


def _present(
    shard: EdgeShard, pids: list[_Pid], owners: dict[_Pid, str] | None = None
) -> dict[_Pid, int]:
    """The revision of each of the points `pids` the shard holds; with `owners`, their
    `document_id`s go into it too."""
    ids: list[PointId] = list(pids)
    fields = [REVISION] if owners is None else [REVISION, DOCUMENT_ID]
    records = shard.retrieve(ids, with_payload=fields, with_vector=False)
    present: dict[_Pid, int] = {}
    for record in records:
        pid = _pid(record.id)
        payload = record.payload or {}
        present[pid] = int(payload[REVISION])
        if owners is not None:
            owners[pid] = str(with_id(payload, pid)[DOCUMENT_ID])
    return present


def _catch_up(
    live: EdgeShard,
    staged: EdgeShard,
    journal: _Journal,
    start: int,
    end: int,
    generation_id: str,
    check: Callable[[], None] = lambda: None,
) -> tuple[int, int]:
    """Bring `staged` up to date with the journal entries `start` to `end`; returns the
    points replayed and the points copied from `live`.

    Entries go in the order the writes reached the live shard. Recorded operations are
    replayed as they are: resolved under the revision rules already, they do to the copy
    what they did to the live shard. Journaled ids are copied as the live shard holds
    them now (vector and payload), or deleted if it does not, whatever the writes that
    touched them were; without the write lock such a point may change again after it is
    read, and that write is journaled again, past `end`, for a later round. So every
    entry's effect is final once the round under the lock has replayed the rest, and
    catching a point up twice is harmless. `check` is called before each entry and each
    page copied (a cancelled optimize raises from it: a round may replay hundreds of
    thousands of points, and a SIGTERM waits for it otherwise).
    """
    replayed = mirrored = 0
    pending: dict[bytes, None] = {}

    def mirror_pending() -> int:
        pids = [_pid_of_bytes(raw) for raw in pending]
        pending.clear()
        for at in range(0, len(pids), _CATCH_UP_PAGE):
            check()
            _mirror(live, staged, pids[at : at + _CATCH_UP_PAGE])
        return len(pids)

    with _translated(f"catch up optimized {generation_id}"):
        for position, entry in enumerate(journal.entries(start, end), start):
            check()
            if isinstance(entry, bytes):
                pending.update(
                    dict.fromkeys(
                        entry[at : at + _ID_BYTES] for at in range(0, len(entry), _ID_BYTES)
                    )
                )
                if len(pending) >= _CATCH_UP_WINDOW:
                    mirrored += mirror_pending()
                continue
            # In order: ids journaled before these operations first.
            mirrored += mirror_pending()
            for operation in entry:
                staged.update(operation)
            replayed += journal.points_between(position, position + 1)
        mirrored += mirror_pending()
    if journal.broken is not None:
        raise DependencyUnavailable(
            DEPENDENCY, f"optimize of {generation_id} abandoned: {journal.broken}"
        )
    return replayed, mirrored


def _mirror(source: EdgeShard, target: EdgeShard, pids: list[_Pid]) -> None:
    """Make `target` hold exactly what `source` holds of the points `pids`."""
    ids: list[PointId] = list(pids)
    records = source.retrieve(ids, with_payload=True, with_vector=True)
    present: dict[_Pid, Point] = {}
    for record in records:
        pid = _pid(record.id)
        assert record.vector is not None  # asked for
        present[pid] = Point(pid, record.vector, record.payload)
    if present:
        target.update(UpdateOperation.upsert_points(list(present.values())))
    absent: list[PointId] = [pid for pid in pids if pid not in present]
    if absent:
        target.update(UpdateOperation.delete_points(absent))


def _write_ids_file(path: Path) -> None:
    """A new generation's point id file: integer ids, no fallback yet (written, fsynced,
    renamed into place, the directory fsynced)."""
    spare = path.with_name(path.name + ".tmp")
    try:
        with open(spare, "w", encoding="utf-8") as file:
            file.write(INT_ID_SCHEME + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(spare, path)
        fsync_path(path.parent)
    except OSError as error:
        raise DependencyUnavailable(DEPENDENCY, f"write {path.name}: {error}") from error


def _read_ids_file(path: Path, point_hash: Callable[[str], int]) -> PointIds:
    """The point ids of the generation whose id file is `path` (UUID ids if absent)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        return PointIds(False)
    except OSError as error:
        raise DependencyUnavailable(DEPENDENCY, f"read {path.name}: {error}") from error
    if lines[0] != INT_ID_SCHEME:
        raise DependencyUnavailable(
            DEPENDENCY, f"{path.name} names point ids {lines[0]!r}, not {INT_ID_SCHEME!r}"
        )
    fallback: list[str] = []
    for line in lines[1:]:
        with contextlib.suppress(ValueError):  # the torn last line of a crashed append
            document_id = json.loads(line) if line else None
            if isinstance(document_id, str):
                fallback.append(document_id)
    return PointIds(True, fallback, point_hash)


def _add_fallback(generation: _Generation, document_ids: Sequence[str]) -> None:
    """Under the write lock, before the shard update that uses them: `document_ids` keep
    their UUID point ids from now on (appended to the generation's id file and fsynced,
    then added to its `PointIds`). A crash before the update leaves them in the set with
    no point written: harmless, the set only says where a document is written."""
    assert generation.ids_file is not None
    text = "".join(json.dumps(d) + "\n" for d in document_ids)
    try:
        with open(generation.ids_file, "a", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        raise DependencyUnavailable(
            DEPENDENCY, f"write {generation.ids_file.name}: {error}"
        ) from error
    generation.ids.fallback.update(document_ids)
    _log.warning(
        "qdrant-edge %s: %d document(s) share an integer point id with another; they keep "
        "UUID point ids",
        generation.path.name,
        len(document_ids),
    )


def _pid_bytes(pid: _Pid) -> bytes:
    """A point id as a journal entry (`_ID_BYTES`)."""
    if isinstance(pid, uuid.UUID):
        return _UUID_MARK + pid.bytes
    return _INT_MARK + pid.to_bytes(16, "big")


def _pid_of_bytes(raw: bytes) -> _Pid:
    if raw[:1] == _UUID_MARK:
        return uuid.UUID(bytes=raw[1:])
    return int.from_bytes(raw[1:], "big")


def _pid(pid: PointId) -> _Pid:
    """A point id the engine handed back, as written: an `int` as it is, a UUID as a
    `uuid.UUID`."""
    if isinstance(pid, int | uuid.UUID):
        return pid
    return uuid.UUID(str(pid))


def _version_of(path: Path) -> int:
    """The version a live directory holds: n for `<generation>+<n>`, 0 for the first."""
    _, mark, version = path.name.rpartition(_VERSION_MARK)
    return int(version) if mark and version.isdigit() else 0


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's `madvise(addr, length, advice)`, or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return cast("Callable[[int, int, int], int]", function)


def _rss_kb(part: str, pid: int | None = None) -> int | None:
    """The resident KiB of `part` (`RssFile`, `RssAnon`) of this process (or `pid`), None
    if unknown."""
    try:
        with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{part}:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _page_out(directory: Path) -> tuple[int, int] | None:
    """Have the kernel reclaim this process's resident pages of the files it maps from
    under `directory` (`madvise(MADV_PAGEOUT)`): (mappings advised, KiB of file-backed
    RSS fewer right after). None where `/proc/self/maps`, `madvise` or the advice is
    missing.

    Non-destructive, whoever uses the pages: a reclaimed page is read back from its file
    on next touch, dirty and shared-with-others pages are left alone, and a range that
    was unmapped and reused between reading the map and advising it loses nothing (the
    advice only reclaims, so at worst it slows that memory's next touch).
    """
    madvise = _madvise()
    before = _rss_kb("RssFile")
    if madvise is None or before is None:
        return None
    prefix = f"{os.path.realpath(directory)}{os.sep}"
    ranges: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n").startswith(prefix):
                    low, _, high = fields[0].partition("-")
                    ranges.append((int(low, 16), int(high, 16)))
    except (OSError, ValueError):
        return None
    refused = 0
    for start, end in ranges:
        if madvise(start, end - start, _MADV_PAGEOUT) != 0 and ctypes.get_errno() == errno.EINVAL:
            refused += 1
    if ranges and refused == len(ranges):
        return None  # a kernel without MADV_PAGEOUT (before 5.4)
    after = _rss_kb("RssFile")
    return len(ranges), max(0, before - (before if after is None else after))


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("length", ctypes.c_size_t))


class _ChildPager:
    """Reclaims an optimizer child's resident pages of the files its copy held before the
    build (the input segments, the WAL), from this process: `process_madvise(2)` with
    `MADV_PAGEOUT` (Linux 5.10+; needs CAP_SYS_NICE over the child). The kernel passes
    over a page mapped more than once, so the child opens appendable segments without
    reading their vector chunks into their second mapping (`_OPTIMIZE_SCRIPT`).

    qdrant-edge reads a shard's files in on load, and the build reads the input segments
    once more, into the new segment; every page stays in the child's RSS until the build
    ends and drops the old segments, so at its end the child holds the shard twice (at 1M
    points 4.9 GiB of its 6.5). The child cannot give them back itself (`optimize` holds
    its GIL from start to end), so the optimizer does it while it waits, every
    `_CHILD_PAGE_OUT_S` (`page_out`). Pages of files the build creates (the new segment,
    whose vectors the graph build reads at random) are left alone. Non-destructive, as
    `_page_out`: a page touched again is read back from its file, dirty pages stay, a
    range remapped meanwhile loses nothing. Where the call is refused (no permission, an
    older kernel, no pidfd) it stops trying and nothing else changes (`refused` says why).
    """

    def __init__(self, pid: int, staging: Path) -> None:
        root = os.path.realpath(staging)
        self._inputs = {
            os.path.join(directory, name) for directory, _, names in os.walk(root) for name in names
        }
        self._pid = pid
        self._fd: int | None = None
        self.refused: str | None = None
        # Rounds run and KiB of the child's file-backed RSS they took away, in total.
        self.rounds = 0
        self.reclaimed_kb = 0
        try:
            self._syscall = ctypes.CDLL(None, use_errno=True).syscall
            self._syscall.restype = ctypes.c_long
            self._fd = os.pidfd_open(pid)
        except (OSError, AttributeError) as error:
            self.refused = f"no pidfd or syscall: {error}"

    def page_out(self) -> None:
        """One round: advise every mapping of an input file the child holds now."""
        if self._fd is None:
            return
        before = _rss_kb("RssFile", self._pid)
        ranges = self._input_ranges()
        invalid = 0
        for start, end in ranges:
            iov = _IoVec(start, end - start)
            done = self._syscall(
                ctypes.c_long(_SYS_PROCESS_MADVISE),
                ctypes.c_int(self._fd),
                ctypes.byref(iov),
                ctypes.c_size_t(1),
                ctypes.c_int(_MADV_PAGEOUT),
                ctypes.c_uint(0),
            )
            if done >= 0:
                continue
            error = ctypes.get_errno()
            if error == errno.ESRCH:  # the child has exited: nothing left to reclaim
                self.close()
                return
            if error in (errno.EPERM, errno.ENOSYS):
                self._stop(os.strerror(error))
                return
            # ENOMEM/EFAULT: the range went meanwhile; EINVAL: this range refuses the
            # advice (or the kernel does: then every range does).
            invalid += error == errno.EINVAL
        if ranges and invalid == len(ranges):
            self._stop("MADV_PAGEOUT refused")
            return
        self.rounds += 1
        after = _rss_kb("RssFile", self._pid)
        if before is not None and after is not None:
            self.reclaimed_kb += max(0, before - after)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _stop(self, why: str) -> None:
        self.refused = why
        self.close()

    def _input_ranges(self) -> list[tuple[int, int]]:
        ranges: list[tuple[int, int]] = []
        try:
            with open(f"/proc/{self._pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6:
                        continue
                    name = fields[5].rstrip("\n").removesuffix(" (deleted)")
                    if name in self._inputs:
                        low, _, high = fields[0].partition("-")
                        ranges.append((int(low, 16), int(high, 16)))
        except (OSError, ValueError):
            return []
        return ranges


def _unread_on_load(shard: Path) -> int:
    """Have the closed shard at `shard` load its appendable segments' vectors without
    reading them in: their storage type `InRamChunkedMmap` becomes `ChunkedMmap` in each
    `segment.json` (the same files, written and searched the same way; replaced
    atomically). Returns the segments changed; one that cannot be rewritten is left as it
    was (logged).

    qdrant-edge maps every vector chunk of an appendable segment twice: read-write, which
    `InRamChunkedMmap` reads in on load, and read-only, through which a search scans the
    segment (brute force). Reloaded as it was, each page of such a segment is resident in
    both mappings once searched, counted twice in RSS (one page of memory: PSS counts it
    once); not read in, only the mappings used hold pages. The optimizer's child opens
    such segments the same way (`_OPTIMIZE_SCRIPT`), and new segments get the shard's
    configured type.
    """
    changed = 0
    for path in sorted(shard.glob("segments/*/segment.json")):
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            vectors = [
                v
                for v in state["config"]["vector_data"].values()
                if v.get("storage_type") == "InRamChunkedMmap"
            ]
            if not vectors:
                continue
            for vector in vectors:
                vector["storage_type"] = "ChunkedMmap"
            spare = path.with_name(path.name + ".orrery")
            spare.write_text(json.dumps(state), encoding="utf-8")
            os.replace(spare, path)
            changed += 1
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            _log.warning("left the storage type of %s as it was: %s", path, error)
    return changed


def _load_shard(path: Path, action: str, search_threads: int | None) -> EdgeShard:
    """The shard at `path`, its search pool `search_threads` threads (None: the shard's
    own). A shard persisted with another pool size is loaded with a config naming only
    its dense vector and the size: qdrant-edge keeps every other setting it persisted
    (provided, else persisted, else derived from the segments) and persists the size."""
    config = None
    if search_threads is not None:
        stored = _stored_config(path)
        if stored and stored.get("max_search_threads") != search_threads:
            config = _search_pool_config(stored, search_threads)
    with _translated(action):
        return EdgeShard.load(str(path)) if config is None else EdgeShard.load(str(path), config)


def _search_pool_config(stored: dict[str, Any], search_threads: int) -> EdgeConfig | None:
    """A config changing only the search pool of the shard `stored` describes; None when
    `stored` does not hold the one cosine dense vector this adapter creates."""
    try:
        dense = stored["vectors"][VECTOR_NAME]
        size, distance = int(dense["size"]), dense["distance"]
    except (KeyError, TypeError, ValueError):
        return None
    if distance != "Cosine":
        return None
    return EdgeConfig(
        vectors={VECTOR_NAME: EdgeVectorParams(size=size, distance=Distance.Cosine)},
        max_search_threads=search_threads,
    )


def _remove_tree(path: Path) -> None:
    """Remove a directory tree or a file, if present."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _copy_file_keeping_holes(source: str, target: str) -> str:
    """Copy a file, leaving its holes unwritten (qdrant-edge preallocates 32 MiB files).

    `shutil.copy2` would write the zeros out: ~4x the disk of a small shard.
    """
    with open(source, "rb") as reader, open(target, "wb") as writer:
        size = os.fstat(reader.fileno()).st_size
        for start, end in _data_ranges(reader.fileno(), size):
            position = start
            while position < end:
                chunk = os.pread(reader.fileno(), min(_COPY_CHUNK, end - position), position)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    written = os.pwrite(writer.fileno(), view, position)
                    view = view[written:]
                    position += written
        os.ftruncate(writer.fileno(), size)
    shutil.copymode(source, target)
    return target


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """`(start, end)` of the parts of a file holding data; all of it if the OS can't tell."""
    position = 0
    while position < size:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:  # only a hole is left
                return
            if position == 0:  # SEEK_DATA unsupported here
                yield 0, size
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        position = end


def _not_found(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.NOT_FOUND,
        f"vector index generation {generation_id!r} does not exist",
        {"generation_id": generation_id},
    )


def _named_vector(document: IndexDocument) -> dict[str, NamedVector]:
    """The point's vector as the binding takes it fastest (a `list` of floats). A
    `PackedVector` gives its float32 values (`tolist`, ~4 us for 384, against ~23 us to
    parse its decimals): the engine stores float32, and the float32 of those values is
    the float32 of its decimals, so the stored vector is the same."""
    vector = document.vector
    assert vector is not None  # checked by check_vector
    if type(vector) is PackedVector:
        return {VECTOR_NAME: vector.float32.tolist()}
    return {VECTOR_NAME: list(vector)}


def _stored_config(path: Path) -> dict[str, Any]:
    """The shard config qdrant-edge persists as JSON (it offers no getter); {} if unreadable."""
    try:
        config = json.loads((path / _CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _stored_indexing_threshold(config: dict[str, Any], tuning: QdrantEdgeTuning) -> int:
    try:
        return int(config["optimizers"]["indexing_threshold"])
    except (KeyError, TypeError, ValueError):
        return tuning.indexing_threshold_kb


def _stored_vacuum_rule(config: dict[str, Any]) -> tuple[float, int]:
    """The shard's `(deleted_threshold, vacuum_min_vector_number)`; the engine's
    defaults where the config leaves them unset."""
    optimizers = config.get("optimizers") or {}
    threshold = optimizers.get("deleted_threshold")
    minimum = optimizers.get("vacuum_min_vector_number")
    return (
        VACUUM_DELETED_THRESHOLD if threshold is None else float(threshold),
        VACUUM_MIN_VECTORS if minimum is None else int(minimum),
    )


def _stored_dimension(config: dict[str, Any], shard: EdgeShard) -> int | None:
    """The dense dimension a shard was created with.

    From the persisted config; else from one stored vector; else None (the engine still
    rejects a wrong dimension, which `_translated` reports as `EMBEDDER_MISMATCH`).
    """
    try:
        return int(config["vectors"][VECTOR_NAME]["size"])
    except (KeyError, TypeError, ValueError):
        pass
    with _translated("probe dimension"):
        records, _ = shard.scroll(ScrollRequest(limit=1, with_vector=[VECTOR_NAME]))
    for record in records:
        vector = record.vector
        if isinstance(vector, dict):
            dense = vector.get(VECTOR_NAME)
            if isinstance(dense, list):
                return len(dense)
    return None


@contextlib.contextmanager
def _translated(action: str) -> Iterator[None]:
    """Turn the driver's bare `Exception`s into `contracts.errors`."""
    try:
        yield
    except (OrreryError, _Cancelled):
        raise
    except Exception as error:
        message = str(error)
        if "dimension error" in message:
            raise OrreryError(
                ErrorCode.EMBEDDER_MISMATCH, f"{action}: {message}", {"engine": DEPENDENCY}
            ) from error
        raise DependencyUnavailable(DEPENDENCY, f"{action}: {message}") from error
