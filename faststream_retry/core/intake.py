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

A reject carries no words, so a consumer that has something to say republishes the
message to its own queue with headers that say it, acks the original, and rejects the
marked copy when it arrives (``CONSUMER_WORD``): ``retry-exception``, ``retry-error``
and ``retry-traceback`` describe the failure, ``retry-delay`` asks for a delay of its
own (as ``RetryLater`` does) and ``retry-permanent`` gives up. They are read as data
only: they can make the message's own retry sooner, later or final, never send it
anywhere but its queue or its DLQ.

``classification`` means what it means for a handler's failure in the middleware:
``transient``, retrying may help (a retry, and a dead letter once the attempts are
spent: ``exhausted``); ``permanent``, retrying cannot help (a dead letter at once).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.durations import format_ms, parse_duration
from faststream_retry.core.events import Reason, Rule, Verdict
from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.policy import Backoff
    from faststream_retry.core.tiers import Tiers

__all__ = [
    "CONSUMER_WORD",
    "DELAY",
    "PERMANENT",
    "DeadLetter",
    "Death",
    "OnDeath",
    "QueueRules",
    "Refuse",
    "Retry",
    "intake_step",
    "newest_death",
    "without_consumer_word",
]

PERMANENT = "retry-permanent"
"""A header that makes a dead-lettered message permanent: it goes to ``<queue>.dlq`` at once.

Its value, a text, is the error the dead letter shows (unless ``retry-error`` says one);
``true`` works too. Other values (false, 0, an empty text) mark nothing. For a consumer
that gives up on a message (it republishes it marked, then rejects the copy), or a
producer that knows better.
"""

DELAY = "retry-delay"
"""A header that asks for the next retry after this long, as ``RetryLater`` does.

A duration: seconds (a number) or a text such as ``"30s"``, ``"1.5s"``, ``"250ms"``,
``"10m"``. Rounded up to the tick, cut to ``max_delay``, and it counts as an attempt. One
that is not a duration (a bug in the consumer that set it) dead-letters the message as
``permanent``, naming the value, as an unusable ``RetryLater`` does.
"""

CONSUMER_WORD = (PERMANENT, DELAY)
"""The headers that ask the worker for something: every copy it makes leaves them out, so
a retry or a replayed dead letter starts afresh. (``retry-exception``, ``retry-error`` and
``retry-traceback``, which only describe the failure, are the dead letter's own headers:
a retry's copy drops them, a dead letter writes them.)"""

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
    """Send the message back to ``queue`` after ``delay_ms`` (rounded to the tick).

    ``rule``: ``explicit`` when the consumer asked for the delay (``retry-delay``),
    else ``dead_lettering``. A retry is always ``transient``.
    """

    queue: str
    attempt: int
    max_attempts: int
    delay_ms: int
    failure: h.FailureRecord
    rule: Rule = Rule.DEAD_LETTERING


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Publish the message to ``<queue>.dlq`` with ``reason``.

    ``classification``: ``transient`` for ``exhausted`` (the failures could have passed;
    the attempts ran out), ``permanent`` for a dead letter at once. ``rule``:
    ``explicit`` when the consumer's word decided, else ``dead_lettering``.
    ``traceback``: what the consumer's ``retry-traceback`` said.
    """

    queue: str
    attempt: int
    max_attempts: int
    reason: Reason
    failure: h.FailureRecord
    classification: Verdict = Verdict.PERMANENT
    rule: Rule = Rule.DEAD_LETTERING
    traceback: str = ""


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
    the allowlisted queue's rules, or ``None`` when the config does not name it. First
    match wins: ``retry-permanent``; a death the queue's rules dead-letter at once
    (poison, expired, maxlen); an unusable ``retry-delay``; the last attempt; the
    consumer's ``retry-delay``; the queue's backoff.
    """
    death = newest_death(headers)
    queue_rules = None if death is None else rules(death.queue)
    if exchange != intake_exchange or death is None or queue_rules is None:
        return _refusal(exchange, intake_exchange, death)
    attempt = h.read_attempt(headers) + 1
    known = _WHY.get(death.reason)
    why = (
        known.format(queue=death.queue)
        if known is not None
        else f"dead-lettered from {death.queue} (reason {death.reason})"
    )
    said_exception = h.read_text(headers, h.EXCEPTION)  # FailureRecord cuts it
    said_error = h.read_text(headers, h.ERROR)
    traceback = h.read_text(headers, h.TRACEBACK, h.TRACEBACK_LIMIT)
    exception = said_exception or death.reason
    error = said_error or why
    queue, max_attempts = death.queue, queue_rules.max_attempts

    def record(exception: str, text: str, delay_ms: int = 0) -> h.FailureRecord:
        return h.FailureRecord(
            attempt=attempt, at_ms=now_ms, exception=exception, error=text, delay_ms=delay_ms
        )

    def dead(reason: Reason, failure: h.FailureRecord, verdict: Verdict, rule: Rule) -> DeadLetter:
        return DeadLetter(queue, attempt, max_attempts, reason, failure, verdict, rule, traceback)

    permanent = _permanent(headers)
    if permanent:
        failure = record(said_exception or PERMANENT, said_error or permanent)
        return dead(Reason.PERMANENT, failure, Verdict.PERMANENT, Rule.EXPLICIT)
    reason = _dead_at_once(death.reason, queue_rules)
    if reason is not None:
        return dead(reason, record(exception, error), Verdict.PERMANENT, Rule.DEAD_LETTERING)
    asked = _asked_delay(headers or {})
    if isinstance(asked, str):  # the consumer's bug, as an unusable RetryLater is
        failure = record(exception, f"{asked} ({error})")
        return dead(Reason.PERMANENT, failure, Verdict.PERMANENT, Rule.EXPLICIT)
    rule = Rule.DEAD_LETTERING if asked is None else Rule.EXPLICIT
    if attempt >= max_attempts:
        return dead(Reason.EXHAUSTED, record(exception, error), Verdict.TRANSIENT, rule)
    if asked is None:
        delay = tiers.round_delay(queue_rules.backoff.delay_ms(attempt, rand))
    else:
        delay = tiers.round_delay(asked)
        if asked > tiers.max_delay_ms:
            error += f" ({DELAY} {format_ms(asked)} cut to max_delay {format_ms(delay)})"
    return Retry(queue, attempt, max_attempts, delay, record(exception, error, delay), rule)


def _permanent(headers: Mapping[str, Any] | None) -> str:
    """Return the text ``retry-permanent`` gives up with; ``""`` when it marks nothing."""
    permanent = h.read_text(headers, PERMANENT)
    if not permanent and headers is not None and headers.get(PERMANENT) is True:
        return "marked permanent (retry-permanent: true)"
    return permanent


def _asked_delay(headers: Mapping[str, Any]) -> int | str | None:
    """Return the delay ``retry-delay`` asks for in ms, why it is unusable, or ``None``."""
    value = headers.get(DELAY)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode(errors="replace")
    if value is None or value == "":
        return None
    try:
        return parse_duration(value, DELAY)
    except RetryConfigError as refused:
        return h.truncate(str(refused), h.HISTORY_ERROR_LIMIT)


def without_consumer_word(headers: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Return ``headers`` without ``CONSUMER_WORD``: what a copy the worker makes starts from."""
    if headers is None:
        return None
    return {k: v for k, v in headers.items() if k not in CONSUMER_WORD}


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
