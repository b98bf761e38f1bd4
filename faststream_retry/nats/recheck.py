"""A tier's re-check consumer: waits for its head's due time, then hops or releases each copy.

Every copy in a tier waits the tier's time from when the server stored it (JetStream's
own timestamp, not a header), so the head of the tier is always the first one ready and
waiting for it holds back nothing that is ready. Once a copy has spent its time there,
``core.steps.recheck`` says what it is: due (released to its subscriber's ready subject),
early (round the tier the rest of its wait takes) or a due time no delay explains
(dead-lettered, ``invalid``). Each copy is confirmed by its PubAck before the tier's
message is acked; while the consumer waits for a head it keeps what it holds alive with
``in_progress``, so the copies of a re-check that died come back within ``ack_wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.events import EventKind
from faststream_retry.core.topology import Route
from faststream_retry.nats import fitting, naming, wire
from faststream_retry.nats.fetch import fetch, stop_loop
from faststream_retry.nats.publisher import confirmed, copy_id
from faststream_retry.nats.streams import RECHECK_ACK_WAIT_S
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

    from faststream_retry.core.steps import Copy, Step
    from faststream_retry.core.topology import Plan
    from faststream_retry.nats.publisher import Publisher
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["FETCH", "RESCAN_S", "Recheck", "RetiredTiers", "stored_ms"]

FETCH = 200
"""Copies one fetch takes: at most this many are held while the head is waited for."""

_KEEP_ALIVE_S = RECHECK_ACK_WAIT_S / 3
_PULL_S = 5.0
"""How long one pull of an idle tier waits. The server hands a copy to a waiting pull the
moment it is stored, so this is no delay; it is how soon a pull lost with its connection
(the server drops it, the client waits it out) is made again. An app has a re-check per
tier (17 with the default backoff): at 1 s, an idle app pulled 34 times a second (4 to 5
ms of its CPU and 2 to 3 ms of the server's, a second)."""
RESCAN_S = 5.0
"""How often the delay stream is looked at for copies in tiers the plan no longer has, and
the plugin's streams for one an operator deleted (within a held copy's ``delivery_limit``
tries, 20 s by default)."""


def stored_ms(msg: Msg) -> int:
    """When the server stored ``msg``, in epoch ms (JetStream's own timestamp)."""
    return int(msg.metadata.timestamp.timestamp() * 1000)


class Recheck:
    """The re-check consumer of one tier of one prefix's delay stream."""

    def __init__(
        self,
        js: JetStreamContext,
        publisher: Publisher,
        reporter: Reporter,
        plan: Callable[[], Plan],
        tier_ms: int,
        *,
        pause_s: float,
    ) -> None:
        """Re-check tier ``tier_ms``; ``plan`` returns the routes covered now."""
        self._js = js
        self._publisher = publisher
        self._reporter = reporter
        self._plan = plan
        self._tier_ms = tier_ms
        self._pause_s = pause_s
        self._prefix = plan().options.prefix
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None

    async def start(self) -> None:
        """Bind the tier's durable consumer (made if missing) and start its loop."""
        prefix, tier = self._prefix, self._tier_ms
        self._sub = await self._js.pull_subscribe(
            naming.tier_filter(prefix, tier),
            durable=naming.recheck_durable(prefix, tier),
            stream=naming.delay_stream(prefix),
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=RECHECK_ACK_WAIT_S,
                max_ack_pending=-1,
                max_deliver=-1,
            ),
        )
        self._task = asyncio.create_task(self._loop(), name=f"faststream-retry recheck {tier}")

    async def stop(self) -> None:
        """Stop; what it holds goes back to the stream at once (``nak``), for the next re-check."""
        self._stopping.set()
        await stop_loop(self._task, self._sub, cancel=True)
        self._task, self._sub = None, None

    async def _loop(self) -> None:
        held: list[Msg] = []
        try:
            while not self._stopping.is_set():
                fetched = await fetch(
                    self._sub,
                    FETCH,
                    _PULL_S,
                    pause_s=self._pause_s,
                    what=f"re-check {self._tier_ms}",
                )
                if fetched is None:
                    return
                held = fetched
                # Each copy's due time, read once. The head is due first, but for a copy
                # redelivered among newer ones (stored earlier, so due earlier): each wake
                # takes every due copy wherever it sits, and waits for the earliest left.
                dues = [stored_ms(m) + self._tier_ms for m in held]
                while held:
                    await self._hold_until(min(dues), held)
                    now = h.now_ms()
                    ready = [m for m, due in zip(held, dues, strict=True) if due <= now]
                    held = [m for m, due in zip(held, dues, strict=True) if due > now]
                    dues = [due for due in dues if due > now]
                    await asyncio.gather(*(self._step(m) for m in ready))
        finally:
            for msg in held:  # stopped while holding: back to the stream now, not after ack_wait
                with contextlib.suppress(Exception):
                    await msg.nak()

    async def _hold_until(self, due_ms: int, held: list[Msg]) -> None:
        """Sleep until ``due_ms``, telling the server every so often that ``held`` is in hand."""
        while (left_s := (due_ms - h.now_ms()) / 1000) > 0:
            await asyncio.sleep(min(left_s, _KEEP_ALIVE_S))
            if due_ms > h.now_ms():
                await asyncio.gather(*(m.in_progress() for m in held), return_exceptions=True)

    async def _step(self, msg: Msg) -> None:
        """Carry out what ``core.steps.recheck`` says of one copy; never raises."""
        try:
            await self._carry(msg)
        except Exception:  # one copy's trouble must not stop the tier
            log.exception("faststream-retry: re-check of %r failed; it comes back", msg.subject)
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._pause_s)

    async def _carry(self, msg: Msg) -> None:
        parsed = naming.split_delay_subject(self._prefix, msg.subject)
        if parsed is None:
            # Not a copy of the plugin's (published by hand on the tier's subjects): it
            # names no subscriber to release it to, nor a dead-letter stream.
            log.error(
                "faststream-retry: %r in the delay stream names no subscriber "
                "(<prefix>.delay.<ms>.<stream>.<consumer>): removed (term)",
                msg.subject,
            )
            await msg.term()
            return
        _, key = parsed
        plan = self._plan()
        route = plan.route(key) or Route(key, ())
        incoming = wire.decode(msg.headers)
        message_id = _text(incoming.get(wire.MESSAGE_ID))
        step = steps.recheck(plan, route, message_id, incoming, now_ms=h.now_ms())
        meta = msg.metadata
        subject, stream, kind = self.destination(step, key)
        ident = copy_id(meta, kind)

        async def send(copy: Copy) -> bool:
            # A copy fits as it was placed; a release or hop adds a little, and a copy
            # placed by hand may be anything (``nats.fitting``).
            fit = fitting.prepared(
                copy.headers,
                msg.headers,
                msg.data,
                msg_id=ident,
                limit=fitting.max_payload_of(msg),
                room=copy.room,
            )
            if fit is None:
                return False
            headers, sent_id = fit
            outcome = await self._publisher.publish(
                subject, msg.data, headers, msg_id=sent_id, stream=stream
            )
            return confirmed(outcome)

        tier = step.event.delay_ms if step.event.kind is EventKind.HOP else None
        if await self._reporter.publish(
            step.event, step.copy, send, incoming=incoming, tier_ms=tier, destination=subject
        ):
            await msg.ack()
        else:
            await msg.nak(delay=self._pause_s)

    def destination(self, step: Step, key: str) -> tuple[str, str, str]:
        """Return the subject, stream and id kind of ``step``'s copy of ``key``'s message."""
        prefix = self._prefix
        kind = step.event.kind
        if kind is EventKind.RELEASED:
            return naming.ready_subject(prefix, key), naming.delay_stream(prefix), "release"
        if kind is EventKind.HOP:
            tier = step.event.delay_ms or self._tier_ms
            return naming.delay_subject(prefix, tier, key), naming.delay_stream(prefix), "hop"
        stream = naming.key_stream(key)
        return naming.dlq_subject(prefix, key), naming.dlq_stream(prefix, stream), "dead"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


class RetiredTiers:
    """Watches the delay stream: tiers the plan no longer has, and streams an operator deleted.

    A new ``max_delay`` or ``tick`` makes other tiers; a copy placed by the app before
    (or by a replica of the old version still running) waits in a tier that no re-check of
    this plan reads. At start, and every ``RESCAN_S``, the delay stream's subjects are
    read (their counts, nothing consumed), and each tier that holds a copy gets a re-check
    of its own, which releases or hops its copies as the plan says (``core.steps.recheck``),
    and stays until the app stops. The same look finds the delay stream or a dead-letter
    stream deleted while the app runs (``nats stream rm``): ``repair`` makes them again
    (told whether the delay stream, and so every consumer of it, was gone), with an ERROR.
    """

    def __init__(
        self,
        make: Callable[[int], Recheck],
        js: JetStreamContext,
        prefix: str,
        *,
        dead_letters: Iterable[str] = (),
        repair: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        """Start a re-check of a tier with ``make``; ``prefix``: the delay stream's.

        ``dead_letters``: the dead-letter streams to look for; ``repair``: makes the
        missing streams again.
        """
        self._make = make
        self._js = js
        self._prefix = prefix
        self._dead_letters = sorted(dead_letters)
        self._repair = repair
        self._planned: set[int] = set()
        self._known: set[int] = set()
        self.started: list[Recheck] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, tiers: Iterable[int]) -> None:
        """Re-check the stranded tiers found now; look again every ``RESCAN_S``."""
        self._planned = set(tiers)
        self._known = set(self._planned)
        await self.scan()
        self._task = asyncio.create_task(self._loop(), name="faststream-retry retired tiers")

    async def stop(self) -> None:
        """Stop looking, and stop the re-checks it started."""
        await stop_loop(self._task, None, cancel=True)
        self._task = None
        await self._forget()

    async def _forget(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.started))
        self.started = []
        self._known = set(self._planned)

    async def scan(self) -> None:
        """Repair deleted streams; start a re-check for each tier none reads; never raises."""
        delay = naming.delay_stream(self._prefix)
        found = await asyncio.gather(
            self._js.stream_info(delay, subjects_filter=f"{self._prefix}.delay.>"),
            *(self._js.stream_info(name) for name in self._dead_letters),
            return_exceptions=True,
        )
        gone = [
            name
            for name, info in zip([delay, *self._dead_letters], found, strict=True)
            if isinstance(info, NotFoundError)
        ]
        if gone and self._repair is not None:
            log.error(
                "faststream-retry: the stream(s) %s were deleted while the app runs: made "
                "again (what they held is gone; what waits to be placed is placed there)",
                ", ".join(gone),
            )
            try:
                await self._repair(delay in gone)
            except Exception as exc:  # looked at again at the next scan
                log.warning("faststream-retry: making %s again: %r", ", ".join(gone), exc)
            if delay in gone:
                await self._forget()  # their consumers went with the stream
            return
        info = found[0]
        if isinstance(info, BaseException):  # a hiccup: the next scan looks again
            log.warning("faststream-retry: looking for retired tiers in %r: %r", delay, info)
            return
        tiers = set()
        for subject in info.state.subjects or {}:
            parsed = naming.split_delay_subject(self._prefix, subject)
            if parsed is not None and parsed[0] not in self._known:
                tiers.add(parsed[0])
        for tier in sorted(tiers):
            recheck = self._make(tier)
            try:
                await recheck.start()
            except Exception as exc:  # looked at again at the next scan
                log.warning("faststream-retry: re-check of retired tier %d: %r", tier, exc)
                continue
            log.warning(
                "faststream-retry: copies wait in tier %s, which the plan no longer has "
                "(max_delay or tick changed): re-checked until they are released",
                tier,
            )
            self._known.add(tier)
            self.started.append(recheck)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(RESCAN_S)
            await self.scan()
