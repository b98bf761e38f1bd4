"""The mover: moves due copies from each covered stream's schedule back to the stream.

Any number of movers may run (one per app replica): each batch is one script (``MOVE``)
that adds a copy to the stream and removes it from the schedule together, so no copy
is moved twice or lost between the two. A mover sleeps until its stream's head is due,
or until a nudge on ``P.retry.wake`` (published by the scheduling script when a copy
becomes the new head), and at most ``cap_s``: a nudge lost while the mover reconnects
costs that much lateness, never an early copy. ``tick_ms`` sleeps that much past the
head, to move a burst in batches rather than a copy per wake (fewer scripts, and under
``appendfsync always`` fewer fsyncs) for at most that much more lateness.

A stream whose group is missing (an operator's ``XGROUP DESTROY`` or ``DEL``) gets no
copies: a group made again starts at ``$``, and a copy added before it would never be
read. They wait in the schedule, said once until the group is back, and move when it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from faststream_retry.redis.tasks import stop_tasks

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.asyncio.client import PubSub

    from faststream_retry.redis.client import Client
    from faststream_retry.redis.keys import StreamKeys
    from faststream_retry.redis.lua import Scripts

__all__ = ["Mover"]

logger = logging.getLogger("faststream_retry.redis")

_RETRY_S = 1.0
"""How long a mover waits after Redis refused a move (down, read-only, out of memory)."""


class Mover:
    """Moves due copies of ``streams`` back, until ``stop()``; see the module docstring."""

    def __init__(
        self,
        client: Client,
        scripts: Scripts,
        streams: Sequence[tuple[StreamKeys, str]],
        *,
        batch: int = 100,
        cap_s: float = 5.0,
        tick_ms: int = 0,
    ) -> None:
        """Keep the settings; nothing runs until ``start()``."""
        self._client = client
        self._scripts = scripts
        self._streams = tuple(keys for keys, _ in streams)
        self._groups = {keys.stream: group for keys, group in streams}
        self._missing: set[str] = set()
        self._batch = batch
        self._cap_s = cap_s
        self._tick_s = tick_ms / 1000
        self._nudged = {keys.wake: asyncio.Event() for keys in self._streams}
        self._tasks: list[asyncio.Task[None]] = []
        self.moved = 0
        """Copies this mover moved (a test's and a benchmark's count)."""
        self.wakes = 0
        """Scripts this mover ran."""
        self.failures = 0
        """Moves Redis refused or could not answer (down, read-only, out of memory)."""
        self.listening = asyncio.Event()
        """Set while the nudges' subscription is up."""

    def start(self) -> None:
        """Start one task per stream, and one listening for nudges."""
        if self._tasks or not self._streams:
            return
        self._tasks.append(asyncio.create_task(self._listen(), name="faststream-retry nudges"))
        for keys in self._streams:
            self._tasks.append(
                asyncio.create_task(self._run(keys), name=f"faststream-retry mover {keys.stream}")
            )

    async def stop(self) -> None:
        """Stop every task; a script already sent completes on the server or not at all."""
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks)

    async def move_once(self, keys: StreamKeys) -> tuple[int, int, int]:
        """Run one ``MOVE``: return ``(moved, head due ms or -1, server now ms)``."""
        moved, head, now, missing = await self._scripts.move(
            keys=[keys.stream, keys.schedule, keys.data],
            args=[self._batch, self._groups[keys.stream]],
        )
        self.wakes += 1
        self.moved += int(moved)
        self._say_missing(keys, int(missing) == 1)
        return int(moved), int(head), int(now)

    def missing(self, stream: str) -> bool:
        """Whether ``stream``'s group was missing at its last move: its copies wait."""
        return stream in self._missing

    def _say_missing(self, keys: StreamKeys, missing: bool) -> None:
        if not missing:
            self._missing.discard(keys.stream)
            return
        if keys.stream in self._missing:
            return
        self._missing.add(keys.stream)
        logger.warning(
            "group %s of %s is missing (deleted?): the copies due back to it wait in %s "
            "until a subscriber makes the group again",
            self._groups[keys.stream],
            keys.stream,
            keys.schedule,
        )

    async def _run(self, keys: StreamKeys) -> None:
        nudged = self._nudged[keys.wake]
        while True:
            # Cleared before the move: a nudge that arrives while it runs is kept.
            nudged.clear()
            try:
                moved, head, now = await self.move_once(keys)
            except (RedisError, OSError) as exc:
                self.failures += 1
                logger.warning("moving due copies of %s failed (%s): again soon", keys.stream, exc)
                await asyncio.sleep(_RETRY_S)
                continue
            if moved >= self._batch:
                continue
            wait = (
                self._cap_s
                if head < 0 or self.missing(keys.stream)
                else min(self._cap_s, (head - now) / 1000 + self._tick_s)
            )
            if wait <= 0:
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(nudged.wait(), wait)

    async def _listen(self) -> None:
        while True:
            pubsub: PubSub = self._client.pubsub()
            try:
                await pubsub.subscribe(*self._nudged)
                self.listening.set()
                # Nudges sent before the subscription took effect are lost: look again.
                self._nudge_all()
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self._cap_s
                    )
                    if message is not None:
                        channel = message["channel"]
                        name = channel.decode() if isinstance(channel, bytes) else str(channel)
                        event = self._nudged.get(name)
                        if event is not None:
                            event.set()
            except (RedisError, OSError) as exc:
                self.listening.clear()
                logger.debug("the mover's nudge subscription broke (%s): subscribing again", exc)
                await asyncio.sleep(_RETRY_S)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _nudge_all(self) -> None:
        for event in self._nudged.values():
            event.set()
