"""Where each step's copy goes, what it carries, and what is told of it (pure).

Every runtime (the middleware, the re-check consumer, the worker's intake) builds its
copies here and only sends them: these are the rules behind "never early, never
elsewhere". A retry waits in the tier its delay takes, addressed to ``<queue>.retry``,
or straight to the work queue when that tier is the whole wait; a hop goes round
another tier the same way; a release goes to the work queue by the default exchange;
a dead letter goes to its dead-letter queue, and only a dead letter may leave out its
own largest headers to fit in a frame. Any other copy that cannot fit even lean is
never sent with its own headers cut: the message goes to its dead-letter queue instead
(``too_large``).

One function a runtime's step: ``failed`` (the middleware's handler failed),
``recheck`` and ``wait_again`` (a copy back from a tier in ``<queue>.retry``),
``intake`` and ``refused`` (a dead letter in the worker's intake), ``in_process`` (a
retry with no copy), ``stuck`` (a message whose copies are never confirmed), ``parked``
(a message held in outage mode, handed back where its transport cannot requeue it);
they build on ``retry``, ``hop``, ``release`` and ``dead_letter``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.decision import Action, Decision, Hop, Release, recheck_step
from faststream_retry.core.events import Reason, RetryEvent, Rule, Verdict
from faststream_retry.core.intake import DeadLetter, Refuse, Retry, without_consumer_word
from faststream_retry.errors import CopyNotConfirmed, HeadersTooLarge, InvalidDueTime

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream_retry.core.topology import Plan, Route

__all__ = [
    "TOO_LARGE_ERROR",
    "Copy",
    "Step",
    "dead_letter",
    "failed",
    "hop",
    "in_process",
    "intake",
    "parked",
    "recheck",
    "refused",
    "release",
    "retry",
    "stuck",
    "too_large",
    "wait_again",
]

TOO_LARGE_ERROR = (
    "with the retry headers its copy would not fit in the frame RabbitMQ carries headers "
    "in (frame_max): its own headers leave no room"
)
"""``retry-error`` of a message dead-lettered as ``HeadersTooLarge``, before its failure."""

_TOO_LARGE = h.exception_name(HeadersTooLarge())
_NOT_CONFIRMED = h.exception_name(CopyNotConfirmed())


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
    dlq: str | None = None
    """Where the message goes instead if the copy cannot fit in a frame even lean
    (``too_large``); ``None`` for a dead letter, which makes room itself."""


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
    return Step(event, copy, wait.tier_ms, route.dlq)


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
    return Step(event, Copy(plan.tier(tier_ms), home, h.carry_over(incoming)), dlq=route.dlq)


def parked(
    plan: Plan,
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    *,
    now_ms: int,
    wait_ms: int,
) -> Step:
    """Send a message held in outage mode round a wait of ``wait_ms``, its attempt unchanged.

    NATS and Redis hand a held message back this way instead of requeueing it: a hop
    (a wait that spends no attempt) due when the wait ends, whatever due time the
    message brought along (an old retry's, or a forged one far ahead).
    """
    due = now_ms + wait_ms
    return hop(
        plan,
        route,
        message_id,
        {**(incoming or {}), h.DUE: due},
        attempt=h.read_attempt(incoming),
        now_ms=now_ms,
        due_ms=due,
        tier_ms=wait_ms,
        last=False,
    )


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
    return Step(event, Copy("", route.queue, h.carry_over(incoming)), dlq=route.dlq)


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
        dlq=dlq,
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


def recheck(
    plan: Plan,
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    *,
    now_ms: int,
) -> Step:
    """The step of a copy back from a tier in ``route``'s ``<queue>.retry``.

    A release once it is due (``decision.recheck_step``: a missing or unreadable due
    time is due now), else a hop round the tier the rest of its wait takes; a due time
    no delay explains is dead-lettered as ``invalid`` (``InvalidDueTime``).
    """
    due = h.read_due(incoming)
    attempt = h.read_attempt(incoming)
    decided = recheck_step(due, now_ms, plan.tiers)
    if isinstance(decided, Release):
        return release(
            route,
            message_id,
            incoming,
            attempt=attempt,
            now_ms=now_ms,
            due_ms=due,
            lateness_ms=decided.lateness_ms,
        )
    if isinstance(decided, Hop):
        return hop(
            plan,
            route,
            message_id,
            incoming,
            attempt=attempt,
            now_ms=now_ms,
            due_ms=due,
            tier_ms=decided.tier_ms,
            last=decided.last,
        )
    error = InvalidDueTime(
        f"retry-due {due} is more than max_delay ({plan.tiers.max_delay_ms} ms) "
        f"ahead of now ({now_ms})"
    )
    failure = h.FailureRecord(
        attempt=attempt, at_ms=now_ms, exception=h.exception_name(error), error=str(error)
    )
    return dead_letter(
        route.dlq, route.queue, message_id, incoming, failure, reason=Reason.INVALID, due_ms=due
    )


def wait_again(
    plan: Plan,
    route: Route,
    refused: Step,
    incoming: Mapping[str, Any] | None,
    *,
    now_ms: int,
) -> Step | None:
    """Where a release its work queue refused waits, rather than be requeued; ``None``: requeue.

    Requeueing spends a redelivery of ``.retry``, and a quorum ``.retry`` dead-letters
    at its delivery limit: a work queue whose leader moves for longer than limit x
    pause would send every waiting message to the DLQ. A tier costs no redelivery. Only
    a release with a known lateness (no other step has one) waits, and only up to
    ``max_delay`` past its due time: a queue that refuses for longer gets the requeue
    path and its limit back. It waits half its lateness, at least a tick: a refusal of
    a few seconds costs a few tries, a long one a try every so often.
    """
    event = refused.event
    lateness = event.lateness_ms
    tiers = plan.tiers
    if lateness is None or lateness >= tiers.max_delay_ms:
        return None
    return hop(
        plan,
        route,
        event.message_id,
        incoming,
        attempt=event.attempt,
        now_ms=now_ms,
        due_ms=event.due_ms,
        tier_ms=tiers.pick(max(lateness // 2, tiers.tick_ms)),
        last=False,
    )


def intake(
    plan: Plan,
    route: Route,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    decided: Retry | DeadLetter,
) -> Step:
    """The step of a dead letter the worker's intake took for ``route``'s queue.

    ``decided`` is ``intake.intake_step``'s answer: a retry round the tiers, or a dead
    letter to ``<queue>.dlq``, with the classification and rule it says. The copy leaves
    out the consumer's word (``intake.CONSUMER_WORD``): it was answered.
    """
    kept = without_consumer_word(incoming)
    if isinstance(decided, DeadLetter):
        return dead_letter(
            route.dlq,
            route.queue,
            message_id,
            kept,
            decided.failure,
            reason=decided.reason,
            max_attempts=decided.max_attempts,
            rule=decided.rule,
            classification=decided.classification,
            traceback=decided.traceback,
        )
    return retry(
        plan,
        route,
        message_id,
        kept,
        decided.failure,
        max_attempts=decided.max_attempts,
        rule=decided.rule,
        classification=Verdict.TRANSIENT,
    )


def refused(
    refusal: Refuse,
    *,
    intake_queue: str,
    dlq: str,
    message_id: str | None,
    incoming: Mapping[str, Any] | None,
    now_ms: int,
) -> Step:
    """The ``invalid`` dead letter of a delivery the worker's intake refuses, to its ``dlq``.

    Its origin is the queue it died in, when RabbitMQ says so, for the operator who
    replays it there (``dlq replay <prefix>.intake --to <queue>``) once the config
    names it.
    """
    failure = h.FailureRecord(
        attempt=h.read_attempt(incoming),
        at_ms=now_ms,
        exception="refused",
        error=refusal.problem,
    )
    return dead_letter(
        dlq,
        intake_queue,
        message_id,
        incoming,
        failure,
        reason=Reason.INVALID,
        origin_queue=refusal.queue or intake_queue,
        rule=Rule.DEAD_LETTERING,
        classification=Verdict.PERMANENT,
    )


def too_large(
    step: Step,
    incoming: Mapping[str, Any] | None,
    *,
    now_ms: int,
    error: str = TOO_LARGE_ERROR,
) -> Step | None:
    """The ``invalid`` dead letter a message takes when ``step``'s copy cannot fit in a frame.

    ``HeadersTooLarge``, to the step's ``dlq``, keeping what the step's event knew of the
    failure; the dead letter leaves out the message's largest headers to fit. ``None``
    for a step that is a dead letter already: it makes room itself. ``error``: what
    ``retry-error`` says of the limit (a transport's own, Redis' binary format's).
    """
    if step.dlq is None:
        return None
    event = step.event
    if event.exception:
        error += f"; it had failed with {event.exception}: {event.error or ''}"
    failure = h.FailureRecord(
        attempt=event.attempt, at_ms=now_ms, exception=_TOO_LARGE, error=error
    )
    return dead_letter(
        step.dlq,
        event.queue,
        event.message_id,
        incoming,
        failure,
        reason=Reason.INVALID,
        max_attempts=event.max_attempts,
        rule=event.rule,
        classification=event.classification,
    )


def stuck(
    route: Route,
    tried: Step,
    incoming: Mapping[str, Any] | None,
    *,
    now_ms: int,
    limit: int,
    max_delay_ms: int,
    outcome: str,
    requeued: int = 0,
    held: int = 0,
) -> Step | None:
    """The dead letter of a message whose copy ``tried`` was not confirmed; ``None``: requeue it.

    A runtime that cannot move a message requeues it after a pause, and must not do so
    for ever: RabbitMQ 4.3 no longer counts a requeue against a quorum queue's delivery
    limit, and a classic queue never did. So the plugin ends the loop itself, on every
    series: once the delivery came back ``limit`` times, by the broker's count
    (``h.read_requeues``) or by the runtime's own (``requeued``, the requeues this
    process made: a classic queue counts none), or, for a release (the only step that
    knows its lateness), once it is ``max_delay_ms`` past its due time. ``held``: the
    times the copy was placed again while the message was held instead of requeued
    (each counts as a requeue would; the handler did not run again). ``outcome`` says
    what became of the last copy. A copy to the dead-letter queue itself gets no second
    one there.
    """
    event = tried.event
    late = event.lateness_ms
    requeues = max(h.read_requeues(incoming), requeued) + held
    if tried.copy.exchange == "" and tried.copy.routing_key == route.dlq:
        return None
    if requeues < limit and (late is None or late < max_delay_ms):
        return None
    copy = tried.copy
    what = f"{event.kind} copy to {copy.exchange or copy.routing_key!r}"
    if requeues >= limit and held:
        times = "once" if held == 1 else f"{held} times"
        why = (
            f"was placed again {times} while the message was held, its handler not run "
            f"again (each counts as a requeue: {requeues} of the delivery limit of {limit})"
        )
    elif requeues >= limit:
        why = f"came back {requeues} times (the delivery limit is {limit})"
    else:
        why = f"is {late} ms past its due time (max_delay is {max_delay_ms} ms)"
    failure = h.FailureRecord(
        attempt=event.attempt,
        at_ms=now_ms,
        exception=_NOT_CONFIRMED,
        error=f"its {what} was not confirmed ({outcome}) and it {why}",
    )
    return dead_letter(
        route.dlq,
        route.queue,
        event.message_id,
        incoming,
        failure,
        reason=Reason.STUCK,
        max_attempts=event.max_attempts,
        due_ms=event.due_ms,
    )
