"""``faststream-retry web`` as an operator starts it: on loopback, or elsewhere with a token."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.cli import environment, script

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = pytest.mark.rabbit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(
    url: str | None, *args: str, cwd: Path | None = None
) -> AsyncIterator[tuple[int, list[str]]]:
    """Run the command (without --url for ``None``); yield its port and lines once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [*script(), "web", *(["--url", url] if url else []), "--port", str(port), *args],
        env=environment(None),
        cwd=cwd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        deadline = asyncio.get_running_loop().time() + 30
        while not any("serving http" in line for line in lines):
            assert asyncio.get_running_loop().time() < deadline, lines
            assert process.poll() is None, lines
            lines.append(await asyncio.to_thread(process.stderr.readline))
        async with httpx.AsyncClient() as client:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    await client.get(f"http://127.0.0.1:{port}/login")
                    break
                assert asyncio.get_running_loop().time() < deadline, lines
                await asyncio.sleep(0.05)
        yield port, lines
    finally:
        process.terminate()
        process.wait(10)


async def test_on_loopback_it_serves_read_only_without_a_token(rabbit_url: str) -> None:
    async with serving(rabbit_url) as (port, lines):
        assert any("(read-only)" in line for line in lines)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            page = await client.get("/")
            assert page.status_code == 200
            assert "read-only" in page.text
            assert (await client.get("/api/status")).json()["format"] == 1


async def test_off_loopback_it_makes_up_a_token_and_asks_for_it(rabbit_url: str) -> None:
    async with serving(rabbit_url, "--host", "0.0.0.0", "--allow-actions") as (port, lines):  # noqa: S104
        printed = "".join(lines)
        token = re.search(r"a token for this page \(not on loopback\): (\S+)", printed)
        assert token is not None, printed
        assert f"/login?token={token[1]}" in printed
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/api/status")).status_code == 401
            bearer = {"Authorization": f"Bearer {token[1]}"}
            assert (await client.get("/api/status", headers=bearer)).status_code == 200
