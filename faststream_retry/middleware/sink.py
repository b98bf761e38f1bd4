"""Where a failure goes once decided: the ``Sink`` protocol, and what every sink shares.

The scope decides (``core.decision``); a sink carries the decision out: each broker's
live sink (``rabbit.sink``, ``nats.sink``/``redis.sink`` through their runtimes) and
test mode's (``test_mode.TestSink``). Each runtime's ``sink()`` chooses.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from faststream.message import StreamMessage

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.topology import Route

__all__ = ["Sink", "requeue_after_pause"]


class Sink(Protocol):
    """What becomes of a failed message once its decision is made."""

    async def retry(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Carry out a retry (``RETRY_NOW`` or ``RETRY_LATER``).

        Returns ``True`` if the handler is to be called again now, in process;
        ``False`` if the message is settled, held by its copy.
        """
        ...

    async def dead_letter(
        self, msg: StreamMessage[Any], route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Dead-letter the message; ``True``: it is settled and its failure goes no further."""
        ...


async def requeue_after_pause(msg: StreamMessage[Any], pause_s: float) -> None:
    """Hand the message back to its queue, after a pause (no hot loop)."""
    if pause_s:
        await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
    await msg.nack()  # RabbitMessage.nack requeues by default
