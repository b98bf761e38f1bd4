"""The commands on NATS, before any server answers: ``migrate``, RabbitMQ's only, says so
and names what works; the others say in one line that the server is not there, never with a
traceback or a password."""

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


def test_migrate_is_rabbitmqs_only_and_says_what_to_use(tmp_path: Path) -> None:
    """Exit 3, one line: why migrate has no meaning on NATS, and the commands that do work."""
    done = command(
        tmp_path, "migrate", "orders", "--queue-type", "classic", "--url",
        "tls://user:secret@127.0.0.1:1", "--yes",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "works on RabbitMQ only" in done.stderr
    assert "status, explain, doctor, dlq and web take --url nats://" in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("dlq", "list", "orders", "--url", "nats://user:secret@127.0.0.1:1"),
        ("dlq", "purge", "orders", "--url", "nats://user:secret@127.0.0.1:1", "--yes"),
        ("dlq", "list", "orders", "--url", "redis://user:secret@127.0.0.1:1"),
        ("dlq", "replay", "orders", "--url", "redis://:secret@127.0.0.1:1"),
        ("status", "--app", "natsapp:broker", "--url", "nats://user:secret@127.0.0.1:1"),
        ("status", "orders", "--url", "nats://user:secret@127.0.0.1:1"),
    ],
    ids=lambda args: " ".join((args[0], args[1], args[-1].split(":", 1)[0])),
)
def test_dlq_on_a_server_not_there_says_so_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """dlq and status work on NATS and Redis: a server not there is exit 3, one line, no password."""
    (tmp_path / "natsapp.py").write_text(APP)
    done = command(tmp_path, *args)
    assert done.returncode == 3, done.stderr
    assert "cannot reach" in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr
