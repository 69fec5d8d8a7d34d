"""Rebuild a kept data dir's qdrant-edge generations with integer or UUID point ids, for an
A/B of the id schemes on the same data (`bench/synthetic_serve_ab.py --data-dir-b`).

    python bench/edge_rekey.py --data-dir R/data --ids int|uuid

Every generation under `R/data/generations/vectors` is read page by page (payloads and
vectors as stored) into a new shard of the project's default config and payload indexes,
each point at `int_point_id(document_id)` (`--ids int`: `document_id` in every payload,
the `+ids` file written) or at `point_id(document_id)` (`--ids uuid`: a canonical UUID
document id left out of its payload, as generations before session 27 store it). The
new shard is optimized in this process (HNSW built, as the optimizer's child builds it),
then takes the old one's place (pointer file and `+ids` file replaced): both sides of an
A/B hold one freshly built shard each, with the same points and vectors. Stops on an
integer id collision (a real one, ~n²/2⁶⁴: then use the projector, which falls back).
Run it with the server
stopped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qdrant_edge import EdgeShard, Point, ScrollRequest, UpdateOperation

import projector.adapters.qdrant_edge_vectors as edge
from contracts.index_fields import DOCUMENT_ID, is_canonical_uuid
from contracts.point_ids import int_point_id
from contracts.vector_payload import point_id, with_id

_PAGE = 1_000


def rekey(vectors: Path, generation_id: str, integer: bool) -> dict[str, Any]:
    index = edge.QdrantEdgeVectorIndex(vectors)
    live = index._live_path(generation_id)
    index.close()
    target = vectors / f"{generation_id}{edge._VERSION_MARK}{edge._version_of(live) + 1}"
    shutil.rmtree(target, ignore_errors=True)
    source = EdgeShard.load(str(live))
    dimension = edge._stored_dimension(edge._stored_config(live), source)
    assert dimension is not None
    started = time.monotonic()
    shard = EdgeShard.create(str(target), edge.QdrantEdgeTuning().edge_config(dimension))
    edge._ensure_payload_indexes(shard)
    seen: dict[int, str] = {}
    offset = None
    points = 0
    while True:
        records, offset = source.scroll(
            ScrollRequest(offset=offset, limit=_PAGE, with_payload=True, with_vector=True)
        )
        batch = []
        for record in records:
            payload = dict(with_id(record.payload or {}, record.id))
            document_id = str(payload[DOCUMENT_ID])
            pid: Any
            if integer:
                pid = int_point_id(document_id)
                if seen.setdefault(pid, document_id) != document_id:
                    raise SystemExit(f"{document_id} and {seen[pid]} share an integer id")
            else:
                pid = point_id(document_id)
                if is_canonical_uuid(document_id):
                    del payload[DOCUMENT_ID]
            assert record.vector is not None
            batch.append(Point(pid, record.vector, payload))
        if batch:
            shard.update(UpdateOperation.upsert_points(batch))
            points += len(batch)
        if offset is None:
            break
    source.close()
    written = time.monotonic() - started
    shard.optimize()
    shard.flush()
    info = shard.info()
    shard.close()
    pointer = vectors / f"{generation_id}{edge._POINTER}"
    pointer.write_text(target.name, encoding="utf-8")
    ids_file = vectors / f"{generation_id}{edge._IDS}"
    if integer:
        edge._write_ids_file(ids_file)
    else:
        ids_file.unlink(missing_ok=True)
    shutil.rmtree(live)
    return {
        "generation": generation_id,
        "points": points,
        "indexed": info.indexed_vectors_count,
        "write_s": round(written, 1),
        "total_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--ids", choices=("int", "uuid"), required=True)
    args = parser.parse_args()
    vectors = args.data_dir / "generations" / "vectors"
    generations = sorted(
        p.name
        for p in vectors.iterdir()
        if not p.name.startswith(".") and edge._VERSION_MARK not in p.name
    ) + sorted(
        p.name.removesuffix(edge._POINTER)
        for p in vectors.glob(f"*{edge._POINTER}")
        if not (vectors / p.name.removesuffix(edge._POINTER)).exists()
    )
    for generation_id in generations:
        print(rekey(vectors, generation_id, args.ids == "int"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
