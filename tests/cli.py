"""Run the real ``faststream-retry`` console script in a subprocess, as an operator would."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def script() -> list[str]:
    """Return the command that runs the console script of this interpreter's environment."""
    installed = Path(sys.executable).with_name("faststream-retry")
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "faststream_retry"]


def environment(url: str | None, **extra: str) -> dict[str, str]:
    """Return the environment of a run: this checkout first on the path, the broker's URL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1", **extra}
    env.pop("RABBITMQ_URL", None)
    if url is not None:
        env["RABBITMQ_URL"] = url
    return env


@dataclass(frozen=True)
class Result:
    """What a run printed and how it ended."""

    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """Return stdout parsed as JSON (the command ran with ``--json``)."""
        return json.loads(self.stdout)

    def rows(self) -> list[dict[str, Any]]:
        """Return the rows of a ``dlq list --json``, which must be whole."""
        listing = self.json()
        assert listing["complete"], listing
        rows: list[dict[str, Any]] = listing["dead_letters"]
        return rows


async def run_cli(
    *args: str,
    url: str | None,
    stdin: str | None = None,
    timeout: float = 120.0,
    cwd: Path | None = None,
    **env: str,
) -> Result:
    """Run ``faststream-retry *args`` to the end, without blocking the event loop."""
    process = await asyncio.create_subprocess_exec(
        *script(),
        *args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(url, **env),
        cwd=cwd or ROOT,
    )
    out, err = await asyncio.wait_for(
        process.communicate(None if stdin is None else stdin.encode()), timeout
    )
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())
