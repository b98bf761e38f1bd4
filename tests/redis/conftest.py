"""Fixtures for the Redis transport's tests: a real server the session starts, a client, names.

``REDIS_URL`` points at a running server (scripts/test's, or a developer's own); unset,
the session starts one with scripts/redis/start.sh on ``REDIS_PORT`` (6401 unless set),
of ``REDIS_SERIES`` (the host's package unless set: 7.0, 8.0 or valkey-9.1), and stops it.
The restart test starts a server of its own on ``REDIS_RESTART_PORT`` (6404 unless set).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from tests.redis.fault_support import ROWS
from tests.redis.support import App

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from _pytest.terminal import TerminalReporter

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "redis"


def start_server(port: int, **env: str) -> tuple[str, bool]:
    """Start (or reuse) a server on ``port``; return its URL and whether this call started it."""
    started = subprocess.run(
        ["bash", str(SCRIPTS / "start.sh")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "REDIS_PORT": str(port), **env},
    )
    if started.returncode != 0:
        pytest.fail(f"could not start Redis on {port} for the tests:\n{started.stderr}")
    return started.stdout.strip().splitlines()[-1], "reusing running server" not in started.stderr


def stop_server(port: int, **env: str) -> None:
    """Stop the server scripts/redis/start.sh started on ``port`` (and only that one)."""
    subprocess.run(
        ["bash", str(SCRIPTS / "stop.sh")],
        capture_output=True,
        check=False,
        env={**os.environ, "REDIS_PORT": str(port), **env},
    )


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a real server: ``REDIS_URL``, or one this session starts and stops."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    port = int(os.environ.get("REDIS_PORT", "6401"))
    url, ours = start_server(port)
    try:
        yield url
    finally:
        if ours:
            stop_server(port)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    """A plain redis-py client, to look inside streams and schedules."""
    connection = Redis.from_url(redis_url)
    try:
        yield connection
    finally:
        await connection.aclose()


@pytest.fixture
def stream() -> str:
    """A stream name of this test's own."""
    return f"retry-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def make_app(redis_url: str, stream: str) -> AsyncIterator[Callable[..., App]]:
    """Build apps on this test's stream (``App``'s options); each is stopped at the end."""
    apps: list[App] = []

    def build(**options: Any) -> App:
        app = App(redis_url, options.pop("stream", stream), **options)
        apps.append(app)
        return app

    try:
        yield build
    finally:
        for app in apps:
            await app.stop()


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """The fault scenarios' figures (``fault_support.record``), one row each."""
    if not ROWS:
        return
    columns = list(dict.fromkeys(c for row in ROWS for c in row))
    terminalreporter.section("Redis fault figures")
    terminalreporter.write_line("| " + " | ".join(columns) + " |")
    terminalreporter.write_line("|" + "---|" * len(columns))
    for row in ROWS:
        terminalreporter.write_line("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
