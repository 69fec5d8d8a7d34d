"""`orrery import-jsonl | dump | backup | restore | compact` as a user runs them, on
real data directories (embedded): dump → import into a fresh data dir → the same dump;
a backup that dies leaves nothing under its name; restore refuses to overwrite; a
restored data dir serves its records again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contracts.faults import CRASH_ENV, CRASH_EXIT_CODE
from tests.e2e.conftest import start_server

pytestmark = [pytest.mark.slow]

NS = "kouten-cli"
DIM = 384


def orrery(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orrery.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def unit(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(DIM)]


def export_file(tmp: Path) -> Path:
    rows: list[dict[str, Any]] = [
        {"tenant": "a", "body": {"title": "alpha quartz"}, "embedding": unit(0), "key": 1},
        {"tenant": "a/deep", "body": {"title": "deep garnet"}, "embedding": unit(2), "key": 2},
        {"tenant": "b", "body": "raw beta topaz", "embedding": unit(1), "key": 3},
        {"body": {"title": "no tenant onyx", "n": [1, 2]}, "key": 4},
    ]
    path = tmp / "export.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def imported(data_dir: Path, file: Path, *extra: str) -> dict[str, Any]:
    done = orrery(
        "import-jsonl",
        str(file),
        "--namespace",
        NS,
        "--galaxy",
        "g",
        "--data-dir",
        str(data_dir),
        *extra,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


def dumped(data_dir: Path, out: Path, galaxy: str = "g") -> str:
    done = orrery(
        "dump",
        "--namespace",
        NS,
        "--galaxy",
        galaxy,
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out.read_text()


def test_dump_import_into_a_fresh_data_dir_gives_the_same_dump(tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    stats = imported(
        first_dir,
        export_file(tmp_path),
        "--ring-field",
        "tenant",
        "--ring-prefix",
        "t/",
        "--payload-field",
        "body",
        "--vec-field",
        "embedding",
        "--id-field",
        "key",
    )
    assert (stats["read"], stats["imported"], stats["rings"]) == (4, 4, 4)
    first = dumped(first_dir, tmp_path / "first.jsonl")
    lines = [json.loads(line) for line in first.splitlines()]
    assert lines[0]["documents"] == 4
    # t/imported is the default ring's; t/a/deep implies t and t/a.
    assert [x["name"] for x in lines if x["type"] == "ring"] == [
        "t",
        "t/a",
        "t/a/deep",
        "t/b",
        "t/imported",
    ]
    assert [x["id"] for x in lines if x["type"] == "document"] == ["1", "2", "3", "4"]
    assert "vec" not in lines[-1]  # the embedder computes that one; it is not stored

    assert imported(second_dir, tmp_path / "first.jsonl")["imported"] == 4
    assert dumped(second_dir, tmp_path / "second.jsonl") == first


@pytest.mark.parametrize("point", ["backup.copied", "backup.before_rename"])
def test_a_backup_that_dies_leaves_nothing_under_its_name(tmp_path: Path, point: str) -> None:
    data = tmp_path / "data"
    imported(data, export_file(tmp_path))
    died = orrery("backup", "--name", "nightly", "--data-dir", str(data), env={CRASH_ENV: point})
    assert died.returncode == CRASH_EXIT_CODE, died.stderr[-2000:]
    backups = data / "backups"
    assert not (backups / "nightly").exists()
    assert [p.name for p in backups.iterdir() if not p.name.startswith(".")] == []
    done = orrery("backup", "--name", "nightly", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert (report["items"], report["liveItems"], report["verified"]) == (4, 4, True)
    # The killed backup's hidden temporary directory is gone too (issue 22).
    assert [p.name for p in backups.iterdir()] == ["nightly"]


def test_a_failing_copy_leaves_nothing_under_its_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "orrery.sqlite").write_bytes(b"this is not a SQLite database" * 200)
    done = orrery("backup", "--name", "broken", "--data-dir", str(data))
    assert done.returncode == 1
    assert "dependency_unavailable" in done.stderr
    assert list((data / "backups").iterdir()) == []


def test_restore_refuses_to_overwrite_then_serves_the_restored_data(tmp_path: Path) -> None:
    data, other, fresh = tmp_path / "data", tmp_path / "other", tmp_path / "fresh"
    imported(data, export_file(tmp_path), "--payload-field", "body", "--id-field", "key")
    assert orrery("backup", "--name", "b1", "--data-dir", str(data)).returncode == 0
    backup = data / "backups" / "b1"
    imported(other, export_file(tmp_path))
    before = (other / "orrery.sqlite").read_bytes()

    refused = orrery("restore", "--backup", str(backup), "--data-dir", str(other))
    assert refused.returncode == 1 and "not empty" in refused.stderr
    assert (other / "orrery.sqlite").read_bytes() == before
    forced = orrery("restore", "--backup", str(backup), "--data-dir", str(other), "--overwrite")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert dumped(other, tmp_path / "o.jsonl") == dumped(data, tmp_path / "d.jsonl")

    assert orrery("restore", "--backup", str(backup), "--data-dir", str(fresh)).returncode == 0
    srv = start_server(fresh)
    try:
        srv.wait_projected(timeout=120, documents={(NS, "objects"): 4})
        response = srv.topk(
            namespace=NS,
            scope_ref="longterm:objects:current",
            query_text="garnet",
            filters={"galaxy": "g"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["results"][0]["payload"] == {"title": "deep garnet"}
    finally:
        srv.stop()


def test_compact_from_the_command_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    file = export_file(tmp_path)
    imported(data, file, "--id-field", "key")
    imported(data, file, "--id-field", "key")  # second revisions of all four
    done = orrery("compact", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    # No projector ever ran: the outbox is unconsumed, so every revision stays.
    assert (report["items"], report["droppedRevisions"]) == (8, 0)
    assert dumped(data, tmp_path / "after.jsonl").count('"type":"document"') == 4
