"""Keeping a message alive while its handler runs, and while its failure is being placed.

JetStream delivers a message again once its ``ack_wait`` passes without an ack, even
while its handler still runs: a handler longer than ``ack_wait`` ran twice, and a copy
held while the server refuses it (``sink``) could outlive the wait too. So while a
covered handler runs, and its failure is placed, the server is told the message is in
hand (``in_progress``) at least every third of the consumer's ``ack_wait``. A handler
that never returns holds its message until the app stops (FastStream gives handlers no
timeout: give yours one).

Every covered message passes through here, and almost every one is settled long before
a third of its ``ack_wait``: so the messages in hand are kept in a table, and one beat per
``ack_wait`` tells each of them, every third of it, while any is in hand. A message
entering the table costs an insert. (A timer per message, or a task started and cancelled
per message, cost a turn of the loop and a cancelled timer left in its heap, for beats
that nearly never happen.) A message that came in just before a beat is told early:
harmless, and no message waits longer than a third of its ``ack_wait`` between two.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["KeepAlive"]


class KeepAlive:
    """The messages in hand of one runtime, one beat per ``ack_wait``."""

    __slots__ = ("_beats",)

    def __init__(self) -> None:
        """Nothing in hand; a beat starts with the first message of its ``ack_wait``."""
        self._beats: dict[float, _Beat] = {}

    def holding(self, raw: Any, ack_wait_s: float) -> _Held:  # noqa: ANN401 - nats-py's Msg
        """Tell ``raw`` ``in_progress`` every third of ``ack_wait_s`` until the block ends."""
        beat = self._beats.get(ack_wait_s)
        if beat is None:
            beat = self._beats[ack_wait_s] = _Beat(ack_wait_s / 3)
        return _Held(beat, raw)


class _Beat:
    """The messages in hand with one ``ack_wait``, and the timer that tells them."""

    __slots__ = ("_every_s", "_loop", "_sending", "_timer", "in_hand")

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        # By id: nats-py's Msg is a dataclass, so not hashable.
        self.in_hand: dict[int, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: asyncio.Task[None] | None = None

    def enter(self, raw: Any) -> None:  # noqa: ANN401 - nats-py's Msg
        self.in_hand[id(raw)] = raw
        loop = asyncio.get_running_loop()
        # Armed while anything is in hand; again in another loop (a test's new one: the
        # old loop's timer never fires).
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_later(self._every_s, self._tick)

    def _tick(self) -> None:
        loop = self._loop
        if not self.in_hand or loop is None:
            self._timer = None  # armed again by the next message
            return
        self._timer = loop.call_later(self._every_s, self._tick)
        if self._sending is None or self._sending.done():  # one still sending: not twice
            self._sending = loop.create_task(self._send(list(self.in_hand.items())))

    async def _send(self, in_hand: list[tuple[int, Any]]) -> None:
        told = await asyncio.gather(
            *(raw.in_progress() for _, raw in in_hand), return_exceptions=True
        )
        for (key, raw), outcome in zip(in_hand, told, strict=True):
            # Settled or disconnected: nothing left to keep. Cancelled too: the caller's
            # block ended while it was being told, or the loop is closing.
            if isinstance(outcome, BaseException) and self.in_hand.get(key) is raw:
                del self.in_hand[key]


class _Held:
    """One message's block: in the table from its start to its end."""

    __slots__ = ("_beat", "_inner", "_raw")

    def __init__(self, beat: _Beat, raw: Any) -> None:  # noqa: ANN401 - nats-py's Msg
        self._beat = beat
        self._raw = raw
        self._inner = False

    def __enter__(self) -> None:
        # A block inside another of the same message leaves it to the outer one.
        self._inner = self._beat.in_hand.get(id(self._raw)) is self._raw
        self._beat.enter(self._raw)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        in_hand = self._beat.in_hand
        key = id(self._raw)
        if not self._inner and in_hand.get(key) is self._raw:
            del in_hand[key]
