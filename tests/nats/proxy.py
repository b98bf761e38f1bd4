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

from tests.faults.proxy import CuttingProxy

Match = Callable[[str, bytes], bool]
"""Whether to cut before the publish of this payload to this subject."""


def publish_to(prefix: str) -> Match:
    """A publish to a subject that starts with ``prefix`` (a copy into the delay stream)."""
    return lambda subject, _payload: subject.startswith(prefix)


def an_ack() -> Match:
    """A JetStream ack: empty (nats-py's) or ``+ACK``; not ``+WPI``, ``-NAK`` or ``+TERM``."""
    return lambda subject, payload: subject.startswith("$JS.ACK.") and payload in (b"", b"+ACK")


class NatsCuttingProxy(CuttingProxy):
    """The fault suite's loopback proxy (connections, ``cut_all``), reading NATS's protocol."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._match: tuple[Match, asyncio.Event] | None = None

    def arm_on(self, match: Match) -> asyncio.Event:
        """Cut the next connection whose client sends a publish ``match`` takes."""
        fired = asyncio.Event()
        self._match = (match, fired)
        return fired

    async def _client_to_broker(
        self,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                line = await reader.readuntil(b"\r\n")
                words = line.split()
                payload = b""
                if words and words[0].upper() in (b"PUB", b"HPUB") and len(words) >= 3:
                    payload = await reader.readexactly(int(words[-1]) + 2)
                    if self._match is not None:
                        match, fired = self._match
                        if match(words[1].decode(errors="replace"), payload[:-2]):
                            self._match = None
                            self._abort(*link)
                            self.cuts += 1
                            fired.set()
                            return
                upstream.write(line + payload)
                await upstream.drain()
