"""The re-check consumer: the step a long wait passes between its tiers.

A wait that is one tier never comes here (its copy goes from the tier straight to the
work queue); a longer one comes back after each tier but the last, and is sent round the
next, or released when it is due.

It is written on aio-pika directly because every hop of every waiting message passes it.
The destination comes from the queue the message was consumed from, never from a header,
so a forged header cannot move a message to another queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import TYPE_CHECKING, Any

from faststream_retry.amqp.acks import AckRuns
from faststream_retry.amqp.channels import RPC_TIMEOUT_S
from faststream_retry.amqp.declare import declare_retry_queue
from faststream_retry.amqp.publisher import Outcome
from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.decision import Hop, Release, recheck_step
from faststream_retry.core.events import Reason
from faststream_retry.engine.step import publish_step
from faststream_retry.errors import InvalidDueTime
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue, ConsumerTag

    from faststream_retry.amqp.publisher import Publisher
    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["RecheckConsumer", "settle"]


class RecheckConsumer:
    """Consumes every route's ``<queue>.retry``: releases due messages, sends the rest round."""

    def __init__(
        self, plan: Plan, publisher: Publisher, reporter: Reporter, *, pause_s: float
    ) -> None:
        """Act on ``plan``'s routes.

        A copy that is not confirmed is requeued after ``pause_s``, except a release the
        work queue refuses: that one goes round the base tier once more.
        """
        self._plan = plan
        self._publisher = publisher
        self._reporter = reporter
        self._pause_s = pause_s
        self._consumers: dict[str, tuple[AbstractQueue, ConsumerTag]] = {}
        self._channel: AbstractChannel | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._acks: weakref.WeakKeyDictionary[Any, AckRuns] = weakref.WeakKeyDictionary()
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
        self._consumers.clear()  # those of a previous channel went with it
        for route in list(self._plan.routes.values()):
            if not await self._consume(channel, route):
                return []
        return [tag for _, tag in self._consumers.values()]

    async def add(self, route: Route) -> ConsumerTag | None:
        """Consume ``route``'s re-check queue too, if consuming; return the new tag."""
        channel = self._channel
        if channel is None or channel.is_closed or route.queue in self._consumers:
            return None  # start() on the next channel consumes every route of the plan
        if not await self._consume(channel, route):
            return None
        return self._consumers[route.queue][1]

    async def remove(self, queue: str) -> None:
        """Stop consuming the re-check queue of ``queue``."""
        consumer = self._consumers.pop(queue, None)
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer[0].cancel(consumer[1], timeout=RPC_TIMEOUT_S)

    async def _consume(self, channel: AbstractChannel, route: Route) -> bool:
        """Consume ``route``'s re-check queue on ``channel``; ``False`` if stopped meanwhile."""
        async with self._consuming:  # start() and add() may race for one route
            if route.queue in self._consumers:
                return True
            queue = await declare_retry_queue(channel, self._plan, route)
            tag = await queue.consume(self._callback(route), timeout=RPC_TIMEOUT_S)
            if self._channel is not channel:  # stop() ran meanwhile: undo, and leave
                with contextlib.suppress(Exception):
                    await queue.cancel(tag, timeout=RPC_TIMEOUT_S)
                return False
            self._consumers[route.queue] = (queue, tag)
            return True

    async def stop(self, wait_s: float) -> None:
        """Stop consuming and give the messages in flight up to ``wait_s`` to finish."""
        self._channel = None
        for queue, tag in self._consumers.values():
            with contextlib.suppress(Exception):
                await queue.cancel(tag, timeout=RPC_TIMEOUT_S)
        self._consumers.clear()
        if self._pending:
            await asyncio.wait(self._pending, timeout=wait_s)
        # Acks still on their way: a channel closed before them would have the broker
        # deliver those messages again, duplicates of copies already confirmed.
        for runs in list(self._acks.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runs.drain(), wait_s)

    def _callback(self, route: Route) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def on_message(message: AbstractIncomingMessage) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._pending.add(task)
            try:
                await self.handle(route, message)
            finally:
                if task is not None:
                    self._pending.discard(task)

        return on_message

    async def handle(self, route: Route, message: AbstractIncomingMessage) -> None:
        """Release ``message`` if it is due, else send it round a tier; then settle it."""
        ok = False
        outcomes: list[Outcome] = []
        try:
            now = h.now_ms()
            incoming = message.headers
            due = h.read_due(incoming)
            attempt = h.read_attempt(incoming)
            plan = self._plan
            step = recheck_step(due, now, plan.tiers)

            def hop(tier_ms: int, at_ms: int, *, last: bool) -> Step:
                return steps.hop(
                    plan,
                    route,
                    message.message_id,
                    incoming,
                    attempt=attempt,
                    now_ms=at_ms,
                    due_ms=due,
                    tier_ms=tier_ms,
                    last=last,
                )

            if isinstance(step, Release):
                sent = steps.release(
                    route,
                    message.message_id,
                    incoming,
                    attempt=attempt,
                    now_ms=now,
                    due_ms=due,
                    lateness_ms=step.lateness_ms,
                )
            elif isinstance(step, Hop):
                sent = hop(step.tier_ms, now, last=step.last)
            else:
                sent = self._invalid(route, message, attempt, now, due)

            ok = await self._publish(route, message, sent, outcomes)
            if not ok and isinstance(step, Release) and self._wait_again(step, outcomes, message):
                # Half the time it is already late, at least a tick: a refusal of a few
                # seconds costs a few tries, a long one a try every so often.
                tier_ms = plan.tiers.pick(max((step.lateness_ms or 0) // 2, plan.tiers.tick_ms))
                ok = await self._publish(
                    route, message, hop(tier_ms, h.now_ms(), last=False), outcomes
                )
        except Exception:  # a hostile message must never kill the consumer
            log.exception("re-check of a message from %s failed", route.retry_queue)
        except BaseException:
            # KeyboardInterrupt, SystemExit or an application's own BaseException from a
            # hook or a log handler, after the copy was confirmed: it goes on, but this
            # delivery is settled first as the copy says, or the broker would deliver
            # it again later, a duplicate of the copy.
            await settle(message, ok=Outcome.CONFIRMED in outcomes, pause_s=0)
            runs = self._runs(message)
            if runs is not None:
                runs.settled(message)
            raise
        runs = self._runs(message)
        if runs is None:
            return  # its channel closed: the broker delivers it again, nothing to ack
        if ok:
            # Acked with the other deliveries confirmed in this turn, in one frame.
            runs.ack(message)
            return
        await settle(message, ok=False, pause_s=self._pause_s)
        runs.settled(message)

    async def _publish(
        self,
        route: Route,
        message: AbstractIncomingMessage,
        step: Step,
        outcomes: list[Outcome],
    ) -> bool:
        return await publish_step(
            self._reporter,
            self._publisher,
            message,
            step,
            dlq=route.dlq,
            origin_queue=route.queue,
            outcomes=outcomes,
        )

    def _runs(self, message: AbstractIncomingMessage) -> AckRuns | None:
        """Return the ack runs of the channel ``message`` came on; ``None`` once it closed.

        aio-pika raises on reading a closed channel: a broker restart closes it under
        every delivery in flight, and each would end its task in a traceback.
        """
        try:
            channel = message.channel
        except Exception:  # ChannelInvalidStateError, whatever the aio-pika version
            return None
        runs = self._acks.get(channel)
        if runs is None:
            runs = self._acks[channel] = AckRuns(channel)
        return runs

    def _wait_again(
        self, step: Release, outcomes: list[Outcome], message: AbstractIncomingMessage
    ) -> bool:
        """Whether a release that failed should wait in a tier rather than be requeued.

        Requeueing spends a redelivery of ``.retry``, and a quorum ``.retry``
        dead-letters at its delivery limit: a work queue whose leader moves for longer
        than limit x pause would send every waiting message to the DLQ. A tier costs no
        redelivery. Only for a nack (the queue exists but will not take the message now),
        only while the delivery can still be acked (else the broker redelivers it and a
        tier copy would be a second one), and only for up to ``max_delay`` past the due
        time: a queue that refuses for longer gets the requeue path and its limit back.
        """
        return (
            outcomes == [Outcome.REFUSED]
            and step.lateness_ms is not None
            and step.lateness_ms < self._plan.tiers.max_delay_ms
            and not message.channel.is_closed
        )

    def _invalid(
        self,
        route: Route,
        message: AbstractIncomingMessage,
        attempt: int,
        now: int,
        due: int | None,
    ) -> Step:
        error = InvalidDueTime(
            f"retry-due {due} is more than max_delay ({self._plan.tiers.max_delay_ms} ms) "
            f"ahead of now ({now})"
        )
        failure = h.FailureRecord(
            attempt=attempt, at_ms=now, exception=h.exception_name(error), error=str(error)
        )
        return steps.dead_letter(
            route.dlq,
            route.queue,
            message.message_id,
            message.headers,
            failure,
            reason=Reason.INVALID,
            due_ms=due,
        )


async def settle(message: AbstractIncomingMessage, *, ok: bool, pause_s: float) -> None:
    """Ack after a confirmed publish; otherwise requeue, after a pause (no hot loop)."""
    try:
        if ok:
            await message.ack()
            return
        if pause_s:
            await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
        await message.nack(requeue=True)
    except Exception as exc:  # channel gone: the broker redelivers the unacked copy
        # A broker restart closes the channel under every delivery in flight: one line
        # each at WARNING would flood the log with what the reconnect line says.
        log.debug("could not settle message %s: %r", message.message_id, exc)
