"""The live sink of a running ``RabbitBroker``.

It publishes the copy ``core.steps`` builds with a broker confirm (``rabbit.step``), then
acks the original, or requeues it after a pause when the copy was not confirmed, until
``rabbit.step.give_up`` dead-letters it (``stuck``): RabbitMQ 4.3 no longer ends that loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.decision import Action
from faststream_retry.middleware.sink import requeue_after_pause
from faststream_retry.rabbit.step import give_up, publish_step

if TYPE_CHECKING:
    from faststream.message import StreamMessage

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.topology import Route
    from faststream_retry.rabbit.live import Live
    from faststream_retry.rabbit.publisher import Outcome
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["LiveSink"]


class LiveSink:
    """A running broker's sink: a retry later or a dead letter is a confirmed copy, then an ack."""

    __slots__ = ("_live", "_pause_s", "_reporter")

    def __init__(self, live: Live, reporter: Reporter, pause_s: float) -> None:
        """Publish through ``live``; a message whose copy failed is requeued after ``pause_s``."""
        self._live = live
        self._reporter = reporter
        self._pause_s = pause_s

    async def retry(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """An immediate retry is made now, in process; a later one is a copy into the tiers."""
        if decision.action is Action.RETRY_NOW:
            self._reporter.in_process(
                route.queue, msg.message_id, msg.headers, decision, exc, immediate=True
            )
            return True
        await self._send(msg, route, decision, exc)
        return False

    async def dead_letter(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Publish the dead letter to ``<queue>.dlq``, then settle the original."""
        await self._send(msg, route, decision, exc)
        return True

    async def _send(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> None:
        """Publish the copy the decision calls for, report it once confirmed, and settle.

        Acked after a confirmed copy. A copy the broker would not take (a full tier, a
        queue refusing it) is placed again after a pause while the message is held:
        the handler ran once and is not run again for it. Once the delivery limit is
        reached it is dead-lettered (``stuck``); a message whose channel closed
        meanwhile is the broker's to redeliver.
        """
        live = self._live
        raw = msg.raw_message
        step = steps.failed(
            live.plan,
            route,
            decision,
            exc,
            message_id=msg.message_id,
            incoming=raw.headers,
            now_ms=h.now_ms(),
        )
        held = 0
        while True:
            outcomes: list[Outcome] = []
            if await publish_step(
                self._reporter, live.publisher, raw, step, exception=exc, outcomes=outcomes
            ) or await give_up(
                self._reporter,
                live.publisher,
                raw,
                step,
                plan=live.plan,
                route=route,
                outcomes=outcomes,
                requeues=live.requeues,
                exception=exc,
                held=held,
            ):
                await msg.ack()
                return
            # Held, the copy is placed again after the pause; at a stop, or once the
            # channel closed, the message goes back instead.
            if not _holdable(raw) or not await live.hold(self._pause_s):
                await requeue_after_pause(msg, 0)
                return
            held += 1


def _holdable(raw: Any) -> bool:  # noqa: ANN401 - aio-pika's incoming message
    """Whether ``raw`` can still be acked later: its channel is open.

    Once it closed, the broker has the message back already, and redelivers it.
    """
    try:
        channel = raw.channel  # aio-pika raises once it closed
    except Exception:
        return False
    return not getattr(channel, "is_closed", True)
