"""`contracts.progress.LogProgress`: per-namespace lag, a model-based property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.progress import LogProgress


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.lists(st.sampled_from("abc"), max_size=6)),
            st.tuples(st.just("apply"), st.integers(0, 40)),
        ),
        max_size=30,
    )
)
def test_each_namespaces_lag_counts_only_its_own_unapplied_events(
    steps: list[tuple[str, object]],
) -> None:
    progress = LogProgress()
    written: list[tuple[str, int]] = []
    for op, arg in steps:
        if op == "write":
            assert isinstance(arg, list)
            events = [(ns, len(written) + 1 + i) for i, ns in enumerate(arg)]
            written.extend(events)
            progress.wrote_events(events)
        else:
            assert isinstance(arg, int)
            progress.applied_up_to(min(arg, len(written)))
        applied = progress.applied
        for namespace in "abcd":
            expected = sum(1 for ns, p in written if ns == namespace and p > applied)
            assert progress.lag(namespace) == expected
        assert progress.lag() == max(0, progress.written - applied)
