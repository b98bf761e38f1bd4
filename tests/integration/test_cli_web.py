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


@contextlib.asynccontextmanager
async def tcp_forward(port: int) -> AsyncIterator[int]:
    """A socat-like forward to ``port`` on this machine; yield the port it listens on."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def test_on_loopback_a_proxy_or_another_name_is_not_this_machine(rabbit_url: str) -> None:
    """No token: what came through a proxy, a forward or by another name is refused."""
    async with serving(rabbit_url, "--allow-actions") as (port, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/api/status")).status_code == 200
            for forwarded in ("127.0.0.1", "127.0.0.1, 192.0.2.2"):
                proxied = await client.get("/api/status", headers={"X-Forwarded-For": forwarded})
                assert proxied.status_code == 401, proxied.text
            rebound = await client.get("/api/status", headers={"Host": "rebind.attacker.test"})
            assert rebound.status_code == 403
        # A forward on another port (socat 192.0.2.2:8793 -> 127.0.0.1:8791): its clients
        # name it, not the page.
        async with (
            tcp_forward(port) as forward,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{forward}") as client,
        ):
            assert (await client.get("/api/status")).status_code == 403
            named = await client.get("/api/status", headers={"Host": f"192.0.2.2:{forward}"})
            assert named.status_code == 403


async def test_a_proxy_named_with_trusted_proxy_says_who_the_client_is(rabbit_url: str) -> None:
    async with (
        serving(rabbit_url, "--trusted-proxy", "127.0.0.1") as (port, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        local = await client.get("/api/status", headers={"X-Forwarded-For": "127.0.0.1"})
        assert local.status_code == 200
        remote = await client.get(
            "/api/status", headers={"X-Forwarded-For": "127.0.0.1, 192.0.2.2"}
        )
        assert remote.status_code == 401
    bad = subprocess.run(
        [*script(), "web", "--url", rabbit_url, "--trusted-proxy", "nginx"],
        env=environment(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0
    assert "trusted_proxies takes addresses or networks" in bad.stderr
