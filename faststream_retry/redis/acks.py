"""A handled entry's ``XACK``, sent beside the handlers: one ``XACK`` a batch.

FastStream acknowledges each handled entry in its handler's turn: one ``XACK`` a message,
its round trip (an ``fsync`` in it under ``appendfsync always``) awaited before the
subscriber hands the next entry of its read to the handler. Measured (bench.redis_retry,
5,000 good messages, ``appendfsync always``): 345 µs of wall time a message, 205 of them
the process's CPU; the rest waited for that answer. Here the handler's turn ends once its
entry is queued; the queue of a stream is sent as one ``XACK`` as soon as the one before
it is answered, so a burst's acknowledgements go in a few commands and Redis writes them
with one ``fsync``.

What does not move: an entry is acknowledged only once its handler succeeded (the same
success FastStream would acknowledge: the plugin queues it where FastStream's own
acknowledgement would come next, and never under ``AckPolicy.MANUAL``); while it waits,
the claimer keeps it alive as a running handler's (``Claimer.settling``); the stop awaits
every queued one (``drain``) before the client closes. What does: a crash (of the process
or of Redis) in the window between the handler's success and its batch's answer leaves
the entry pending, to be claimed and handled again as a lost attempt, as FastStream's own
window between a handler's return and its ``XACK`` does, for up to ``bound`` entries
rather than one. An ``XACK`` Redis refuses (down, a cut connection) is sent again every
half second, its entries kept alive, for up to ``retry_s``: a blip no longer makes a
handled entry run again, as FastStream's one refused ``XACK`` did. Past that it is logged
(a WARNING, at most one a minute), and its entries are claimed once idle.

At most ``bound`` entries of a stream wait or are in flight at once: the next handler's
success on that stream waits for room (backpressure, nothing dropped). A stream whose
``XACK`` is slow (a cluster node failing over) holds up no other stream's successes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = ["DEFAULT_BOUND", "Acks"]

logger = logging.getLogger("faststream_retry.redis")

DEFAULT_BOUND = 32
"""Handled entries of one stream waiting for their ``XACK`` at most.

It bounds what a crash makes run again (module docstring), as ``settling``'s bound does for
failures. Measured (bench.redis_retry, 5,000 good messages, ``appendfsync always``, 2
rounds each): msg/s over bare FastStream with a bound of 8 2.53-2.68, of 32 3.52-3.53, of
256 3.62-3.92; throughput is bound by it only past ``bound`` entries a round trip (3,200 a
second with a 10 ms ``fsync``, FastStream's own 100).
"""

_WARN_EVERY_S = 60.0
_PAUSE_S = 0.5
"""Between two tries of a refused ``XACK``."""


class Acks:
    """The handled entries of one engine waiting for their ``XACK``; see the module docstring."""

    __slots__ = (
        "_bound",
        "_client",
        "_counts",
        "_flushing",
        "_idle",
        "_retry_s",
        "_room",
        "_waiting",
        "_warned",
    )

    def __init__(
        self,
        client: Any,  # noqa: ANN401 - redis-py's
        bound: int = DEFAULT_BOUND,
        retry_s: float = 60.0,
    ) -> None:
        """Acknowledge on ``client``; at most ``bound`` (>= 1) entries waiting at once.

        A refused ``XACK`` is tried again for up to ``retry_s``.
        """
        self._client = client
        self._bound = max(1, bound)
        self._retry_s = retry_s
        self._waiting: dict[tuple[str, str], list[tuple[str, AbstractContextManager[None]]]] = {}
        self._flushing: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._warned = -_WARN_EVERY_S

    @property
    def waiting(self) -> int:
        """How many entries are queued or in an ``XACK`` not answered yet."""
        return sum(self._counts.values())

    async def add(
        self, stream: str, group: str, entry_id: str, hold: AbstractContextManager[None]
    ) -> None:
        """Queue ``entry_id`` of ``stream`` for ``group``'s ``XACK``; wait only for room.

        ``hold`` is entered now and exited once the ``XACK`` is answered (or refused):
        the claimer's keep-alive of the entry meanwhile. Cancelled while waiting for room:
        nothing is queued and ``hold`` is let go (the entry stays pending, claimed later).
        """
        # Entered before the wait for room, as a failure's step's hold is (``sink``): the
        # handler's own hold is gone, and a keep-alive pass during a long wait (a Redis
        # slow to answer the XACKs before it) would otherwise skip this entry.
        key = (stream, group)
        hold.__enter__()
        try:
            while self._counts.get(key, 0) >= self._bound:
                self._room.clear()
                await self._room.wait()
        except BaseException:
            hold.__exit__(None, None, None)
            raise
        self._waiting.setdefault(key, []).append((entry_id, hold))
        self._counts[key] = self._counts.get(key, 0) + 1
        self._idle.clear()
        if key not in self._flushing:
            self._flushing[key] = asyncio.get_running_loop().create_task(self._flush(key))

    async def _flush(self, key: tuple[str, str]) -> None:
        """Send the queue of ``key`` as one ``XACK``, again until nothing is queued."""
        try:
            while batch := self._waiting.pop(key, None):
                await self._send(key, batch)
        finally:
            del self._flushing[key]
            if not self._flushing:
                self._idle.set()

    async def _send(
        self, key: tuple[str, str], batch: list[tuple[str, AbstractContextManager[None]]]
    ) -> None:
        """One ``XACK`` of ``batch``, again while refused (``retry_s``); then let its holds go."""
        ids = [entry for entry, _ in batch]
        deadline = time.monotonic() + self._retry_s
        try:
            while (refused := await self._xack(key, ids)) is not None:
                if time.monotonic() + _PAUSE_S > deadline:
                    self._warn(key[0], len(batch), refused)
                    return
                await asyncio.sleep(_PAUSE_S)
        finally:
            for _, hold in batch:
                hold.__exit__(None, None, None)
            self._let_go(key, len(batch))

    async def _xack(self, key: tuple[str, str], ids: list[str]) -> Exception | None:
        """Send one ``XACK``; return what refused it, if anything did."""
        try:
            await self._client.xack(key[0], key[1], *ids)
        except Exception as exc:  # any refusal: tried again, then said
            return exc
        return None

    def _let_go(self, key: tuple[str, str], n: int) -> None:
        left = self._counts[key] - n
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]
        self._room.set()

    def _warn(self, stream: str, n: int, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned < _WARN_EVERY_S:
            return
        self._warned = now
        logger.warning(
            "faststream-retry: %d handled entries of %s could not be acknowledged in %.0f s "
            "(%r): they stay pending, and are claimed once idle for claim_idle and handled "
            "again (said at most once a minute)",
            n,
            stream,
            self._retry_s,
            exc,
        )

    async def close(self) -> None:
        """Stop sending: the ``XACK``s still refused are given up (their entries claimed later)."""
        tasks = list(self._flushing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        waiting, self._waiting = self._waiting, {}
        for key, batch in waiting.items():
            for _, hold in batch:
                hold.__exit__(None, None, None)
            self._let_go(key, len(batch))
        self._idle.set()

    async def drain(self, timeout_s: float | None = None) -> int:
        """Wait until every queued entry's ``XACK`` is answered, at most ``timeout_s``.

        Return how many are still waiting then: they stay pending, claimed later.
        """
        # asyncio's own: TimeoutError is an alias of it only from Python 3.11 on.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self.waiting
