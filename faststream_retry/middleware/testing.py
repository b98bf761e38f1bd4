"""What test mode records: ``RetryRecorder``, and the ``testing()`` blocks open on a middleware.

``RetryMiddleware.testing()`` opens a block: test mode runs while one is open (outside
one, the plugin leaves a test broker's messages to FastStream), a ``RetryRecorder`` hears
every event until the block ends, and the block says whether its dead letters raise from
``publish()`` (``raise_on_dead_letter``). Test mode's sink (``test_mode``) asks the
innermost open block.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from faststream_retry.core.events import EventKind, RetryEvent, RetryHook

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["RetryRecorder", "Testing"]


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


class Testing:
    """The ``testing()`` blocks open on one middleware, innermost last."""

    def __init__(self, hooks: list[RetryHook]) -> None:
        """Add each block's recorder to ``hooks`` (the middleware's own list) while it is open."""
        self._hooks = hooks
        self._open: list[tuple[RetryRecorder, bool]] = []

    @contextlib.contextmanager
    def block(self, *, raise_on_dead_letter: bool) -> Iterator[RetryRecorder]:
        """Record every event for the block; its dead letters raise if ``raise_on_dead_letter``."""
        recorder = RetryRecorder()
        opened = (recorder, raise_on_dead_letter)
        self._hooks.append(recorder)
        self._open.append(opened)
        try:
            yield recorder
        finally:
            self._open.remove(opened)
            self._hooks.remove(recorder)

    @property
    def active(self) -> bool:
        """Return whether a block is open: test mode runs under a test broker only then."""
        return bool(self._open)

    @property
    def raise_on_dead_letter(self) -> bool:
        """Return whether a dead letter's exception reaches ``publish()``: the innermost block's."""
        return self._open[-1][1] if self._open else False
