"""Field names of a lexical index, shared by the side that writes it and the side that reads it.

Stdlib only: engines build their schemas from these names in their own adapters.

Text fields (`TEXT_FIELDS`) are analyzed by the generation's text analyzer. Version 1
(`TEXT_ANALYZER_V1`): split on every character that is not alphanumeric, drop tokens of
`TEXT_TOKEN_MAX_BYTES` bytes or more, lowercase, fold to ASCII ("Früher" -> "fruher",
"Straße" -> "strasse"). Version 2 (`text_analyzer_name(language)`, e.g.
"orrery_text_v2_english") is version 1 followed by the Snowball stemmer of the
namespace's language ("running", "runs" -> "run"; "none" = no stemming), and adds the
combined field `TEXT` (title, body and tags in one field, so that one BM25 field can score
a document). A generation records its analyzer in its index (and its schema digest); query
text is analyzed with the analyzer of the generation it searches, never with a guess.
Keyword fields hold exact values; `FACETS` holds one `name=value` term per facet value.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

__all__ = [
    "BODY",
    "DEFAULT_TEXT_ANALYZER",
    "DEFAULT_TEXT_LANGUAGE",
    "DOCUMENT_ID",
    "DOCUMENT_KEY_HIGH",
    "DOCUMENT_KEY_LOW",
    "FACETS",
    "FACET_SEPARATOR",
    "GALAXY",
    "HIDDEN_FACET",
    "ITEM_ID",
    "NO_STEMMING",
    "REVISION",
    "RING",
    "RING_PATH",
    "SOURCE_TEXT_FIELDS",
    "STATUS",
    "STATUS_KEY",
    "STEMMER_LANGUAGES",
    "TAGS",
    "TEXT",
    "TEXT_ANALYZER",
    "TEXT_ANALYZER_V1",
    "TEXT_FIELDS",
    "TEXT_TOKEN_MAX_BYTES",
    "TITLE",
    "UPDATED_AT",
    "UPDATED_AT_MICROS",
    "VISIBILITY",
    "TextLanguages",
    "combined_text",
    "document_id_of_key",
    "document_key",
    "has_combined_field",
    "hidden_term",
    "is_canonical_uuid",
    "parse_text_languages",
    "ring_path",
    "status_key",
    "text_analyzer_language",
    "text_analyzer_name",
]

# Text fields, BM25-scored.
TITLE = "title"
BODY = "body"
TAGS = "tags"
# The record's own text fields.
SOURCE_TEXT_FIELDS = (TITLE, BODY, TAGS)
# Title, body and tags in one field (`combined_text`); analyzer version 2 and later.
TEXT = "text"
TEXT_FIELDS = (TITLE, BODY, TAGS, TEXT)

# Keyword and numeric fields: identity, filters, what a candidate reports.
DOCUMENT_ID = "document_id"
REVISION = "revision"
ITEM_ID = "item_id"
GALAXY = "galaxy"
RING = "ring"
# The record's ring and each of its ancestors ("a/b/c" -> "a", "a/b", "a/b/c"), one
# keyword each: "ring a/b and everything below it" is one term match, not a prefix scan.
RING_PATH = "ring_path"
STATUS = "status"
VISIBILITY = "visibility"
FACETS = "facets"
UPDATED_AT = "updated_at"
# `updated_at` as integer microseconds since the Unix epoch (UTC): exact range filters on
# engines whose date type truncates (tantivy indexes dates at second precision).
UPDATED_AT_MICROS = "updated_at_us"
# Numeric copies of what a search hit must report, for engines that read numeric
# columns per hit far faster than stored documents (tantivy fast fields): the document's
# UUID as two unsigned 64-bit halves (`document_key`; absent for an id that is not a
# canonical UUID) and `status_key(status)`. With `REVISION` and `UPDATED_AT_MICROS`
# they make a candidate without a stored-document read.
DOCUMENT_KEY_HIGH = "document_key_hi"
DOCUMENT_KEY_LOW = "document_key_lo"
STATUS_KEY = "status_key"

# A facet value is indexed as the single term f"{name}{FACET_SEPARATOR}{value}".
FACET_SEPARATOR = "="
# The facet that keeps a document out of a search lane (`Record.index_lanes`): its
# values are the lanes left out (`lexical`, `vector`). No client facet can have this
# name (facet names start with a letter or digit), and every search of a lane excludes
# `hidden_term(lane)`, so a document indexed before the facet existed stays searchable.
HIDDEN_FACET = "~hidden"


def hidden_term(lane: str) -> str:
    """The facet term that keeps a document out of `lane` (`lexical` or `vector`)."""
    return f"{HIDDEN_FACET}{FACET_SEPARATOR}{lane}"


# Names under which engines register the text analyzer; the version is bumped whenever
# its behaviour changes, since that needs a new generation. Version 1 (no stemming, no
# `TEXT` field) is still read, so that generations built before version 2 stay usable.
TEXT_ANALYZER_V1 = "orrery_text_v1"
TEXT_ANALYZER = "orrery_text_v2"
TEXT_TOKEN_MAX_BYTES = 40

# `language` value that means "no stemming" (version 2 without its last step).
NO_STEMMING = "none"
# Snowball stemmers that both tantivy (rust-stemmers) and OpenSearch (Lucene's `snowball`
# filter) have, and that agree on the word forms `tests/conformance/test_lexical_index.py`
# checks. They are not byte-identical: rust-stemmers follows a newer Snowball release
# (English: 75 of SciFact's 35,711 distinct words stem differently, e.g. "biologists",
# "added", "international"), so BM25 scores of such words differ slightly between the
# embedded and the server deployment. Dutch is left out: its algorithms differ widely.
STEMMER_LANGUAGES = frozenset(
    {
        "danish",
        "english",
        "finnish",
        "french",
        "german",
        "hungarian",
        "italian",
        "norwegian",
        "portuguese",
        "romanian",
        "russian",
        "spanish",
        "swedish",
        "turkish",
    }
)
# English: Orrery's benchmark corpora and most deployments are English; a namespace in
# another language (or mixed, like the German+English sample) says so in the settings.
DEFAULT_TEXT_LANGUAGE = "english"


def document_key(document_id: str) -> tuple[int, int] | None:
    """The `(DOCUMENT_KEY_HIGH, DOCUMENT_KEY_LOW)` values of `document_id`: its UUID's
    upper and lower 64 bits; None unless `document_id` is a UUID in canonical form
    (lowercase, hyphenated), so that `document_id_of_key` gives back the very string.

    The canonical form is exactly what `str(uuid.UUID(...))` writes, so it is matched
    as text and its hex digits read directly (a third of parsing and formatting a
    `uuid.UUID`, once per indexed document)."""
    if not is_canonical_uuid(document_id):
        return None
    value = int(document_id.replace("-", ""), 16)
    return value >> 64, value & _LOW_64


# Memoized: every lexical hit of every query maps its key back (~170 per one-shot at
# SciFact), and the same documents recur across queries; `lru_cache` is C, thread-safe
# and bounded.
@functools.lru_cache(maxsize=65_536)
def document_id_of_key(high: int, low: int) -> str:
    """The document id whose `document_key` is `(high, low)`: the canonical UUID string
    (formatted directly: a third of `str(uuid.UUID(int=...))`'s time, once per hit)."""
    digits = f"{high:016x}{low:016x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def document_ids_of_keys(
    highs: Sequence[int | None], lows: Sequence[int | None]
) -> list[str | None]:
    """`document_id_of_key` of each `(high, low)`, None where either is None (a
    document whose id has no key): the same strings, formatted in numpy for a whole
    column at once (an evidence read-back maps every document of a generation; ~2 µs a
    key one by one through the memo, which so many distinct keys only churn)."""
    size = len(highs)
    if len(lows) != size:
        raise ValueError("highs and lows differ in length")
    absent = (
        [i for i, (h, lo) in enumerate(zip(highs, lows, strict=True)) if h is None or lo is None]
        if None in highs or None in lows
        else []
    )
    keys = np.empty((size, 2), dtype=">u8")
    if absent:
        keys[:, 0] = [0 if h is None else h for h in highs]
        keys[:, 1] = [0 if lo is None else lo for lo in lows]
    else:
        keys[:, 0] = highs
        keys[:, 1] = lows
    # 32 hex digits a key (big-endian: high first), then the canonical 8-4-4-4-12 groups.
    digits = np.frombuffer(keys.tobytes().hex().encode("ascii"), dtype="S1").reshape(size, 32)
    text = np.full((size, 36), b"-", dtype="S1")
    for (start, end), at in zip(_UUID_GROUPS, _UUID_GROUP_AT, strict=True):
        text[:, at : at + end - start] = digits[:, start:end]
    ids: list[str | None] = text.view("S36").ravel().astype("U36").tolist()
    for i in absent:
        ids[i] = None
    return ids


# Hex digit ranges of the five groups of a canonical UUID, and where each starts in it.
_UUID_GROUPS = ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))
_UUID_GROUP_AT = (0, 9, 14, 19, 24)


@functools.lru_cache(maxsize=4_096)
def status_key(status: str) -> int:
    """`STATUS_KEY` of `status`: the first 8 bytes of its SHA-256 (UTF-8), big-endian.
    Readers map keys back through the index's own status terms and fall back to the
    stored value for a key two of them share. Memoized: a corpus has few statuses and
    every indexed document asks for one."""
    return int.from_bytes(
        hashlib.sha256(status.encode("utf-8", "surrogatepass")).digest()[:8], "big"
    )


_LOW_64 = (1 << 64) - 1
# `str(uuid.UUID(...))`'s form: 32 lowercase hex digits grouped 8-4-4-4-12.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_canonical_uuid(text: str) -> bool:
    """Whether `text` is exactly what `str(uuid.UUID(text))` writes (lowercase,
    hyphenated): such an id is its own UUID string, parsed by no one."""
    return _CANONICAL_UUID.fullmatch(text) is not None


def ring_path(ring: str) -> tuple[str, ...]:
    """The `RING_PATH` values of a record in `ring`: the ring and its ancestors, root
    first ("a/b/c" -> ("a", "a/b", "a/b/c")); none for the empty ring."""
    if not ring:
        return ()
    parts = ring.split("/")
    return tuple("/".join(parts[: n + 1]) for n in range(len(parts)))


def _check_language(language: str) -> str:
    if language != NO_STEMMING and language not in STEMMER_LANGUAGES:
        known = ", ".join(sorted(STEMMER_LANGUAGES))
        raise ValueError(f"unknown text language {language!r} (known: {NO_STEMMING}, {known})")
    return language


def text_analyzer_name(language: str) -> str:
    """The analyzer of the current version for `language` ("orrery_text_v2_english",
    "orrery_text_v2_none"); `ValueError` for a language without a stemmer here."""
    return f"{TEXT_ANALYZER}_{_check_language(language)}"


DEFAULT_TEXT_ANALYZER = text_analyzer_name(DEFAULT_TEXT_LANGUAGE)


def text_analyzer_language(name: str) -> str | None:
    """The stemming language of analyzer `name` (`NO_STEMMING` for none); None for version
    1. `ValueError` for a name that is no analyzer of any version."""
    if name == TEXT_ANALYZER_V1:
        return None
    prefix = f"{TEXT_ANALYZER}_"
    if not name.startswith(prefix):
        raise ValueError(f"unknown text analyzer {name!r}")
    return _check_language(name[len(prefix) :])


def has_combined_field(analyzer: str) -> bool:
    """Whether an index analyzed by `analyzer` holds the `TEXT` field (version 2 on)."""
    return text_analyzer_language(analyzer) is not None


def combined_text(title: str, body: str, tags: Iterable[str]) -> str:
    """The `TEXT` field of a document: its non-empty title, body and tags, one per line."""
    return "\n".join(part for part in (title, body, *tags) if part)


@dataclass(frozen=True, slots=True)
class TextLanguages:
    """The stemming language of each namespace (`ORRERY_NAMESPACE_LANGUAGES`), and of the
    others (`ORRERY_DEFAULT_LANGUAGE`). Read when a generation is created: a generation
    keeps the analyzer it was created with, so a changed setting takes effect with the
    next generation of a scope (`orrery gen build`)."""

    default: str = DEFAULT_TEXT_LANGUAGE
    namespaces: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        _check_language(self.default)
        for language in self.namespaces.values():
            _check_language(language)

    def language_for(self, namespace: str) -> str:
        return self.namespaces.get(namespace, self.default)

    def analyzer_for(self, namespace: str) -> str:
        """The analyzer a new generation of `namespace` is created with."""
        return text_analyzer_name(self.language_for(namespace))


def parse_text_languages(namespaces: str, default: str = DEFAULT_TEXT_LANGUAGE) -> TextLanguages:
    """`TextLanguages` from a JSON object `{"namespace": "language", ...}` (blank: none)
    and the default language; `ValueError` naming what is wrong."""
    mapping: object = json.loads(namespaces) if namespaces.strip() else {}
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise ValueError('namespace languages must be a JSON object {"namespace": "language"}')
    normalized = {k: v.strip().lower() for k, v in mapping.items()}
    return TextLanguages(default.strip().lower(), MappingProxyType(normalized))
