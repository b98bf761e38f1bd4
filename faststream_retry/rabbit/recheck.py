"""The re-check consumer: the step a long wait passes between its tiers.

A wait that is one tier never comes here (its copy goes from the tier straight to the
work queue); a longer one comes back after each tier but the last, and is sent round the
next, or released when it is due.

It is written on aio-pika directly because every hop of every waiting message passes it.
The destination comes from the queue the message was consumed from, never from a header,
so a forged header cannot move a message to another queue. What each copy is comes from
``core.steps`` (``recheck``, ``wait_again``); consuming and settling from
``rabbit.consumer``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.rabbit.consumer import Consumer
from faststream_retry.rabbit.publisher import Outcome
from faststream_retry.rabbit.step import give_up, publish_step

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, ConsumerTag

    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.rabbit.publisher import Publisher
    from faststream_retry.rabbit.requeues import Requeues
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["RecheckConsumer"]


class RecheckConsumer:
    """Consumes every route's ``<queue>.retry``: releases due messages, sends the rest round."""

    def __init__(
        self,
        plan: Plan,
        publisher: Publisher,
        reporter: Reporter,
        *,
        pause_s: float,
        requeues: Requeues,
    ) -> None:
        """Act on ``plan``'s routes.

        A copy that is not confirmed is requeued after ``pause_s``, except a release the
        work queue refuses: that one waits in a tier (``core.steps.wait_again``).
        """
        self._plan = plan
        self._publisher = publisher
        self._reporter = reporter
        self._requeues = requeues
        # Acks in runs: the re-check consumers have their channel to themselves.
        self._consumer = Consumer(pause_s=pause_s, ack_runs=True)
        self._channel: AbstractChannel | None = None
        self._consuming = asyncio.Lock()

    @property
    def plan(self) -> Plan:
        """Return the plan whose routes are consumed."""
        return self._plan

    @plan.setter
    def plan(self, plan: Plan) -> None:
        # Same tiers, other routes: a subscriber started or stopped after the broker.
        self._plan = plan

    async def start(self, channel: AbstractChannel) -> list[ConsumerTag]:
        """Consume every route's re-check queue on ``channel``; return the consumer tags.

        Once per channel: a second call with the same channel starts nothing.
        """
        if channel is self._channel:
            return []
        self._channel = channel
        self._consumer.forget()  # those of a previous channel went with it
        for route in list(self._plan.routes.values()):
            if not await self._consume(channel, route):
                return []
        return self._consumer.tags

    async def add(self, route: Route) -> ConsumerTag | None:
        """Consume ``route``'s re-check queue too, if consuming; return the new tag."""
        channel = self._channel
        if channel is None or channel.is_closed or route.queue in self._consumer:
            return None  # start() on the next channel consumes every route of the plan
        if not await self._consume(channel, route):
            return None
        return self._consumer.tag(route.queue)

    async def remove(self, queue: str) -> None:
        """Stop consuming the re-check queue of ``queue``."""
        await self._consumer.cancel(queue)

    async def _consume(self, channel: AbstractChannel, route: Route) -> bool:
        """Consume ``route``'s re-check queue on ``channel``; ``False`` if stopped meanwhile."""
        async with self._consuming:  # start() and add() may race for one route
            if route.queue in self._consumer:
                return True
            # Declared before it is consumed (at start, when its subscriber joined, and
            # on every reopen): a queue gone meanwhile answers 404, and the channels
            # reopen, declaring the plan again.
            queue = await channel.get_queue(route.retry_queue, ensure=False)
            await self._consumer.consume(
                route.queue,
                queue,
                functools.partial(self.handle, route),
                what=f"re-check of a message from {route.retry_queue}",
            )
            if self._channel is not channel:  # stop() ran meanwhile: undo, and leave
                await self._consumer.cancel(route.queue)
                return False
            return True

    async def stop(self, wait_s: float) -> None:
        """Stop consuming and give the messages in flight up to ``wait_s`` to finish."""
        self._channel = None
        await self._consumer.stop(wait_s)

    async def handle(
        self, route: Route, message: AbstractIncomingMessage, outcomes: list[Outcome]
    ) -> None:
        """Release ``message`` if it is due, else send it round a tier; ``outcomes`` learns each.

        A release the work queue refuses (a nack: it exists but will not take the
        message now) waits in a tier instead, while the delivery can still be acked:
        else the broker delivers it again, and a tier copy would be a second one.
        """
        plan = self._plan
        incoming = message.headers
        step = steps.recheck(plan, route, message.message_id, incoming, now_ms=h.now_ms())
        if await self._publish(message, step, outcomes):
            return
        if outcomes == [Outcome.REFUSED]:
            again = steps.wait_again(plan, route, step, incoming, now_ms=h.now_ms())
            if (
                again is not None
                and not message.channel.is_closed
                and await self._publish(message, again, outcomes)
            ):
                return
        await give_up(
            self._reporter,
            self._publisher,
            message,
            step,
            plan=plan,
            route=route,
            outcomes=outcomes,
            requeues=self._requeues,
        )

    async def _publish(
        self, message: AbstractIncomingMessage, step: steps.Step, outcomes: list[Outcome]
    ) -> bool:
        return await publish_step(self._reporter, self._publisher, message, step, outcomes=outcomes)
