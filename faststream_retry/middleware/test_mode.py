"""Test mode's sink: what becomes of a failure under ``TestRabbitBroker``.

``TestRabbitBroker`` replaces the broker's start, so the plugin's start hook never runs
and there is no broker to hold a copy. Inside a ``testing()`` block the scope goes on
(outside one it leaves the message to FastStream), and ``Runtime.sink`` notices
(FastStream's fake producer is in place and the plugin is not started) and hands
failures here. Decisions
are made exactly as in production; a retry is made at once instead of waiting, and a
dead letter is settled without a broker to hold it, handed to the app's ``<queue>.dlq``
subscriber if it has one. ``nats.test_mode`` is the same under ``TestNatsBroker``, and
``redis.test_mode`` under ``TestRedisBroker``: each changes only how the message and its
dead letter are read and written (``_incoming``, ``_mirror_attempt``, ``_settle``,
``_hand_over``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.decision import Action
from faststream_retry.middleware import _internals
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream.message import StreamMessage

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["TestSink"]


class TestSink:
    """Under ``TestRabbitBroker``: retries in process, records, dead letters to ``<queue>.dlq``."""

    __slots__ = ("_broker", "_plan", "_reporter", "_testing")

    def __init__(
        self,
        broker: Any,  # noqa: ANN401 - a RabbitBroker (NATS's and Redis' in their test_mode)
        topology: Plan,
        reporter: Reporter,
        testing: Testing,
    ) -> None:
        """Sink the failures of ``broker``'s messages, planned as ``topology``."""
        self._broker = broker
        self._plan = topology
        self._reporter = reporter
        self._testing = testing

    async def retry(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Every retry is made now: there is no TTL to wait for. Its delay is still reported."""
        immediate = decision.action is Action.RETRY_NOW
        self._reporter.in_process(
            route.queue, msg.message_id, msg.headers, decision, exc, immediate=immediate
        )
        # Mirror what the copy would carry, so the handler sees its attempt.
        self._mirror_attempt(msg, decision.attempt)
        return True

    def _mirror_attempt(self, msg: StreamMessage[Any], attempt: int) -> None:
        """Write ``attempt`` into the message's headers as its copy would carry it."""
        msg.headers[h.ATTEMPT] = attempt

    async def dead_letter(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Record and settle a dead letter; hand it to the app's ``<queue>.dlq`` subscriber.

        The ``.dlq`` subscriber, if the app has one, gets the headers and properties the
        real copy would carry, so a test can assert on what an operator would find;
        without one there is nowhere to put it (``TestRabbitBroker`` refuses a publish
        nobody consumes). If that subscriber raises, the dead letter stays settled and
        its exception is logged at ERROR, or, under
        ``testing(raise_on_dead_letter=True)``, raised from ``publish()`` with the
        handler's exception as its cause. Returns ``False`` under
        ``raise_on_dead_letter``: the handler's exception is not suppressed, and
        ``TestRabbitBroker`` raises it from ``publish()``, as it does for a handler
        without the plugin.
        """
        letter = steps.failed(
            self._plan,
            route,
            decision,
            exc,
            message_id=msg.message_id,
            incoming=self._incoming(msg),
            now_ms=h.now_ms(),
        )
        # Where this broker's dead letters are (a Redis key, a NATS subject), as live.
        event = dataclasses.replace(letter.event, dlq=self._dead_letter_address(route))
        self._reporter.record(event, incoming=msg.headers, exception=exc)
        await self._settle(msg)
        try:
            await self._hand_over(msg, route, letter)
        except Exception as failure:  # the app's dead-letter handler raised on it
            if self._testing.raise_on_dead_letter:
                # A bug in the .dlq consumer must fail the test, not pass a
                # pytest.raises() written for the handler's exception.
                raise failure from exc
            log.error(
                "the %s subscriber failed on the dead letter of message %s",
                self._dead_letter_address(route),
                msg.message_id,
                exc_info=failure,
            )
        return not self._testing.raise_on_dead_letter

    def _incoming(self, msg: StreamMessage[Any]) -> Mapping[str, Any]:
        """The message's headers as the core reads them."""
        return msg.headers

    async def _settle(self, msg: StreamMessage[Any]) -> None:
        """Settle a dead-lettered message as the live sink does once its dead letter is stored."""
        await msg.ack()

    def _dead_letter_address(self, route: Route) -> str:
        """Where the route's dead letters go: the log line's name of their subscriber."""
        return route.dlq

    async def _hand_over(self, msg: StreamMessage[Any], route: Route, letter: Step) -> None:
        """Publish the dead letter to the app's ``<queue>.dlq`` subscriber, if it has one."""
        broker = self._broker
        if any(_internals.queue_of(sub) == route.dlq for sub in broker.subscribers):
            await broker.publish(
                msg.body,
                queue=route.dlq,
                headers=letter.copy.headers,
                message_id=msg.message_id,
                correlation_id=msg.correlation_id,
                content_type=msg.content_type or None,
            )
