"""The OpenSearch bulk body (`projector.adapters.opensearch_lexical._bulk_body`): byte for
byte what serializing each NDJSON line's dict with pydantic-core makes (the body as built
before session 27), for upserts and deletes of any ids and texts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from contracts.index import IndexDocument
from projector.adapters.opensearch_lexical import _analyzed, _bulk_body, _engine_id, _source

# Texts: any code point, lone surrogates too (`_analyzed` replaces them); keywords and
# ids: valid Unicode (validated upstream; neither body serializes a surrogate there).
TEXT = st.text(st.characters(codec=None), max_size=40)
WORD = st.text(st.characters(codec="utf-8"), max_size=40)
IDS = st.one_of(WORD, st.text(min_size=400, max_size=600), st.just("#sha256:x"))


def _reference(index: str, operations: list[Any], combined: bool) -> bytes:
    lines: list[dict[str, Any]] = []
    for operation in operations:
        if isinstance(operation, IndexDocument):
            meta = {
                "_index": index,
                "_id": _engine_id(operation.document_id),
                "version": operation.revision,
                "version_type": "external",
            }
            lines.append({"index": meta})
            lines.append(_source(operation, combined))
        else:
            document_id, revision = operation
            meta = {
                "_index": index,
                "_id": _engine_id(document_id),
                "version": revision,
                "version_type": "external_gte",
            }
            lines.append({"delete": meta})
    return b"\n".join([to_json(line) for line in lines]) + b"\n"


documents = st.builds(
    IndexDocument,
    document_id=IDS,
    revision=st.integers(1, 2**63 - 1),
    item_id=WORD,
    galaxy=WORD,
    ring=st.sampled_from(["", "a", "a/b/c"]),
    status=WORD,
    updated_at=st.datetimes(
        min_value=datetime(1970, 1, 2),
        max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from([UTC, datetime.now().astimezone().tzinfo]),
    ).map(lambda d: d + timedelta(0)),
    visibility=st.lists(WORD, max_size=2).map(tuple),
    facets=st.dictionaries(WORD, st.lists(WORD, max_size=2).map(tuple), max_size=2),
    title=TEXT,
    body=TEXT,
    tags=st.lists(TEXT, max_size=3).map(tuple),
)
deletes = st.tuples(IDS, st.integers(1, 2**63 - 1))


@settings(max_examples=150, deadline=None)
@given(
    index=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    operations=st.lists(st.one_of(documents, deletes), max_size=6),
    combined=st.booleans(),
)
def test_the_bulk_body_is_the_lines_serialized_one_by_one(
    index: str, operations: list[Any], combined: bool
) -> None:
    assert _bulk_body(index, operations, combined) == _reference(index, operations, combined)


@given(TEXT)
def test_analyzed_text_replaces_what_is_not_unicode_and_keeps_the_rest(text: str) -> None:
    assert _analyzed(text) == text.encode("utf-8", "replace").decode("utf-8")
