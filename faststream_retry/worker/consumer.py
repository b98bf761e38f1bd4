"""The retry worker's intake consumer: dead letters in, retry copies or dead letters out.

Each delivery is decided by ``core.intake.intake_step`` and settled like a re-check step:
acked only once its copy is confirmed, requeued after a pause otherwise. It runs on
channels of its own: acks of the re-check consumers go out in ``multiple`` runs per
channel, which must never cover an intake delivery still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING, Any

from aio_pika import ExchangeType
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from faststream_retry.amqp.channels import RPC_TIMEOUT_S, close_quietly
from faststream_retry.amqp.publisher import Outcome
from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.events import Reason, Rule, Verdict
from faststream_retry.core.intake import DeadLetter, Refuse, intake_step
from faststream_retry.core.topology import intake_dlq_name
from faststream_retry.engine.recheck import settle
from faststream_retry.engine.step import publish_step
from faststream_retry.errors import RetryTopologyError
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

    from faststream_retry.amqp.publisher import Publisher
    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.core.worker_config import WorkerConfig
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["IntakeConsumer", "check_intake", "declare_intake", "intake_arguments"]


def intake_arguments(config: WorkerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the arguments of the intake queue and of the intake's DLQ."""
    options = config.retry.topology
    base: dict[str, Any] = {"x-queue-type": options.queue_type}
    if options.queue_type != "quorum":
        return dict(base), dict(base)
    # A delivery that crashes the worker again and again ends in the intake's DLQ,
    # never nowhere; at-least-once so a node failing meanwhile cannot drop it.
    return {
        **base,
        "x-delivery-limit": options.delivery_limit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": intake_dlq_name(config.prefix),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }, dict(base)


async def declare_intake(channel: AbstractChannel, config: WorkerConfig) -> None:
    """Declare the intake exchange (internal: only dead-lettering can publish to it) and queues."""
    name = config.intake
    arguments, dlq_arguments = intake_arguments(config)
    await channel.declare_queue(
        intake_dlq_name(config.prefix), durable=True, arguments=dlq_arguments, timeout=RPC_TIMEOUT_S
    )
    exchange = await channel.declare_exchange(
        name, ExchangeType.FANOUT, durable=True, internal=True, timeout=RPC_TIMEOUT_S
    )
    queue = await channel.declare_queue(
        name, durable=True, arguments=arguments, timeout=RPC_TIMEOUT_S
    )
    await queue.bind(exchange, routing_key="", timeout=RPC_TIMEOUT_S)


async def check_intake(connection: AbstractRobustConnection, config: WorkerConfig) -> None:
    """Declare the intake objects at start; a refusal becomes a message naming the fix.

    Raises:
        RetryTopologyError: one of them exists with other arguments, or the user may not
            declare it.
    """
    channel = await connection.channel()
    try:
        await declare_intake(channel, config)
    except ChannelPreconditionFailed as exc:
        raise RetryTopologyError(
            f"the worker's intake ({config.intake}, {intake_dlq_name(config.prefix)}) exists "
            f"with other arguments: {exc.args[0] if exc.args else exc}. Another prefix or "
            "queue_type was used before: set the same in the config, or delete those objects "
            "once they are empty"
        ) from exc
    except ChannelAccessRefused as exc:
        raise RetryTopologyError(
            f"the worker may not declare its intake ({config.intake}): "
            f"{exc.args[0] if exc.args else exc}. Give its user configure, write and read "
            f"permissions on '^{config.prefix}\\.'"
        ) from exc
    finally:
        await close_quietly(channel)


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
        self._rand = rand
        self._pause_s = config.retry.pause_s
        self._pending: set[asyncio.Task[Any]] = set()
        self._consumer: tuple[Any, str] | None = None

    async def start(self, channel: AbstractChannel) -> str:
        """Consume the intake queue on ``channel``; return the consumer tag."""
        queue = await channel.get_queue(self._config.intake, ensure=False)
        tag = await queue.consume(self._on_message, timeout=RPC_TIMEOUT_S)
        self._consumer = (queue, tag)
        return tag

    async def stop(self, wait_s: float) -> None:
        """Stop consuming and give the deliveries in flight up to ``wait_s`` to settle."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer[0].cancel(consumer[1], timeout=RPC_TIMEOUT_S)
        if self._pending:
            await asyncio.wait(self._pending, timeout=wait_s)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._pending.add(task)
        try:
            await self.handle(message)
        finally:
            if task is not None:
                self._pending.discard(task)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Decide what ``message`` needs, publish that copy, then settle the delivery."""
        outcomes: list[Outcome] = []
        try:
            await self._act(message, outcomes)
        except Exception:  # a hostile message must never kill the consumer
            log.exception("faststream-retry worker: a dead letter from the intake failed")
        except BaseException:
            # Cancelled (a stop, a lost connection) after the copy was confirmed: acked,
            # or the broker would deliver it again, a second copy.
            await settle(message, ok=Outcome.CONFIRMED in outcomes, pause_s=0)
            raise
        ok = Outcome.CONFIRMED in outcomes
        await settle(message, ok=ok, pause_s=0 if ok else self._pause_s)

    async def _act(self, message: AbstractIncomingMessage, outcomes: list[Outcome]) -> None:
        plan = self._plan()
        now = h.now_ms()
        incoming = message.headers
        step = intake_step(
            exchange=message.exchange or "",
            intake_exchange=self._config.intake,
            headers=incoming,
            rules=self._config.rules,
            tiers=plan.tiers,
            now_ms=now,
            rand=self._rand,
        )
        if isinstance(step, Refuse):
            await self._send(message, outcomes, self._refuse(message, step, now))
            return
        try:
            route = await self._cover(step.queue)
        except RetryTopologyError as exc:
            # Its .retry or .dlq exists with other arguments, or may not be declared:
            # kept in the intake's DLQ with the reason, not retried every second.
            refusal = Refuse(f"cannot retry in {step.queue!r}: {exc}", step.queue)
            await self._send(message, outcomes, self._refuse(message, refusal, now))
            return
        if isinstance(step, DeadLetter):
            sent = steps.dead_letter(
                route.dlq,
                route.queue,
                message.message_id,
                incoming,
                step.failure,
                reason=step.reason,
                max_attempts=step.max_attempts,
                rule=Rule.DEAD_LETTERING,
                classification=Verdict.PERMANENT,
            )
        else:
            sent = steps.retry(
                plan,
                route,
                message.message_id,
                incoming,
                step.failure,
                max_attempts=step.max_attempts,
                rule=Rule.DEAD_LETTERING,
                classification=Verdict.TRANSIENT,
            )
        await self._send(message, outcomes, sent, dlq=route.dlq)

    async def _send(
        self,
        message: AbstractIncomingMessage,
        outcomes: list[Outcome],
        step: Step,
        *,
        dlq: str | None = None,
    ) -> None:
        """Publish ``step``'s copy and report it; ``outcomes`` learns each outcome at once.

        ``dlq`` takes the message if a retry copy cannot fit in a frame (a dead letter
        makes room instead).
        """
        await publish_step(
            self._reporter,
            self._publisher,
            message,
            step,
            dlq=step.copy.routing_key if dlq is None else dlq,
            origin_queue=step.event.queue,
            outcomes=outcomes,
        )

    def _refuse(self, message: AbstractIncomingMessage, step: Refuse, now: int) -> Step:
        intake = self._config.intake
        failure = h.FailureRecord(
            attempt=h.read_attempt(message.headers),
            at_ms=now,
            exception="refused",
            error=step.problem,
        )
        # The queue it died in, when RabbitMQ says so, for the operator who replays it
        # there (dlq replay <prefix>.intake --to <queue>) once the config names it.
        return steps.dead_letter(
            intake_dlq_name(self._config.prefix),
            intake,
            message.message_id,
            message.headers,
            failure,
            reason=Reason.INVALID,
            origin_queue=step.queue or intake,
            rule=Rule.DEAD_LETTERING,
            classification=Verdict.PERMANENT,
        )
