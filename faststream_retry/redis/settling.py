"""A failure's script, run beside its handler rather than in the handler's turn.

A failed handler's step (``sink.RedisSink``) is one script: the copy or letter written
and the entry acknowledged, atomically. Awaited in the handler's turn, its round trip
(an ``fsync`` in it under ``appendfsync always``) was 400 to 1,000 µs of every failure's
wall time, during which FastStream's subscriber, which hands a read's entries to its
handler one at a time, handled nothing (bench.redis_retry, 2,000 failures). Here the
handler's turn ends once the step is handed over; the steps of several failures are then
in flight together, and Redis answers them with one ``fsync``.

Nothing of the guarantees moves: the entry stays pending in its group until the script
that stores its copy acknowledges it (FastStream is told it is settled, so it sends no
``XACK`` of its own); a step Redis refuses leaves it pending for the claimer, as before;
its events and span fire once the script answered; and every step still running is
awaited at the stop (``drain``), before the entries are released and the client closes.
While a step runs, the claimer keeps its entry alive as it keeps a handler's
(``Claimer.settling``).

At most ``bound`` steps run at once: the next failure's handler waits for a slot
(backpressure, nothing dropped). Each step in flight holds one connection of the
plugin's client (redis-py's pool opens one per concurrent command), so the bound is also
the most connections the steps open; under a pool capped by the broker's
``max_connections`` (redis-py refuses a command past it: ``MaxConnectionsError``), the
bound leaves room for the engine's other tasks (``bound_for``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["DEFAULT_BOUND", "Settlements", "bound_for"]

logger = logging.getLogger("faststream_retry.redis")

DEFAULT_BOUND = 32
"""Steps in flight at most, per engine (see the module docstring).

Measured (bench.redis_retry burst of 2,000, ``appendfsync always``, 3 rounds, load about
5): unbounded, at most 27, 31 and 54 steps were in flight; fail path msg/s with a bound of
1 (the handler's turn, as before) 528-1,042, of 8 864-1,680, of 32 1,767-1,778, unbounded
1,285-1,590. 32 takes what running several at once gives, and bounds the connections.
"""

_OTHERS = 6
"""Connections the engine's other tasks may hold at once: the mover, its wake
subscription, the keep-alive, the claims, the dead-letter gauge, a release."""


def bound_for(client: Any, wanted: int = DEFAULT_BOUND) -> int:  # noqa: ANN401 - redis-py's
    """The bound for ``client``: ``wanted``, lowered under a pool of few connections (>= 1)."""
    pool = getattr(client, "connection_pool", None)
    most = getattr(pool, "max_connections", None)
    if not isinstance(most, int) or most >= wanted + _OTHERS:
        return wanted
    return max(1, most - _OTHERS)


class Settlements:
    """The steps in flight beside the handlers of one engine; see the module docstring."""

    __slots__ = ("_idle", "_running", "_slots")

    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        """At most ``bound`` (>= 1) steps at once."""
        self._slots = asyncio.Semaphore(max(1, bound))
        self._running: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        """How many steps are in flight now."""
        return len(self._running)

    async def submit(self, step: Callable[[], Awaitable[None]]) -> None:
        """Start ``step()`` in a task once a slot is free; return without waiting for it.

        ``step`` must handle its own errors: one that raises is logged, nothing more.
        """
        await self._slots.acquire()
        try:
            task = asyncio.get_running_loop().create_task(self._run(step))
        except BaseException:
            self._slots.release()
            raise
        self._running.add(task)
        self._idle.clear()

    async def _run(self, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except Exception:
            logger.exception("faststream-retry: a failure's step raised beside its handler")
        finally:
            self._slots.release()
            task = asyncio.current_task()
            if task is not None:
                self._running.discard(task)
            if not self._running:
                self._idle.set()

    async def drain(self, timeout_s: float | None = None) -> int:
        """Wait until every step submitted so far ended (those submitted meanwhile too).

        At most ``timeout_s`` (``None``: no bound); return how many still run then. A step
        that runs on holds its entry pending: claimed later, as a lost attempt.
        """
        # asyncio's own: TimeoutError is an alias of it only from Python 3.11 on.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return len(self._running)
