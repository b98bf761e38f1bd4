"""A TCP proxy between the app and nats-server that cuts connections on cue.

It reads what the client sends (NATS's text protocol: a line per operation, a payload
after ``PUB``/``HPUB``), so a cut can land exactly where it hurts: just before a publish
to a subject (mid-publish: the server never sees the copy, the client waits for a PubAck
that cannot come) or just before an ack (to ``$JS.ACK.…``: the server never sees
it, so it delivers the message again after ``ack_wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

Match = Callable[[str, bytes], bool]
"""Whether to cut before the publish of this payload to this subject."""


def publish_to(prefix: str) -> Match:
    """A publish to a subject that starts with ``prefix`` (a copy into the delay stream)."""
    return lambda subject, _payload: subject.startswith(prefix)


def an_ack() -> Match:
    """A JetStream ack: empty (nats-py's) or ``+ACK``; not ``+WPI``, ``-NAK`` or ``+TERM``."""
    return lambda subject, payload: subject.startswith("$JS.ACK.") and payload in (b"", b"+ACK")


class CuttingProxy:
    """Loopback proxy to ``upstream_port``; ``arm`` or ``cut_all`` to break connections."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._armed: tuple[Match, asyncio.Event] | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.cut_all(count=False)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def arm(self, match: Match) -> asyncio.Event:
        """Cut the next connection whose client sends a publish ``match`` takes."""
        fired = asyncio.Event()
        self._armed = (match, fired)
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
            self._client_to_server(reader, upstream, link),
            self._pipe(up_reader, client),
            return_exceptions=True,
        )
        self._abort(*link)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _client_to_server(
        self,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                line = await reader.readuntil(b"\r\n")
                words = line.split()
                op = words[0].upper() if words else b""
                payload = b""
                if op in (b"PUB", b"HPUB") and len(words) >= 3:
                    payload = await reader.readexactly(int(words[-1]) + 2)
                    if self._armed is not None:
                        match, fired = self._armed
                        if match(words[1].decode(errors="replace"), payload[:-2]):
                            self._armed = None
                            self._abort(*link)
                            self.cuts += 1
                            fired.set()
                            return
                upstream.write(line + payload)
                await upstream.drain()
