"""Server mode's ingest path in one process, per stage: CPU µs a record.

    set -a; . /tmp/orrery-servers/servers.env; set +a
    (cd /path/to/tree && /work/main/.venv/bin/python $OLDPWD/bench/server_ingest_stages.py \
        --size 6000 [--out FILE])

`bench/topk.py`'s corpus (precomputed vectors, bodies of 2,000 records) through the
code of the tree it runs in (its working directory first on `sys.path`): the ingest
API's `parse_body` and `write_records` into a fresh PostgreSQL database (migrated, then
dropped), then the relay's claim (`PostgresOutboxReader.unpublished`, 1,000 rows at a
time) with each row's value and headers as a publisher builds them, and its mark
(`mark_published`, without placements: no Kafka), the projector's
`decode_message` of each, and its PostgreSQL bookkeeping of a batch (512 events, as
the projector's batch): the registry's `revisions` of the batch's documents
(`revisions`), the batch's index documents (`to_index_document`, `index_documents`)
and their ring statistics (`PostgresRingStatistics.apply`, `ring_stats`). Kafka, the
engines and the HTTP stack are left out: the stages Orrery's own code spends CPU on
between the request body and a decoded event, and the projector's own tables.
Run it from two trees in turn (alternating, load recorded) for a paired comparison;
figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.getcwd())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import psycopg
    from psycopg.conninfo import make_conninfo

    from bench.common import utc_now
    from bench.topk import Vocabulary, corpus_batches
    from contracts.events import LogEntry
    from contracts.index import to_index_document
    from ingest.adapters.kafka_wire import headers_of
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore
    from ingest.service import parse_body, write_records
    from projector.adapters.kafka_wire import decode_message
    from projector.adapters.postgres_migrations import COMPONENT, migrations
    from projector.adapters.postgres_ring_stats import PostgresRingStatistics
    from projector.adapters.postgres_state import PostgresProjectorState

    server = os.environ["ORRERY_DATABASE_URL"]
    bodies = list(corpus_batches(args.size, 2000, args.seed, Vocabulary.build(random.Random(7))))
    name = f"orrery_stages_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    url = make_conninfo(server, dbname=name)
    load_before = os.getloadavg()
    try:
        migrate(url)
        migrate(url, migrations(), component=COMPONENT)
        store, reader = PostgresRecordStore(url), PostgresOutboxReader(url)
        state, ring_stats = PostgresProjectorState(url), PostgresRingStatistics(url)
        cpu = dict.fromkeys(
            (
                "parse",
                "write",
                "claim",
                "mark",
                "decode",
                "revisions",
                "index_documents",
                "ring_stats",
            ),
            0.0,
        )
        entries: list[LogEntry] = []
        for body in bodies:
            t0 = time.process_time()
            admitted = parse_body(
                body,
                max_batch=5000,
                vector_dimension=384,
                max_record_bytes=1 << 20,
                allowed_namespace=None,
            )
            t1 = time.process_time()
            write_records(admitted.records, store=store, stored_json=admitted.stored_json)
            cpu["parse"] += t1 - t0
            cpu["write"] += time.process_time() - t1
        decoded = 0
        vector_type = ""
        while True:
            t0 = time.process_time()
            rows = reader.unpublished(1000)
            messages = [(row.event_json.encode(), headers_of(row)) for row in rows]
            t1 = time.process_time()
            if not rows:
                break
            reader.mark_published([row.position for row in rows])
            t2 = time.process_time()
            for offset, (value, headers) in enumerate(messages):
                entry = decode_message("bench", 0, offset, None, value, headers)
                event = getattr(entry, "event", None)
                vector_type = "undecodable" if event is None else type(event.record.vector).__name__
                if isinstance(entry, LogEntry):
                    entries.append(entry)
            cpu["claim"] += t1 - t0
            cpu["mark"] += t2 - t1
            cpu["decode"] += time.process_time() - t2
            decoded += len(rows)
        for start in range(0, len(entries), 512):
            records = [e.event.record for e in entries[start : start + 512]]
            t0 = time.process_time()
            state.revisions("bench", sorted({r.doc_id for r in records}))
            t1 = time.process_time()
            # The engines' documents, built once per batch in the projector for every
            # engine and the ring statistics alike: their own stage (until session 24
            # they were counted in `ring_stats`, ~8 µs a record).
            documents = [to_index_document(r, r.vector) for r in records if not r.deleted]
            t2 = time.process_time()
            ring_stats.apply("bench", documents, [])
            cpu["revisions"] += t1 - t0
            cpu["index_documents"] += t2 - t1
            cpu["ring_stats"] += time.process_time() - t2
        store.close()
        reader.close()
        state.close()
        ring_stats.close()
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    if decoded != args.size:
        raise SystemExit(f"decoded {decoded} events of {args.size}")
    result = {
        "tree": os.getcwd(),
        "when": utc_now(),
        "size": args.size,
        "us_per_record": {k: round(v / args.size * 1e6, 1) for k, v in cpu.items()},
        "decoded_vector": vector_type,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
