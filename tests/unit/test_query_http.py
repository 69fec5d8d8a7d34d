"""The one-shot path's plumbing: the thread hop (or, embedded, none) and the API key
headers the hot routes declare by hand."""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar

import pytest
from fastapi import FastAPI, Header

from contracts.errors import ErrorCode, OrreryError
from query.entrypoints.http import KEY_HEADER_PARAMETERS, Inline, Offload

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
