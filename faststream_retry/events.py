"""Events the plugin reports to hooks: one per decision, release and re-check hop (pure)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["EventKind", "RetryEvent", "RetryHook", "emit"]

log = logging.getLogger("faststream_retry")


class EventKind(str, enum.Enum):
    """What happened to a message."""

    SCHEDULED = "scheduled"
    """A transient failure was sent into the delay tiers (or retried in-process)."""
    HOP = "hop"
    """The re-check consumer sent a not-yet-due message round another tier."""
    RELEASED = "released"
    """The re-check consumer republished a due message to its queue."""
    DEAD_LETTERED = "dead_lettered"
    """The message was published to ``<queue>.dlq``."""


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One thing the plugin did with a message.

    Times are epoch milliseconds. ``delay_ms`` is the planned delay (``SCHEDULED``)
    or the tier TTL (``HOP``); ``lateness_ms`` is release time minus due time
    (``RELEASED``); ``reason`` is ``permanent``, ``exhausted`` or ``invalid``
    (``DEAD_LETTERED``); ``rule`` is the classification rule that decided.
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
    reason: str | None = None
    exception: str | None = None
    error: str | None = None
    rule: str | None = None
    immediate: bool = False


RetryHook = Callable[[RetryEvent], None]
"""A callable that receives every event; it must be quick and must not block."""


def emit(hooks: Sequence[RetryHook], event: RetryEvent) -> None:
    """Call every hook; a failing hook is logged and never disturbs the message."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:  # noqa: PERF203 - a user's hook must never lose or stall a message
            log.exception("faststream-retry hook %r failed on %s", hook, event.kind)
