"""Events the plugin reports to hooks, and the words they use (pure).

``Verdict``, ``Reason`` and ``Rule`` are ``str`` enums: their values are what the ``retry-reason``
header, the metric labels and the log lines carry, and a member compares equal to its
value (``Reason.EXHAUSTED == "exhausted"``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["EventKind", "Reason", "RetryEvent", "RetryHook", "Rule", "Verdict", "Word"]


class Word(str, enum.Enum):
    """A ``str`` enum that prints as its value on every Python version."""

    # Python 3.11 formats a str-mixin member as "Class.NAME"; these are words on the
    # wire and in logs, so they format as their value everywhere.
    def __str__(self) -> str:
        """Return the value."""
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        """Format the value."""
        return format(str(self.value), format_spec)


class EventKind(Word):
    """What happened to a message."""

    SCHEDULED = "scheduled"
    """A transient failure was sent into the delay tiers (or retried in-process)."""
    HOP = "hop"
    """The re-check consumer sent a not-yet-due message round another tier."""
    RELEASED = "released"
    """The re-check consumer republished a due message to its queue."""
    DEAD_LETTERED = "dead_lettered"
    """The message was put in its dead letters: ``RetryEvent.dlq`` says where."""
    OUTAGE_STARTED = "outage_started"
    """The queue went into outage mode (``RetryMiddleware(outage_after=...)``)."""
    OUTAGE_ENDED = "outage_ended"
    """The queue left outage mode: a handler call succeeded, or its broker stopped."""


class Reason(Word):
    """Why a message was dead-lettered (the ``retry-reason`` header)."""

    PERMANENT = "permanent"
    """The failure was classified permanent: retrying cannot help."""
    EXHAUSTED = "exhausted"
    """A transient failure on the last attempt the policy allows."""
    INVALID = "invalid"
    """Its ``retry-due`` lies further ahead than any legitimate delay, or (the retry
    worker) it reached the intake from a queue the worker may not send to."""
    POISON = "poison"
    """(The retry worker) it reached a quorum queue's delivery limit: a crash loop."""
    EXPIRED = "expired"
    """(The retry worker) it expired in its queue, which is configured not to retry that."""
    MAXLEN = "maxlen"
    """(The retry worker) its queue dropped it at its length limit, configured not to retry."""
    STUCK = "stuck"
    """Its copy could not be published, try after try, up to the delivery limit (or, out
    of ``<queue>.retry``, for ``max_delay`` past its due time): the plugin gave up
    requeueing it, which on RabbitMQ 4.3 no longer ends at the delivery limit."""


class Verdict(Word):
    """What a failure means for the message: the same for the middleware and the worker."""

    TRANSIENT = "transient"
    """Retrying may help: retried while attempts remain, then dead-lettered as ``exhausted``."""
    PERMANENT = "permanent"
    """Retrying cannot help: dead-lettered at once."""


class Rule(Word):
    """Which classification rule decided (see ``faststream_retry.core.classify``)."""

    EXPLICIT = "explicit"
    HANDLER = "handler"
    DEFAULT = "default"
    BUILTIN = "builtin"
    FALLBACK = "fallback"
    DEAD_LETTERING = "dead_lettering"
    """(The retry worker) RabbitMQ's dead-letter reason decided: no exception to classify."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryEvent:
    """One thing the plugin did with a message.

    Times are epoch milliseconds. ``delay_ms`` is the planned delay (``SCHEDULED``)
    or the tier TTL (``HOP``); ``lateness_ms`` is release time minus due time
    (``RELEASED``); ``reason`` says why a message was ``DEAD_LETTERED`` and ``dlq``
    where its dead letter is; ``rule`` is
    the classification rule that decided and ``classification`` its verdict (both
    only when a handler failed, or the retry worker's intake decided on a dead letter).

    ``OUTAGE_STARTED`` and ``OUTAGE_ENDED`` are about the queue, not one message:
    ``message_id`` names the message whose failure switched the queue into outage
    mode (with that failure's ``attempt``, ``exception`` and ``error``), or whose
    success ended it (``attempt`` 0; ``None`` when the broker stopped). ``failures``
    is the consecutive transient failures that switched it, or those during it;
    ``delay_ms`` the probe interval; ``probes`` and ``duration_ms`` say what the
    outage took.

    Each kind has a constructor that takes what that kind carries, and only that:
    ``RetryEvent.scheduled(...)``, ``.hop``, ``.released``, ``.dead_lettered``,
    ``.outage_started`` and ``.outage_ended``.
    """

    kind: EventKind
    queue: str
    message_id: str | None
    attempt: int
    at_ms: int
    max_attempts: int = 0
    delay_ms: int | None = None
    due_ms: int | None = None
    lateness_ms: int | None = None
    reason: Reason | None = None
    exception: str | None = None
    error: str | None = None
    rule: Rule | None = None
    immediate: bool = False
    classification: Verdict | None = None
    failures: int | None = None
    probes: int | None = None
    duration_ms: int | None = None
    dlq: str | None = None
    """Where a ``DEAD_LETTERED`` message's letter is, on its broker: the queue
    ``<queue>.dlq`` (RabbitMQ), the stream key ``{<stream>}.dlq`` (Redis), the subject
    ``<prefix>.dlq.<stream>.<consumer>`` in the stream ``<prefix>-dlq-<stream>`` (NATS).
    ``None`` for every other kind."""

    @classmethod
    def scheduled(
        cls,
        *,
        queue: str,
        message_id: str | None,
        attempt: int,
        at_ms: int,
        max_attempts: int,
        delay_ms: int,
        due_ms: int | None,
        exception: str,
        error: str,
        rule: Rule,
        classification: Verdict,
        immediate: bool = False,
    ) -> RetryEvent:
        """A failed message sent round the tiers, due at ``due_ms``.

        Or retried in the process: ``immediate`` (no due time), or test mode's stand-in
        for the tiers (due when the real copy would be).
        """
        return cls(
            kind=EventKind.SCHEDULED,
            queue=queue,
            message_id=message_id,
            attempt=attempt,
            at_ms=at_ms,
            max_attempts=max_attempts,
            delay_ms=delay_ms,
            due_ms=due_ms,
            exception=exception,
            error=error,
            rule=rule,
            immediate=immediate,
            classification=classification,
        )

    @classmethod
    def hop(
        cls,
        *,
        queue: str,
        message_id: str | None,
        attempt: int,
        at_ms: int,
        tier_ms: int,
        due_ms: int | None,
    ) -> RetryEvent:
        """An early message sent round tier ``tier_ms`` again (its TTL is ``delay_ms``)."""
        return cls(
            kind=EventKind.HOP,
            queue=queue,
            message_id=message_id,
            attempt=attempt,
            at_ms=at_ms,
            delay_ms=tier_ms,
            due_ms=due_ms,
        )

    @classmethod
    def released(
        cls,
        *,
        queue: str,
        message_id: str | None,
        attempt: int,
        at_ms: int,
        due_ms: int | None,
        lateness_ms: int | None,
    ) -> RetryEvent:
        """A due message back in its queue, ``lateness_ms`` after its due time."""
        return cls(
            kind=EventKind.RELEASED,
            queue=queue,
            message_id=message_id,
            attempt=attempt,
            at_ms=at_ms,
            due_ms=due_ms,
            lateness_ms=lateness_ms,
        )

    @classmethod
    def dead_lettered(
        cls,
        *,
        queue: str,
        message_id: str | None,
        attempt: int,
        at_ms: int,
        reason: Reason,
        exception: str,
        error: str,
        max_attempts: int = 0,
        due_ms: int | None = None,
        rule: Rule | None = None,
        classification: Verdict | None = None,
        dlq: str | None = None,
    ) -> RetryEvent:
        """A message sent to its dead letters at ``dlq``, with ``reason``.

        ``rule`` and ``classification`` say how a handler's failure was classified.
        """
        return cls(
            kind=EventKind.DEAD_LETTERED,
            queue=queue,
            message_id=message_id,
            attempt=attempt,
            at_ms=at_ms,
            max_attempts=max_attempts,
            due_ms=due_ms,
            reason=reason,
            exception=exception,
            error=error,
            rule=rule,
            classification=classification,
            dlq=dlq,
        )

    @classmethod
    def outage_started(
        cls,
        *,
        queue: str,
        message_id: str | None,
        attempt: int,
        at_ms: int,
        max_attempts: int,
        probe_ms: int,
        exception: str,
        error: str,
        failures: int,
    ) -> RetryEvent:
        """``queue`` went into outage mode on the failure of ``message_id``.

        It was the last of ``failures`` transient failures in a row; a probe goes
        through every ``probe_ms``.
        """
        return cls(
            kind=EventKind.OUTAGE_STARTED,
            queue=queue,
            message_id=message_id,
            attempt=attempt,
            at_ms=at_ms,
            max_attempts=max_attempts,
            delay_ms=probe_ms,
            exception=exception,
            error=error,
            failures=failures,
        )

    @classmethod
    def outage_ended(
        cls,
        *,
        queue: str,
        message_id: str | None,
        at_ms: int,
        probe_ms: int,
        failures: int,
        probes: int,
        duration_ms: int,
    ) -> RetryEvent:
        """``queue`` left outage mode on the success of ``message_id``.

        ``message_id`` is ``None`` when the broker stopped; the mode lasted
        ``duration_ms``, with ``probes`` and ``failures`` during it.
        """
        return cls(
            kind=EventKind.OUTAGE_ENDED,
            queue=queue,
            message_id=message_id,
            attempt=0,
            at_ms=at_ms,
            delay_ms=probe_ms,
            failures=failures,
            probes=probes,
            duration_ms=duration_ms,
        )


RetryHook = Callable[[RetryEvent], None]
"""A callable that receives every event; it must be quick and must not block."""
