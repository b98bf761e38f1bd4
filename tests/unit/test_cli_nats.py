"""The commands that do not work on NATS yet say so, naming the issue, never with a traceback.

Each fails before it connects anywhere: a ``nats://`` URL, or an app whose broker is a
``NatsBroker`` (only ``doctor`` takes one).
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.cli import ROOT

if TYPE_CHECKING:
    from pathlib import Path

pytest.importorskip("faststream.nats", reason="faststream[nats], a test dependency")

APP = """
from faststream.nats import JStream, NatsBroker
from faststream_retry import RetryMiddleware

broker = NatsBroker("nats://127.0.0.1:1", middlewares=[RetryMiddleware()], logger=None)


@broker.subscriber("orders", stream=JStream("ORDERS"), durable="d")
async def handle(body: str) -> None: ...
"""


def command(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "300", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "faststream_retry", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--url", "nats://user:secret@127.0.0.1:1", "orders"),
        ("dlq", "list", "orders", "--url", "nats://127.0.0.1:1"),
        ("dlq", "purge", "orders", "--url", "nats://127.0.0.1:1", "--yes"),
        ("migrate", "orders", "--queue-type", "classic", "--url", "tls://127.0.0.1:1", "--yes"),
        ("web", "--url", "nats://127.0.0.1:1"),
        ("status", "--app", "natsapp:broker"),
        ("explain", "natsapp:broker"),
        ("web", "--app", "natsapp:broker"),
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_command_not_on_nats_yet_says_so(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Exit 3, one line that names issue 39 and the one command that works; no password."""
    (tmp_path / "natsapp.py").write_text(APP)
    done = command(tmp_path, *args)
    assert done.returncode == 3, done.stderr
    assert "does not work on NATS yet (issue 39" in done.stderr
    assert "only `doctor` does" in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr
