"""Text analyzer versions, per-namespace languages and the combined text field: the
contracts (`contracts.index_fields`, `contracts.index.field_boosts`), the settings that
choose a language, and the schema digest that records it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts.index import DEFAULT_FIELD_BOOSTS, TITLE_BOOST, field_boosts
from contracts.index_fields import (
    DEFAULT_TEXT_ANALYZER,
    NO_STEMMING,
    STEMMER_LANGUAGES,
    TEXT_ANALYZER_V1,
    TextLanguages,
    combined_text,
    has_combined_field,
    parse_text_languages,
    text_analyzer_language,
    text_analyzer_name,
)
from projector.service import analyzed_schema_digest, schema_digest
from query.settings import QuerySettings


def test_analyzer_names_carry_version_and_language() -> None:
    assert DEFAULT_TEXT_ANALYZER == "orrery_text_v2_english"
    assert text_analyzer_name("german") == "orrery_text_v2_german"
    assert text_analyzer_name(NO_STEMMING) == "orrery_text_v2_none"
    for language in [*STEMMER_LANGUAGES, NO_STEMMING]:
        assert text_analyzer_language(text_analyzer_name(language)) == language
    assert text_analyzer_language(TEXT_ANALYZER_V1) is None


@pytest.mark.parametrize("name", ["orrery_text_v2_klingon", "orrery_text_v3_english", "standard"])
def test_unknown_analyzers_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown text"):
        text_analyzer_language(name)


@pytest.mark.parametrize("language", ["klingon", "dutch", "porter", "English", ""])
def test_only_stemmers_both_engines_share_are_languages(language: str) -> None:
    # Dutch differs between rust-stemmers and Lucene; names are lowercase.
    with pytest.raises(ValueError, match="unknown text language"):
        text_analyzer_name(language)


def test_only_version_2_has_the_combined_field() -> None:
    assert has_combined_field(DEFAULT_TEXT_ANALYZER)
    assert has_combined_field(text_analyzer_name(NO_STEMMING))
    assert not has_combined_field(TEXT_ANALYZER_V1)


def test_combined_text_joins_the_non_empty_fields() -> None:
    assert combined_text("Title", "Body text", ("tag one", "", "tag2")) == (
        "Title\nBody text\ntag one\ntag2"
    )
    assert combined_text("", "only body", ()) == "only body"
    assert combined_text("", "", ()) == ""


def test_namespace_languages_override_the_default() -> None:
    languages = parse_text_languages('{"demo": "None", "docs_de": " German "}', "english")
    assert languages.language_for("demo") == NO_STEMMING
    assert languages.analyzer_for("docs_de") == "orrery_text_v2_german"
    assert languages.analyzer_for("anything") == DEFAULT_TEXT_ANALYZER
    assert parse_text_languages("", "none").analyzer_for("x") == "orrery_text_v2_none"
    assert TextLanguages().analyzer_for("x") == DEFAULT_TEXT_ANALYZER


@pytest.mark.parametrize(
    ("namespaces", "default"),
    [
        ('{"demo": "klingon"}', "english"),
        ("{}", "klingon"),
        ('["demo", "german"]', "english"),
        ('{"demo": 3}', "english"),
        ("{not json", "english"),
    ],
)
def test_invalid_languages_are_refused(namespaces: str, default: str) -> None:
    with pytest.raises(ValueError):
        parse_text_languages(namespaces, default)


def test_settings_read_languages_and_refuse_unknown_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORRERY_DEFAULT_LANGUAGE", "none")
    monkeypatch.setenv("ORRERY_NAMESPACE_LANGUAGES", json.dumps({"scifact": "english"}))
    languages = QuerySettings().text_languages()
    assert languages.analyzer_for("scifact") == "orrery_text_v2_english"
    assert languages.analyzer_for("demo") == "orrery_text_v2_none"
    monkeypatch.setenv("ORRERY_NAMESPACE_LANGUAGES", json.dumps({"scifact": "elvish"}))
    with pytest.raises(ValidationError, match="unknown text language"):
        QuerySettings()


def test_settings_default_to_english_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORRERY_DEFAULT_LANGUAGE", raising=False)
    monkeypatch.delenv("ORRERY_NAMESPACE_LANGUAGES", raising=False)
    assert QuerySettings().text_languages().analyzer_for("demo") == DEFAULT_TEXT_ANALYZER


def test_the_schema_digest_names_the_analyzer() -> None:
    base = schema_digest("tantivy", "qdrant-edge", "minilm")
    english = analyzed_schema_digest(base, text_analyzer_name("english"))
    assert english == analyzed_schema_digest(base, text_analyzer_name("english"))
    assert english != analyzed_schema_digest(base, text_analyzer_name("german"))
    assert english != analyzed_schema_digest(base, text_analyzer_name(NO_STEMMING))
    assert english != base


def test_the_combined_field_is_not_scored_by_default() -> None:
    assert field_boosts(None) == {"title": TITLE_BOOST, "body": 1.0, "tags": 1.0}
    assert DEFAULT_FIELD_BOOSTS["text"] == 0.0
    only_text = {"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0}
    assert field_boosts(only_text) == {"text": 1.0}


def test_without_the_combined_field_its_boost_goes_to_the_fields_it_combines() -> None:
    only_text = {"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0}
    assert field_boosts(only_text, combined_field=False) == {
        "title": 1.0,
        "body": 1.0,
        "tags": 1.0,
    }
    assert field_boosts({"text": 0.5}, combined_field=False) == {
        "title": TITLE_BOOST + 0.5,
        "body": 1.5,
        "tags": 1.5,
    }
    assert field_boosts(None, combined_field=False) == field_boosts(None)
    with pytest.raises(ValueError, match="unknown text field"):
        field_boosts({"abstract": 1.0}, combined_field=False)
