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

The document is as strict as the server (issue 22: 907 schema-valid requests were
`422`): a negative case (violating the schema) must be a 4xx (schemathesis's
`negative_data_rejection`, type mutations included); a positive case may be refused
only with a status a valid request can meet (401, 403, 404, 409, 429) or with one of
`STATE_CODES`, refusals that depend on the server's state or configuration and that no
schema can say (an unknown profile, the embedder's dimension, …) — never
`invalid_request` or `unknown_field`. And a quarter of the positive cases with a JSON
object body are sent once more with one integer, boolean or object field given another JSON
type (`true`, `"2"`, `"yes"`, `false`, …): that must be `422`, never coerced.

`ORRERY_FUZZ_EXAMPLES` (default 50) sets the cases per operation and mode.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi._hypothesis import _draw_negated_locations
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from contracts.errors import HTTP_STATUS, ErrorResponse
from contracts.export_schemas import MODELS
from contracts.openapi import COMPONENTS, DEPLOYMENT, apply_facts, components_of, error_responses
from orrery.guard import MAX_BODY_BYTES_KEY
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
# Statuses a schema-valid request can meet: its key, a resource that does not exist, a
# conflict with what is stored, pacing.
VALID_REFUSALS = {401, 403, 404, 409, 429}
# Refusals of schema-valid requests that depend on the server's state or configuration
# (docs/reliability.md, "Strict types"): profiles and vocabularies registered, the
# embedder's dimension, the configured result limit and batch size, a query that names
# nothing to rank, cursors and generations that come and go.
STATE_CODES = {
    "unknown_profile",
    "unknown_search_profile",
    "unknown_vocabulary",
    "unknown_chunk",
    "embedder_mismatch",
    "result_limit_exceeded",
    "batch_too_large",
    "empty_query",
    "phrase_set_too_large",
    "invalid_continuation",
    "expired_continuation",
    "generation_unavailable",
}
# Refusals of schema-valid requests still open (docs/reliability.md), by the beginning
# of their messages: rules across fields JSON Schema cannot compare, and two the
# ChonkyDB dialect's own work decides (issue 22: Twinr's index names and record identity).
CROSS_FIELD = (
    "page_size replaces the result limit",
    "profile rrf",
    "give either temporal_start",
    "give either temporal_end",
    "a chunk id is both used and ignored",
    "allowed_indexes:",
    "the item has no",
    # An integer of more than 20 digits inside a free-form payload (`contracts.wire`).
    "the body is not valid JSON: an integer of",
    # The deployment's shape: the embedded engines keep one shard with one copy (issue 23).
    "tantivy and qdrant-edge keep a generation in one shard",
)
# The door's value rules no JSON Schema keyword states (`contracts.admission`, issue 22):
# float32's range and a non-zero length for vectors, keyword bytes, facet counts (a
# record's size is 413 record_too_large, not one of them).
ADMISSION_TYPES = {
    "vector_not_finite",
    "vector_zero",
    "embedder_mismatch",
    "keyword_too_long",
    "too_many_facets",
    "not_unicode",
}


def _admission_refusal(error: dict[str, Any]) -> bool:
    """Whether a 422 refuses records only for `ADMISSION_TYPES` reasons."""
    records = (error.get("details") or {}).get("records")
    if error.get("code") != "invalid_request" or not isinstance(records, list) or not records:
        return False
    types = [e.get("type") for r in records for e in r.get("errors", [])]
    return bool(types) and all(t in ADMISSION_TYPES for t in types)


# Another JSON type for a field of each type: what lax parsers coerce.
COERCED: dict[str, list[Any]] = {
    "integer": [True, "2", 2.5],
    "boolean": ["yes", "true", 1],
    "object": [False, "{}", []],
}
SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("fuzz") / "data",
        "--sample",
        env={"ORRERY_API_KEYS": f"{API_KEY}={NAMESPACE}", "ORRERY_ADMIN_KEY": ADMIN_KEY},
    )
    try:
        # The sample corpus is embedded on start: minutes on a loaded 2-core machine.
        srv.wait_projected(timeout=600, headers={"x-api-key": API_KEY})
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
                if status == "413" and MAX_BODY_BYTES_KEY in op:
                    # The guard's limit said (`orrery.guard.BodyLimits.document`).
                    assert got["description"].startswith(response["description"]), where
                    got = {**got, "description": response["description"]}
                schema = got["content"]["application/json"]["schema"]
                error = response["content"]["application/json"]["schema"]
                if "anyOf" in schema and schema["anyOf"][-1] == error:
                    # The route's own body for this status too (`operation(also=…)`:
                    # readiness is 503 with its body while not ready), or the error.
                    assert _all_refs({"anyOf": schema["anyOf"][:-1]}), f"{where} {status}"
                    assert got["description"] == response["description"], f"{where} {status}"
                    continue
                assert got == response, f"{where} {status}"


BODY_METHODS = ("post", "put", "patch")


def test_every_body_route_declares_413_and_an_oversized_body_gets_it(
    server: Server, document: dict[str, Any]
) -> None:
    """Every operation that carries a body (POST/PUT/PATCH) declares its body limit
    (`x-orrery-max-body-bytes`, the request guard's own `BodyLimits`) and a `413` whose
    codes include `body_too_large`; a request declaring one byte more than that limit
    gets exactly `413 body_too_large` with `details.max_body_bytes` = the declared limit
    (sent raw: the KoutenDB import's limit is 2 GiB, refused from its `Content-Length`).
    And a chunked body (no `Content-Length`) one byte over is refused the same way."""
    bounded = [
        (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in BODY_METHODS
    ]
    assert len(bounded) >= 10
    for method, path, op in bounded:
        where = f"{method.upper()} {path}"
        limit = op.get(MAX_BODY_BYTES_KEY)
        assert isinstance(limit, int) and limit > 0, where
        schema = op["responses"]["413"]["content"]["application/json"]["schema"]
        codes = [c for part in schema["allOf"] for c in _codes_of(part)]
        assert "body_too_large" in codes, where
        assert f"a body over {limit} bytes" in op["responses"]["413"]["description"], where
        status, body = _declared_oversize(server.port, method, _filled(path), limit)
        assert status == 413, f"{where}: {status} {body[:200]!r}"
        error = json.loads(body)["error"]
        assert error["code"] == "body_too_large", where
        assert error["details"] == {"max_body_bytes": limit}, where
    limit = document["paths"]["/v1/records"]["post"][MAX_BODY_BYTES_KEY]
    chunk = b" " * 65_536

    def chunks() -> Iterator[bytes]:
        sent = 0
        while sent <= limit:
            piece = chunk[: limit + 1 - sent]
            sent += len(piece)
            yield piece

    response = httpx.post(
        f"http://127.0.0.1:{server.port}/v1/records",
        content=chunks(),
        headers={**HEADERS, "content-type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 413, response.text[:200]
    assert response.json()["error"]["code"] == "body_too_large"
    assert response.json()["error"]["details"] == {"max_body_bytes": limit}


def _codes_of(part: dict[str, Any]) -> list[str]:
    error = part.get("properties", {}).get("error", {})
    return list(error.get("properties", {}).get("code", {}).get("enum", ()))


def _filled(path: str) -> str:
    """`path` with each `{parameter}` given a plain value (the guard answers before any
    route reads it)."""
    return re.sub(r"\{[^}]+\}", "x1", path)


def _declared_oversize(port: int, method: str, path: str, limit: int) -> tuple[int, bytes]:
    """The status and body of a request whose `Content-Length` is `limit + 1`, of which
    only a few bytes are sent (the guard refuses it from the header)."""
    head = (
        f"{method.upper()} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {limit + 1}\r\n"
        f"x-api-key: {API_KEY}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + b"{}")
        received = b""
        while b"\r\n\r\n" not in received or len(received.partition(b"\r\n\r\n")[2]) < _length(
            received
        ):
            data = sock.recv(65_536)
            if not data:
                break
            received += data
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def _length(received: bytes) -> int:
    headers = received.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    found = re.search(r"content-length:\s*(\d+)", headers)
    return int(found.group(1)) if found else 0


def _all_refs(schema: dict[str, Any]) -> bool:
    """A component, or `anyOf` components (a path that takes two shapes)."""
    options = schema.get("anyOf", [schema])
    return all(str(o.get("$ref", "")).startswith(COMPONENTS) for o in options)


def test_openapi_components_equal_docs_schemas(document: dict[str, Any]) -> None:
    """`docs/schemas/` and `/openapi.json` agree: every component is the schema (or a
    `$defs` entry) of an exported file, unchanged but for the deployment's facts (the
    server's result limit, profiles and embedder dimension, `contracts.openapi`)."""
    facts = document["info"][DEPLOYMENT]
    assert facts["vector_dimension"] == 384 and facts["max_result_limit"] == 500
    assert "weighted@3" in facts["fusion_profiles"]
    exported: dict[str, Any] = {}
    for name, model in MODELS.items():
        on_disk = apply_facts(json.loads((SCHEMAS / f"{name}.schema.json").read_text()), facts)
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
    (`timeout_seconds`, or the KoutenDB envelope's `timeoutSeconds`, down to
    microseconds): the answer asked for, not a server fault."""
    if response.status_code != 504 or not isinstance(case.body, dict):
        return False
    chosen = [case.body[k] for k in ("timeout_seconds", "timeoutSeconds") if k in case.body]
    if len(chosen) != 1:
        return False
    error = response.json().get("error", {})
    return bool(
        error.get("code") == "deadline_exceeded"
        and error.get("details", {}).get("timeout_seconds") == chosen[0]
    )


def _refused_valid(response: Any) -> str | None:
    """Why a schema-valid request's answer shows the document looser than the server."""
    status = response.status_code
    if status < 400 or status >= 500 or status in VALID_REFUSALS:
        return None
    try:
        error = response.json()["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without Orrery's error shape"
    if code in STATE_CODES or message.startswith(CROSS_FIELD) or _admission_refusal(error):
        return None
    return f"schema-valid request refused: {status} {code}: {response.text[:300]}"


def _resolve(schema: Any, components: dict[str, Any]) -> dict[str, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        schema = components[schema["$ref"].removeprefix(COMPONENTS)]
    return schema if isinstance(schema, dict) else {}


def _open_item(response: Any) -> bool:
    try:
        return str(response.json()["error"]["message"]).startswith(CROSS_FIELD)
    except (ValueError, KeyError, TypeError):
        return False


def _body_schema(
    operation: Any, body: dict[str, Any], components: dict[str, Any]
) -> dict[str, Any] | None:
    """The component schema of an operation's JSON body that `body` is an instance of
    (of a path taking two shapes, the one declaring every key of `body`), or None."""
    content = operation.definition.raw.get("requestBody", {}).get("content", {})
    schema = _resolve(content.get("application/json", {}).get("schema"), components)
    branches = [_resolve(s, components) for s in schema.get("anyOf", [schema])]
    for branch in branches:
        properties = branch.get("properties")
        if isinstance(properties, dict) and set(body) <= set(properties):
            return branch
    return None


def _kind(prop: dict[str, Any]) -> str | None:
    kinds = {prop.get("type")} if "type" in prop else {o.get("type") for o in prop.get("anyOf", [])}
    kinds.discard("null")
    kinds.discard(None)
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    return kind if kind in COERCED else None


def _coerce(
    operation: Any,
    case: Any,
    data: st.DataObject,
    base_url: str,
    failures: list[str],
    components: dict[str, Any],
) -> int:
    """Half the time: send `case` once more with one typed field of its JSON body given
    another JSON type; that must be `422`. The cases sent (0 or 1)."""
    if not isinstance(case.body, dict) or data.draw(st.integers(0, 3), label="coerce") != 0:
        return 0
    schema = _body_schema(operation, case.body, components)
    if schema is None:
        return 0
    properties = {n: _resolve(p, components) for n, p in schema["properties"].items()}
    typed = sorted(name for name, prop in properties.items() if _kind(prop) is not None)
    if not typed:
        return 0
    name = data.draw(st.sampled_from(typed), label="coerced field")
    value = data.draw(st.sampled_from(COERCED[str(_kind(properties[name]))]), label="value")
    body = {**case.body, name: value}
    response = httpx.request(
        case.method,
        base_url + case.formatted_path,
        params=case.query,
        headers={**HEADERS, "content-type": "application/json"},
        content=json.dumps(body).encode(),
        timeout=60,
    )
    if response.status_code != 422 and not _open_item(response):
        failures.append(
            f"coerced {case.method} {case.formatted_path} {name}={value!r} -> "
            f"{response.status_code}: {response.text[:200]}"
        )
    return 1


def _fuzz(
    operation: Any, mode: Any, base_url: str, failures: list[str], components: dict[str, Any]
) -> int:
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
        if mode is schemathesis.GenerationMode.POSITIVE:
            problem = _refused_valid(response)
            if problem is not None:
                failures.append(
                    f"{label}: {problem}; body={json.dumps(case.body, default=str)[:300]}"
                )
            cases += _coerce(operation, case, data, base_url, failures, components)
        try:
            checks = CHECKS
            if mode is schemathesis.GenerationMode.NEGATIVE:
                checks = [*CHECKS, negative_data_rejection]
            if _own_deadline(case, response):
                checks = [c for c in checks if c is not not_a_server_error]
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

    run()
    return cases


# The locations a negative case may break, all of them (schemathesis 4.32's own choice,
# asked with every coin landing on "break it"): none when no query parameter exists, no
# path parameter or header has a constraint a value can violate, and no body schema can
# be violated.
_ALL_LOCATIONS = dict.fromkeys(
    (
        ParameterLocation.PATH,
        ParameterLocation.HEADER,
        ParameterLocation.COOKIE,
        ParameterLocation.QUERY,
    )
)


def _negatable(operation: Any) -> bool:
    """Whether schemathesis can make a negative case of `operation`. Without one it draws,
    rejects every draw and gives up after ~460 (`Unsatisfiable`) whatever `EXAMPLES` is:
    16 operations here, a sixth of the run's time, and not one request sent."""
    return (
        _draw_negated_locations(
            lambda _strategy: True,
            operation,
            schemathesis.GenerationMode.NEGATIVE,
            explicit=_ALL_LOCATIONS,
            body_is_generated=True,
        )
        is not None
    )


# ~3,300 cases (41 operations positive, 25 of them negative too, 50 each) and the coerced
# resends: minutes, longer than the suite's 300 s default on a busy machine.
@pytest.mark.timeout(1200)
def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(server: Server) -> None:
    base_url = f"http://127.0.0.1:{server.port}"
    document = httpx.get(f"{base_url}/openapi.json").json()
    # A negative case may be too large (more records than the batch allows, a body over
    # the guard's limit): 413, which every body-carrying operation declares
    # (`test_every_body_route_declares_413_and_an_oversized_body_gets_it`), is a rejection.
    config = SchemathesisConfig.from_dict(
        {
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]
                }
            }
        }
    )
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)
    components = document["components"]["schemas"]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures: list[str] = []
    cases = 0
    negated = 0
    for operation in operations:
        cases += _fuzz(
            operation, schemathesis.GenerationMode.POSITIVE, base_url, failures, components
        )
        if _negatable(operation):
            negated += 1
            cases += _fuzz(
                operation, schemathesis.GenerationMode.NEGATIVE, base_url, failures, components
            )
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    assert cases >= MIN_CASES, f"only {cases} cases ran"
    # 25 of 41 operations have something to break (a query parameter, a constrained path
    # parameter, a body); far fewer would mean the question above stopped being asked right.
    assert negated >= 20, f"negative cases for only {negated} operations"
    # Every write the fuzzer got acknowledged is one the projector can apply.
    server.wait_projected(timeout=60, headers={"x-api-key": API_KEY})
