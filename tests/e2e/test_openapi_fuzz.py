"""Schema-driven fuzzing: schemathesis against the live `/openapi.json` of a real
`orrery serve` process (embedded, sample corpus, an API key and the admin key).

Every operation the document declares gets hypothesis-driven cases, positive (valid for
the schema) and negative (violating it); half the positive cases are steered into the
key's namespace and a registered scope, so they reach the query path past `403` (a
negative case is left as generated: steering could make it valid). Checked on
every response: no 5xx, the status is documented, the content type is documented, and
the body is valid against the documented schema — for errors that is Orrery's
`ErrorResponse` with a code of exactly that status (`contracts.openapi`); every error
body is also re-checked here against `HTTP_STATUS`. Failures are collected over the
whole run and reported together.

`ORRERY_FUZZ_EXAMPLES` (default 50) sets the cases per operation and mode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from contracts.errors import HTTP_STATUS, ErrorResponse
from contracts.export_schemas import MODELS
from contracts.openapi import COMPONENTS, components_of, error_responses
from tests.e2e.conftest import Server, start_server

pytestmark = [pytest.mark.slow]

API_KEY = "fuzz-key"
ADMIN_KEY = "fuzz-admin-key"
NAMESPACE = "demo"
SCOPE_REFS = ["longterm:objects:current", "longterm:conflicts:current", "graph:current"]
PROFILES = [None, "weighted@3", "weighted@1", "rrf@2"]
QUERIES = ["Thermoskanne", "rote Thermoskanne Küche", "keys", "where are my glasses"]
HEADERS = {"x-api-key": API_KEY, "x-admin-key": ADMIN_KEY}
EXAMPLES = int(os.environ.get("ORRERY_FUZZ_EXAMPLES", "50"))
MIN_CASES = 1_000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
JSON_TYPES = ("application/json", "application/x-ndjson")
SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("fuzz") / "data",
        "--sample",
        env={"ORRERY_API_KEYS": f"{API_KEY}={NAMESPACE}", "ORRERY_ADMIN_KEY": ADMIN_KEY},
    )
    try:
        srv.wait_projected(timeout=120, headers={"x-api-key": API_KEY})
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    response = server.client.get("/openapi.json")
    assert response.status_code == 200, response.text[:300]
    return dict(response.json())


def test_openapi_declares_bodies_successes_and_orrery_errors(document: dict[str, Any]) -> None:
    text = json.dumps(document)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text
    errors = error_responses()
    assert set(errors) == {str(s) for s in HTTP_STATUS.values()}
    # POST …/{generation_id}/<action>, …/backups/{name}/verify, /v1/admin/compact
    bodiless = {"verify", "promote", "retire", "abort", "compact"}
    for path, item in document["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            assert op.get("x-orrery-access"), where
            if method == "post" and path.rsplit("/", 1)[-1] not in bodiless:
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                assert _all_refs(schema), where
            successes = [s for s in op["responses"] if s.startswith("2")]
            # One success, plus a 202 where work is accepted to finish later.
            assert len(successes) == 1 or sorted(successes) == ["200", "202"], where
            for status in successes:
                content = op["responses"][status]["content"]
                # JSON, or JSON lines (the KoutenDB dump) whose lines are components.
                (ok,) = [c["schema"] for t, c in content.items() if t in JSON_TYPES]
                assert _all_refs(ok), where
            for status, response in errors.items():
                got = op["responses"][status]
                schema = got["content"]["application/json"]["schema"]
                error = response["content"]["application/json"]["schema"]
                if "anyOf" in schema and schema["anyOf"][-1] == error:
                    # The route's own body for this status too (`operation(also=…)`:
                    # readiness is 503 with its body while not ready), or the error.
                    assert _all_refs({"anyOf": schema["anyOf"][:-1]}), f"{where} {status}"
                    assert got["description"] == response["description"], f"{where} {status}"
                    continue
                assert got == response, f"{where} {status}"


def _all_refs(schema: dict[str, Any]) -> bool:
    """A component, or `anyOf` components (a path that takes two shapes)."""
    options = schema.get("anyOf", [schema])
    return all(str(o.get("$ref", "")).startswith(COMPONENTS) for o in options)


def test_openapi_components_equal_docs_schemas(document: dict[str, Any]) -> None:
    """`docs/schemas/` and `/openapi.json` agree: every component is the schema (or a
    `$defs` entry) of an exported file, unchanged."""
    exported: dict[str, Any] = {}
    for name, model in MODELS.items():
        on_disk = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        for component, schema in components_of(on_disk, model.__name__).items():
            assert exported.setdefault(component, schema) == schema, component
    served = document["components"]["schemas"]
    assert served, "no components"
    for component, schema in served.items():
        assert component in exported, f"{component} is served but not in docs/schemas"
        assert schema == exported[component], f"{component} differs: run `make schemas`"


def _steer(case: Any, data: st.DataObject) -> None:
    """Half the time, put the key's namespace, a registered scope, a query and a known
    profile into the case, with a result limit the server allows and no foreign cursor."""
    if not data.draw(st.booleans(), label="steer"):
        return
    scope_ref = data.draw(st.sampled_from(SCOPE_REFS), label="scope_ref")
    profile = data.draw(st.sampled_from(PROFILES), label="profile")
    limit = data.draw(st.integers(1, 20), label="limit")
    query_text = data.draw(st.sampled_from(QUERIES), label="query_text")
    targets: list[dict[str, Any]] = []
    if isinstance(case.query, dict):
        targets.append(case.query)
    body = case.body
    if isinstance(body, dict):
        targets.append(body)
        if isinstance(body.get("records"), list):
            targets.extend(r for r in body["records"] if isinstance(r, dict))
    elif isinstance(body, list):
        targets.extend(r for r in body if isinstance(r, dict))
    for target in targets:
        if "namespace" in target:
            target["namespace"] = NAMESPACE
        if "scope_ref" in target:
            target["scope_ref"] = scope_ref
            target["query_text"] = query_text
            target.pop("phrase_plan", None)
        if "profile" in target:
            target["profile"] = profile
        for key in ("result_limit", "limit"):
            if key in target:
                target[key] = limit
        if "page_size" in target:
            target["page_size"] = target.get("result_limit", target.get("limit", limit))
        if "cursor" in target:
            target["cursor"] = None


def _orrery_error(response: Any) -> str | None:
    """Why an error response is not Orrery's shape with a code of its status, or None."""
    try:
        body = ErrorResponse.model_validate_json(response.content)
    except ValueError as exc:
        return f"not ErrorResponse: {str(exc)[:200]}"
    if HTTP_STATUS[body.error.code] != response.status_code:
        return f"code {body.error.code.value} is not a {response.status_code} code"
    return None


def _own_deadline(case: Any, response: Any) -> bool:
    """A `504 deadline_exceeded` of the deadline the request itself chose
    (`timeout_seconds`, down to microseconds): the answer asked for, not a server fault."""
    if response.status_code != 504 or not isinstance(case.body, dict):
        return False
    if "timeout_seconds" not in case.body:
        return False
    error = response.json().get("error", {})
    return bool(
        error.get("code") == "deadline_exceeded"
        and error.get("details", {}).get("timeout_seconds") == case.body["timeout_seconds"]
    )


def _fuzz(operation: Any, mode: Any, base_url: str, failures: list[str]) -> int:
    """Run `EXAMPLES` cases of one operation in one generation mode; the cases run."""
    strategy = operation.as_strategy(generation_mode=mode)
    cases = 0

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        nonlocal cases
        case = data.draw(strategy, label="case")
        if mode is schemathesis.GenerationMode.POSITIVE:
            _steer(case, data)
        response = case.call(base_url=base_url, headers=HEADERS, timeout=60)
        cases += 1
        label = f"{mode.value} {case.method} {case.formatted_path}"
        try:
            checks = CHECKS
            if _own_deadline(case, response):
                checks = [c for c in CHECKS if c is not not_a_server_error]
            case.validate_response(response, checks=checks, headers=HEADERS)
        except FailureGroup as group:
            titles = "; ".join(sorted({f.title for f in group.exceptions}))
            failures.append(
                f"{label} -> {response.status_code}: {titles}; "
                f"body={json.dumps(case.body, default=str)[:300]} "
                f"response={response.text[:300]}"
            )
            return
        if response.status_code >= 400:
            problem = _orrery_error(response)
            if problem is not None:
                failures.append(f"{label} -> {response.status_code}: {problem}")

    try:
        run()
    except Unsatisfiable:
        # Nothing of this operation can violate its schema (no body, no typed parameter).
        if mode is not schemathesis.GenerationMode.NEGATIVE or cases:
            raise
    return cases


def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(server: Server) -> None:
    base_url = f"http://127.0.0.1:{server.port}"
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures: list[str] = []
    cases = 0
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            cases += _fuzz(operation, mode, base_url, failures)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert cases >= MIN_CASES, f"only {cases} cases ran"
    # Every write the fuzzer got acknowledged is one the projector can apply.
    server.wait_projected(timeout=60, headers={"x-api-key": API_KEY})
