"""What the span shipper costs the serving process per sampled request, by request rate.

    .venv/bin/python bench/span_shipper_rate.py [--out docs/bench/span_shipper_rate.json]

`orrery.tracing` with an OTLP endpoint (the exporter child, `orrery.span_exporter`,
exporting to a receiver in a process of its own) around the one-shot ASGI app of
`bench/metrics_overhead.py`; requests one after another with a gap of 60 ms (every
request its own 50 ms batch), 10 ms and none (saturation). Per request: the process's
CPU beyond the request thread's own (the shipper thread: its wake-ups, pickling, the
pipe write and the child's health checks). The exporter child's CPU is not counted.
Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.metrics_overhead import _app, _noop_send, _receive, _scope

REPO_ROOT = Path(__file__).resolve().parent.parent


def measure(gaps_ms: list[float], requests: int) -> dict[str, Any]:
    from orrery.telemetry import Observability, RequestTelemetry, query_observer
    from orrery.tracing import open_tracing

    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.otlp"], cwd=REPO_ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None and receiver.stdin is not None
    tracing = open_tracing(receiver.stdout.readline().strip(), service="b", roles=["b"])
    observability = Observability(tracing=tracing)
    app = RequestTelemetry(_app(query_observer(observability)), observability=observability)

    async def one() -> None:
        await app(_scope(), _receive, _noop_send)

    asyncio.run(one())
    tracing.flush()  # the child started
    out: dict[str, Any] = {}
    try:
        for gap in gaps_ms:
            n = requests if gap else requests * 25
            started_cpu, started_own = time.process_time_ns(), time.thread_time_ns()
            for _ in range(n):
                asyncio.run(one())
                if gap:
                    time.sleep(gap / 1000.0)
            own = time.thread_time_ns() - started_own
            tracing.flush(timeout=120)
            beyond = (time.process_time_ns() - started_cpu - own) / 1000.0 / n
            out[f"gap_{gap:g}ms"] = {"requests": n, "shipper_process_cpu_us": round(beyond, 1)}
    finally:
        tracing.close()
        receiver.stdin.close()
        receiver.wait(timeout=60)
    return out


def load() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per gap")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "span_shipper_rate.json"
    )
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "bench": "span_shipper_rate",
        "when": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "loadavg_before": load(),
    }
    result["by_gap"] = measure([60.0, 10.0, 0.0], args.requests)
    result["loadavg_after"] = load()
    for name, row in result["by_gap"].items():
        print(f"{name:10} {row['shipper_process_cpu_us']:8.1f} us of the process per request")
    print("loadavg", result["loadavg_before"], "->", result["loadavg_after"])
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
