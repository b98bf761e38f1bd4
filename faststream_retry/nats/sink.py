"""Where a handler's failure goes on NATS: a confirmed copy in the delay or dead-letter stream.

The same decisions as on RabbitMQ (``core.decision``, ``core.steps.failed``): an
``immediate`` retry calls the handler again in the process; a later one is a copy into
its tier's subject of the delay stream, confirmed by its PubAck before the original is
acked; a dead letter is a copy into the dead-letter stream of the subscriber's stream,
confirmed before the original is terminated (``term``: JetStream will not deliver it
again). A copy the server will not take keeps the original, held (``in_progress``) and
placed again after each pause; after ``delivery_limit`` tries it is dead-lettered as
``stuck`` (``core.steps.stuck``), the handler not run again, or, if even that is not
taken, goes back to the consumer (``nak``), which redelivers it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.decision import Action
from faststream_retry.core.events import EventKind, Reason
from faststream_retry.nats import fitting, naming, wire
from faststream_retry.nats.publisher import Outcome, confirmed, copy_id
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from faststream_retry.core.decision import Decision
    from faststream_retry.core.steps import Copy, Step
    from faststream_retry.core.topology import Route
    from faststream_retry.nats.live import NatsLive
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["TOO_LARGE_ERROR", "Message", "NatsSink"]

TOO_LARGE_ERROR = (
    "with the retry headers its copy would not fit in the server's max_payload, even "
    "without its history: its own headers leave no room"
)
"""``retry-error`` of a message dead-lettered as ``HeadersTooLarge`` on NATS."""
_MAX_DELIVER = "faststream_retry.nats.MaxDeliver"
"""``retry-exception`` of a message dead-lettered at its consumer's ``max_deliver``."""


class Message(Protocol):
    """What the sink reads of FastStream's ``NatsMessage``."""

    @property
    def raw_message(self) -> Any: ...  # noqa: ANN401, D102 - nats-py's Msg

    @property
    def message_id(self) -> str: ...  # noqa: D102

    @property
    def headers(self) -> Any: ...  # noqa: ANN401, D102

    async def ack(self) -> None: ...  # noqa: D102

    async def nack(self) -> None: ...  # noqa: D102

    async def reject(self) -> None: ...  # noqa: D102


class NatsSink:
    """A running NATS broker's sink."""

    __slots__ = ("_live", "_pause_s", "_reporter")

    def __init__(self, live: NatsLive, reporter: Reporter, pause_s: float) -> None:
        """Publish through ``live``; a copy not confirmed is placed again after ``pause_s``."""
        self._live = live
        self._reporter = reporter
        self._pause_s = pause_s

    async def retry(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """An immediate retry is made now, in process; a later one is a copy into its tier."""
        if decision.action is Action.RETRY_NOW:
            self._reporter.in_process(
                route.queue, msg.message_id, msg.headers, decision, exc, immediate=True
            )
            return True
        await self._send(msg, route, decision, exc)
        return False

    async def dead_letter(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Publish the dead letter to the stream's dead-letter stream, then settle the original."""
        await self._send(msg, route, decision, exc)
        return True

    async def last_delivery(self, msg: Message, route: Route, delivered: int) -> bool:
        """Dead-letter the consumer's last allowed delivery as ``stuck``; ``False``: not placed.

        Its handler does not run (``middleware.nats.runtime.settle_first``).
        """
        raw = msg.raw_message
        incoming = wire.failed(raw.headers, subject=raw.subject, message_id=msg.message_id)
        now = h.now_ms()
        failure = h.FailureRecord(
            attempt=h.read_attempt(incoming),
            at_ms=now,
            exception=_MAX_DELIVER,
            error=(
                f"delivered {delivered} times, the consumer's max_deliver: JetStream would "
                "deliver it no more (a handler that crashed its process, or outlived "
                "ack_wait, at each delivery); dead-lettered before its handler ran"
            ),
        )
        letter = steps.dead_letter(
            route.dlq, route.queue, msg.message_id, incoming, failure, reason=Reason.STUCK
        )
        return await self._place(msg, letter, incoming, RuntimeError(failure.error))

    async def _send(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> None:
        live = self._live
        raw = msg.raw_message
        incoming = wire.failed(raw.headers, subject=raw.subject, message_id=msg.message_id)
        step = steps.failed(
            live.plan,
            route,
            decision,
            exc,
            message_id=msg.message_id,
            incoming=incoming,
            now_ms=h.now_ms(),
        )
        held = 0
        while True:
            outcomes: list[Outcome] = []
            too_large: list[bool] = []
            if await self._place(msg, step, incoming, exc, outcomes, too_large=too_large):
                return
            if too_large:
                # A retry whose copy cannot fit in max_payload even lean would never be
                # placed: dead-lettered at once, its own largest headers left out to fit.
                letter = steps.too_large(step, incoming, now_ms=h.now_ms(), error=TOO_LARGE_ERROR)
                if letter is not None:
                    step = letter
                    continue
            held += 1
            if not live.running or held >= live.delivery_limit:
                break
            # Held: the server is told it is in hand, and the copy placed again.
            await asyncio.gather(raw.in_progress(), return_exceptions=True)
            await asyncio.sleep(self._pause_s)
        # A copy the server keeps refusing (a full delay stream): dead-lettered as stuck,
        # the handler not run again for it; failing that, back to the consumer.
        letter = steps.stuck(
            route,
            step,
            incoming,
            now_ms=h.now_ms(),
            limit=live.delivery_limit,
            max_delay_ms=live.plan.tiers.max_delay_ms,
            outcome=(outcomes or [Outcome.REFUSED])[-1].value,
            held=held,
        )
        if live.running and letter is not None and await self._place(msg, letter, incoming, exc):
            return
        await msg.nack()  # back to the consumer, which redelivers it

    async def _place(
        self,
        msg: Message,
        step: Step,
        incoming: dict[str, Any],
        exc: BaseException,
        outcomes: list[Outcome] | None = None,
        *,
        too_large: list[bool] | None = None,
    ) -> bool:
        """Publish ``step``'s copy, report it, and settle ``msg`` once it is confirmed.

        The copy's header names are made sendable and its size fitted to the server's
        ``max_payload`` (``nats.fitting``); one that cannot fit is not published, and
        ``too_large`` is told.
        """
        live = self._live
        raw = msg.raw_message
        prefix, key = live.prefix, step.event.queue
        dead = step.event.kind is EventKind.DEAD_LETTERED
        if dead:
            subject = naming.dlq_subject(prefix, key)
            stream = naming.dlq_stream(prefix, naming.key_stream(key))
        else:
            tier = step.tier_ms or live.plan.tiers.tick_ms
            subject = naming.delay_subject(prefix, tier, key)
            stream = naming.delay_stream(prefix)
        meta = raw.metadata
        ident = copy_id(meta, "dead" if dead else "retry")
        seen: list[Outcome] = [] if outcomes is None else outcomes

        async def send(copy: Copy) -> bool:
            limit = fitting.max_payload_of(raw)
            fit = fitting.prepared(
                copy.headers, raw.headers, raw.data, msg_id=ident, limit=limit, room=copy.room
            )
            if fit is None:
                log.warning(
                    "faststream-retry: message %s: its copy to %r would not fit in the "
                    "server's max_payload (%d bytes) even without its history",
                    msg.message_id,
                    subject,
                    limit,
                )
                if too_large is not None:
                    too_large.append(True)
                return False
            headers, sent_id = fit
            left = [k for k in copy.headers if k not in headers and fitting.is_token(k)]
            if left or sent_id is None:
                log.warning(
                    "faststream-retry: message %s: its copy to %r would not fit in the "
                    "server's max_payload (%d bytes): sent without %s",
                    msg.message_id,
                    subject,
                    limit,
                    ", ".join(sorted(left)) or "its Nats-Msg-Id",
                )
            outcome = await live.publisher.publish(
                subject, raw.data, headers, msg_id=sent_id, stream=stream
            )
            seen.append(outcome)
            return confirmed(outcome)

        if not await self._reporter.publish(
            step.event,
            step.copy,
            send,
            incoming=incoming,
            exception=exc,
            tier_ms=step.tier_ms,
            destination=subject,
        ):
            return False
        if dead:
            await msg.reject()  # term: never delivered again
        else:
            await msg.ack()
        return True
