"""What to do with a failed message (pure: the middleware only carries it out)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.classify import Classification, Verdict, classify
from faststream_retry.errors import RetryLater
from faststream_retry.policy import HandlerPolicy, RetryPolicy, to_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.tiers import Tiers

__all__ = ["Action", "Decision", "decide"]


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
    delay for ``RETRY_LATER``; ``reason`` is ``permanent`` or ``exhausted`` for
    ``DEAD_LETTER``.
    """

    action: Action
    attempt: int
    max_attempts: int
    classification: Classification
    delay_ms: int = 0
    reason: str | None = None


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
    policy = handler.resolve(default) if handler is not None else default
    classification = classify(
        exc,
        handler_transient=policy.transient if handler is not None else (),
        handler_permanent=policy.permanent if handler is not None else (),
        default_transient=default.transient,
        default_permanent=default.permanent,
    )
    max_attempts = policy.max_attempts
    if classification.verdict is Verdict.PERMANENT:
        return Decision(
            Action.DEAD_LETTER,
            attempt,
            max_attempts,
            classification,
            reason="permanent",
        )
    if attempt >= max_attempts:
        return Decision(
            Action.DEAD_LETTER,
            attempt,
            max_attempts,
            classification,
            reason="exhausted",
        )
    if isinstance(exc, RetryLater):
        delay = tiers.round_delay(to_ms(exc.delay, "RetryLater(delay=...)"))
        return Decision(Action.RETRY_LATER, attempt, max_attempts, classification, delay)
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
