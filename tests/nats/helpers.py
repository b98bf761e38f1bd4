"""Reading what the plugin left on the server: dead letters, waiting copies (no consuming);
and running an app's broker for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from nats.js.api import RetentionPolicy, StreamConfig
from nats.js.errors import NotFoundError

from tests.rabbit import eventually_async

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from faststream.nats import NatsBroker
    from nats.js import JetStreamContext


async def raw_hpub(url: str, subject: str, header_lines: bytes, body: bytes) -> None:
    """Publish as other clients can (Go, the nats CLI, raw protocol): any header name."""
    parsed = urlparse(url)
    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"protocol":1}\r\n')
    block = b"NATS/1.0\r\n" + header_lines + b"\r\n"
    size = len(block) + len(body)
    writer.write(
        f"HPUB {subject} {len(block)} {size}\r\n".encode() + block + body + b"\r\nPING\r\n"
    )
    await writer.drain()
    line = await reader.readline()
    writer.close()
    assert line.startswith(b"PONG"), line


@contextlib.asynccontextmanager
async def running(broker: NatsBroker) -> AsyncIterator[NatsBroker]:
    """``broker`` started for the block, and stopped after it, whatever happens in it."""
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def drained(js: JetStreamContext, prefix: str, timeout: float = 10.0) -> None:
    """Wait until the delay stream of ``prefix`` holds nothing: every copy settled.

    A copy's ack or term reaches the server after what the test saw (the handler's call,
    the dead letter's PubAck), so it is waited for, not read at once.
    """

    async def empty() -> bool:
        return await stream_count(js, f"{prefix}-delay") == 0

    await eventually_async(empty, timeout, f"the delay stream of {prefix} to empty")


async def stream_messages(
    js: JetStreamContext, stream: str
) -> list[tuple[str, bytes, dict[str, Any]]]:
    """Every message in ``stream``, read by sequence (nothing consumed): subject, body, headers."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return []
    found: list[tuple[str, bytes, dict[str, Any]]] = []
    if not info.state.messages:  # an empty stream's first sequence is 0, which get_msg refuses
        return found
    for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:
            continue
        headers: dict[str, Any] = {}
        for key, value in (msg.headers or {}).items():
            headers[key] = json.loads(value) if key.startswith("retry-") else value
        found.append((str(msg.subject), bytes(msg.data or b""), headers))
    return found


async def stream_count(js: JetStreamContext, stream: str) -> int:
    """How many messages ``stream`` holds (0 when it does not exist)."""
    try:
        return int((await js.stream_info(stream)).state.messages)
    except NotFoundError:
        return 0


async def make_delay_stream(js: JetStreamContext, prefix: str, **config: Any) -> None:
    """Make the delay stream of ``prefix`` by hand, as an operator would, with ``config`` on top."""
    await js.add_stream(
        StreamConfig(
            name=f"{prefix}-delay",
            subjects=[f"{prefix}.delay.>", f"{prefix}.ready.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            **config,
        )
    )
