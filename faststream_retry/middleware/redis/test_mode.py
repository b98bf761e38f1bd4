"""Test mode under ``TestRedisBroker``: ``test_mode``'s sink, reading and writing as Redis does.

The decisions, the in-process retries and the recorder are ``test_mode.TestSink``'s. What
differs is the wire: a Redis message's headers are text in FastStream's binary format
(``redis.envelope``), so the attempt a retried call sees is decimal text and the history
JSON text, as a copy the mover puts back carries them; a dead-lettered message is
acknowledged, as the live dead-letter script does (``XACK``); and the dead letter is
published, headers as the dead-letter stream holds them, to the stream's ``P.dlq``
(``redis.keys``: ``{orders}.dlq`` for ``orders``), where a subscriber of that stream gets
it (``TestRedisBroker`` drops a publish nobody consumes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.middleware.test_mode import TestSink
from faststream_retry.redis import envelope, keys

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream.message import StreamMessage

    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Route

__all__ = ["RedisTestSink"]

MESSAGE_ID = "message_id"
"""The header FastStream's Redis parser reads a message's id from (``redis.sink``'s)."""


class RedisTestSink(TestSink):
    """Under ``TestRedisBroker``: retries in process, records, dead letters to ``P.dlq``."""

    __slots__ = ()

    def _incoming(self, msg: StreamMessage[Any]) -> Mapping[str, Any]:
        incoming = envelope.from_wire(msg.headers)
        # As the live sink: the dead letter carries the id every attempt had.
        incoming.setdefault(MESSAGE_ID, msg.message_id)
        return incoming

    def _mirror_attempt(self, msg: StreamMessage[Any], attempt: int) -> None:
        msg.headers[h.ATTEMPT] = str(attempt)

    def _dead_letter_address(self, route: Route) -> str:
        return keys.stream_keys(route.queue).dlq

    async def _hand_over(self, msg: StreamMessage[Any], route: Route, letter: Step) -> None:
        await self._broker.publish(
            msg.body,
            stream=self._dead_letter_address(route),
            headers=envelope.to_wire(letter.copy.headers),
            correlation_id=msg.correlation_id,
        )
