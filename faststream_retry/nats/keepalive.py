"""Keeping a message alive while its handler runs, and while its failure is being placed.

JetStream delivers a message again once its ``ack_wait`` passes without an ack, even
while its handler still runs: a handler longer than ``ack_wait`` ran twice, and a copy
held while the server refuses it (``sink``) could outlive the wait too. So while a
covered handler runs, and its failure is placed, the server is told the message is in
hand (``in_progress``) every third of the consumer's ``ack_wait``. A handler that never
returns holds its message until the app stops (FastStream gives handlers no timeout: give
yours one).

Every covered message passes through here, and almost every one is settled long before
its first beat: so a beat is a timer on the loop, and a task is made only when one fires.
A task per message (started, then cancelled) cost two turns of the loop and a coroutine
each, for beats that nearly never happen.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["kept_alive"]


def kept_alive(raw: Any, ack_wait_s: float) -> _KeptAlive:  # noqa: ANN401 - nats-py's Msg
    """Send ``in_progress`` for ``raw`` every third of ``ack_wait_s`` until the block ends."""
    return _KeptAlive(raw, ack_wait_s / 3)


class _KeptAlive:
    """A context manager: beats from its creation to the end of its block."""

    __slots__ = ("_every_s", "_loop", "_raw", "_sending", "_timer")

    def __init__(self, raw: Any, every_s: float) -> None:  # noqa: ANN401 - nats-py's Msg
        self._raw = raw
        self._every_s = every_s
        self._loop = asyncio.get_running_loop()
        self._sending: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(every_s, self._beat)

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        if self._sending is not None:
            self._sending.cancel()

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _beat(self) -> None:
        # The next beat is counted from this one, as a sleep between sends would; one
        # still being sent (a slow write) is not sent twice.
        self._timer = self._loop.call_later(self._every_s, self._beat)
        if self._sending is None or self._sending.done():
            self._sending = self._loop.create_task(self._send())

    async def _send(self) -> None:
        try:
            await self._raw.in_progress()
        except Exception:  # settled or disconnected: nothing left to keep
            self._stop()
