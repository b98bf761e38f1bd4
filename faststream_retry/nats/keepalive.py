"""Keeping a message alive while its handler runs, and while its failure is being placed.

JetStream delivers a message again once its ``ack_wait`` passes without an ack, even
while its handler still runs: a handler longer than ``ack_wait`` ran twice, and a copy
held while the server refuses it (``sink``) could outlive the wait too. So while a
covered handler runs, and its failure is placed, the server is told the message is in
hand (``in_progress``) every third of the consumer's ``ack_wait``. A handler that never
returns holds its message until the app stops (FastStream gives handlers no timeout: give
yours one).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["kept_alive"]


@contextlib.contextmanager
def kept_alive(raw: Any, ack_wait_s: float) -> Iterator[None]:  # noqa: ANN401 - nats-py's Msg
    """Send ``in_progress`` for ``raw`` every third of ``ack_wait_s`` until the block ends."""
    beat = asyncio.get_running_loop().create_task(_beat(raw, ack_wait_s / 3))
    try:
        yield
    finally:
        beat.cancel()


async def _beat(raw: Any, every_s: float) -> None:  # noqa: ANN401 - nats-py's Msg
    while True:
        await asyncio.sleep(every_s)
        try:
            await raw.in_progress()
        except Exception:  # settled or disconnected: nothing left to keep
            return
