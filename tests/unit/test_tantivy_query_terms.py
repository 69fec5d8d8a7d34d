"""A query's terms are analyzed once per thread for its search and its re-score's
lookup (`query.adapters.tantivy_lexical._query_terms`): always what a fresh analysis
gives, whatever came before on the thread."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.index_fields import text_analyzer_name
from projector.adapters.tantivy_lexical import _text_analyzer
from query.adapters.tantivy_lexical import _query_terms

ANALYZERS = [_text_analyzer(text_analyzer_name(lang)) for lang in ("english", "none")]
texts = st.one_of(
    st.sampled_from(["", "the running dogs", "The Running DOGS", "dogs", "naïve café \ud800 x"]),
    st.text(max_size=40),
)


def _fresh(analyzer: object, text: str) -> list[str]:
    cleaned = text.encode("utf-8", "replace").decode("utf-8")
    return list(dict.fromkeys(analyzer.analyze(cleaned)))  # type: ignore[attr-defined]


@given(st.lists(st.tuples(st.sampled_from([0, 1]), texts), min_size=1, max_size=12))
def test_the_terms_are_a_fresh_analysis_whatever_came_before(
    calls: list[tuple[int, str]],
) -> None:
    for which, text in calls:
        analyzer = ANALYZERS[which]
        terms = _query_terms(analyzer, text)
        assert terms == _fresh(analyzer, text)
        terms.append("changed by the caller")  # a fresh list: the next call is unaffected
        assert _query_terms(analyzer, text) == _fresh(analyzer, text)
