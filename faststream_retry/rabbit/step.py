"""One step's copy, published with a confirm and reported; one too large goes to the DLQ.

The middleware, the re-check consumer and the retry worker all end a step here; where
each copy goes, and where a copy that cannot fit goes instead, is ``core.steps``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.rabbit.publisher import Outcome

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

    from faststream_retry.core.steps import Copy, Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.rabbit.publisher import Publisher
    from faststream_retry.rabbit.requeues import Requeues
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["give_up", "publish_step"]


async def publish_step(
    reporter: Reporter,
    publisher: Publisher,
    message: AbstractIncomingMessage,
    step: Step,
    *,
    exception: BaseException | None = None,
    outcomes: list[Outcome] | None = None,
) -> bool:
    """Publish ``step``'s copy of ``message`` inside its event's span; ``True`` once confirmed.

    A copy too large for a frame is replaced by the step's ``invalid`` dead letter
    (``core.steps.too_large``), reported as such; ``outcomes`` collects each publish's
    outcome.
    """
    seen: list[Outcome] = [] if outcomes is None else outcomes

    async def send(copy: Copy) -> bool:
        outcome = await publisher.deliver(message, copy)
        seen.append(outcome)
        return outcome is Outcome.CONFIRMED

    incoming = message.headers
    ok = await reporter.publish(
        step.event,
        step.copy,
        send,
        incoming=incoming,
        exception=exception,
        tier_ms=step.tier_ms,
    )
    if ok or seen[-1:] != [Outcome.TOO_LARGE]:
        return ok
    letter = steps.too_large(step, incoming, now_ms=h.now_ms())
    if letter is None:
        return ok
    return await reporter.publish(
        letter.event, letter.copy, send, incoming=incoming, exception=exception
    )


async def give_up(
    reporter: Reporter,
    publisher: Publisher,
    message: AbstractIncomingMessage,
    tried: Step,
    *,
    plan: Plan,
    route: Route,
    outcomes: list[Outcome],
    requeues: Requeues,
    exception: BaseException | None = None,
    held: int = 0,
) -> bool:
    """Dead-letter ``message``, whose copy ``tried`` was not confirmed, if it has tried enough.

    ``core.steps.stuck`` says when: the delivery came back ``delivery_limit`` times (by
    the broker's count or by ``requeues``, this process's, plus ``held``: the times its
    copy was placed again while the message was held), or a release is ``max_delay``
    late. ``True`` once that dead letter is confirmed (ack the original); ``False``: the
    caller holds or requeues it, and ``requeues`` counts that.
    """
    if not outcomes or Outcome.CONFIRMED in outcomes:
        return False
    letter = steps.stuck(
        route,
        tried,
        message.headers,
        now_ms=h.now_ms(),
        limit=plan.options.delivery_limit,
        max_delay_ms=plan.tiers.max_delay_ms,
        outcome=outcomes[-1].value,
        requeued=requeues.seen(route.queue, message),
        held=held,
    )
    if letter is not None and await publish_step(
        reporter, publisher, message, letter, exception=exception, outcomes=outcomes
    ):
        requeues.settled(route.queue, message)
        return True
    if not held:
        requeues.requeued(route.queue, message)
    return False
