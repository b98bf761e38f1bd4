"""One step's copy, published and reported; one that cannot fit in a frame is dead-lettered.

The middleware, the re-check consumer and the retry worker all end a step here. A retry
copy, a hop or a release whose headers would not fit in a frame even lean (the message's
own headers leave no room: see ``faststream_retry.core.fit``) is never retried with its own
headers cut: it goes to the dead-letter queue as ``invalid``, ``HeadersTooLarge``, and
that dead letter leaves out the message's largest headers to fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.amqp.publisher import Outcome
from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.events import Reason
from faststream_retry.errors import HeadersTooLarge

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

    from faststream_retry.amqp.publisher import Publisher
    from faststream_retry.core.steps import Copy, Step
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["TOO_LARGE_ERROR", "publish_step"]

TOO_LARGE_ERROR = (
    "with the retry headers its copy would not fit in the frame RabbitMQ carries headers "
    "in (frame_max): its own headers leave no room"
)
"""``retry-error`` of a message dead-lettered as ``HeadersTooLarge``, before its failure."""

_TOO_LARGE = h.exception_name(HeadersTooLarge())


async def publish_step(
    reporter: Reporter,
    publisher: Publisher,
    message: AbstractIncomingMessage,
    step: Step,
    *,
    dlq: str,
    origin_queue: str,
    exception: BaseException | None = None,
    outcomes: list[Outcome] | None = None,
) -> bool:
    """Publish ``step``'s copy of ``message`` inside its event's span; ``True`` once confirmed.

    A copy too large for a frame is replaced by an ``invalid`` dead letter to ``dlq``
    (reported as such); ``outcomes`` collects each publish's outcome.
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
    if ok or step.copy.room or seen[-1:] != [Outcome.TOO_LARGE]:
        return ok
    letter = _too_large(step, message, dlq, origin_queue)
    return await reporter.publish(
        letter.event, letter.copy, send, incoming=incoming, exception=exception
    )


def _too_large(step: Step, message: AbstractIncomingMessage, dlq: str, origin_queue: str) -> Step:
    """Return the ``invalid`` dead letter of a message whose step's copy cannot fit."""
    event = step.event
    error = TOO_LARGE_ERROR
    if event.exception:
        error += f"; it had failed with {event.exception}: {event.error or ''}"
    failure = h.FailureRecord(
        attempt=event.attempt, at_ms=h.now_ms(), exception=_TOO_LARGE, error=error
    )
    return steps.dead_letter(
        dlq,
        event.queue,
        event.message_id,
        message.headers,
        failure,
        reason=Reason.INVALID,
        origin_queue=origin_queue,
        max_attempts=event.max_attempts,
        rule=event.rule,
        classification=event.classification,
    )
