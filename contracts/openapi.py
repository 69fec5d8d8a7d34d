"""What `/openapi.json` says about Orrery's wire formats, as plain dicts (no framework).

The routes parse their bodies by hand (`contracts.wire.loads_strict`, then the model), so
a web framework sees neither the request model nor Orrery's error shape. Each route
declares both with `operation(...)` (merged into its `openapi_extra` next to
`contracts.auth.declare`), and every app passes its generated document through
`finish_document`, which

- adds the component schema of every model a route names, taken from the same JSON
  Schema `contracts.export_schemas` writes to `docs/schemas/` (`$defs` become components),
  so the two never disagree;
- documents every error response on every operation in Orrery's shape
  (`contracts.errors.ErrorResponse`), one response per status of `HTTP_STATUS`, each
  restricted to that status's codes — a new `ErrorCode` appears without an edit here;
- drops the framework's own validation-error schemas, which Orrery never sends.

Guarantee: every `$ref` in a finished document resolves to one of its components, or
`finish_document` raises `ValueError`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from typing import Any

from pydantic import BaseModel

from contracts.errors import HTTP_STATUS, ErrorCode, ErrorResponse

__all__ = [
    "COMPONENTS",
    "components_of",
    "error_responses",
    "finish_document",
    "operation",
    "wire_models",
]

COMPONENTS = "#/components/schemas/"
_LOCAL_DEFS = "#/$defs/"
_JSON = "application/json"
# What a framework documents for its own request validation; Orrery answers
# `ErrorResponse` instead (`invalid_request`, `unknown_field`, …).
_FRAMEWORK_SCHEMAS = ("HTTPValidationError", "ValidationError")


def _ref(model: type[BaseModel]) -> dict[str, str]:
    if wire_models().get(model.__name__) is not model:
        raise ValueError(
            f"{model.__module__}.{model.__name__} is not exported "
            "(add it to contracts.export_schemas.MODELS)"
        )
    return {"$ref": COMPONENTS + model.__name__}


def operation(
    *,
    ok: type[BaseModel] | tuple[type[BaseModel], ...],
    status: int = 200,
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None,
    body_required: bool = True,
    accepted: type[BaseModel] | None = None,
    also: dict[int, type[BaseModel]] | None = None,
) -> dict[str, Any]:
    """The `openapi_extra` fragment of a route: its JSON request body (`body`) and its
    success response (`ok` with `status`). Error responses are `finish_document`'s. A
    tuple of models is a path that takes (or answers) any one of them (`anyOf`), e.g.
    Orrery's own shape and a dialect's. `accepted`: the body of a `202` the route also
    answers (work accepted to finish later). `also`: error statuses the route answers
    with a model of its own too (`GET /v1/readiness`: 503 with the readiness body while
    not ready), besides the error shape."""
    fragment: dict[str, Any] = {
        "responses": {
            str(status): {"content": {_JSON: {"schema": _schema(ok)}}},
        }
    }
    if accepted is not None:
        fragment["responses"]["202"] = {"content": {_JSON: {"schema": _schema(accepted)}}}
    for error_status, model in (also or {}).items():
        fragment["responses"][str(error_status)] = {
            _ALSO: True,
            "content": {_JSON: {"schema": _schema(model)}},
        }
    if body is not None:
        fragment["requestBody"] = {
            "required": body_required,
            "content": {_JSON: {"schema": _schema(body)}},
        }
    return fragment


def _schema(models: type[BaseModel] | tuple[type[BaseModel], ...]) -> dict[str, Any]:
    if isinstance(models, tuple):
        return {"anyOf": [_ref(m) for m in models]}
    return _ref(models)


def error_responses() -> dict[str, dict[str, Any]]:
    """One OpenAPI response per error status of `HTTP_STATUS`: `ErrorResponse` with the
    codes of exactly that status."""
    by_status: dict[int, list[ErrorCode]] = {}
    for code, status in HTTP_STATUS.items():
        by_status.setdefault(status, []).append(code)
    out: dict[str, dict[str, Any]] = {}
    for status in sorted(by_status):
        codes = [code.value for code in by_status[status]]
        schema = {
            "allOf": [
                {"$ref": COMPONENTS + ErrorResponse.__name__},
                {"properties": {"error": {"properties": {"code": {"enum": codes}}}}},
            ]
        }
        out[str(status)] = {
            "description": "Error: " + ", ".join(f"`{c}`" for c in codes),
            "content": {_JSON: {"schema": schema}},
        }
    return out


@cache
def wire_models() -> dict[str, type[BaseModel]]:
    """Every exported wire model by class name (`contracts.export_schemas.MODELS`)."""
    from contracts.export_schemas import MODELS

    by_name: dict[str, type[BaseModel]] = {}
    for model in MODELS.values():
        if by_name.setdefault(model.__name__, model) is not model:
            raise ValueError(f"two exported models are named {model.__name__!r}")
    return by_name


def components_of(schema: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """An exported JSON Schema (`docs/schemas/*.schema.json`, local `#/$defs/` refs) as
    OpenAPI components: itself under `name`, each of its `$defs` under its own name."""
    rewritten = _rewrite_refs(copy.deepcopy(schema))
    defs = rewritten.pop("$defs", {})
    return {**defs, name: rewritten}


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_LOCAL_DEFS):
            node["$ref"] = COMPONENTS + ref.removeprefix(_LOCAL_DEFS)
        for value in node.values():
            _rewrite_refs(value)
    elif isinstance(node, list):
        for value in node:
            _rewrite_refs(value)
    return node


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


# Marks a route's own model for an error status (`operation(also=…)`), kept by
# `finish_document` next to the error shape.
_ALSO = "x-orrery-also"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def finish_document(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of a generated OpenAPI `document` made true to the wire (module docstring)."""
    doc = copy.deepcopy(document)
    errors = error_responses()
    for path_item in doc.get("paths", {}).values():
        for method in _METHODS:
            op = path_item.get(method)
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            also = {}
            for status in [s for s in responses if s[:1] in ("4", "5")]:
                response = responses.pop(status)
                if response.get(_ALSO):
                    also[status] = response["content"][_JSON]["schema"]
            responses.update(copy.deepcopy(errors))
            for status, schema in also.items():
                error = responses[status]["content"][_JSON]["schema"]
                responses[status]["content"][_JSON]["schema"] = {"anyOf": [schema, error]}
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in _FRAMEWORK_SCHEMAS:
        schemas.pop(name, None)
    models = wire_models()
    wanted = {ref.removeprefix(COMPONENTS) for ref in _refs(doc.get("paths", {}))}
    for name in sorted(wanted & models.keys()):
        for component, schema in components_of(models[name].model_json_schema(), name).items():
            if schemas.setdefault(component, schema) != schema:
                raise ValueError(f"two different schemas are named {component!r}")
    missing = {
        ref
        for ref in _refs(doc)
        if not ref.startswith(COMPONENTS) or ref.removeprefix(COMPONENTS) not in schemas
    }
    if missing:
        raise ValueError(f"unresolved $ref in the OpenAPI document: {sorted(missing)}")
    return doc
