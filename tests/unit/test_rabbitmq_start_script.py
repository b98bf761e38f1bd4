"""scripts/rabbitmq/start.sh names what took its epmd's port, rather than a node's "nodistribution"."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

START = Path(__file__).resolve().parents[2] / "scripts" / "rabbitmq" / "start.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_program_on_the_epmd_port_is_named_and_nothing_starts(tmp_path: Path) -> None:
    """A test server given the epmd port by mistake (CI's RabbitMQ 4.3 failed to start with
    only "nodistribution" when a NATS server held 4371): the start stops at once, naming
    the program and the fix."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        epmd_port = int(squatter.getsockname()[1])
        done = subprocess.run(
            ["bash", str(START)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={
                **os.environ,
                "TMPDIR": str(tmp_path),
                "RMQ_PORT": str(_free_port()),
                "ERL_EPMD_PORT": str(epmd_port),
                "RMQ_SERIES": "",
            },
        )
    assert done.returncode != 0
    assert f"port {epmd_port}" in done.stderr
    assert "is taken by" in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.glob("rabbitmq-test-*/*.pid")), "no node was started"
