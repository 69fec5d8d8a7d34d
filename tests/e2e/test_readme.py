"""The README's generation walkthrough runs as written on the sample (issue 26).

The block between `<!-- walkthrough -->` and `<!-- /walkthrough -->` runs line by line
in one bash, in a directory whose `./orrery-data` is the data dir of a running
`orrery serve --sample` (the default data dir, as after `make run`), with the venv's
`orrery` on PATH; every line's exit code is checked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import start_server

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = "::readme-exit::"


def walkthrough() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- walkthrough -->\s*```bash\n(.*?)```\s*<!-- /walkthrough -->", text, re.S
    )
    assert block, "README.md has no walkthrough block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    lines = walkthrough()
    srv = start_server(tmp_path / "orrery-data", "--sample", env={"ORRERY_ADMIN_KEY": "secret"})
    try:
        deadline = time.monotonic() + 300
        while (
            not (ready := srv.client.get("/v1/readiness").json())["ready"]
            or len(ready["scopes"]) < 5
        ):
            assert time.monotonic() < deadline, ready
            time.sleep(0.2)
        script = "\n".join(f"{line}\necho {MARK}$?" for line in lines)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["COLUMNS"] = "120"
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        srv.stop()
    codes = [
        int(line.removeprefix(MARK)) for line in result.stdout.splitlines() if line.startswith(MARK)
    ]
    report = "\n".join(f"{code}  {line}" for code, line in zip(codes, lines, strict=False))
    assert len(codes) == len(lines), f"{report}\n{result.stderr[-3000:]}"
    assert all(code == 0 for code in codes), f"{report}\n{result.stderr[-3000:]}"
    assert "fact:thermos_location_old" in result.stdout  # the search answered
