"""Ready means queryable (issue 15): once readiness reports a scope ready, the very next
query is answered, in both deployments — the eligibility verdict is re-taken when the
generation's registry facts change, not on the timer (set to an hour here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_generations import (
    DEPLOYMENTS,
    KIND,
    NS,
    SCOPE,
    build_sealed,
    deployed,
    ok,
    promote,
    records,
    verify,
)

# The timer never fires during a test: only a change of registry facts re-checks.
NO_TIMER = {"ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "3600"}
ROUNDS = 20


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_ready_scope_answers_the_next_query_and_a_promote_serves_at_once(
    tmp_path: Path, deployment: str
) -> None:
    with deployed(deployment, tmp_path / "data", **NO_TIMER) as srv:
        for i in range(ROUNDS):
            namespace = f"fresh{i}"
            assert srv.post_records(records(0, 5, namespace=namespace)).status_code == 200
            ready = srv.wait_projected(timeout=60, documents={(namespace, KIND): 5})
            scope = next(s for s in ready["scopes"] if s["namespace"] == namespace)
            assert scope["eligible"] is True, scope
            answer = srv.topk(
                namespace=namespace, scope_ref=SCOPE, query_text="item number 3", result_limit=3
            )
            assert answer.status_code == 200, f"round {i}: {answer.text[:400]}"
            assert answer.json()["generation_id"] == scope["generation_id"]

        assert srv.post_records(records(0, 30)).status_code == 200
        srv.wait_projected(timeout=60, documents={(NS, KIND): 30})
        generation_id = build_sealed(srv)
        assert verify(srv, generation_id)["verified"]
        promote(srv, generation_id)
        answer = ok(srv.topk(namespace=NS, scope_ref=SCOPE, query_text="item 7", result_limit=3))
        assert answer["generation_id"] == generation_id
        ready = srv.wait_projected(timeout=30)
        scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
        assert scope["generation_id"] == generation_id and scope["eligible"] is True, scope
