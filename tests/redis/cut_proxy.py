"""A TCP proxy between the app and Redis that cuts connections on cue.

It looks for a command's name in what the client sends, so a cut can land where it hurts:
``before`` (the command never reaches Redis: a step that never ran) or ``reply`` (Redis
runs it and its reply is dropped: the client cannot know it ran, and redis-py sends it
again on a new connection). A reply that is a null (``*-1``, ``_``: a blocking read that
timed out empty) is let through and the cut waits for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

_NULLS = (b"*-1\r\n", b"_\r\n", b"$-1\r\n")


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    awaiting: asyncio.Event | None = None
    """Set when this link's next reply is to be dropped and the link cut (the event fires)."""


@dataclass
class _Armed:
    needle: bytes
    when: str
    fired: asyncio.Event = field(default_factory=asyncio.Event)


class RedisCuttingProxy:
    """Loopback proxy to ``upstream_port``; ``arm`` or ``cut_all`` to break connections."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._armed: _Armed | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.cut_all(count=False)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def arm(self, needle: bytes, when: str) -> asyncio.Event:
        """Cut the next connection that sends ``needle`` (a command, a script's sha).

        ``when``: ``before`` it reaches Redis, or once Redis' ``reply`` to it comes back
        (the reply dropped). The event fires with the cut.
        """
        assert when in ("before", "reply")
        self._armed = _Armed(needle, when)
        return self._armed.fired

    def cut_all(self, *, count: bool = True) -> None:
        """Abort every open connection, both ways."""
        for link in list(self._links):
            self._abort(link)
        if count:
            self.cuts += 1

    def _abort(self, link: _Link) -> None:
        self._links.discard(link)
        for writer in (link.client, link.upstream):
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client.transport.abort()
            return
        link = _Link(client, upstream)
        self._links.add(link)
        await asyncio.gather(
            self._to_redis(reader, link), self._to_client(up_reader, link), return_exceptions=True
        )
        self._abort(link)

    async def _to_redis(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                armed = self._armed
                if armed is not None and armed.needle in data and link.awaiting is None:
                    self._armed = None
                    if armed.when == "before":
                        self._cut(link, armed.fired)
                        return
                    link.awaiting = armed.fired
                link.upstream.write(data)
                await link.upstream.drain()

    async def _to_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if link.awaiting is not None and data not in _NULLS:
                    self._cut(link, link.awaiting)
                    return
                link.client.write(data)
                await link.client.drain()

    def _cut(self, link: _Link, fired: asyncio.Event) -> None:
        self._abort(link)
        self.cuts += 1
        fired.set()
