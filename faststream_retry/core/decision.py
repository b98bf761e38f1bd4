"""What to do with a failed message, and with one back from a tier (pure: adapters carry it out)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.core.classify import Classification, Verdict, classify
from faststream_retry.core.events import Reason, Rule
from faststream_retry.core.headers import exception_name
from faststream_retry.core.policy import HandlerPolicy, RetryPolicy, effective_policy, to_ms
from faststream_retry.errors import RetryConfigError, RetryLater

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.tiers import Tiers

__all__ = ["Action", "Decision", "Hop", "Invalid", "Release", "decide", "recheck_step"]


class Action(str, enum.Enum):
    """The three outcomes of a failure."""

    RETRY_NOW = "retry_now"
    """Call the handler again in-process (``immediate`` retries)."""
    RETRY_LATER = "retry_later"
    """Send the message through the delay tiers."""
    DEAD_LETTER = "dead_letter"
    """Publish it to ``<queue>.dlq``."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one failed handler call.

    ``attempt`` is this call's number (1 for the first); ``delay_ms`` is the rounded
    delay for ``RETRY_LATER``; ``reason`` says why for ``DEAD_LETTER``.
    ``capped_from_ms`` is the delay a ``RetryLater`` asked for when it was longer than
    ``max_delay`` (and ``delay_ms`` is ``max_delay``). ``problem`` says why a
    ``RetryLater`` was dead-lettered instead (its delay was unusable).
    """

    action: Action
    attempt: int
    max_attempts: int
    classification: Classification
    delay_ms: int = 0
    reason: Reason | None = None
    capped_from_ms: int | None = None
    problem: str | None = None


def _asked_ms(exc: RetryLater) -> int | str:
    """Return the delay a ``RetryLater`` asks for, or why it is unusable.

    ``RetryLater`` checks its delay, but a subclass may skip its ``__init__`` or the
    attribute may be changed (or be a property that raises) after construction.
    """
    try:
        return to_ms(exc.delay, "delay", owner="RetryLater")
    except RetryConfigError as refused:
        return str(refused)
    except Exception as raised:  # whatever the handler's object does: a bug in the handler
        return f"reading RetryLater.delay raised {exception_name(raised)}"


def decide(
    exc: BaseException,
    *,
    attempt: int,
    handler: HandlerPolicy | None,
    default: RetryPolicy,
    tiers: Tiers,
    rand: Callable[[], float],
) -> Decision:
    """Decide what a failure means, given it was failed handler call number ``attempt``."""
    policy = effective_policy(handler, default)
    classification = classify(
        exc,
        handler_transient=policy.transient if handler is not None else (),
        handler_permanent=policy.permanent if handler is not None else (),
        default_transient=default.transient,
        default_permanent=default.permanent,
    )
    asked: int | str | None = None
    if issubclass(type(exc), RetryLater):  # type(): exc.__class__ may be a property
        asked = _asked_ms(exc)  # type: ignore[arg-type]
    max_attempts = policy.max_attempts
    if isinstance(asked, str):  # a delay no tier can hold: the handler's bug, not a retry
        return Decision(
            Action.DEAD_LETTER,
            attempt,
            max_attempts,
            Classification(Verdict.PERMANENT, Rule.EXPLICIT),
            reason=Reason.PERMANENT,
            problem=asked,
        )
    if classification.verdict is Verdict.PERMANENT:
        return Decision(
            Action.DEAD_LETTER, attempt, max_attempts, classification, reason=Reason.PERMANENT
        )
    if attempt >= max_attempts:
        return Decision(
            Action.DEAD_LETTER, attempt, max_attempts, classification, reason=Reason.EXHAUSTED
        )
    if asked is not None:
        capped = asked if asked > tiers.max_delay_ms else None
        return Decision(
            Action.RETRY_LATER,
            attempt,
            max_attempts,
            classification,
            tiers.round_delay(asked),
            capped_from_ms=capped,
        )
    if attempt <= policy.immediate:
        return Decision(Action.RETRY_NOW, attempt, max_attempts, classification)
    raw = policy.backoff.delay_ms(attempt - policy.immediate, rand)
    return Decision(
        Action.RETRY_LATER,
        attempt,
        max_attempts,
        classification,
        tiers.round_delay(raw),
    )


@dataclass(frozen=True, slots=True)
class Release:
    """Due: back to the work queue. ``lateness_ms`` is ``None`` when the due time was unreadable."""

    lateness_ms: int | None


@dataclass(frozen=True, slots=True)
class Hop:
    """Not due yet: round the tier with TTL ``tier_ms`` again.

    ``last``: that tier covers the rest of the wait, so the copy is addressed to the
    work queue and the broker delivers it there on expiry (no further re-check).
    """

    tier_ms: int
    remaining_ms: int
    last: bool = False


@dataclass(frozen=True, slots=True)
class Invalid:
    """A due time no legitimate delay can explain: dead-letter it."""

    ahead_ms: int


def recheck_step(due_ms: int | None, now_ms: int, tiers: Tiers) -> Release | Hop | Invalid:
    """Decide what the re-check consumer does with a message back from a tier.

    A missing or unreadable due time means due now. A due time beyond ``max_delay``
    plus one tick can never be legitimate: capping it without rewriting the header
    would send it round the tiers for ever, so it is ``Invalid``. Otherwise the
    message waits in the tier ``Tiers.wait`` picks, and is never released early.
    """
    if due_ms is None or due_ms <= now_ms:
        return Release(None if due_ms is None else now_ms - due_ms)
    remaining = due_ms - now_ms
    if remaining > tiers.max_delay_ms + tiers.tick_ms:
        return Invalid(remaining)
    wait = tiers.wait(remaining)
    return Hop(wait.tier_ms, remaining, last=wait.last)
