"""The hand-over: a subscriber's ready subject, consumed by the plugin, run by the subscriber.

The re-check releases a due copy to ``<prefix>.ready.<key>``, not to the work subject:
a copy published there would reach every consumer whose filter matches it, not only the
one that failed. This consumer hands each copy to the failing subscriber's own FastStream
pipeline (its middlewares, this plugin's included, its handler, its ack policy), with the
subject it first came on given back, so the handler sees the message as it was; acking
it acks the ready copy. A failure of the retried call is decided and carried out as any
other, its attempt counted on from the copy's headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from nats.js.api import AckPolicy, ConsumerConfig

from faststream_retry.nats import naming, wire
from faststream_retry.nats.fetch import fetch, stop_loop
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

__all__ = ["FETCH", "Ready"]

FETCH = 20
"""Ready copies one fetch takes; they run side by side, as a pull subscriber's batch does."""


class Ready:
    """The hand-over consumer of one covered subscriber."""

    def __init__(
        self,
        js: JetStreamContext,
        prefix: str,
        key: str,
        hand_over: Callable[[Msg], Awaitable[Any]],
        *,
        ack_wait_s: float,
        pause_s: float,
    ) -> None:
        """Hand ``key``'s ready copies to ``hand_over`` (the subscriber's ``consume``).

        ``ack_wait_s``: the subscriber's own, since its handler runs on these copies.
        """
        self._js = js
        self._prefix = prefix
        self._key = key
        self._hand_over = hand_over
        self._ack_wait_s = ack_wait_s
        self._pause_s = pause_s
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._running = False

    async def start(self) -> None:
        """Bind the ready subject's durable consumer (made if missing); start handing over."""
        prefix, key = self._prefix, self._key
        self._sub = await self._js.pull_subscribe(
            naming.ready_subject(prefix, key),
            durable=naming.ready_durable(prefix, key),
            stream=naming.delay_stream(prefix),
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=self._ack_wait_s, max_deliver=-1
            ),
        )
        self._running = True
        self._task = asyncio.create_task(self._loop(), name=f"faststream-retry ready {key}")

    def stop_intake(self) -> None:
        """Take no more copies; those being handled finish."""
        self._running = False

    async def stop(self) -> None:
        """Stop taking copies, let those in hand finish, and unbind."""
        self._running = False
        await stop_loop(self._task, self._sub, cancel=False)
        self._task, self._sub = None, None

    async def _loop(self) -> None:
        while self._running:
            batch = await fetch(
                self._sub, FETCH, 0.5, pause_s=self._pause_s, what=f"hand-over of {self._key}"
            )
            if batch is None:
                return
            if not self._running:  # stopped meanwhile: back to the stream for the next start
                for msg in batch:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                return
            await asyncio.gather(*(self._one(m) for m in batch))

    async def _one(self, msg: Msg) -> None:
        subject = _original_subject(msg.headers)
        if subject is not None:
            msg.subject = subject
        try:
            await self._hand_over(msg)
        except Exception:  # FastStream's consume logs and settles its own failures
            log.exception("faststream-retry: handing over a ready copy of %s failed", self._key)


def _original_subject(headers: dict[str, str] | None) -> str | None:
    """The subject the message first came on (``wire.SUBJECT``); ``None`` if unreadable."""
    raw = (headers or {}).get(wire.SUBJECT)
    if raw is None:
        return None
    try:
        subject = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(subject, str) or not subject or any(c.isspace() for c in subject):
        return None
    return subject
