"""A person's first hour (issue 26), as real processes: every expected failure of
`orrery serve` is one line on stderr and exit code 2 (a traceback only with --debug);
"serving" is said once the sample is searchable; readiness answers 503 until then; a
mistyped namespace is `404 unknown_namespace`; a new snapshot kind is queryable without
a restart; `gen build` refuses a scope that never held a record.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from projector.bootstrap import operator_lock
from tests.conftest import EMBEDDING_CACHE_ENV
from tests.e2e.conftest import Server, free_port, start_server

ADMIN_KEY = "first-hour-admin"


def orrery(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run `orrery ARGS`; (exit code, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "orrery.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    return result.returncode, result.stderr


def one_line(stderr: str) -> str:
    """The one line an expected failure prints (logging lines of the start aside)."""
    lines = [line for line in stderr.splitlines() if line.startswith("orrery: ")]
    assert "Traceback" not in stderr and "╭" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ORRERY_DEFAULT_PROFILE": "nosuch"}, "ORRERY_DEFAULT_PROFILE: default profile 'nosuch'"),
        ({"ORRERY_SCOPES": "{bad"}, "ORRERY_SCOPES is not JSON"),
        ({"ORRERY_API_KEYS": "garbage"}, "ORRERY_API_KEYS entry 'garbage'"),
        ({"ORRERY_PORT": "abc"}, "ORRERY_PORT: Input should be a valid integer"),
        ({"ORRERY_SCOPES": '{"*": {"x@y": "objects"}}'}, "ORRERY_SCOPES['*']['x@y']"),
        # More than the deployment's store or log takes (issue 22).
        (
            {"ORRERY_MAX_RECORD_BYTES": "4194305"},
            "ORRERY_MAX_RECORD_BYTES: Value error, 4194305 is more than the embedded store",
        ),
        (
            {"ORRERY_MODE": "servers", "ORRERY_MAX_RECORD_BYTES": "983041"},
            "ORRERY_MAX_RECORD_BYTES: Value error, 983041 is more than one Kafka message",
        ),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    code, stderr = orrery("serve", "--data-dir", str(tmp_path / "data"), env=env)
    assert code == 2
    assert expected in one_line(stderr)


def test_binding_every_address_without_keys_is_refused_in_one_line(tmp_path: Path) -> None:
    code, stderr = orrery("serve", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0")
    assert code == 2
    # The message holds `[/galaxy]`, which rich would have read as a closing tag.
    assert "refusing to bind 0.0.0.0" in one_line(stderr) and "[/galaxy]" in stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    code, stderr = orrery("--debug", "serve", "--data-dir", str(tmp_path / "d"), "--host", "::")
    assert code != 0 and "Traceback" in stderr and "refusing to bind ::" in stderr


def test_a_locked_data_dir_is_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    lock = operator_lock(data_dir)
    lock.acquire()  # as a running `orrery serve` holds it
    try:
        code, stderr = orrery("serve", "--data-dir", str(data_dir), "--port", str(free_port()))
    finally:
        lock.release()
    assert code == 2
    assert f"another process operates {data_dir}" in one_line(stderr)


def test_a_port_in_use_is_one_line_and_never_says_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = orrery("serve", "--data-dir", str(tmp_path / "data"), "--port", str(port))
    assert code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in one_line(stderr)
    assert "serving" not in stderr


def test_servers_unreachable_is_one_line_per_window_not_a_traceback(tmp_path: Path) -> None:
    """Nothing listens on the Kafka, OpenSearch and Redis addresses: the projector's
    retries (backoff up to 5 s) are reported once, without a traceback, in 15 s."""
    log_path = tmp_path / "servers.log"
    env = {
        **os.environ,
        "ORRERY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "ORRERY_OPENSEARCH_URL": f"http://127.0.0.1:{free_port()}",
        "ORRERY_REDIS_URL": f"redis://127.0.0.1:{free_port()}",
    }
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "orrery.cli", "serve", "--mode", "servers"),
                *("--data-dir", str(tmp_path / "data"), "--port", str(port)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while "projector batch failed" not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        time.sleep(15)  # backoff 0.1 → 5 s: about eight more attempts
        assert process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=30)
    text = log_path.read_text()
    failures = [line for line in text.splitlines() if "projector batch failed" in line]
    assert len(failures) == 1, text
    assert "dependency" in failures[0] or "kafka" in failures[0]
    assert "Traceback" not in text
    assert "is serving" not in text  # no query answers without its servers


def test_server_mode_without_its_database_is_one_line(tmp_path: Path) -> None:
    env = {
        "ORRERY_DATABASE_URL": f"postgresql://orrery@127.0.0.1:{free_port()}/orrery",
        "ORRERY_CURSOR_KEYS": "k1:0123456789abcdef0123456789abcdef",
        "ORRERY_QDRANT_URL": f"http://127.0.0.1:{free_port()}",
    }
    code, stderr = orrery("query-worker", "--data-dir", str(tmp_path), "--port", "1", env=env)
    assert code == 2
    assert one_line(stderr).startswith("orrery: dependency_unavailable: postgres")
    # A setting that cannot work across machines is refused before any connection.
    code, stderr = orrery(
        "query-worker", "--data-dir", str(tmp_path), env={**env, "ORRERY_CURSOR_KEYS": ""}
    )
    assert code == 2 and "ORRERY_CURSOR_KEYS is not" in one_line(stderr)


# -- a server with the sample --------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[int]]]:
    """`orrery serve --sample`, and the readiness codes seen from its first answer until
    ready, each checked against its body."""
    srv = start_server(
        tmp_path_factory.mktemp("first-hour") / "data",
        "--sample",
        # A first start embeds the sample: no vectors kept from the suite's other servers.
        env={"ORRERY_ADMIN_KEY": ADMIN_KEY, EMBEDDING_CACHE_ENV: None},
    )
    codes: list[int] = []
    deadline = time.monotonic() + 300
    while True:
        log_before = srv.log_path.read_text()
        response = srv.client.get("/v1/readiness")
        codes.append(response.status_code)
        assert response.status_code == (200 if response.json()["ready"] else 503)
        if response.status_code == 503:
            # Not ready: the banner has not said "serving" before this answer.
            assert "is serving on" not in log_before
        elif {s["namespace"] for s in response.json()["scopes"]} == {"demo"} and len(
            response.json()["scopes"]
        ) == 5:
            break
        assert time.monotonic() < deadline, srv.log_path.read_text()[-3000:]
        time.sleep(0.2)
    yield srv, codes
    srv.stop()


def _banner(srv: Server) -> str:
    deadline = time.monotonic() + 30
    while "is serving on" not in (text := srv.log_path.read_text()):
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.1)
    return text


def test_serving_is_said_once_the_sample_is_searchable(sample: tuple[Server, list[int]]) -> None:
    srv, codes = sample
    text = _banner(srv)
    assert text.index("is starting on") < text.index("is serving on")
    assert "searchable after" in text
    # The sample takes seconds to index: readiness said 503 meanwhile.
    assert codes[0] == 503 and codes[-1] == 200
    body = {
        "namespace": "demo",
        "scope_ref": "longterm:objects:current",
        "query_text": "Thermoskanne",
        "result_limit": 3,
    }
    assert srv.topk(**body).status_code == 200


def test_an_unknown_namespace_is_404_not_not_ready(sample: tuple[Server, list[int]]) -> None:
    srv, _ = sample
    answer = srv.topk(namespace="dem0", scope_ref="longterm:objects:current", query_text="x")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_namespace"
    # A known namespace without records of a built-in scope's kind: not ready, and why.
    none_yet = srv.topk(namespace="demo", scope_ref="longterm:graph_nodes:current", query_text="x")
    assert none_yet.status_code == 503
    assert none_yet.json()["error"]["details"]["reason"] == "no_records"


def test_a_new_snapshot_kind_is_queryable_without_a_restart(
    sample: tuple[Server, list[int]],
) -> None:
    srv, _ = sample
    ref = "longterm:recipes:current"
    before = srv.topk(namespace="demo", scope_ref=ref, query_text="Apfelkuchen")
    assert before.status_code == 404 and before.json()["error"]["code"] == "unknown_scope"
    record = {
        "namespace": "demo",
        "snapshot_kind": "recipes",
        "item_id": "recipe:apfelkuchen",
        "revision": 1,
        "payload": {"summary": "Apfelkuchen nach Oma"},
        "text": {"title": "Apfelkuchen nach Oma", "body": "Äpfel, Zimt, Streusel"},
    }
    assert srv.post_records([record]).status_code == 200
    deadline = time.monotonic() + 120
    while True:
        listed = srv.client.get("/v1/scopes").json()["namespaces"]
        refs = {s["scope_ref"]: s for n in listed if n["namespace"] == "demo" for s in n["scopes"]}
        if ref in refs:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    assert refs[ref]["source"] == "runtime" and refs[ref]["snapshot_kind"] == "recipes"
    assert refs["longterm:objects:current"]["source"] == "builtin"
    # The first generation is live before its first batch commits: readiness says when
    # the record is in it (as for any write).
    srv.wait_projected(documents={("demo", "recipes"): 1}, timeout=120)
    answer = srv.topk(namespace="demo", scope_ref=ref, query_text="Apfelkuchen")
    assert answer.status_code == 200, answer.text
    assert [r["item_id"] for r in answer.json()["results"]] == ["recipe:apfelkuchen"]


def test_gen_build_refuses_a_scope_that_never_held_a_record(
    sample: tuple[Server, list[int]],
) -> None:
    srv, _ = sample
    env = {"ORRERY_ADMIN_KEY": ADMIN_KEY}
    url = f"http://127.0.0.1:{srv.port}"
    code, stderr = orrery("gen", "build", "nosuchns", "objects", "--url", url, env=env)
    assert code == 1 and "holds no records" in stderr and "--allow-empty" in stderr
    code, stderr = orrery(
        "gen", "build", "nosuchns", "objects", "--url", url, "--allow-empty", env=env
    )
    assert code == 0, stderr


def test_readiness_needs_no_json_to_read(sample: tuple[Server, list[int]]) -> None:
    srv, _ = sample
    # Ready now (the fixture waited): 200, the body says so too.
    with httpx.Client(base_url=f"http://127.0.0.1:{srv.port}") as client:
        response = client.get("/v1/readiness")
    assert response.status_code == 200 and response.json()["ready"] is True


# -- the terminal: --version, search, explain ---------------------------------------------


def orrery_out(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `orrery ARGS` (a wide terminal); (exit code, stdout, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "orrery.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=180,
    )
    return result.returncode, result.stdout, result.stderr


def test_version_and_a_mistyped_command() -> None:
    from importlib.metadata import version

    code, out, _ = orrery_out("--version")
    assert code == 0 and out.strip() == f"orrery {version('orrery')}"
    code, _, err = orrery_out("serch", "x")
    assert code == 2 and "Did you mean 'search'" in err


def test_search_prints_a_table_and_json(sample: tuple[Server, list[int]]) -> None:
    srv, _ = sample
    url = f"http://127.0.0.1:{srv.port}"
    query = "Wo stand früher meine rote Thermoskanne?"
    code, out, err = orrery_out("search", query, "--url", url, "-k", "3")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "fused" in line)
    assert all(word in header for word in ("rank", "id", "title", "lexical", "vector"))
    first = next(line for line in out.splitlines() if "fact:thermos_location_old" in line)
    assert "Rote Thermoskanne" in first and first.split("│")[1].strip() == "1"
    code, out, err = orrery_out("search", query, "--url", url, "--json", "--profile", "rrf@2")
    answer = json.loads(out)
    assert code == 0 and answer["profile"] == "rrf@2"
    assert answer["results"][0]["item_id"] == "fact:thermos_location_old"


def test_search_compares_two_profiles(sample: tuple[Server, list[int]]) -> None:
    srv, _ = sample
    url = f"http://127.0.0.1:{srv.port}"
    code, out, err = orrery_out(
        "search", "Thermoskanne", "--url", url, "--compare", "rrf@2", "--json", "-k", "5"
    )
    assert code == 0, err
    doc = json.loads(out)
    a = [r["document_id"] for r in doc["answer"]["results"]]
    b = [r["document_id"] for r in doc["compare"]["results"]]
    assert doc["compare"]["profile"] == "rrf@2"
    assert doc["overlap_at_k"] == len(set(a) & set(b)) / 5
    code, out, _ = orrery_out("search", "Thermoskanne", "--url", url, "--compare", "rrf@2")
    assert code == 0 and "overlap@10" in out and "rrf@2" in out


def test_explain_adds_each_sources_own_rank_and_the_plan(
    sample: tuple[Server, list[int]],
) -> None:
    srv, _ = sample
    url = f"http://127.0.0.1:{srv.port}"
    query = "Wo stand früher meine rote Thermoskanne?"
    code, out, err = orrery_out("explain", query, "--url", url, "--json", "-k", "3")
    assert code == 0, err
    doc = json.loads(out)
    top = doc["answer"]["results"][0]["document_id"]
    assert doc["source_ranks"]["lexical"][top] == 1
    code, out, _ = orrery_out("explain", query, "--url", url, "-k", "3")
    assert code == 0 and "(#1)" in out and "latency" in out and "cache" in out


def test_search_errors_are_one_line(sample: tuple[Server, list[int]]) -> None:
    srv, _ = sample
    code, _, err = orrery_out("search", "x", "--url", f"http://127.0.0.1:{srv.port}", "-n", "dem0")
    assert code == 2 and "unknown_namespace" in one_line(err)
    code, _, err = orrery_out("search", "x", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == 2 and "no Orrery answers at" in one_line(err)


def test_search_opens_a_data_dir_without_a_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    records = tmp_path / "records.jsonl"
    record = {
        "namespace": "home",
        "snapshot_kind": "objects",
        "item_id": "fact:keys",
        "revision": 1,
        "payload": {"summary": "The house keys hang by the door"},
        "text": {"title": "House keys", "body": "The house keys hang on the hook by the door"},
    }
    records.write_text(json.dumps(record) + "\n")
    code, _, err = orrery_out("ingest", str(records), "--data-dir", str(data_dir))
    assert code == 0, err
    code, out, err = orrery_out(
        "search", "house keys", "-n", "home", "--data-dir", str(data_dir), "--json"
    )
    assert code == 0, err
    assert [r["item_id"] for r in json.loads(out)["results"]] == ["fact:keys"]
    code, _, err = orrery_out("search", "x", "-n", "nobody", "--data-dir", str(data_dir))
    assert code == 2 and "holds no records of nobody/objects" in one_line(err)
