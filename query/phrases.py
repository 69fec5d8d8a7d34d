"""Controlled-term phrase plans on the query path.

A request's `phrase_plan` names a vocabulary of its namespace and groups of terms. This
module resolves the plan against the operator's vocabularies (`VocabularyRegistry`) into
a `ResolvedPhrasePlan`, which

- restricts the lexical source before scoring: every required group with a known term
  becomes one any-of phrase group of `SearchFilter.phrases`, applied by the engine as a
  non-scoring filter;
- restricts the vector source to the same documents: the lexical port lists the ids that
  match the whole lexical filter (filter-only mode, at most `max_documents`; more is
  `PHRASE_SET_TOO_LARGE`, never a partial set), which then become the vector filter's
  `document_ids` (vector engines refuse phrase groups);
- takes the broad lexical fallback for a group with no known term: it does not restrict,
  its alternatives join the lexical query text as plain words;
- reports what it resolved and matched (`PhrasePlanReport`, `query_plan.phrase_plan`).

Pure logic over the `LexicalSearch` port; reading the vocabulary file is the bootstrap's
business (`parse_vocabularies` takes its text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from contracts.digests import sha256_json
from contracts.errors import ErrorCode, OrreryError
from contracts.index import SearchFilter
from contracts.phrases import (
    PhraseGroupReport,
    PhrasePlan,
    PhrasePlanReport,
    VocabularySet,
    normalize_term,
)
from query.ports import LexicalSearch

__all__ = [
    "DEFAULT_MAX_DOCUMENTS",
    "MAX_PLAN_PHRASES",
    "ResolvedGroup",
    "ResolvedPhrasePlan",
    "VocabularyRegistry",
    "parse_vocabularies",
]

# Distinct phrases one plan may resolve to: each is one engine clause per text field
# (and, for the report, one existence check against the candidates).
MAX_PLAN_PHRASES = 64
DEFAULT_MAX_DOCUMENTS = 10_000
BROAD_LEXICAL = "broad_lexical"


def parse_vocabularies(text: str) -> VocabularySet:
    """Vocabularies from JSON (`{namespace: {vocabulary: {term: [phrase, ...]}}}`).

    Blank text means none. Raises `ValueError` naming what is wrong.
    """
    if not text.strip():
        return VocabularySet({})
    try:
        return VocabularySet.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"invalid vocabularies: {exc}") from exc


@dataclass(frozen=True, slots=True)
class _Vocabulary:
    # normalized term -> (term as registered, its phrases in order, deduplicated)
    terms: Mapping[str, tuple[str, tuple[str, ...]]]
    digest: str


@dataclass(frozen=True, slots=True)
class ResolvedGroup:
    """One group of a plan: its known terms (as registered, request order), how many
    alternatives are no term, and for a group without known terms the words that join
    the lexical query instead."""

    index: int
    required: bool
    terms: tuple[str, ...]
    unknown_alternatives: int
    fallback_words: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return bool(self.terms)


class ResolvedPhrasePlan:
    """A request's phrase plan resolved against its namespace's vocabulary.

    Without a vocabulary (`ResolvedPhrasePlan(None)`) it stands for a request without a
    plan: it restricts nothing, changes no text and reports nothing. One instance serves
    one request (it records how many documents the vector source was restricted to).
    """

    def __init__(
        self,
        vocabulary: str | None,
        groups: Sequence[ResolvedGroup] = (),
        phrases: Mapping[str, tuple[str, ...]] | None = None,
        *,
        digest: str = "",
        max_documents: int = DEFAULT_MAX_DOCUMENTS,
    ) -> None:
        self.vocabulary = vocabulary
        self.groups = tuple(groups)
        self.phrases: Mapping[str, tuple[str, ...]] = dict(phrases or {})
        self.max_documents = max_documents
        self.phrase_document_count: int | None = None
        self._digest = digest

    @property
    def active(self) -> bool:
        return self.vocabulary is not None

    @property
    def restriction(self) -> tuple[tuple[str, ...], ...]:
        """`SearchFilter.phrases`: one any-of group per required group with known terms."""
        groups: list[tuple[str, ...]] = []
        for group in self.groups:
            if group.required and group.known:
                phrases = tuple(dict.fromkeys(p for t in group.terms for p in self.phrases[t]))
                if phrases not in groups:
                    groups.append(phrases)
        return tuple(groups)

    @property
    def fallback_words(self) -> tuple[str, ...]:
        return tuple(word for group in self.groups for word in group.fallback_words)

    @property
    def narrows(self) -> bool:
        """Whether the plan alone makes a query: it restricts or adds lexical words."""
        return bool(self.restriction or self.fallback_words)

    @property
    def fingerprint(self) -> str | None:
        """A digest of everything the plan changes about an answer (the vocabulary's
        content included, so an edited vocabulary never serves a cached answer); None
        without a plan."""
        if not self.active:
            return None
        return sha256_json(
            {
                "vocabulary": self.vocabulary,
                "vocabulary_digest": self._digest,
                "groups": [
                    [g.required, list(g.terms), g.unknown_alternatives, list(g.fallback_words)]
                    for g in self.groups
                ],
            }
        )

    def restrict(self, search_filter: SearchFilter) -> SearchFilter:
        """`search_filter` with the required groups added (lexical engines apply them)."""
        restriction = self.restriction
        if not restriction:
            return search_filter
        return search_filter.model_copy(update={"phrases": search_filter.phrases + restriction})

    def lexical_text(self, text: str) -> str:
        """The lexical query: `text` plus the words of groups that took the fallback."""
        return " ".join(part for part in (text, *self.fallback_words) if part)

    def vector_filter(
        self, search_filter: SearchFilter, generation_id: str, lexical: LexicalSearch
    ) -> SearchFilter:
        """The vector source's filter: `search_filter` with its phrase groups replaced by
        the ids of the documents that match it whole, listed by the lexical port.

        Raises `PHRASE_SET_TOO_LARGE` when more than `max_documents` match: the vector
        source is never restricted to a partial set.
        """
        if not search_filter.phrases:
            return search_filter
        found = lexical.search(generation_id, "", search_filter, self.max_documents + 1)
        if len(found) > self.max_documents:
            raise OrreryError(
                ErrorCode.PHRASE_SET_TOO_LARGE,
                f"the required phrase groups match more than {self.max_documents} documents, "
                "too many to restrict the vector source by id; add a required group or a "
                "filter, or use a lexical-only ranking (vector_weight 0)",
                {"max_documents": self.max_documents, "vocabulary": self.vocabulary},
            )
        self.phrase_document_count = len(found)
        ids = tuple(candidate.document_id for candidate in found)
        return search_filter.model_copy(update={"phrases": (), "document_ids": ids})

    def report(
        self, candidate_ids: Iterable[str], generation_id: str, lexical: LexicalSearch
    ) -> PhrasePlanReport | None:
        """What the plan resolved to and which of its phrases occur in the candidates
        (one filter-only lexical lookup per distinct phrase, limited to those ids)."""
        if self.vocabulary is None:
            return None
        ids = tuple(dict.fromkeys(candidate_ids))
        matched: set[str] = set()
        for phrase in dict.fromkeys(p for phrases in self.phrases.values() for p in phrases):
            if ids and lexical.search(
                generation_id, "", SearchFilter(document_ids=ids, phrases=((phrase,),)), 1
            ):
                matched.add(phrase)
        matched_terms = {
            term: [p for p in phrases if p in matched]
            for term, phrases in self.phrases.items()
            if any(p in matched for p in phrases)
        }
        return PhrasePlanReport(
            vocabulary=self.vocabulary,
            resolved_terms={term: list(phrases) for term, phrases in self.phrases.items()},
            matched_terms=matched_terms,
            groups=[
                PhraseGroupReport(
                    group=g.index,
                    required=g.required,
                    terms=list(g.terms),
                    unknown_alternatives=g.unknown_alternatives,
                    restricted=g.required and g.known,
                    matched=any(t in matched_terms for t in g.terms),
                )
                for g in self.groups
            ],
            unknown_groups=[g.index for g in self.groups if not g.known],
            fallback=BROAD_LEXICAL if self.fallback_words else None,
            phrase_document_count=self.phrase_document_count,
        )


class VocabularyRegistry:
    """The vocabularies of every namespace, and the bound of the vector restriction.

    Guarantees: terms are looked up by `normalize_term`; resolution is deterministic
    (same plan, same vocabularies: same result and fingerprint). Immutable after
    construction, so safe to share between threads.
    """

    def __init__(
        self,
        vocabularies: VocabularySet | None = None,
        *,
        max_documents: int = DEFAULT_MAX_DOCUMENTS,
    ) -> None:
        if max_documents < 1:
            raise ValueError("max_documents must be positive")
        self.max_documents = max_documents
        self._namespaces: dict[str, dict[str, _Vocabulary]] = {}
        for namespace, named in (vocabularies.root if vocabularies else {}).items():
            self._namespaces[namespace] = {
                name: _Vocabulary(
                    terms={
                        normalize_term(term): (term, tuple(dict.fromkeys(phrases)))
                        for term, phrases in terms.items()
                    },
                    digest=sha256_json(terms),
                )
                for name, terms in named.items()
            }

    def vocabularies(self, namespace: str) -> list[str]:
        """The vocabulary names registered for `namespace`, sorted."""
        return sorted(self._namespaces.get(namespace, {}))

    def terms(self, namespace: str, vocabulary: str) -> list[str]:
        """The terms of one vocabulary of `namespace` as registered, sorted (empty for an
        unknown vocabulary)."""
        known = self._namespaces.get(namespace, {}).get(vocabulary)
        return [] if known is None else sorted(term for term, _ in known.terms.values())

    def resolve(self, namespace: str, plan: PhrasePlan | None) -> ResolvedPhrasePlan:
        """Resolve `plan` for `namespace` (an inactive plan when there is none).

        Raises `UNKNOWN_VOCABULARY` when the namespace has no such vocabulary, and
        `INVALID_REQUEST` when the plan resolves to more than `MAX_PLAN_PHRASES`
        distinct phrases.
        """
        if plan is None:
            return ResolvedPhrasePlan(None)
        vocabulary = self._namespaces.get(namespace, {}).get(plan.vocabulary)
        if vocabulary is None:
            raise OrreryError(
                ErrorCode.UNKNOWN_VOCABULARY,
                f"namespace {namespace!r} has no vocabulary {plan.vocabulary!r}",
                {"namespace": namespace, "vocabulary": plan.vocabulary},
            )
        groups: list[ResolvedGroup] = []
        phrases: dict[str, tuple[str, ...]] = {}
        for index, group in enumerate(plan.groups):
            terms: list[str] = []
            unknown: list[str] = []
            for alternative in group.alternatives:
                entry = vocabulary.terms.get(normalize_term(alternative))
                if entry is None:
                    unknown.append(alternative)
                    continue
                term, term_phrases = entry
                if term not in terms:
                    terms.append(term)
                phrases[term] = term_phrases
            groups.append(
                ResolvedGroup(
                    index=index,
                    required=group.required,
                    terms=tuple(terms),
                    unknown_alternatives=len(unknown),
                    fallback_words=() if terms else tuple(unknown),
                )
            )
        distinct = len({p for term_phrases in phrases.values() for p in term_phrases})
        if distinct > MAX_PLAN_PHRASES:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"the phrase plan resolves to {distinct} distinct phrases; at most "
                f"{MAX_PLAN_PHRASES} are allowed",
                {"phrases": distinct, "max_phrases": MAX_PLAN_PHRASES},
            )
        return ResolvedPhrasePlan(
            plan.vocabulary,
            groups,
            phrases,
            digest=vocabulary.digest,
            max_documents=self.max_documents,
        )
