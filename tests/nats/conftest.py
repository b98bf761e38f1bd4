"""A real nats-server with JetStream for the NATS transport's tests.

``NATS_URL`` names a running server (``scripts/test`` sets it per series); without it
the session starts one with ``scripts/nats/start.sh`` on ``NATS_PORT`` (4301 by default)
and stops it at the end. Each test gets a prefix and stream names of its own, and its
streams are deleted after it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

nats = pytest.importorskip("nats", reason="nats-py (faststream[nats]), a test dependency")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from nats.aio.client import Client
    from nats.js import JetStreamContext

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The URL of a nats-server with JetStream: ``NATS_URL``, or one this session starts."""
    url = os.environ.get("NATS_URL")
    if url:
        yield url
        return
    env = {**os.environ, "NATS_PORT": os.environ.get("NATS_PORT", "4301")}
    started = subprocess.run(
        ["bash", str(ROOT / "scripts/nats/start.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        pytest.fail(f"scripts/nats/start.sh failed:\n{started.stderr}")
    reused = "reusing" in started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        if not reused:
            subprocess.run(["bash", str(ROOT / "scripts/nats/stop.sh")], env=env, check=False)


class Names:
    """A test's own prefix and stream names, so tests never share a stream."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:10]
        self.prefix = f"t{self.tag}"
        self.streams: list[str] = []

    def stream(self, name: str = "W") -> str:
        """A stream name of this test's."""
        full = f"{name}_{self.tag}"
        self.streams.append(full)
        return full

    def subject(self, name: str = "work") -> str:
        """A subject of this test's."""
        return f"{self.tag}.{name}"

    def plugin_streams(self) -> list[str]:
        """The streams the plugin makes for this test's prefix."""
        return [f"{self.prefix}-delay", *(f"{self.prefix}-dlq-{s}" for s in self.streams)]


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[JetStreamContext]:
    """A JetStream context of the test's own, for looking at streams."""
    client: Client = await nats.connect(nats_url)
    try:
        yield client.jetstream()
    finally:
        await client.drain()


@pytest.fixture
async def names(js: JetStreamContext) -> AsyncIterator[Names]:
    """This test's names; its streams and the plugin's are deleted after it."""
    made = Names()
    yield made
    for stream in [*made.streams, *made.plugin_streams()]:
        with contextlib.suppress(Exception):  # never made, or gone already
            await js.delete_stream(stream)


FAULT_ROWS: list[dict[str, object]] = []
"""The fault suite's rows (``tests.nats.faults.row``), printed at the end of the run."""


@pytest.fixture
def fault_rows() -> list[dict[str, object]]:
    """Where a fault test adds its row of figures."""
    return FAULT_ROWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault suite's table: scenario x server, sent / processed / dead / lost / duplicates."""
    if not FAULT_ROWS:
        return
    columns = list(FAULT_ROWS[0])
    terminalreporter.section("NATS fault suite figures")
    terminalreporter.write_line("| " + " | ".join(columns) + " |")
    terminalreporter.write_line("|" + "---|" * len(columns))
    for row in FAULT_ROWS:
        terminalreporter.write_line("| " + " | ".join(str(row[c]) for c in columns) + " |")
