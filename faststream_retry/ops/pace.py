"""Pacing an operator's moves: at most so many a second, on any broker."""

from __future__ import annotations

import asyncio
import time

__all__ = ["Rate"]


class Rate:
    """At most ``per_s`` moves a second, evenly spaced; ``None`` or 0: no pacing."""

    def __init__(self, per_s: float | None) -> None:
        """Pace at ``per_s`` moves a second from now."""
        self._gap = 1 / per_s if per_s else 0.0
        self._next = time.monotonic()

    async def wait(self) -> None:
        """Return when the next move may go."""
        if not self._gap:
            return
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(self._next, now) + self._gap
