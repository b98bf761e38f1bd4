"""Session fixtures: a real RabbitMQ for the tests marked ``rabbit``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "rabbitmq"


@pytest.fixture(scope="session")
def rabbit_url() -> Iterator[str]:
    """The URL of a real broker: ``RABBITMQ_URL``, or one this session starts and stops."""
    url = os.environ.get("RABBITMQ_URL")
    if url:
        yield url
        return
    started = subprocess.run(
        ["bash", str(SCRIPTS / "start.sh")], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        pytest.fail(f"could not start RabbitMQ for the tests:\n{started.stderr}")
    # A node that was already running belongs to someone else: leave it up.
    ours = "reusing running node" not in started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        if ours:
            subprocess.run(["bash", str(SCRIPTS / "stop.sh")], capture_output=True, check=False)
