"""Test mode under ``TestNatsBroker``: ``test_mode``'s sink, reading and writing as NATS does.

The decisions, the in-process retries and the recorder are ``test_mode.TestSink``'s. What
differs is the wire: a handler's ``retry-*`` headers are JSON text on NATS (``nats.wire``),
so the attempt a retried call sees is written that way; a dead-lettered message is
terminated, as the live sink does once its dead letter is confirmed; and the dead letter
is published, headers as the dead-letter stream would hold them, to
``<prefix>.dlq.<key>`` (``nats.naming``), where every subscriber of that subject gets it
(``TestNatsBroker`` drops a publish nobody consumes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.middleware.test_mode import TestSink
from faststream_retry.nats import naming, wire

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream.message import StreamMessage

    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Route

__all__ = ["NatsTestSink"]


class NatsTestSink(TestSink):
    """Under ``TestNatsBroker``: retries in process, records, dead letters to their subject."""

    __slots__ = ()

    def _incoming(self, msg: StreamMessage[Any]) -> Mapping[str, Any]:
        return wire.failed(msg.headers, subject=msg.raw_message.subject, message_id=msg.message_id)

    def _mirror_attempt(self, msg: StreamMessage[Any], attempt: int) -> None:
        msg.headers[h.ATTEMPT] = wire.value(attempt)

    async def _settle(self, msg: StreamMessage[Any]) -> None:
        await msg.reject()  # term: JetStream would never deliver it again

    def _dead_letter_address(self, route: Route) -> str:
        return naming.dlq_subject(self._plan.options.prefix, route.queue)

    async def _hand_over(self, msg: StreamMessage[Any], route: Route, letter: Step) -> None:
        # No Nats-Msg-Id: the real one names the stream sequence of the message, and a
        # message under TestNatsBroker has none.
        await self._broker.publish(
            msg.body,
            self._dead_letter_address(route),
            headers=wire.encode(letter.copy.headers, msg_id=None),
            correlation_id=msg.correlation_id,
        )
