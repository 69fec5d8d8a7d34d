"""Controlled-term phrase plans: the request part, the operator's vocabularies and the
diagnostics a query plan reports.

A plan is request data, never query text: `{vocabulary, groups: [{alternatives, required}]}`.
Each alternative is a *term* of the named vocabulary; the namespace's operator registers,
per term, the phrases that stand for it (`ORRERY_VOCABULARIES`, format `VocabularySet`).
A group matches a document when one of its terms' phrases occurs in a text field as a
phrase (its analyzed tokens adjacent and in order). Required groups restrict before
scoring; a group none of whose alternatives is a known term takes the broad lexical
fallback (its words join the lexical query). docs/query.md ("Phrase plans") has the
whole semantics.

Terms are looked up by `normalize_term` (Unicode NFC, case-folded, inner whitespace
collapsed), so `"Kühlschrank"` and `" kühlschrank "` name the same term.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, model_validator

from contracts.index_fields import TEXT_TOKEN_MAX_BYTES
from contracts.names import Namespace
from contracts.records import Name

__all__ = [
    "MAX_GROUP_ALTERNATIVES",
    "MAX_PHRASE_GROUPS",
    "MAX_TERM_PHRASES",
    "PhraseGroup",
    "PhraseGroupReport",
    "PhrasePlan",
    "PhrasePlanReport",
    "VocabularySet",
    "normalize_term",
]

MAX_PHRASE_GROUPS = 16
MAX_GROUP_ALTERNATIVES = 32
# Phrases one vocabulary term may stand for.
MAX_TERM_PHRASES = 32
_MAX_TEXT = 256
_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+")


def normalize_term(term: str) -> str:
    """The lookup key of a vocabulary term: NFC, case-folded, whitespace collapsed."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", term).casefold()).strip()


def _check_phrase(phrase: str) -> str:
    words = _WORD.findall(phrase)
    if not words:
        raise ValueError(f"phrase {phrase!r} has no word (letters or digits)")
    for word in words:
        # The analyzer drops such tokens, which would leave a gap in the phrase.
        if len(word.encode("utf-8", "replace")) >= TEXT_TOKEN_MAX_BYTES:
            raise ValueError(f"phrase {phrase!r} has a word of {TEXT_TOKEN_MAX_BYTES}+ bytes")
    return phrase


def _check_term(term: str) -> str:
    if not normalize_term(term):
        raise ValueError("a term must not be blank")
    return term


Term = Annotated[str, Field(min_length=1, max_length=_MAX_TEXT), AfterValidator(_check_term)]
Phrase = Annotated[str, Field(min_length=1, max_length=_MAX_TEXT), AfterValidator(_check_phrase)]


class PhraseGroup(BaseModel):
    """Alternatives for one concept: vocabulary terms, any of which may match."""

    model_config = ConfigDict(extra="forbid", strict=True)

    alternatives: list[Annotated[str, Field(min_length=1, max_length=_MAX_TEXT)]] = Field(
        min_length=1,
        max_length=MAX_GROUP_ALTERNATIVES,
        description="Vocabulary terms (looked up case-insensitively); each stands for its "
        "registered phrases. Alternatives that are no term of the vocabulary are ignored; "
        "a group with no known term takes the broad lexical fallback.",
    )
    required: bool = Field(
        default=True,
        description="Only documents matching this group are candidates (in every source, "
        "before scoring). A non-required group neither restricts nor scores: it is "
        "resolved and reported in query_plan.phrase_plan.matched_terms.",
    )


class PhrasePlan(BaseModel):
    """Controlled-term phrase groups of one request: all required groups must match."""

    model_config = ConfigDict(extra="forbid", strict=True)

    vocabulary: str = Field(
        min_length=1,
        max_length=128,
        description="A vocabulary registered for the request's namespace "
        "(unknown: 422 unknown_vocabulary)",
    )
    groups: list[PhraseGroup] = Field(min_length=1, max_length=MAX_PHRASE_GROUPS)


class PhraseGroupReport(BaseModel):
    """How one group of the plan was resolved (by position, its text is not echoed)."""

    group: int = Field(description="Index of the group in the request")
    required: bool
    terms: list[str] = Field(description="Its alternatives that are vocabulary terms")
    unknown_alternatives: int = Field(description="How many alternatives are no term")
    restricted: bool = Field(description="Whether it restricted the candidates")
    matched: bool = Field(description="Whether one of its phrases occurs in a candidate")


class PhrasePlanReport(BaseModel):
    """`query_plan.phrase_plan`: what the plan resolved to and what it matched.

    Safe diagnostics: vocabulary terms and their registered phrases only (operator
    data); alternatives that are no term are counted, never echoed.
    """

    vocabulary: str
    resolved_terms: dict[str, list[str]] = Field(
        description="Each known term of the plan and the phrases it stands for"
    )
    matched_terms: dict[str, list[str]] = Field(
        description="Terms with a phrase that occurs in at least one candidate document "
        "(the candidates both sources returned), with those phrases"
    )
    groups: list[PhraseGroupReport]
    unknown_groups: list[int] = Field(description="Groups with no known term")
    fallback: Literal["broad_lexical"] | None = Field(
        default=None,
        description="Set when an unknown group's words joined the lexical query instead "
        "of restricting (see unknown_groups)",
    )
    phrase_document_count: int | None = Field(
        default=None,
        description="Documents matching every required group, resolved by id to restrict "
        "the vector source; None when no vector search needed it",
    )


class VocabularySet(RootModel[dict[Namespace, dict[Name, dict[Term, list[Phrase]]]]]):
    """`ORRERY_VOCABULARIES`: `{namespace: {vocabulary: {term: [phrase, ...]}}}`.

    Namespaces follow the namespace rule (`contracts.names`), vocabulary names the record
    name rule (letters, digits, `_.-`).

    Every term stands for 1..32 phrases; a phrase must contain a word (letters or
    digits) and no word of 40 or more UTF-8 bytes (the analyzer would drop it). Two
    terms of one vocabulary must not normalize to the same key.
    """

    @model_validator(mode="after")
    def _check_terms(self) -> VocabularySet:
        for namespace, vocabularies in self.root.items():
            for vocabulary, terms in vocabularies.items():
                seen: dict[str, str] = {}
                for term, phrases in terms.items():
                    where = f"{namespace}/{vocabulary}/{term!r}"
                    if not 1 <= len(phrases) <= MAX_TERM_PHRASES:
                        raise ValueError(
                            f"{where}: a term stands for 1..{MAX_TERM_PHRASES} phrases"
                        )
                    key = normalize_term(term)
                    if key in seen:
                        raise ValueError(f"{where}: same term as {seen[key]!r} once normalized")
                    seen[key] = term
        return self
