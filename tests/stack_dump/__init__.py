"""Stop a test's subprocess, and when it will not stop, say where it waits.

A subprocess started with ``environ(...)`` has this folder's ``sitecustomize`` loaded:
``stop_or_dump`` sends it SIGINT, and if it has not exited in time, SIGUSR2 (its
threads' and asyncio tasks' stacks, into its own log), then kills it and fails the test
with that log's end.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

FOLDER = Path(__file__).parent
"""On a subprocess's PYTHONPATH: SIGUSR2 dumps its stacks to stderr."""


def stop_or_dump(app: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
    """SIGINT ``app``; fail, with its stacks and the end of ``log``, if it runs ``seconds`` on."""
    if app.poll() is not None:
        return
    app.send_signal(signal.SIGINT)
    try:
        app.wait(seconds)
    except subprocess.TimeoutExpired:
        app.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while "=== end of stack dump ===" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        app.kill()
        app.wait()
        pytest.fail(
            f"the app did not stop within {seconds} s of SIGINT; its log's end:\n"
            + log.read_text(errors="replace")[-20_000:]
        )
