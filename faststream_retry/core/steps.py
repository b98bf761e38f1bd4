"""Where each step's copy goes, what it carries, and what is told of it (pure).

Every runtime (the middleware, the re-check consumer, the worker's intake) builds its
copies here and only sends them: these are the rules behind "never early, never
elsewhere". A retry waits in the tier its delay takes, addressed to ``<queue>.retry``,
or straight to the work queue when that tier is the whole wait; a hop goes round
another tier the same way; a release goes to the work queue by the default exchange;
a dead letter goes to its dead-letter queue, and only a dead letter may leave out its
own largest headers to fit in a frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.decision import Action, Decision
from faststream_retry.core.events import Reason, RetryEvent, Rule, Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream_retry.core.topology import Plan, Route

__all__ = ["Copy", "Step", "dead_letter", "failed", "hop", "in_process", "release", "retry"]


@dataclass(frozen=True, slots=True)
class Copy:
    """The copy a step publishes: where to, and with which headers."""

    exchange: str
    routing_key: str
    headers: dict[str, Any]
    room: bool = False
    """A dead letter that may leave out its own largest headers to fit in a frame."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step: the copy to publish and the event to report once it is confirmed."""

    event: RetryEvent
    copy: Copy
    tier_ms: int | None = None
    """The tier a retry's copy waits in (``None`` for any other step)."""


def retry(
    plan: Plan,
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    failure: h.FailureRecord,
    *,
    max_attempts: int,
    rule: Rule,
    classification: Verdict,
) -> Step:
    """Send a failed message round the tiers, due ``failure.delay_ms`` after it failed."""
    due = failure.at_ms + failure.delay_ms
    wait = plan.tiers.wait(failure.delay_ms)
    # A wait that is one tier goes from it straight back to the work queue, addressed
    # by the routing key; a longer one passes the re-check step.
    home = route.queue if wait.last and route.home_from_tier else route.retry_queue
    event = RetryEvent.scheduled(
        queue=route.queue,
        message_id=message_id,
        attempt=failure.attempt,
        at_ms=failure.at_ms,
        max_attempts=max_attempts,
        delay_ms=failure.delay_ms,
        due_ms=due,
        exception=failure.exception,
        error=h.truncate(failure.error, h.HISTORY_ERROR_LIMIT),
        rule=rule,
        classification=classification,
    )
    copy = Copy(plan.tier(wait.tier_ms), home, h.retry_headers(incoming, failure, due))
    return Step(event, copy, wait.tier_ms)


def hop(
    plan: Plan,
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    *,
    attempt: int,
    now_ms: int,
    due_ms: int | None,
    tier_ms: int,
    last: bool,
) -> Step:
    """Send an early message round tier ``tier_ms`` again.

    The last tier's copy is addressed to the work queue itself, where the broker
    delivers it on expiry (when the route allows it); any other comes back to
    ``<queue>.retry``.
    """
    event = RetryEvent.hop(
        queue=route.queue,
        message_id=message_id,
        attempt=attempt,
        at_ms=now_ms,
        tier_ms=tier_ms,
        due_ms=due_ms,
    )
    home = route.queue if last and route.home_from_tier else route.retry_queue
    return Step(event, Copy(plan.tier(tier_ms), home, h.carry_over(incoming)))


def release(
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    *,
    attempt: int,
    now_ms: int,
    due_ms: int | None,
    lateness_ms: int | None,
) -> Step:
    """Send a due message back to its work queue, by the default exchange."""
    event = RetryEvent.released(
        queue=route.queue,
        message_id=message_id,
        attempt=attempt,
        at_ms=now_ms,
        due_ms=due_ms,
        lateness_ms=lateness_ms,
    )
    return Step(event, Copy("", route.queue, h.carry_over(incoming)))


def dead_letter(
    dlq: str,
    queue: str,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    failure: h.FailureRecord,
    *,
    reason: Reason,
    origin_queue: str | None = None,
    max_attempts: int = 0,
    due_ms: int | None = None,
    rule: Rule | None = None,
    classification: Verdict | None = None,
    traceback: str = "",
) -> Step:
    """Send a message of ``queue`` to ``dlq``, with ``reason`` and its last failure.

    ``origin_queue`` is what ``retry-origin-queue`` says (``queue`` unless given).
    """
    headers = h.dead_letter_headers(
        incoming,
        failure,
        reason=reason,
        origin_queue=queue if origin_queue is None else origin_queue,
        traceback=traceback,
    )
    event = RetryEvent.dead_lettered(
        queue=queue,
        message_id=message_id,
        attempt=failure.attempt,
        at_ms=failure.at_ms,
        max_attempts=max_attempts,
        due_ms=due_ms,
        reason=reason,
        exception=failure.exception,
        error=h.truncate(failure.error, h.HISTORY_ERROR_LIMIT),
        rule=rule,
        classification=classification,
    )
    return Step(event, Copy("", dlq, headers, room=True))


def failed(
    plan: Plan,
    route: Route,
    decision: Decision,
    exc: BaseException,
    *,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    now_ms: int,
) -> Step:
    """The step a handler's failure takes, as ``decision`` says: a retry or a dead letter.

    Not for ``RETRY_NOW``, which publishes nothing (``in_process``).
    """
    failure = h.FailureRecord.of(
        exc,
        attempt=decision.attempt,
        at_ms=now_ms,
        delay_ms=decision.delay_ms,
        problem=decision.problem,
    )
    verdict = decision.classification
    if decision.action is Action.DEAD_LETTER:
        return dead_letter(
            route.dlq,
            route.queue,
            message_id,
            incoming,
            failure,
            reason=decision.reason or Reason.PERMANENT,
            max_attempts=decision.max_attempts,
            rule=verdict.rule,
            classification=verdict.verdict,
            traceback=h.traceback_text(exc),
        )
    return retry(
        plan,
        route,
        message_id,
        incoming,
        failure,
        max_attempts=decision.max_attempts,
        rule=verdict.rule,
        classification=verdict.verdict,
    )


def in_process(
    queue: str,
    message_id: str | None,
    decision: Decision,
    exc: BaseException,
    now_ms: int,
    *,
    immediate: bool,
) -> RetryEvent:
    """The event of a retry made in the process, with no copy.

    ``immediate``: an ``immediate`` retry (no due time); otherwise test mode's stand-in
    for a retry through the tiers, due when the real one would be.
    """
    return RetryEvent.scheduled(
        queue=queue,
        message_id=message_id,
        attempt=decision.attempt,
        at_ms=now_ms,
        max_attempts=decision.max_attempts,
        delay_ms=decision.delay_ms,
        due_ms=None if immediate else now_ms + decision.delay_ms,
        exception=h.exception_name(exc),
        error=h.error_text(exc, h.HISTORY_ERROR_LIMIT, decision.problem),
        rule=decision.classification.rule,
        classification=decision.classification.verdict,
        immediate=immediate,
    )
