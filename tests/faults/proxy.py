"""A TCP proxy between the app and RabbitMQ that cuts connections on cue.

It reads the AMQP frames the client sends, so a cut can land exactly where it hurts:
just before a ``basic.publish`` (mid-publish: the broker never sees the copy, the
client waits for a confirm that cannot come) or a ``basic.ack`` (mid-ack: the broker
never sees the ack, so it redelivers).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

BASIC_PUBLISH = (60, 40)
BASIC_ACK = (60, 80)
_HEADER = b"AMQP\x00\x00\x09\x01"


class CuttingProxy:
    """Loopback proxy to ``upstream_port``; ``arm`` or ``cut_all`` to break connections."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._armed: tuple[tuple[int, int], asyncio.Event] | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.cut_all(count=False)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def arm(self, method: tuple[int, int]) -> asyncio.Event:
        """Cut the next connection whose client sends ``method``; the event fires then."""
        fired = asyncio.Event()
        self._armed = (method, fired)
        return fired

    def cut_all(self, *, count: bool = True) -> None:
        """Abort every open connection, both ways."""
        for client, upstream in list(self._links):
            self._abort(client, upstream)
        if count:
            self.cuts += 1

    def _abort(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self._links.discard((client, upstream))
        for writer in (client, upstream):
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client.transport.abort()
            return
        link = (client, upstream)
        self._links.add(link)
        await asyncio.gather(
            self._client_to_broker(reader, upstream, link),
            self._pipe(up_reader, client),
            return_exceptions=True,
        )
        self._abort(*link)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _client_to_broker(
        self,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            upstream.write(await reader.readexactly(len(_HEADER)))
            while True:
                head = await reader.readexactly(7)
                kind, _channel, size = struct.unpack(">BHI", head)
                rest = await reader.readexactly(size + 1)
                if kind == 1 and self._armed is not None:
                    method, fired = self._armed
                    if struct.unpack(">HH", rest[:4]) == method:
                        self._armed = None
                        self._abort(*link)
                        self.cuts += 1
                        fired.set()
                        return
                upstream.write(head + rest)
                await upstream.drain()
