"""Publishing a copy into a stream, confirmed by its PubAck.

A copy counts only once the server says it stored it (or dropped it as a duplicate of
one it stored: ``Nats-Msg-Id``, within the stream's duplicate window); anything else
(a timeout, no stream for the subject, a refusal) is not confirmed, and the message it
came from is kept.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any

from faststream_retry.nats import naming, wire
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

__all__ = ["Outcome", "Publisher", "confirmed", "copy_id"]


def copy_id(meta: Msg.Metadata, kind: str) -> str:
    """The ``Nats-Msg-Id`` of the ``kind`` copy made of the delivery ``meta`` describes."""
    stored_us = round(meta.timestamp.timestamp() * 1_000_000)
    return naming.msg_id(meta.stream, meta.consumer, meta.sequence.stream, stored_us, kind)


class Outcome(str, enum.Enum):
    """What became of one publish."""

    CONFIRMED = "confirmed"
    DUPLICATE = "duplicate"
    """Confirmed: the server had the same ``Nats-Msg-Id`` already."""
    REFUSED = "refused"
    TIMEOUT = "timeout"


class Publisher:
    """Publishes the plugin's copies on one JetStream context."""

    __slots__ = ("_js", "_timeout_s")

    def __init__(self, js: JetStreamContext, timeout_s: float) -> None:
        """Publish on ``js``; a PubAck later than ``timeout_s`` is not waited for."""
        self._js = js
        self._timeout_s = timeout_s

    async def publish(
        self,
        subject: str,
        body: bytes,
        headers: Mapping[str, Any],
        *,
        msg_id: str | None,
        stream: str,
    ) -> Outcome:
        """Publish ``body`` with ``headers`` (as ``wire.encode`` puts them) to ``subject``.

        ``stream``: the stream that must take it (the server refuses the publish if the
        subject is another stream's). ``msg_id`` ``None``: none (a dead letter whose body
        leaves no room for a header).
        """
        try:
            ack = await self._js.publish(
                subject,
                body,
                timeout=self._timeout_s,
                stream=stream,
                headers=wire.encode(headers, msg_id=msg_id),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            timeout = isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or (
                type(exc).__name__ == "TimeoutError"
            )
            log.warning(
                "faststream-retry: the copy to %r (%s) was not confirmed: %r", subject, msg_id, exc
            )
            return Outcome.TIMEOUT if timeout else Outcome.REFUSED
        return Outcome.DUPLICATE if ack.duplicate else Outcome.CONFIRMED


def confirmed(outcome: Outcome) -> bool:
    """Whether the server holds the copy."""
    return outcome in (Outcome.CONFIRMED, Outcome.DUPLICATE)
