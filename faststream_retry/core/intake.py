"""What the standalone retry worker does with a dead letter from its intake (pure).

A work queue opts in by dead-lettering into the intake exchange ``<prefix>.intake``.
The exchange is *internal*: no client can publish to it, only RabbitMQ's own
dead-lettering can. So a delivery that came through that exchange was dead-lettered,
and the newest entry of its ``x-death`` (RabbitMQ writes it first, whatever a publisher
put in the list) names the queue it died in. A delivery that came any other way (a
publish straight to the intake queue by the default exchange) is refused, and so is a
queue the worker's allowlist does not name: both go to the intake's own dead-letter
queue with reason ``invalid``. ``x-first-death-queue`` is never read: RabbitMQ keeps a
value a publisher set.

The attempt count is the plugin's own ``retry-attempt`` header, never the ``x-death``
count, whose meaning changed in RabbitMQ 4.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.policy import Backoff
    from faststream_retry.core.tiers import Tiers

__all__ = [
    "PERMANENT",
    "DeadLetter",
    "Death",
    "OnDeath",
    "QueueRules",
    "Refuse",
    "Retry",
    "intake_step",
    "newest_death",
]

PERMANENT = "retry-permanent"
"""A header that makes a dead-lettered message permanent: it goes to ``<queue>.dlq`` at once.

Its value, a text, is the error the dead letter shows; ``true`` works too. Other values
(false, 0, an empty text) mark nothing. For a consumer that republishes a
message it gave up on rather than rejecting it, or a producer that knows better.
"""

# x-death reasons, as RabbitMQ writes them.
REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"


class OnDeath(str, enum.Enum):
    """What a dead-letter reason means for a queue: retry it, or dead-letter it at once."""

    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class QueueRules:
    """How the worker treats one work queue's dead letters.

    ``direct_release``: a retry's last tier dead-letters the copy straight into the
    queue (one hop less). Only for a queue that never refuses a publish (no
    ``x-overflow: reject-publish`` by argument or policy) and is never deleted while
    copies wait: a refused copy stays in the tier for minutes and holds up the other
    copies in it. Otherwise the re-check step releases it, with a confirm.
    """

    max_attempts: int
    backoff: Backoff
    expired: OnDeath = OnDeath.DEAD
    maxlen: OnDeath = OnDeath.DEAD
    direct_release: bool = False


@dataclass(frozen=True, slots=True)
class Death:
    """The newest entry of ``x-death``: where and why the message was dead-lettered."""

    queue: str
    reason: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Send the message back to ``queue`` after ``delay_ms`` (rounded to the tick)."""

    queue: str
    attempt: int
    max_attempts: int
    delay_ms: int
    failure: h.FailureRecord


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Publish the message to ``<queue>.dlq`` with ``reason``."""

    queue: str
    attempt: int
    max_attempts: int
    reason: Reason
    failure: h.FailureRecord


@dataclass(frozen=True, slots=True)
class Refuse:
    """Not a dead letter the worker may act on: to the intake's DLQ as ``invalid``.

    ``queue`` is the queue RabbitMQ dead-lettered it from, when that is known: only for a
    delivery through the intake exchange, whose newest ``x-death`` entry RabbitMQ wrote.
    It is recorded as the dead letter's origin (information only: nothing routes by it).
    """

    problem: str
    queue: str | None = None


def newest_death(headers: Mapping[str, Any] | None) -> Death | None:
    """Return the newest ``x-death`` entry, or ``None`` when there is no readable one."""
    deaths = headers.get("x-death") if headers else None
    if not isinstance(deaths, (list, tuple)) or not deaths:
        return None
    newest = deaths[0]  # RabbitMQ puts the most recent death first
    if not isinstance(newest, Mapping):
        return None
    queue, reason = newest.get("queue"), newest.get("reason")
    if isinstance(queue, bytes):
        queue = queue.decode("utf-8", "replace")
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    if not isinstance(queue, str) or not queue or not isinstance(reason, str):
        return None
    return Death(queue, reason)


_WHY = {
    REJECTED: "rejected (requeue=false) by a consumer of {queue}",
    EXPIRED: "expired in {queue} (a message or queue TTL)",
    MAXLEN: "dropped from {queue} at its length limit",
    DELIVERY_LIMIT: (
        "reached the delivery limit of {queue}: its consumer crashed or requeued it every time"
    ),
}


def intake_step(
    *,
    exchange: str,
    intake_exchange: str,
    headers: Mapping[str, Any] | None,
    rules: Callable[[str], QueueRules | None],
    tiers: Tiers,
    now_ms: int,
    rand: Callable[[], float],
) -> Retry | DeadLetter | Refuse:
    """Decide what becomes of one delivery from the intake queue.

    ``exchange`` is the exchange the delivery came through; ``rules(queue)`` returns
    the allowlisted queue's rules, or ``None`` when the config does not name it.
    """
    death = newest_death(headers)
    queue_rules = None if death is None else rules(death.queue)
    if exchange != intake_exchange or death is None or queue_rules is None:
        return _refusal(exchange, intake_exchange, death)
    attempt = h.read_attempt(headers) + 1
    known = _WHY.get(death.reason)
    error = (
        known.format(queue=death.queue)
        if known is not None
        else f"dead-lettered from {death.queue} (reason {death.reason})"
    )
    max_attempts = queue_rules.max_attempts

    def record(exception: str, text: str, delay_ms: int = 0) -> h.FailureRecord:
        return h.FailureRecord(
            attempt=attempt, at_ms=now_ms, exception=exception, error=text, delay_ms=delay_ms
        )

    permanent = h.read_text(headers, PERMANENT)
    if not permanent and headers is not None and headers.get(PERMANENT) is True:
        permanent = "marked permanent (retry-permanent: true)"
    if permanent:
        return DeadLetter(
            death.queue, attempt, max_attempts, Reason.PERMANENT, record(PERMANENT, permanent)
        )
    reason = _dead_at_once(death.reason, queue_rules)
    if reason is not None:
        return DeadLetter(death.queue, attempt, max_attempts, reason, record(death.reason, error))
    if attempt >= max_attempts:
        return DeadLetter(
            death.queue, attempt, max_attempts, Reason.EXHAUSTED, record(death.reason, error)
        )
    delay = tiers.round_delay(queue_rules.backoff.delay_ms(attempt, rand))
    return Retry(death.queue, attempt, max_attempts, delay, record(death.reason, error, delay))


def _refusal(exchange: str, intake_exchange: str, death: Death | None) -> Refuse:
    """Say why a delivery is not a dead letter the worker may send back."""
    if exchange != intake_exchange:
        # No queue: whatever x-death it carries, a publisher wrote it.
        return Refuse(
            "published to the intake queue through "
            f"{repr(exchange) if exchange else 'the default exchange'}, "
            f"not dead-lettered through {intake_exchange!r}"
        )
    if death is None:
        return Refuse("no readable x-death: RabbitMQ did not dead-letter it")
    return Refuse(
        f"dead-lettered from {death.queue!r}, which the worker's config does not name",
        death.queue,
    )


def _dead_at_once(reason: str, rules: QueueRules) -> Reason | None:
    """Return why a death of this reason is dead-lettered without a retry, if it is."""
    if reason == DELIVERY_LIMIT:
        # A consumer that crashes or requeues on this message every time: a crash
        # loop, which a delay will not end.
        return Reason.POISON
    if reason == EXPIRED and rules.expired is OnDeath.DEAD:
        return Reason.EXPIRED
    if reason == MAXLEN and rules.maxlen is OnDeath.DEAD:
        return Reason.MAXLEN
    return None
