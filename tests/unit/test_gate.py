"""The gate of one work queue in outage mode: who waits, who probes, who is requeued (no broker).

Times here are real (asyncio timers, probe intervals of 100-200 ms) and checked only from
below (nothing comes early) and by order, never by how late: the machine is shared.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faststream_retry import EventKind, RetryEvent, Rule, Verdict
from faststream_retry.core.classify import Classification
from faststream_retry.core.decision import Action, Decision
from faststream_retry.core.outage import Outage, OutageOptions
from faststream_retry.outages import Gate, Outages, Requeue
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import ATTR, METRICS, Telemetry
from tests.rabbit import eventually

PROBE_MS = 150


def transient(attempt: int = 1) -> Decision:
    return Decision(
        Action.RETRY_LATER,
        attempt,
        5,
        Classification(Verdict.TRANSIENT, Rule.BUILTIN),
        delay_ms=1000,
    )


def permanent() -> Decision:
    return Decision(Action.DEAD_LETTER, 1, 5, Classification(Verdict.PERMANENT, Rule.EXPLICIT))


class Harness:
    def __init__(self, after: int = 2, probe_ms: int = PROBE_MS, hold_ms: int = 60_000) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider(shutdown_on_exit=False)
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.events: list[RetryEvent] = []
        self.reporter = Reporter(
            Telemetry(tracer_provider, MeterProvider(metric_readers=[self.metrics])),
            [self.events.append],
        )
        self.gate = Gate(
            "orders",
            Outage(after, probe_ms),
            hold_ms=hold_ms,
            after=after,
            reporter=self.reporter,
        )

    def switch_on(self) -> None:
        for n in range(self.gate.after):
            self.gate.failed(transient(), f"m{n}", ConnectionError("database down"))
        assert self.gate.active

    def counts(self) -> dict[str, float]:
        data = self.metrics.get_metrics_data()
        found: dict[str, float] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        found[metric.name] = (
                            point.value if isinstance(point, NumberDataPoint) else point.count
                        )
        return found

    def kinds(self) -> list[EventKind]:
        return [e.kind for e in self.events]


async def test_in_normal_mode_every_message_goes_straight_through() -> None:
    """No outage: enter returns at once, as a plain passage, and nothing is reported."""
    harness = Harness()
    assert await harness.gate.enter() is False
    harness.gate.succeeded("m")
    harness.gate.leave(False)
    assert harness.events == []
    assert harness.counts() == {}


async def test_switching_on_is_reported_once_with_what_switched_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Nth transient failure: one WARNING, one event, a span, the active gauge at 1."""
    harness = Harness(after=3)
    caplog.set_level(logging.INFO, logger="faststream_retry")
    harness.gate.failed(transient(), "m1", ConnectionError("down"))
    harness.gate.failed(permanent(), "m2", ValueError("bad payload"))
    harness.gate.failed(transient(), "m3", ConnectionError("down"))
    assert harness.events == []
    harness.gate.failed(transient(attempt=2), "m4", ConnectionError("database down"))
    harness.gate.failed(transient(), "m5", ConnectionError("still down"))
    (event,) = harness.events
    assert event.kind is EventKind.OUTAGE_STARTED
    assert (event.queue, event.message_id, event.attempt) == ("orders", "m4", 2)
    assert (event.failures, event.delay_ms) == (3, PROBE_MS)
    assert (event.exception, event.error) == ("ConnectionError", "database down")
    assert event.classification is None, "the failure itself is counted by its own step"
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.levelname == "WARNING"
    assert line.getMessage() == (
        "faststream-retry: orders is in outage mode after 3 consecutive transient failures "
        "(last: ConnectionError: database down); taking one message per 150 ms until one "
        "succeeds"
    )
    assert line.retry["event"] == "outage_started"  # type: ignore[attr-defined]
    assert line.retry["failures"] == 3  # type: ignore[attr-defined]
    assert harness.counts() == {METRICS.OUTAGE_ENTERED: 1, METRICS.OUTAGE_ACTIVE: 1}
    assert harness.spans.get_finished_spans() == (), "the outage's span is still open"


async def test_one_probe_per_interval_first_come_first_served() -> None:
    """Waiters go on one at a time, in the order they came, each an interval after the last
    probe ended; the others keep waiting."""
    harness = Harness()
    gate = harness.gate
    # Stamped before: the outage starts at switch_on's last failure, and reporting the ones
    # before it took 21 ms once on a loaded CI machine (the first gap read 129 ms).
    switched = time.monotonic()
    harness.switch_on()
    order: list[tuple[str, float]] = []

    async def message(name: str) -> None:
        probe = await gate.enter()
        assert probe, "in outage mode only probes get through"
        order.append((name, time.monotonic()))
        gate.failed(transient(), name, ConnectionError("still down"))
        gate.leave(probe)

    tasks = [asyncio.create_task(message(f"w{n}")) for n in range(3)]
    await eventually(lambda: len(order) == 3, timeout=10, what="three probes")
    await asyncio.gather(*tasks)
    assert [name for name, _ in order] == ["w0", "w1", "w2"]
    starts = [switched] + [at for _, at in order]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= PROBE_MS / 1000 - 0.01 for gap in gaps), gaps
    assert gate.outage.probes == 3
    assert harness.counts()[METRICS.OUTAGE_PROBES] == 3


async def test_the_next_probe_waits_for_the_running_one() -> None:
    """A probe that takes long is never joined by a second one."""
    harness = Harness()
    gate = harness.gate
    harness.switch_on()
    first = await gate.enter()
    assert first, "nobody waited and the slot came due: the first to come is the probe"
    second = asyncio.create_task(gate.enter())
    await asyncio.sleep(3 * PROBE_MS / 1000)
    assert not second.done(), "the first probe still runs"
    gate.leave(first)
    assert await asyncio.wait_for(second, 5) is True


async def test_a_success_opens_the_gate_for_everyone(caplog: pytest.LogCaptureFixture) -> None:
    """The first success ends the mode: every waiter goes on at once, and it is reported."""
    harness = Harness(probe_ms=5_000)
    gate = harness.gate
    harness.switch_on()
    caplog.set_level(logging.INFO, logger="faststream_retry")
    caplog.clear()
    waiters = [asyncio.create_task(gate.enter()) for _ in range(5)]
    await eventually(lambda: gate.waiting == 5, what="five waiters")
    gate.succeeded("m-ok")
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [False] * 5
    assert not gate.active
    assert gate.waiting == 0
    ended = harness.events[-1]
    assert ended.kind is EventKind.OUTAGE_ENDED
    assert (ended.message_id, ended.attempt, ended.probes, ended.failures) == ("m-ok", 0, 0, 0)
    assert ended.duration_ms is not None
    assert ended.duration_ms >= 0
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.levelname == "WARNING"
    assert line.getMessage().startswith("faststream-retry: orders left outage mode after ")
    assert line.getMessage().endswith(
        ": message m-ok succeeded (0 probes, 0 transient failures meanwhile); full speed again"
    )
    counts = harness.counts()
    assert counts[METRICS.OUTAGE_ACTIVE] == 0
    assert counts[METRICS.OUTAGE_DURATION] == 1
    (span,) = harness.spans.get_finished_spans()
    assert span.name == "orders outage"
    assert span.attributes is not None
    assert span.attributes[ATTR.QUEUE] == "orders"
    assert span.attributes[ATTR.OUTAGE_AFTER] == 2
    assert span.attributes[ATTR.OUTAGE_PROBE_MS] == 5_000
    assert span.attributes[ATTR.OUTAGE_END] == "success"
    assert span.attributes[ATTR.OUTAGE_PROBE_COUNT] == 0
    assert [e.name for e in span.events] == ["exception"]
    assert span.parent is None, "a trace of its own"


async def test_a_message_held_too_long_is_requeued() -> None:
    """After outage_hold the waiter is told to requeue, and leaves the line."""
    harness = Harness(probe_ms=5_000, hold_ms=200)
    gate = harness.gate
    harness.switch_on()
    started = time.monotonic()
    with pytest.raises(Requeue, match=r"held for 0.2 s \(outage_hold\)"):
        await gate.enter()
    assert time.monotonic() - started >= 0.19
    assert gate.waiting == 0
    assert list(gate._line) == []
    assert harness.counts()[METRICS.OUTAGE_REQUEUED] == 1
    assert gate.active, "requeueing a message changes nothing about the outage"


async def test_closing_requeues_every_waiter_and_ends_the_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker stops: every held message is requeued at once, and the outage is reported
    as stopped (no message id); afterwards nothing is held."""
    harness = Harness(probe_ms=5_000)
    gate = harness.gate
    harness.switch_on()
    caplog.set_level(logging.INFO, logger="faststream_retry")
    caplog.clear()
    waiters = [asyncio.create_task(gate.enter()) for _ in range(3)]
    await eventually(lambda: gate.waiting == 3, what="three waiters")
    gate.close()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, Requeue) for r in results), results
    assert harness.counts()[METRICS.OUTAGE_REQUEUED] == 3
    ended = harness.events[-1]
    assert (ended.kind, ended.message_id) == (EventKind.OUTAGE_ENDED, None)
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert "was in outage mode for" in line.getMessage()
    assert line.getMessage().endswith(
        "when its consumer stopped (0 probes); the messages it held were requeued"
    )
    (span,) = harness.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR.OUTAGE_END] == "stopped"
    assert await gate.enter() is False
    gate.failed(transient(), "late", ConnectionError("down"))
    gate.close()
    assert len(harness.events) == 2, "a closed gate reports nothing more"


async def test_a_probe_cancelled_before_it_runs_frees_the_slot() -> None:
    """A waiter made the probe but cancelled before it resumed gives the slot back."""
    harness = Harness(probe_ms=5_000)
    gate = harness.gate
    harness.switch_on()
    doomed = asyncio.create_task(gate.enter())
    await eventually(lambda: gate.waiting == 1, what="a waiter")
    gate.outage._next_probe_ms = 0  # the slot is due now, without waiting 5 s
    gate._wake()  # the waiter is made the probe...
    assert gate.outage.probing
    doomed.cancel()  # ...and cancelled before it ever runs again
    try:
        probe = await doomed
    except asyncio.CancelledError:
        assert not gate.outage.probing, "the slot is given back"
    else:
        # Before Python 3.12, wait_for returns a result that came before the cancel.
        assert probe is True
        gate.leave(probe)
    assert not gate.outage.probing
    assert gate.outage.until_probe_ms(0) is not None, "the next probe is scheduled"


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    """A waiter cancelled before its turn takes no place in the line."""
    harness = Harness(probe_ms=5_000)
    gate = harness.gate
    harness.switch_on()
    waiter = asyncio.create_task(gate.enter())
    await eventually(lambda: gate.waiting == 1, what="a waiter")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert list(gate._line) == []
    assert not gate.outage.probing


def test_outages_keep_one_gate_per_queue_with_the_tick_as_probe() -> None:
    """Gates are per queue; no probe option means the tick; off means no gates at all."""
    reporter = Reporter(Telemetry(), [])
    assert Outages.of(None, 1_000, reporter) is None
    outages = Outages.of(OutageOptions(3, None, 60_000), 1_000, reporter)
    assert outages is not None
    gate = outages.gate("a")
    assert outages.gate("a") is gate
    assert outages.gate("b") is not gate
    assert (gate.outage.after, gate.outage.probe_ms) == (3, 1_000)
    explicit = Outages.of(OutageOptions(3, 250, 60_000), 1_000, reporter)
    assert explicit is not None
    assert explicit.gate("a").outage.probe_ms == 250


async def test_outages_close_every_gate() -> None:
    """Closing the broker's outages requeues the waiters of every queue."""
    events: list[Any] = []
    outages = Outages(
        OutageOptions(1, 5_000, 60_000), 5_000, Reporter(Telemetry(), [events.append])
    )
    gates = [outages.gate("a"), outages.gate("b")]
    for gate in gates:
        gate.failed(transient(), "m", ConnectionError("down"))
    waiters = [asyncio.create_task(gate.enter()) for gate in gates]
    await eventually(lambda: all(g.waiting == 1 for g in gates), what="a waiter per queue")
    outages.close()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, Requeue) for r in results)
    assert [e.kind for e in events].count(EventKind.OUTAGE_ENDED) == 2


async def test_a_slot_given_as_the_hold_runs_out_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.12's wait_for raises TimeoutError when the hold runs out in the same tick as
    the gate's answer: the answer wins, or the probe slot would stay taken for ever."""
    harness = Harness(probe_ms=5_000, hold_ms=100)
    gate = harness.gate
    harness.switch_on()

    async def answered_then_timed_out(waiter: asyncio.Future[bool], timeout: float) -> bool:
        gate.outage._next_probe_ms = 0
        gate._wake()  # the slot goes to this waiter...
        assert waiter.result() is True
        raise asyncio.TimeoutError  # ...and the hold runs out at the same moment

    monkeypatch.setattr(asyncio, "wait_for", answered_then_timed_out)
    assert await gate.enter() is True, "it is the probe"
    assert gate.outage.probing
    assert harness.counts().get(METRICS.OUTAGE_REQUEUED) is None
    gate.leave(True)
    assert not gate.outage.probing


async def test_a_requeue_given_as_the_hold_runs_out_is_a_requeue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker stops in the same tick as the hold runs out: requeued, counted once."""
    harness = Harness(probe_ms=5_000, hold_ms=100)
    gate = harness.gate
    harness.switch_on()

    async def closed_then_timed_out(waiter: asyncio.Future[bool], timeout: float) -> bool:
        gate.close()
        raise asyncio.TimeoutError

    monkeypatch.setattr(asyncio, "wait_for", closed_then_timed_out)
    with pytest.raises(Requeue, match="the broker stops"):
        await gate.enter()
    assert harness.counts()[METRICS.OUTAGE_REQUEUED] == 1
