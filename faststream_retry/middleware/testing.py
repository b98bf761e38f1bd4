"""Test mode: what the plugin does under ``TestRabbitBroker``, and the recorder tests read.

``TestRabbitBroker`` replaces the broker's start, so the plugin's start hook never runs
and there is no broker to hold a copy. The middleware notices (FastStream's fake producer
is in place and the plugin is not started) and makes the same decisions as in production,
but calls the handler again at once instead of waiting, and settles a dead letter without
publishing it. ``RetryMiddleware.testing()`` scopes a ``RetryRecorder`` to a block.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from faststream_retry.core.events import EventKind, RetryEvent, RetryHook

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["RetryRecorder", "recording"]


class RetryRecorder:
    """Collects every event while ``RetryMiddleware.testing()`` is active."""

    def __init__(self) -> None:
        """Start empty."""
        self.events: list[RetryEvent] = []

    def __call__(self, event: RetryEvent) -> None:
        """Record one event (the recorder is a hook)."""
        self.events.append(event)

    @property
    def scheduled(self) -> list[RetryEvent]:
        """Return the retries scheduled, in-process ones included."""
        return [e for e in self.events if e.kind is EventKind.SCHEDULED]

    @property
    def dead_letters(self) -> list[RetryEvent]:
        """Return the dead letters."""
        return [e for e in self.events if e.kind is EventKind.DEAD_LETTERED]


@contextlib.contextmanager
def recording(hooks: list[RetryHook]) -> Iterator[RetryRecorder]:
    """Add a recorder to ``hooks`` for the block, and take it out again afterwards."""
    recorder = RetryRecorder()
    hooks.append(recorder)
    try:
        yield recorder
    finally:
        hooks.remove(recorder)
