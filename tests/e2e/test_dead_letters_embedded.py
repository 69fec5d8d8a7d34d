"""Dead letters in the embedded deployment: an outbox row that is no `RecordChanged`.

Real components in a temp dir: the SQLite store and outbox, the embedded projector
(tantivy, qdrant-edge, SQLite registry), the query worker's readiness and the
`orrery project --dead-letters` listing.
"""

from __future__ import annotations

import base64
import functools
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts.auth import ApiKeyGrant
from contracts.errors import OrreryError
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from orrery.cli import app
from projector.bootstrap import EmbeddedProjector, embedded_projector
from projector.service import project_batch
from query.adapters.sqlite_routing import SqliteRouting
from query.entrypoints.http import readiness, readiness_for
from tests.fakes import FakeHashingEmbedder

GARBAGE = b'{"event_type": "record_changed", "record": {"namespace": 7}}'


def rec(item: str) -> Record:
    return Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id=item,
        revision=1,
        text={"title": f"thing {item}", "body": "body"},
    )


@dataclass
class Stack:
    data_dir: Path
    db: Path
    store: SqliteRecordStore
    projector: EmbeddedProjector

    def garbage(self, value: bytes) -> None:
        with closing(sqlite3.connect(self.db)) as conn, conn:
            conn.execute(
                "INSERT INTO outbox (document_id, revision, namespace, snapshot_kind, "
                "event_json, created_at) VALUES ('x', 1, 'ns', 'objects', ?, "
                "'2026-01-01T00:00:00+00:00')",
                (value,),
            )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    data_dir = tmp_path / "data"
    db = data_dir / "orrery.sqlite"
    store = SqliteRecordStore(db)
    projector = embedded_projector(data_dir, db, embedder=FakeHashingEmbedder(16), batch_size=50)
    yield Stack(data_dir, db, store, projector)
    projector.close()
    store.close()


def test_an_undecodable_outbox_row_is_parked_and_projection_continues(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack.store.write([rec("a"), rec("b")])
    stack.garbage(GARBAGE)
    stack.store.write([rec("c")])
    with caplog.at_level("ERROR", logger="orrery.projector"):
        reports = [stack.projector.step() for _ in range(3)]
    assert [r.parked for r in reports] == [1, 0, 0]
    assert reports[0].events == 4 and reports[0].position == 4 and reports[-1].lag == 0
    assert any("undecodable event at outbox@3" in r.getMessage() for r in caplog.records)

    (letter,) = stack.projector.state.dead_letters()
    assert letter.message.where == "outbox@3" and letter.message.position == 3
    assert letter.message.value == GARBAGE and "namespace" in letter.message.reason

    routing = SqliteRouting(stack.db)
    (scope,) = routing.scopes()
    assert scope.document_count == 3 and scope.applied_position == 4
    ready = readiness(routing, None)
    assert ready["ready"] is True
    log = ready["projector_log"]
    assert (log["lag_events"], log["position"], log["dead_letters"]) == (0, 4, 1)

    listed = CliRunner().invoke(
        app, ["project", "--dead-letters", "--data-dir", str(stack.data_dir)]
    )
    assert listed.exit_code == 0, listed.output
    (line,) = listed.output.splitlines()
    shown = json.loads(line)
    assert shown["where"] == "outbox@3" and shown["position"] == 3
    assert base64.b64decode(shown["value_base64"]) == GARBAGE


def test_readiness_is_not_ready_while_events_wait(stack: Stack) -> None:
    stack.store.write([rec("a")])
    stack.projector.step()
    stack.projector.step()
    routing = SqliteRouting(stack.db)
    assert readiness(routing, None)["ready"] is True
    stack.store.write([rec("b")])
    waiting = readiness(routing, None)
    assert waiting["ready"] is False and waiting["projector_log"]["current"] is False
    stack.projector.step()
    assert readiness(routing, None)["ready"] is True


def test_without_a_dead_letter_box_the_batch_fails_and_nothing_commits(stack: Stack) -> None:
    stack.store.write([rec("a")])
    stack.garbage(b"\xff not json")
    step = functools.partial(
        project_batch,
        log=stack.projector.log,
        state=stack.projector.state,
        lexical=stack.projector.lexical,
        vectors=stack.projector.vectors,
        embedder=stack.projector.embedder,
        cache=stack.projector.state,
        lexical_engine="tantivy",
        vector_engine="qdrant-edge",
    )
    for _ in range(2):  # delivered again, never skipped
        with pytest.raises(OrreryError, match="undecodable"):
            step()
    assert stack.projector.state.position("projector") == 0
    assert stack.projector.state.dead_letter_count() == 0


def test_keyed_readiness_takes_the_namespaces_own_lag_and_dead_letters(stack: Stack) -> None:
    """Issue 22: a key's readiness once took the projector's global measurement, so
    another tenant's unapplied events (or dead letters) made it unready."""
    other = Record(
        namespace="other", snapshot_kind="objects", item_id="o", revision=1, text={"title": "o"}
    )
    stack.store.write([other])
    stack.garbage(GARBAGE)  # a dead letter of the projector, not of "other"
    stack.projector.step()
    stack.projector.step()
    stack.store.write([rec("late")])  # "ns" has an event the projector has not applied
    routing = SqliteRouting(stack.db)
    body = readiness(routing, None)
    # Globally: measured before the newest write, so it cannot vouch for it.
    assert body["ready"] is False and body["projector_log"]["current"] is False
    assert body["projector_log"]["dead_letters"] == 1
    mine = readiness_for(body, ApiKeyGrant(namespace="other"), routing.namespace_log)
    assert mine["ready"] is True, mine
    assert mine["projector_log"] == {"current": True, "lag_events": 0, "dead_letters": 0}
    theirs = readiness_for(body, ApiKeyGrant(namespace="ns"), routing.namespace_log)
    assert theirs["ready"] is False
    assert theirs["projector_log"]["lag_events"] == 1
    stack.projector.step()
    body = readiness(routing, None)
    theirs = readiness_for(body, ApiKeyGrant(namespace="ns"), routing.namespace_log)
    assert theirs["ready"] is True, theirs
    assert theirs["projector_log"]["lag_events"] == 0
