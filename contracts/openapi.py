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

- fills in the deployment's facts (`DEPLOYMENT`): a field whose refusal depends on the
  server's configuration — the largest result limit, the embedder's dimension, the
  fusion profiles it knows — carries `x-orrery-deployment: <fact>` in its schema, with
  the default deployment's bound in `docs/schemas/`; the served document puts this
  server's value there (and lists the facts under `info.x-orrery-deployment`), so a
  request valid for the served document is never refused for them.

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
    "DEPLOYMENT",
    "apply_facts",
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
DEPLOYMENT = "x-orrery-deployment"


def _apply_fact(node: dict[str, Any], value: Any) -> None:
    """One fact into the schema node that names it (its `anyOf` branches included):
    an integer is the `maximum` of an integer and the exact length of an array; a list
    is the `enum` of a string (with null where null is allowed)."""
    branches = node.get("anyOf", [])
    nullable = any(b.get("type") == "null" for b in branches)
    if isinstance(value, int):
        for keyword in ("maximum",) if "maximum" in node else ():
            node[keyword] = value
        for keyword in ("minItems", "maxItems"):
            if keyword in node:
                node[keyword] = value
    for branch in [node, *branches]:
        kind = branch.get("type")
        if isinstance(value, int) and kind == "integer":
            branch["maximum"] = value
        elif isinstance(value, int) and kind == "array":
            branch["minItems"] = branch["maxItems"] = value
        elif isinstance(value, list) and kind == "string":
            branch["enum"] = list(value)
    if isinstance(value, list) and "enum" in node:
        node["enum"] = [*value, None] if nullable else list(value)


def apply_facts(schema: Any, facts: dict[str, Any]) -> Any:
    """`schema` (in place) with every node that names a fact of `facts` (`DEPLOYMENT`)
    given its value; a fact not in `facts` keeps the default deployment's bound."""
    if isinstance(schema, dict):
        name = schema.get(DEPLOYMENT)
        if isinstance(name, str) and facts.get(name) is not None:
            _apply_fact(schema, facts[name])
        for value in schema.values():
            apply_facts(value, facts)
    elif isinstance(schema, list):
        for value in schema:
            apply_facts(value, facts)
    return schema


def finish_document(
    document: dict[str, Any], facts: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of a generated OpenAPI `document` made true to the wire (module docstring),
    with this deployment's `facts` (`DEPLOYMENT`) filled in."""
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
    if facts:
        apply_facts(schemas, facts)
        doc.setdefault("info", {})[DEPLOYMENT] = facts
    return doc
