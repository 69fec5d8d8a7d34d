"""The one-shot path's plumbing: the thread hop (or, embedded, none) and the API key
headers the hot routes declare by hand."""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar

import pytest
from fastapi import FastAPI, Header
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import ErrorCode, OrreryError
from contracts.topk import ScoreBreakdown, TopKResponse, TopKResult
from query.entrypoints.http import KEY_HEADER_PARAMETERS, Inline, Offload, _json

_SEEN: ContextVar[str] = ContextVar("seen", default="unset")


def _where(label: str, *, suffix: str = "") -> tuple[str, str, str]:
    return threading.current_thread().name, _SEEN.get(), label + suffix


def test_offload_runs_on_a_worker_thread_with_the_callers_context() -> None:
    offload = Offload(max_threads=2)

    async def main() -> tuple[str, str, str]:
        _SEEN.set("request")
        return await offload(_where, "x", suffix="!")

    try:
        thread, seen, label = asyncio.run(main())
    finally:
        offload.close()
    assert thread.startswith("orrery-query") and thread != threading.current_thread().name
    assert (seen, label) == ("request", "x!")


def test_offload_raises_the_calls_error() -> None:
    offload = Offload(max_threads=1)

    def fail() -> None:
        raise OrreryError(ErrorCode.DEADLINE_EXCEEDED, "late")

    try:
        with pytest.raises(OrreryError) as err:
            asyncio.run(offload(fail))
    finally:
        offload.close()
    assert err.value.code is ErrorCode.DEADLINE_EXCEEDED


def test_inline_runs_on_the_event_loops_thread_in_the_callers_context() -> None:
    inline = Inline()

    async def main() -> tuple[tuple[str, str, str], str]:
        _SEEN.set("request")
        return await inline(_where, "x", suffix="!"), threading.current_thread().name

    (thread, seen, label), loop_thread = asyncio.run(main())
    assert thread == loop_thread
    assert (seen, label) == ("request", "x!")
    with pytest.raises(OrreryError) as err:
        asyncio.run(inline(_fail_late))
    assert err.value.code is ErrorCode.DEADLINE_EXCEEDED


def _fail_late() -> None:
    raise OrreryError(ErrorCode.DEADLINE_EXCEEDED, "late")


def test_key_header_parameters_are_what_fastapi_documents_for_header_params() -> None:
    app = FastAPI()

    @app.post("/declared")
    async def declared(
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> None:
        return None

    @app.post("/by_hand", openapi_extra={"parameters": KEY_HEADER_PARAMETERS})
    async def by_hand() -> None:
        return None

    paths = app.openapi()["paths"]
    assert paths["/by_hand"]["post"]["parameters"] == paths["/declared"]["post"]["parameters"]


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(
    st.lists(
        st.tuples(
            st.text(),
            st.dictionaries(st.text(), _json_values, max_size=5),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        max_size=4,
    ),
    st.one_of(st.none(), st.text()),
)
def test_a_json_response_is_model_dump_json_byte_for_byte(
    results: list[tuple[str, dict[str, object], float]], request_id: str | None
) -> None:
    """`_json` serializes to bytes directly: the same bytes as `model_dump_json()`
    encoded (non-ASCII text, large integers, floats, nested payloads)."""
    response = TopKResponse(
        scope_ref="ltm:objects:current",
        generation_id="g1",
        profile="weighted@3",
        client_request_id=request_id,
        results=[
            TopKResult(
                rank=rank,
                document_id=doc,
                item_id=doc,
                payload_schema="s",
                payload=payload,
                score=score,
                score_breakdown=ScoreBreakdown(
                    lexical=score, vector=0.5, freshness=0.0, metadata=1.0
                ),
            )
            for rank, (doc, payload, score) in enumerate(results, start=1)
        ],
    )
    sent = _json(response)
    assert sent.body == response.model_dump_json().encode()
    assert sent.media_type == "application/json"
