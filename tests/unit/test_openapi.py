"""`contracts.openapi`: the OpenAPI document says what the wire carries.

The embedded app's `/openapi.json` is checked live in `tests/e2e/test_openapi_fuzz.py`;
here the helpers, and the ingest-only app of the server deployment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import BaseModel

from contracts.admission import MAX_RECORD_BYTES
from contracts.errors import HTTP_STATUS, ErrorCode
from contracts.export_schemas import MODELS
from contracts.openapi import (
    COMPONENTS,
    components_of,
    error_responses,
    finish_document,
    operation,
)
from contracts.topk import TopKRequest, TopKResponse
from orrery.guard import MAX_BODY_BYTES_KEY

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def exported_components() -> dict[str, Any]:
    """Every schema of `docs/schemas/` (and each of its `$defs`) as an OpenAPI component."""
    out: dict[str, Any] = {}
    for name, model in MODELS.items():
        on_disk = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        for component, schema in components_of(on_disk, model.__name__).items():
            assert out.setdefault(component, schema) == schema, f"two {component} schemas"
    return out


def test_every_error_status_documents_exactly_its_codes() -> None:
    responses = error_responses()
    for code, status in HTTP_STATUS.items():
        schema = responses[str(status)]["content"]["application/json"]["schema"]
        ref, narrowing = schema["allOf"]
        assert ref == {"$ref": COMPONENTS + "ErrorResponse"}
        codes = narrowing["properties"]["error"]["properties"]["code"]["enum"]
        assert code.value in codes
        assert all(HTTP_STATUS[ErrorCode(c)] == status for c in codes)
    assert set(responses) == {str(s) for s in HTTP_STATUS.values()}


def test_operation_declares_body_and_success_by_reference() -> None:
    fragment = operation(body=TopKRequest, ok=TopKResponse)
    body = fragment["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": COMPONENTS + "TopKRequest"}
    ok = fragment["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": COMPONENTS + "TopKResponse"}


def test_an_unexported_model_cannot_be_documented() -> None:
    class Unlisted(BaseModel):
        x: int

    with pytest.raises(ValueError, match="not exported"):
        operation(ok=Unlisted)


def test_finish_document_adds_components_and_drops_framework_errors() -> None:
    declared = operation(body=TopKRequest, ok=TopKResponse)
    framework_422 = {
        "content": {"application/json": {"schema": {"$ref": COMPONENTS + "HTTPValidationError"}}}
    }
    generated: dict[str, Any] = {
        "openapi": "3.1.0",
        "paths": {
            "/q": {
                "post": {
                    "requestBody": declared["requestBody"],
                    "responses": {**declared["responses"], "422": framework_422},
                }
            }
        },
        "components": {"schemas": {"HTTPValidationError": {}, "ValidationError": {}}},
    }
    doc = finish_document(generated)
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert {"TopKRequest", "TopKResponse", "ErrorResponse", "QueryPlan"} <= set(schemas)
    responses = doc["paths"]["/q"]["post"]["responses"]
    assert responses["200"] == declared["responses"]["200"]
    assert {k: v for k, v in responses.items() if k != "200"} == error_responses()
    exported = exported_components()
    for name, schema in schemas.items():
        assert schema == exported[name], name


def test_finish_document_refuses_an_unresolved_reference() -> None:
    generated = {"paths": {"/x": {"get": {"responses": {"200": {"$ref": COMPONENTS + "Nowhere"}}}}}}
    with pytest.raises(ValueError, match="unresolved"):
        finish_document(generated)


def test_ingest_only_app_documents_bodies_and_orrery_errors() -> None:
    """The server deployment's ingest API (`orrery ingest-api`)."""
    from fastapi.testclient import TestClient

    from ingest.entrypoints.http import create_router
    from orrery.http import build_app

    # Documenting the routes touches no store.
    router = create_router(
        store=cast(Any, None),
        grants={},
        max_batch=10,
        vector_dimension=None,
        max_record_bytes=MAX_RECORD_BYTES,
    )
    with TestClient(build_app("Orrery ingest", [router], max_body_bytes=1_000)) as client:
        doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(doc)
    post = doc["paths"]["/v1/records"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": COMPONENTS + "WriteRequest"}
    for path_item in doc["paths"].values():
        for method, op in path_item.items():
            for status, response in error_responses().items():
                got = op["responses"][status]
                if status == "413" and method in ("post", "put", "patch"):
                    # The request guard's limit said (`orrery.guard.BodyLimits.document`).
                    assert op[MAX_BODY_BYTES_KEY] == 1_000
                    assert got["description"] == (
                        f"{response['description']}; a body over 1000 bytes "
                        "(ORRERY_MAX_BODY_BYTES) is `body_too_large` with "
                        "details.max_body_bytes = 1000"
                    )
                    got = {**got, "description": response["description"]}
                assert got == response
    exported = exported_components()
    for name, schema in doc["components"]["schemas"].items():
        assert schema == exported[name], f"{name}: run `make schemas`"
