"""Outage mode, carried out: a gate per work queue that holds its messages (asyncio, any broker).

``outage.Outage`` decides; a ``Gate`` does what it says for one work queue of one broker,
whichever transport it is on (RabbitMQ, NATS, Redis: it imports none of them).
The middleware's per-message scope passes each message through ``Gate.enter`` before the
handler runs:

- in normal mode, straight through;
- in outage mode the message waits, unacked, in a first-come line. Once per probe
  interval the first in line goes on as the probe, one probe at a time. A success (the
  probe's, or that of a call already running when the mode began) ends the mode and lets
  the whole line go at once. A message that waited ``outage_hold`` is requeued
  (``Requeue``), and so is every waiting one when the broker stops.

Nothing here talks to the broker: the scope acks, nacks and publishes as before, and
hands a ``Requeue``d message back as its transport does (RabbitMQ: ``nack``, requeued;
NATS and Redis: parked as a copy that spends no attempt, ``nats.park``, ``redis.park``).
The state lives in this process only; several processes consuming one queue each keep their
own streak and gate and decide alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.core.events import RetryEvent
from faststream_retry.core.outage import Outage, OutageOptions

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.trace import Span

    from faststream_retry.core.decision import Decision
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Gate", "HandBacks", "Outages", "Requeue"]


class Requeue(Exception):  # noqa: N818 - what the scope does with the message, not an error
    """The held message goes back to its queue: it waited ``outage_hold``, or the broker stops."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Gate:
    """Holds the messages of one work queue while it is in outage mode."""

    __slots__ = (
        "_closed",
        "_hold_s",
        "_line",
        "_reporter",
        "_span",
        "_timer",
        "after",
        "outage",
        "queue",
    )

    def __init__(
        self, queue: str, outage: Outage, *, hold_ms: int, after: int, reporter: Reporter
    ) -> None:
        """Hold ``queue``'s messages as ``outage`` says, each at most ``hold_ms``."""
        self.queue = queue
        self.outage = outage
        self.after = after
        self._hold_s = hold_ms / 1000
        self._reporter = reporter
        self._line: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._span: Span | None = None
        self._closed = False

    @property
    def active(self) -> bool:
        """Return whether the queue is in outage mode."""
        return self.outage.active

    @property
    def waiting(self) -> int:
        """Return how many messages wait at the gate."""
        return sum(not waiter.done() for waiter in self._line)

    async def enter(self) -> bool:
        """Wait while the queue is in outage mode; ``True``: the caller goes on as the probe.

        A caller that gets ``True`` must call ``leave(True)`` once its handler call is
        over, whatever the outcome.

        Raises:
            Requeue: the message waited ``outage_hold``, or the broker stops: hand it
                back to its queue without calling the handler.
        """
        outage = self.outage
        if not outage.active or self._closed:
            return False
        if not self._line and outage.take_probe(_now_ms()):
            self._reporter.count_probe(self.queue)
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._line.append(waiter)
        self._schedule()
        try:
            return await asyncio.wait_for(waiter, self._hold_s)
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():
                # The gate answered as the hold ran out (Python 3.12's wait_for then
                # raises anyway): a slot given must be taken, or no probe comes again.
                return self._answer(waiter)
            self._discard(waiter)
            self._reporter.count_requeued(self.queue)
            raise Requeue(f"held for {self._hold_s:g} s (outage_hold)") from None
        except Requeue:
            self._reporter.count_requeued(self.queue)
            raise
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                # Cancelled just after it was made the probe: free the slot for the next.
                self.leave(probe=True)
            else:
                self._discard(waiter)
            raise

    def _answer(self, waiter: asyncio.Future[bool]) -> bool:
        try:
            return waiter.result()
        except Requeue:
            self._reporter.count_requeued(self.queue)
            raise

    def leave(self, probe: bool) -> None:
        """A call let through is over; a probe's end makes the next probe due an interval on."""
        if probe:
            self.outage.probe_done(_now_ms())
            self._schedule()

    def failed(self, decision: Decision, message_id: str | None, exc: BaseException) -> None:
        """Count a failed handler call; report it if it switches the queue into outage mode."""
        if self._closed:
            return
        entered = self.outage.failed(decision.classification.verdict, _now_ms())
        if entered is None:
            return
        event = RetryEvent.outage_started(
            queue=self.queue,
            message_id=message_id,
            attempt=decision.attempt,
            at_ms=h.now_ms(),
            max_attempts=decision.max_attempts,
            probe_ms=self.outage.probe_ms,
            exception=h.exception_name(exc),
            error=h.error_text(exc, h.HISTORY_ERROR_LIMIT, decision.problem),
            failures=entered.failures,
        )
        self._span = self._reporter.outage(event, after=self.after)

    def succeeded(self, message_id: str | None) -> None:
        """Count a successful handler call; if it ends outage mode, let the line go."""
        if self._closed:
            return
        left = self.outage.succeeded(_now_ms())
        if left is None:
            return
        self._cancel_timer()
        line, self._line = self._line, collections.deque()
        for waiter in line:
            if not waiter.done():
                waiter.set_result(False)
        self._report_end(message_id, left.duration_ms, left.probes, left.failures)

    def close(self) -> int:
        """The broker stops: requeue every waiting message; nothing is held from now on.

        Return how many were waiting (each now raises ``Requeue`` in its own task).
        """
        if self._closed:
            return 0
        self._closed = True
        self._cancel_timer()
        line, self._line = self._line, collections.deque()
        requeued = 0
        for waiter in line:
            if not waiter.done():
                waiter.set_exception(Requeue("the broker stops"))
                requeued += 1
        left = self.outage.stopped(_now_ms())
        if left is not None:
            self._report_end(None, left.duration_ms, left.probes, left.failures)
        return requeued

    def _report_end(
        self, message_id: str | None, duration_ms: int, probes: int, failures: int
    ) -> None:
        event = RetryEvent.outage_ended(
            queue=self.queue,
            message_id=message_id,
            at_ms=h.now_ms(),
            probe_ms=self.outage.probe_ms,
            failures=failures,
            probes=probes,
            duration_ms=duration_ms,
        )
        span, self._span = self._span, None
        self._reporter.outage(event, span)

    def _schedule(self) -> None:
        """Wake the line when the probe slot is due (one timer at a time)."""
        if self._timer is not None or not self._line:
            return  # with nobody waiting, the next to come takes a due slot itself
        wait_ms = self.outage.until_probe_ms(_now_ms())
        if wait_ms is None:
            return  # a probe runs: its end schedules the next
        self._timer = asyncio.get_running_loop().call_later(wait_ms / 1000, self._wake)

    def _wake(self) -> None:
        """Make the first live waiter the probe, if the slot is due (else wait on)."""
        self._timer = None
        line = self._line
        while line and line[0].done():  # timed out or cancelled
            line.popleft()
        if line and self.outage.take_probe(_now_ms()):
            line.popleft().set_result(True)
            self._reporter.count_probe(self.queue)
        self._schedule()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _discard(self, waiter: asyncio.Future[bool]) -> None:
        # Waiters time out in the order they came, so this one is near the front.
        with contextlib.suppress(ValueError):
            self._line.remove(waiter)


class Outages:
    """The gates of one broker's work queues, made as their messages come."""

    def __init__(self, options: OutageOptions, probe_ms: int, reporter: Reporter) -> None:
        """Probe every ``probe_ms`` (the option, or the tick) in every queue's outage mode."""
        self.options = options
        self.probe_ms = probe_ms
        self._reporter = reporter
        self._gates: dict[str, Gate] = {}
        self._caps: dict[str, int] = {}

    def cap(self, queue: str, hold_ms: int) -> None:
        """Hold ``queue``'s messages at most ``hold_ms``, if that is shorter than ``outage_hold``.

        For a transport that redelivers a message held too long (NATS: the consumer's
        ``ack_wait``); set before the queue's first message.
        """
        self._caps[queue] = max(1, min(hold_ms, self._caps.get(queue, hold_ms)))

    def hold_ms(self, queue: str) -> int:
        """Return how long ``queue``'s messages may wait at its gate."""
        return min(self.options.hold_ms, self._caps.get(queue, self.options.hold_ms))

    @classmethod
    def of(cls, options: OutageOptions | None, tick_ms: int, reporter: Reporter) -> Outages | None:
        """Return the gates for ``options``; ``None`` when outage mode is off."""
        if options is None:
            return None
        probe_ms = options.probe_ms if options.probe_ms is not None else tick_ms
        return cls(options, probe_ms, reporter)

    def gate(self, queue: str) -> Gate:
        """Return ``queue``'s gate."""
        gate = self._gates.get(queue)
        if gate is None:
            options = self.options
            gate = self._gates[queue] = Gate(
                queue,
                Outage(options.after, self.probe_ms),
                hold_ms=self.hold_ms(queue),
                after=options.after,
                reporter=self._reporter,
            )
        return gate

    def close(self) -> int:
        """Requeue every held message, of every queue (the broker stops); return how many."""
        return sum(gate.close() for gate in self._gates.values())


class HandBacks:
    """The held messages a transport hands back by a step of its own (a park), counted.

    A stop requeues every held message (``Outages.close``) and must not close the
    connection under their parks: it waits (``settle``) until as many have started
    as were held, and none runs.
    """

    __slots__ = ("_changed", "_running", "_started")

    def __init__(self) -> None:
        """Count from 0."""
        self._started = 0
        self._running = 0
        self._changed = asyncio.Event()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        """Count one hand-back while it runs."""
        self._started += 1
        self._running += 1
        self._changed.set()
        try:
            yield
        finally:
            self._running -= 1
            self._changed.set()

    async def settle(self, held: int, timeout_s: float) -> None:
        """Wait until ``held`` more hand-backs started and none runs, at most ``timeout_s``."""
        target = self._started + held

        async def settled() -> None:
            while self._started < target or self._running:
                self._changed.clear()
                await self._changed.wait()

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(settled(), timeout_s)
