"""The retry worker's intake consumer: dead letters in, retry copies or dead letters out.

Each delivery is decided by ``core.intake.intake_step``, its copy built by
``core.steps`` (``intake``, ``refused``), and it is consumed and settled by
``rabbit.consumer`` as a re-check step is: acked only once its copy is confirmed, requeued
after a pause otherwise. It runs on channels of its own: acks of the re-check consumers
go out in ``multiple`` runs per channel, which must never cover an intake delivery still
in flight. The intake's queues are ``worker.declare``'s.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.intake import Refuse, intake_step
from faststream_retry.core.topology import intake_dlq_name
from faststream_retry.errors import RetryTopologyError
from faststream_retry.rabbit.consumer import Consumer
from faststream_retry.rabbit.step import give_up, publish_step

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.core.worker_config import WorkerConfig
    from faststream_retry.rabbit.publisher import Outcome, Publisher
    from faststream_retry.rabbit.requeues import Requeues
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["IntakeConsumer"]


class IntakeConsumer:
    """Consumes ``<prefix>.intake`` and acts on each dead letter."""

    def __init__(
        self,
        config: WorkerConfig,
        plan: Callable[[], Plan],
        cover: Callable[[str], Awaitable[Route]],
        publisher: Publisher,
        reporter: Reporter,
        *,
        requeues: Requeues,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """Decide with ``config``'s rules on ``plan()``'s tiers; ``cover(queue)`` readies a queue.

        ``cover`` declares a queue's ``.retry`` and ``.dlq`` and starts its re-check
        consumer the first time a dead letter of it arrives (a queue a pattern names).
        """
        self._config = config
        self._plan = plan
        self._cover = cover
        self._publisher = publisher
        self._reporter = reporter
        self._requeues = requeues
        self._rand = rand
        # Acks one by one: the re-check consumers' runs are on channels of their own.
        self._consumer = Consumer(pause_s=config.retry.pause_s)

    async def start(self, channel: AbstractChannel) -> str:
        """Consume the intake queue on ``channel``; return the consumer tag."""
        intake = self._config.intake
        queue = await channel.get_queue(intake, ensure=False)
        return await self._consumer.consume(
            intake,
            queue,
            self.handle,
            what="faststream-retry worker: a dead letter from the intake",
        )

    async def stop(self, wait_s: float) -> None:
        """Stop consuming and give the deliveries in flight up to ``wait_s`` to settle."""
        await self._consumer.stop(wait_s)

    async def handle(self, message: AbstractIncomingMessage, outcomes: list[Outcome]) -> None:
        """Decide what ``message`` needs and publish that copy; ``outcomes`` learns each."""
        plan = self._plan()
        now = h.now_ms()
        incoming = message.headers
        decided = intake_step(
            exchange=message.exchange or "",
            intake_exchange=self._config.intake,
            headers=incoming,
            rules=self._config.rules,
            tiers=plan.tiers,
            now_ms=now,
            rand=self._rand,
        )
        if isinstance(decided, Refuse):
            step = self._refused(message, decided, now)
        else:
            try:
                route = await self._cover(decided.queue)
            except RetryTopologyError as exc:
                # Its .retry or .dlq exists with other arguments, or may not be declared:
                # kept in the intake's DLQ with the reason, not retried every second.
                refusal = Refuse(f"cannot retry in {decided.queue!r}: {exc}", decided.queue)
                step = self._refused(message, refusal, now)
            else:
                step = steps.intake(plan, route, message.message_id, incoming, decided)
                if not await self._publish(message, step, outcomes):
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
                return
        await self._publish(message, step, outcomes)

    async def _publish(
        self, message: AbstractIncomingMessage, step: Step, outcomes: list[Outcome]
    ) -> bool:
        return await publish_step(self._reporter, self._publisher, message, step, outcomes=outcomes)

    def _refused(self, message: AbstractIncomingMessage, refusal: Refuse, now: int) -> Step:
        return steps.refused(
            refusal,
            intake_queue=self._config.intake,
            dlq=intake_dlq_name(self._config.prefix),
            message_id=message.message_id,
            incoming=message.headers,
            now_ms=now,
        )
