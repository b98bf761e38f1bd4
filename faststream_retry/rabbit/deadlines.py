"""How long a publish may wait for its confirm, kept by one watchdog for every publish.

``asyncio.timeout()`` around each publish arms and cancels a timer per copy: about a
fifth of the re-check consumer's CPU when it hops thousands of messages a second. The
watchdog instead looks at the publishes in flight a few times per timeout and cancels
those past it; each publish only notes when it started. A publish cancelled this way
raises ``asyncio.TimeoutError``, as under ``asyncio.timeout()``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable

__all__ = ["STALL_S", "Deadlines"]

_T = TypeVar("_T")

STALL_S = 1.0
"""A watchdog that wakes this much later than it asked was frozen with its process."""


class Deadlines:
    """Bounds publishes to ``timeout_s`` each, give or take a quarter of it (at most 1 s)."""

    def __init__(self, timeout_s: float) -> None:
        """Cancel what waits longer than ``timeout_s``; look every quarter of it, at most 1 s."""
        self._timeout_s = timeout_s
        self._look_s = min(max(timeout_s / 4, 0.01), 1.0)
        self._since: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def run(self, awaitable: Awaitable[_T]) -> _T:
        """Await ``awaitable`` in the current task; ``asyncio.TimeoutError`` past the timeout."""
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing to cancel, so no bound (never here)
            return await awaitable
        loop = asyncio.get_running_loop()
        self._since[task] = loop.time()
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch(), name="faststream-retry deadlines")
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            # Ours, unless someone else cancelled the task too (3.11+ can tell).
            if sys.version_info >= (3, 11) and task.uncancel() > 0:
                raise
            raise asyncio.TimeoutError from None
        finally:
            del self._since[task]
            self._expired.discard(task)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._since:
            before = loop.time()
            await asyncio.sleep(self._look_s)
            stalled = loop.time() - before - self._look_s
            if stalled > STALL_S:
                # The process stood still (SIGSTOP, a frozen VM or container, a long GC
                # pause), not the broker: the confirms of that time wait unread in the
                # socket. Cancelling now would requeue messages whose copies are
                # confirmed, duplicates; the stall is not counted, and I/O goes first.
                for task in self._since:
                    self._since[task] += stalled
                continue
            late = loop.time() - self._timeout_s
            for task, since in list(self._since.items()):
                if since <= late and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
