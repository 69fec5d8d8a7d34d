"""`bench/stage_cpu.py`'s pieces: the ASGI call without sockets and the per-piece timer."""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.stage_cpu import Pieces, asgi_post, gil_probe


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(body[::-1], status_code=201, media_type="application/json")


APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"])])


@given(st.binary(max_size=4096))
def test_asgi_post_sends_the_body_and_returns_the_answer(body: bytes) -> None:
    status, out = asyncio.run(asgi_post(APP, "/echo", body))
    assert status == 201
    assert out == body[::-1]


def test_an_unknown_path_is_the_apps_404() -> None:
    status, _ = asyncio.run(asgi_post(APP, "/nowhere", b"{}"))
    assert status == 404


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    class Thing:
        def double(self, x: int) -> int:
            return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    module.Thing = Thing  # type: ignore[attr-defined]
    module.triple = triple  # type: ignore[attr-defined]
    return module


def test_pieces_time_only_while_on_and_pass_results_through() -> None:
    module: Any = _module("stage_cpu_test_module")
    sys.modules[module.__name__] = module
    try:
        pieces = Pieces()
        pieces.wrap(module.__name__, "triple", "triple")
        pieces.wrap(module.__name__, "Thing.double", "double")
        assert module.triple(2) == 6
        assert pieces.cpu == {}
        pieces.on = True
        assert [module.triple(i) for i in range(3)] == [0, 3, 6]
        assert module.Thing().double(4) == 8
        pieces.on = False
        module.triple(5)
        report = pieces.report(requests=3)
        assert report["triple"]["calls_per_query"] == 1.0
        assert report["double"]["calls_per_query"] == round(1 / 3, 2)
        assert all(v >= 0.0 for figures in report.values() for v in figures.values())
    finally:
        del sys.modules[module.__name__]


def test_gil_probe_reports_each_figure_per_call() -> None:
    calls: list[object] = []
    probe = gil_probe(calls.append, [(1.0, 0.0), (0.0, 1.0)])
    assert calls == [(1.0, 0.0), (0.0, 1.0)]
    assert set(probe) == {
        "wall_ms",
        "thread_cpu_ms",
        "process_cpu_ms_with_counter",
        "counter_ran_ms",
    }
    assert all(value >= 0.0 for value in probe.values())
