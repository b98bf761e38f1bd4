"""Where a failure goes once decided: the ``Sink`` protocol, and what every sink shares.

The scope decides (``core.decision``); a sink carries the decision out: each broker's
live sink (``rabbit.sink``, ``nats.sink``/``redis.sink`` through their runtimes) and
test mode's (``test_mode.TestSink``). Each runtime's ``sink()`` chooses.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core import headers as h
from faststream_retry.core import steps

if TYPE_CHECKING:
    from faststream.message import StreamMessage

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.topology import Route
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Sink", "record_in_process", "requeue_after_pause"]


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


def record_in_process(
    reporter: Reporter,
    msg: StreamMessage[Any],
    route: Route,
    decision: Decision,
    exc: BaseException,
    *,
    immediate: bool,
) -> None:
    """Report a retry made in the process, with no copy (``core.steps.in_process``)."""
    event = steps.in_process(
        route.queue, msg.message_id, decision, exc, h.now_ms(), immediate=immediate
    )
    reporter.record(event, incoming=msg.headers, exception=exc)


async def requeue_after_pause(msg: StreamMessage[Any], pause_s: float) -> None:
    """Hand the message back to its queue, after a pause (no hot loop)."""
    if pause_s:
        await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
    await msg.nack()  # RabbitMessage.nack requeues by default
