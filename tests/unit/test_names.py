from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from schemathesis.core.jsonschema.patterns import enforced_pattern

from contracts.events import topic_for
from contracts.names import (
    NAMESPACE_PATTERN,
    TOKEN_MAX_LENGTH,
    check_namespace,
    namespace_token,
)
from contracts.records import Record, derive_document_id
from contracts.topk import TopKRequest

# What Twinr builds (`twinr_longterm_v1:<project dir name>:<sha1[:12]>`) and other
# names that must be accepted, yet never become a name as they are.
VALID = [
    "demo",
    "twinr-prod",
    "twinr_longterm_v1.home",
    "twinr_longterm_v1:twinr:deff13356ec6",
    "twinr_longterm_v1:Mein Zuhause (alt):a7f1ed265838",
    "twinr_longterm_v1:日本語のルート:0123456789ab",
    "Demo",
    "..",
    ".",
    "..:..",
    "%2e%2e",
    "a*b?c<d>e|f\"g'h,i#j",
    "emoji 🪐 name",
    "x" * 255,
    "ü" * 255,
]
INVALID = [
    "",
    "../etc",
    "a/b",
    "a\\b",
    "nul\x00",
    "line\nbreak",
    "tab\t",
    "del\x7f",
    "c1\x85",
    "sep\u2028x",
    "lone\ud800surrogate",
    " leading",
    "trailing ",
    "x" * 256,
]


@pytest.mark.parametrize("namespace", VALID)
def test_namespace_rule_accepts(namespace: str) -> None:
    assert check_namespace(namespace) == namespace
    assert Record(namespace=namespace, snapshot_kind="objects", item_id="x", revision=1)
    assert TopKRequest(namespace=namespace, scope_ref="longterm:objects:current")


@pytest.mark.parametrize("namespace", INVALID)
def test_namespace_rule_rejects(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        check_namespace(namespace)
    with pytest.raises(ValidationError):
        Record(namespace=namespace, snapshot_kind="objects", item_id="x", revision=1)
    with pytest.raises(ValidationError):
        TopKRequest(namespace=namespace, scope_ref="longterm:objects:current")


def test_schema_pattern_is_the_rule() -> None:
    """The JSON Schema pattern is the rule on every text a JSON body can carry (a lone
    surrogate only as an escape, which the body loader refuses first), and every JSON
    Schema validator's regex engine compiles it (schemathesis keeps it)."""
    pattern = re.compile(NAMESPACE_PATTERN)
    for namespace in VALID:
        assert pattern.fullmatch(namespace), namespace
    for namespace in INVALID:
        if any(0xD800 <= ord(c) <= 0xDFFF for c in namespace):
            continue
        assert not pattern.fullmatch(namespace), namespace
    assert enforced_pattern(NAMESPACE_PATTERN) == NAMESPACE_PATTERN
    schema = TopKRequest.model_json_schema()["properties"]["namespace"]
    assert schema["pattern"] == NAMESPACE_PATTERN


# Kafka topics, OpenSearch index/alias names (lowercase; no `\/*?"<>| ,#:`), Qdrant
# collections, file names: the intersection, without `.` (the alias separator).
_SAFE_TOKEN = re.compile(rf"[a-z0-9_-]{{1,{TOKEN_MAX_LENGTH}}}")


@pytest.mark.parametrize("namespace", [*VALID, *INVALID[1:]])
def test_token_is_safe_everywhere(namespace: str) -> None:
    token = namespace_token(namespace)
    assert _SAFE_TOKEN.fullmatch(token), token
    assert token not in {".", ".."}
    topic = topic_for("orrery.records", namespace)
    assert len(topic) <= 249 and re.fullmatch(r"[A-Za-z0-9._-]+", topic)


def test_plain_names_keep_their_names() -> None:
    assert namespace_token("demo") == "demo"
    assert namespace_token("twinr-prod") == "twinr-prod"
    assert topic_for("orrery.records", "demo") == "orrery.records.demo"


def test_tokens_are_distinct_and_deterministic() -> None:
    names = [*VALID, "DEMO", "demo ", "Demo", "twinr_longterm_v1:twinr:deff13356ec7"]
    tokens = {namespace_token(n) for n in set(names)}
    assert len(tokens) == len(set(names))
    assert namespace_token("Demo") != namespace_token("demo")  # OpenSearch folds case
    assert namespace_token("a.b") != namespace_token("a_b")
    assert [namespace_token(n) for n in VALID] == [namespace_token(n) for n in VALID]
    # A hashed token starts with `_`, which a plain one never does.
    assert namespace_token("_x-aaaaaaaaaaaaaaaaaaaaaaaaaa").startswith("_")
    assert namespace_token("x" * 65) != "x" * 65


def test_twinr_namespace_token_is_readable() -> None:
    token = namespace_token("twinr_longterm_v1:twinr:deff13356ec6")
    assert token.startswith("_twinr-longterm-v1-twinr-")


def test_identity_rule_unchanged() -> None:
    # derive_document_id hashes the namespace itself, never its token.
    ns = "twinr_longterm_v1:twinr:deff13356ec6"
    assert derive_document_id(ns, "objects", "x") != derive_document_id(
        namespace_token(ns), "objects", "x"
    )
