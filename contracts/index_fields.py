"""Field names of a lexical index, shared by the side that writes it and the side that reads it.

Stdlib only: engines build their schemas from these names in their own adapters.

Text fields (`TEXT_FIELDS`) are analyzed by `TEXT_ANALYZER`: split on every character that
is not alphanumeric, drop tokens longer than `TEXT_TOKEN_MAX_BYTES`, lowercase, fold to
ASCII ("Früher" -> "fruher", "Straße" -> "strasse"). Query text must be analyzed the same
way. Keyword fields hold exact values; `FACETS` holds one `name=value` term per facet value.
"""

from __future__ import annotations

__all__ = [
    "BODY",
    "DOCUMENT_ID",
    "FACETS",
    "FACET_SEPARATOR",
    "GALAXY",
    "ITEM_ID",
    "REVISION",
    "RING",
    "STATUS",
    "TAGS",
    "TEXT_ANALYZER",
    "TEXT_FIELDS",
    "TEXT_TOKEN_MAX_BYTES",
    "TITLE",
    "UPDATED_AT",
    "UPDATED_AT_MICROS",
    "VISIBILITY",
]

# Text fields, BM25-scored.
TITLE = "title"
BODY = "body"
TAGS = "tags"
TEXT_FIELDS = (TITLE, BODY, TAGS)

# Keyword and numeric fields: identity, filters, what a candidate reports.
DOCUMENT_ID = "document_id"
REVISION = "revision"
ITEM_ID = "item_id"
GALAXY = "galaxy"
RING = "ring"
STATUS = "status"
VISIBILITY = "visibility"
FACETS = "facets"
UPDATED_AT = "updated_at"
# `updated_at` as integer microseconds since the Unix epoch (UTC): exact range filters on
# engines whose date type truncates (tantivy indexes dates at second precision).
UPDATED_AT_MICROS = "updated_at_us"

# A facet value is indexed as the single term f"{name}{FACET_SEPARATOR}{value}".
FACET_SEPARATOR = "="

# Name under which engines that register analyzers register the text analyzer; the
# suffix is bumped whenever its behaviour changes, since that needs a new generation.
TEXT_ANALYZER = "orrery_text_v1"
TEXT_TOKEN_MAX_BYTES = 40
