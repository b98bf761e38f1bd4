"""One reporting path: a step's span, metrics, log line and hooks, for every kind of step."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from faststream_retry import EventKind, Reason, RetryEvent, RetryLater, Rule, Verdict
from faststream_retry.core import headers as h
from faststream_retry.core.steps import Copy
from faststream_retry.reporting import lines, metrics, spans
from faststream_retry.reporting.reporter import Reporter, emit
from faststream_retry.reporting.telemetry import ATTR, METRICS, Telemetry, duration_buckets


class Harness:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider(shutdown_on_exit=False)
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.events: list[RetryEvent] = []
        self.reporter = Reporter(
            Telemetry(tracer_provider, MeterProvider(metric_readers=[self.metrics])),
            [self.events.append],
        )

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


def scheduled(
    *,
    message_id: str | None = "m-1",
    attempt: int = 2,
    at_ms: int = 1_000,
    max_attempts: int = 4,
    delay_ms: int = 400,
    due_ms: int | None = 1_400,
    exception: str = "TimeoutError",
    error: str = "slow",
    immediate: bool = False,
) -> RetryEvent:
    """A handler's transient failure on attempt 2 of 4, sent round the 400 ms tier."""
    return RetryEvent.scheduled(
        queue="orders",
        message_id=message_id,
        attempt=attempt,
        at_ms=at_ms,
        max_attempts=max_attempts,
        delay_ms=delay_ms,
        due_ms=due_ms,
        exception=exception,
        error=error,
        rule=Rule.BUILTIN,
        classification=Verdict.TRANSIENT,
        immediate=immediate,
    )


def dead_lettered(reason: Reason) -> RetryEvent:
    """The same failure, dead-lettered for ``reason``."""
    return RetryEvent.dead_lettered(
        queue="orders",
        message_id="m-1",
        attempt=2,
        at_ms=1_000,
        max_attempts=4,
        reason=reason,
        exception="TimeoutError",
        error="slow",
        rule=Rule.BUILTIN,
        classification=Verdict.TRANSIENT,
    )


@pytest.mark.parametrize(
    "table", [spans.SPANS, metrics.COUNTS, lines.LINES], ids=["spans", "metrics", "lines"]
)
def test_every_kind_of_event_has_its_row_in_every_instruments_table(
    table: Mapping[EventKind, object],
) -> None:
    """A new EventKind is one row in each table: its span, what it counts, its log line."""
    assert set(table) == set(EventKind)


async def confirmed(_: Copy) -> bool:
    return True


async def refused(_: Copy) -> bool:
    return False


async def test_a_confirmed_retry_is_spanned_counted_logged_and_hooked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scheduled: span with the decision, failure + scheduled counters, one INFO line, one event."""
    harness = Harness()
    event = scheduled()
    copy = Copy("p.delay.400", "orders.retry", {})
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    ok = await harness.reporter.publish(
        event, copy, confirmed, incoming={}, exception=TimeoutError("slow"), tier_ms=400
    )
    assert ok
    (span,) = harness.spans.get_finished_spans()
    assert span.name == "orders retry scheduled"
    assert span.attributes is not None
    assert span.attributes[ATTR.TIER_MS] == 400
    assert span.attributes[ATTR.DESTINATION] == "p.delay.400"
    assert span.attributes[ATTR.RULE] == "builtin"
    assert [e.name for e in span.events] == ["exception"]
    assert "traceparent" in copy.headers  # the next step continues this trace
    assert harness.counts() == {
        METRICS.FAILURES: 1,
        METRICS.SCHEDULED: 1,
        METRICS.PLANNED_DELAY: 1,
    }
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.levelname == "INFO"
    assert harness.events == [event]


async def test_an_unconfirmed_step_is_a_failed_span_and_nothing_else() -> None:
    """Not confirmed: the span says so, and no metric, log line or event claims it happened."""
    harness = Harness()
    event = scheduled()
    ok = await harness.reporter.publish(
        event, Copy("p.delay.400", "orders.retry", {}), refused, incoming={}
    )
    assert not ok
    (span,) = harness.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert harness.counts() == {}
    assert harness.events == []


async def test_dead_letters_are_error_spans_and_error_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Dead-lettered: ERROR span with reason and DLQ, the reason counter, one ERROR line."""
    harness = Harness()
    event = dead_lettered(Reason.EXHAUSTED)
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    error = TimeoutError("slow")
    await harness.reporter.publish(
        event, Copy("", "orders.dlq", {}), confirmed, incoming={}, exception=error
    )
    (span,) = harness.spans.get_finished_spans()
    assert span.name == "orders dead-letter"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert (span.attributes[ATTR.REASON], span.attributes[ATTR.DLQ]) == ("exhausted", "orders.dlq")
    assert harness.counts() == {METRICS.FAILURES: 1, METRICS.DEAD_LETTERED: 1}
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.levelname == "ERROR"
    assert "to orders.dlq: reason=exhausted attempt=2/4" in line.getMessage()
    assert line.exc_text == h.traceback_text(error)[:-1]  # whatever the retry setting
    assert (line.queue, line.message_id) == ("orders", "m-1")  # type: ignore[attr-defined]


async def test_recheck_steps_continue_the_message_trace_and_stay_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hops and releases: their own span names, lateness recorded, DEBUG lines only."""
    harness = Harness()
    hop = RetryEvent.hop(
        queue="orders", message_id="m-1", attempt=1, at_ms=1_000, tier_ms=200, due_ms=1_300
    )
    release = RetryEvent.released(
        queue="orders", message_id="m-1", attempt=1, at_ms=1_305, due_ms=1_300, lateness_ms=5
    )
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    await harness.reporter.publish(
        hop, Copy("p.delay.200", "orders.retry", {}), confirmed, incoming={}
    )
    await harness.reporter.publish(release, Copy("", "orders", {}), confirmed, incoming={})
    hop_span, release_span = harness.spans.get_finished_spans()
    assert (hop_span.name, release_span.name) == ("orders retry hop", "orders retry release")
    assert hop_span.attributes is not None
    assert (hop_span.attributes[ATTR.TIER_MS], hop_span.attributes[ATTR.REMAINING_MS]) == (200, 300)
    assert release_span.attributes is not None
    assert release_span.attributes[ATTR.LATENESS_MS] == 5
    assert harness.counts() == {METRICS.RELEASED: 1, METRICS.LATENESS: 1}
    lines = [r for r in caplog.records if r.name == "faststream_retry"]
    assert [r.levelname for r in lines] == ["DEBUG", "DEBUG"]
    assert lines[0].getMessage() == "re-check hop message m-1 from orders.retry (due 1300)"
    assert harness.events == [hop, release]


async def test_an_invalid_due_time_counts_as_a_dead_letter_not_a_failure() -> None:
    """No handler failed: only the dead-letter counter moves."""
    harness = Harness()
    event = RetryEvent.dead_lettered(
        queue="orders",
        message_id="m-1",
        attempt=1,
        at_ms=1_000,
        due_ms=10**12,
        reason=Reason.INVALID,
        exception="",
        error="",
    )
    await harness.reporter.publish(event, Copy("", "orders.dlq", {}), confirmed, incoming={})
    assert harness.counts() == {METRICS.DEAD_LETTERED: 1}


def test_an_immediate_retry_is_recorded_with_a_span_of_its_own() -> None:
    """In-process retries publish nothing; their span only records the decision."""
    harness = Harness()
    event = scheduled(delay_ms=0, due_ms=None, immediate=True)
    harness.reporter.record(event, incoming={}, exception=TimeoutError("slow"))
    (span,) = harness.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR.IMMEDIATE] is True
    assert ATTR.DESTINATION not in span.attributes
    assert harness.events == [event]


async def test_a_broken_instrument_never_turns_a_confirmed_step_into_a_requeue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy exists once confirmed: a meter that raises is logged, and publish says True."""
    harness = Harness()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(harness.reporter.telemetry, "scheduled", SimpleNamespace(add=broken))
    event = scheduled()
    copy = Copy("p.delay.400", "orders.retry", {})
    assert await harness.reporter.publish(event, copy, confirmed, incoming={})


@pytest.mark.parametrize(
    ("choice", "attempt", "with_traceback"),
    [("first", 1, True), ("first", 2, False), ("every", 3, True), ("never", 1, False)],
)
def test_retry_lines_carry_the_traceback_as_configured(
    caplog: pytest.LogCaptureFixture, choice: str, attempt: int, with_traceback: bool
) -> None:
    """log_retry_traceback: the first failure's traceback by default; every or never."""
    reporter = Reporter(Telemetry(None, None), [], log_retry_traceback=choice)
    error = ConnectionError("down")
    event = scheduled(
        message_id=None,
        attempt=attempt,
        max_attempts=5,
        delay_ms=100,
        due_ms=1_100,
        exception="ConnectionError",
        error="down",
    )
    caplog.set_level(logging.INFO, logger="faststream_retry")
    reporter.report(event, error)
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.levelname == "INFO"
    assert (line.exc_text is not None) is with_traceback
    # FastStream's message id column wants a str, never None.
    assert line.message_id == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize("choice", ["first", "every"])
def test_a_retry_later_is_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture, choice: str
) -> None:
    """RetryLater is the handler's own instruction, not a failure: no traceback under its line."""

    class RateLimited(RetryLater):
        pass

    reporter = Reporter(Telemetry(None, None), [], log_retry_traceback=choice)
    caplog.set_level(logging.INFO, logger="faststream_retry")
    for error in (RetryLater(30, "429 from the API"), RateLimited(5)):
        try:
            raise error
        except RetryLater as raised:  # noqa: PERF203 - two cases, each with its raise
            reporter.report(
                scheduled(attempt=1, max_attempts=5, delay_ms=30_000, due_ms=30_100), raised
            )
    lines = [r for r in caplog.records if r.name == "faststream_retry"]
    assert [(r.levelname, r.exc_text) for r in lines] == [("INFO", None), ("INFO", None)]


def test_the_stock_reporter_logs_the_first_failures_traceback() -> None:
    """Without the option, a Reporter behaves as RetryMiddleware's default says."""
    assert Reporter(Telemetry(None, None), []).log_retry_traceback == "first"


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise IndexError


async def test_an_unprintable_exception_is_recorded_on_the_span_with_a_fallback() -> None:
    """OpenTelemetry's record_exception calls str(): the plugin records a safe event instead."""
    harness = Harness()
    event = scheduled()
    copy = Copy("p.delay.400", "orders.retry", {})
    ok = await harness.reporter.publish(
        event, copy, confirmed, incoming={}, exception=UnprintableError(), tier_ms=400
    )
    assert ok
    (span,) = harness.spans.get_finished_spans()
    (recorded,) = span.events
    assert recorded.name == "exception"
    assert recorded.attributes is not None
    assert dict(recorded.attributes) == {
        "exception.type": "tests.unit.test_reporting.UnprintableError",
        "exception.message": (
            "<unprintable tests.unit.test_reporting.UnprintableError: str() raised IndexError>"
        ),
        "exception.stacktrace": "tests.unit.test_reporting.UnprintableError: <exception str() failed>\n",
        "exception.escaped": "False",
    }
    assert harness.events == [event]


async def test_a_span_that_cannot_even_take_the_fallback_is_only_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span whose add_event raises too: logged, the copy sent and reported."""
    harness = Harness()
    from opentelemetry.sdk.trace import Span  # noqa: PLC0415

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("span closed")

    monkeypatch.setattr(Span, "add_event", broken)
    sent: list[Copy] = []

    async def send(copy: Copy) -> bool:
        sent.append(copy)
        return True

    event = dead_lettered(Reason.PERMANENT)
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    ok = await harness.reporter.publish(
        event, Copy("", "orders.dlq", {}), send, incoming={}, exception=UnprintableError()
    )
    assert ok
    assert len(sent) == 1
    assert harness.events == [event]
    messages = [r.getMessage() for r in caplog.records if "could not" in r.getMessage()]
    assert messages == [
        "faststream-retry could not record the exception on the span of dead_lettered of message m-1"
    ]


async def test_a_tracer_that_cannot_start_a_span_does_not_stop_the_step(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting the span raises (a broken propagator, say): sent once, reported, logged."""
    harness = Harness()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("propagator down")

    monkeypatch.setattr("faststream_retry.reporting.telemetry.propagate.inject", broken)
    sent: list[Copy] = []

    async def send(copy: Copy) -> bool:
        sent.append(copy)
        return True

    event = scheduled()
    ok = await harness.reporter.publish(
        event, Copy("p.delay.400", "orders.retry", {}), send, incoming={}
    )
    assert ok
    assert len(sent) == 1
    assert harness.events == [event]
    assert any(
        r.getMessage() == "faststream-retry could not start the span of scheduled of message m-1"
        for r in caplog.records
    )
    harness.reporter.record(scheduled(immediate=True), incoming={})
    assert len(harness.events) == 2


async def test_a_span_that_cannot_end_or_be_marked_is_only_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marking the span failed and ending it raise: the dead letter still counts as sent."""
    harness = Harness()
    from opentelemetry.sdk.trace import Span  # noqa: PLC0415

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(Span, "set_status", broken)
    monkeypatch.setattr(Span, "end", broken)
    event = dead_lettered(Reason.PERMANENT)
    for send in (confirmed, refused):
        await harness.reporter.publish(event, Copy("", "orders.dlq", {}), send, incoming={})
    assert harness.events == [event]
    broken_steps = sorted(
        r.getMessage().split(" dead_lettered")[0]
        for r in caplog.records
        if "could not" in r.getMessage()
    )
    assert broken_steps == [
        "faststream-retry could not end the span of",
        "faststream-retry could not end the span of",
        "faststream-retry could not mark the span of",
        "faststream-retry could not mark the span of",
    ]


def test_metrics_log_and_hooks_each_run_when_another_raises(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken meter does not silence the log line or the hooks; a broken log filter neither."""
    harness = Harness()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(harness.reporter.telemetry, "failures", SimpleNamespace(add=broken))
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    event = dead_lettered(Reason.EXHAUSTED)
    harness.reporter.report(event)
    assert harness.events == [event]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == (
        "ERROR",
        "faststream-retry could not count dead_lettered of message m-1",
    )
    assert lines[1][0] == "ERROR"
    assert lines[1][1].startswith("dead-lettered message m-1")

    class Raising(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            raise RuntimeError("filter bug")

    logger = logging.getLogger("faststream_retry")
    raising = Raising()
    logger.addFilter(raising)
    try:
        harness.reporter.report(event)  # the log and the report of its failure both raise
    finally:
        logger.removeFilter(raising)
    assert harness.events == [event, event]


def test_a_failing_hook_is_logged_and_the_event_still_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """events.emit guards each hook: the next hook runs, the step is counted."""
    harness = Harness()
    seen: list[RetryEvent] = []

    def bad(_: RetryEvent) -> None:
        raise RuntimeError("hook bug")

    harness.reporter.hooks = [bad, seen.append]
    event = scheduled()
    harness.reporter.report(event)
    assert seen == [event]
    assert harness.counts()[METRICS.SCHEDULED] == 1
    assert any("hook" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_warn_once_warns_once_per_key(caplog: pytest.LogCaptureFixture) -> None:
    """The first time a key comes it is a WARNING; after that, nothing."""
    harness = Harness()
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    for key in ("a", "a", "b", "a"):
        harness.reporter.warn_once(key, "asked %s", key)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "asked a"),
        ("WARNING", "asked b"),
    ]


def test_a_traceback_that_cannot_be_formatted_still_has_its_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """logging would drop the whole line ("--- Logging error ---"): it says why instead."""

    class NotedError(Exception):
        @property
        def __notes__(self) -> list[str]:
            raise IndexError

    reporter = Reporter(Telemetry(None, None), [], log_retry_traceback="every")
    caplog.set_level(logging.INFO, logger="faststream_retry")
    for event in (scheduled(delay_ms=100), dead_lettered(Reason.PERMANENT)):
        reporter.report(event, NotedError("n"))
        reporter.report(event, ValueError("v"))
    lines = [r for r in caplog.records if r.name == "faststream_retry"]
    why = "NotedError: n\n(no full traceback: formatting it raised IndexError)"
    assert [(r.levelname, (r.exc_text or "").endswith(why)) for r in lines] == [
        ("INFO", True),
        ("INFO", False),
        ("ERROR", True),
        ("ERROR", False),
    ]
    assert caplog.text.count("formatting it raised IndexError") == 2
    assert "Logging error" not in capsys.readouterr().err


def outage_started() -> RetryEvent:
    return RetryEvent.outage_started(
        queue="orders",
        message_id="m-9",
        attempt=3,
        at_ms=1_000,
        max_attempts=0,
        probe_ms=1_000,
        exception="ConnectionError",
        error="database down",
        failures=20,
    )


def outage_ended(message_id: str | None = "m-42") -> RetryEvent:
    return RetryEvent.outage_ended(
        queue="orders",
        message_id=message_id,
        at_ms=605_000,
        probe_ms=1_000,
        failures=598,
        probes=599,
        duration_ms=604_000,
    )


def test_an_outage_is_one_span_two_warnings_two_events_and_its_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Start and end of outage mode: the span spans it, each end is a WARNING and an event,
    the gauge goes up and down, and the failures are not counted a second time."""
    harness = Harness()
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    span = harness.reporter.outage(outage_started(), after=20)
    assert span is not None
    assert harness.spans.get_finished_spans() == ()
    assert harness.counts() == {METRICS.OUTAGE_ENTERED: 1, METRICS.OUTAGE_ACTIVE: 1}
    assert harness.reporter.outage(outage_ended(), span) is None
    (finished,) = harness.spans.get_finished_spans()
    assert finished.name == "orders outage"
    assert finished.attributes is not None
    assert dict(finished.attributes) == {
        ATTR.SYSTEM: "rabbitmq",
        ATTR.QUEUE: "orders",
        ATTR.OUTAGE_AFTER: 20,
        ATTR.OUTAGE_PROBE_MS: 1_000,
        ATTR.MESSAGE_ID: "m-9",
        ATTR.OUTAGE_FAILURES: 598,
        ATTR.OUTAGE_PROBE_COUNT: 599,
        ATTR.OUTAGE_DURATION_MS: 604_000,
        ATTR.OUTAGE_END: "success",
    }
    (exception,) = finished.events
    assert exception.name == "exception"
    assert dict(exception.attributes or {}) == {
        ATTR.EXCEPTION_TYPE: "ConnectionError",
        ATTR.EXCEPTION_MESSAGE: "database down",
    }
    assert harness.counts() == {
        METRICS.OUTAGE_ENTERED: 1,
        METRICS.OUTAGE_ACTIVE: 0,
        METRICS.OUTAGE_DURATION: 1,
    }
    assert [e.kind for e in harness.events] == [EventKind.OUTAGE_STARTED, EventKind.OUTAGE_ENDED]
    lines = [r for r in caplog.records if r.name == "faststream_retry"]
    assert [r.levelname for r in lines] == ["WARNING", "WARNING"]
    assert [r.getMessage() for r in lines] == [
        (
            "faststream-retry: orders is in outage mode after 20 consecutive transient failures "
            "(last: ConnectionError: database down); taking one message per 1 s until one succeeds"
        ),
        (
            "faststream-retry: orders left outage mode after 10 min 4 s: message m-42 succeeded "
            "(599 probes, 598 transient failures meanwhile); full speed again"
        ),
    ]
    assert lines[1].retry == {  # type: ignore[attr-defined]
        "event": "outage_ended",
        "queue": "orders",
        "message_id": "m-42",
        "attempt": 0,
        "max_attempts": 0,
        "delay_ms": 1_000,
        "reason": None,
        "exception": None,
        "rule": None,
        "failures": 598,
        "probes": 599,
        "duration_ms": 604_000,
    }


def test_an_outage_cut_short_by_a_stop_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """No message ended it (``message_id`` None): the line and the span say the consumer stopped."""
    harness = Harness()
    span = harness.reporter.outage(outage_started(), after=20)
    caplog.clear()
    harness.reporter.outage(outage_ended(None), span)
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.getMessage() == (
        "faststream-retry: orders was in outage mode for 10 min 4 s when its consumer stopped "
        "(599 probes); the messages it held were requeued"
    )
    (finished,) = harness.spans.get_finished_spans()
    assert (finished.attributes or {})[ATTR.OUTAGE_END] == "stopped"


def test_a_broken_tracer_costs_an_outage_its_span_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The span cannot start: logged; the outage is still counted, logged and hooked."""
    harness = Harness()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("tracer down")

    monkeypatch.setattr(harness.reporter.telemetry, "start_outage", broken)
    assert harness.reporter.outage(outage_started(), after=20) is None
    assert [e.kind for e in harness.events] == [EventKind.OUTAGE_STARTED]
    assert harness.counts()[METRICS.OUTAGE_ACTIVE] == 1
    assert any(
        r.getMessage()
        == "faststream-retry could not start the span of outage_started of message m-9"
        for r in caplog.records
    )
    harness.reporter.outage(outage_ended(), None)
    assert harness.counts()[METRICS.OUTAGE_ACTIVE] == 0


def test_a_broken_meter_never_disturbs_a_probe_or_a_requeue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counting a probe or a requeue never raises into the gate."""
    harness = Harness()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("meter down")

    monkeypatch.setattr(harness.reporter.telemetry.outage_probes, "add", broken)
    monkeypatch.setattr(harness.reporter.telemetry.outage_requeued, "add", broken)
    harness.reporter.count_probe("orders")
    harness.reporter.count_requeued("orders")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1_000, "1 s"),
        (1_500, "1.5 s"),
        (59_999, "59.999 s"),
        (60_000, "1 min"),
        (605_000, "10 min 5 s"),
    ],
)
def test_durations_in_outage_lines(ms: int, text: str) -> None:
    """Short ones in ms, then seconds, then minutes and seconds."""
    from faststream_retry.core.durations import format_ms  # noqa: PLC0415

    assert format_ms(ms) == text


def test_a_failing_hook_is_logged_and_the_next_one_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One broken hook costs a log line with its traceback, not the other hooks."""
    seen: list[RetryEvent] = []

    def broken(event: RetryEvent) -> None:
        raise RuntimeError(event.queue)

    event = scheduled(message_id="m1", attempt=1, at_ms=0)
    with caplog.at_level(logging.ERROR, logger="faststream_retry"):
        emit([broken, seen.append], event)
    assert seen == [event]
    [record] = caplog.records
    assert record.getMessage() == f"faststream-retry hook {broken!r} failed on scheduled"
    assert record.exc_info is None  # formatted by the plugin, bounded (see _log)
    assert record.exc_text is not None
    assert record.exc_text.startswith("Traceback (most recent call last):\n")
    assert record.exc_text.endswith("RuntimeError: orders")


def test_without_tracing_or_an_info_log_a_failure_is_only_counted_and_hooked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No SDK, no log at INFO: no span is made and no line is built, per retry or release.

    Under a burst of failures this is per message; a user who installs no
    OpenTelemetry SDK should pay close to nothing for the reporting.
    """
    metric_reader = InMemoryMetricReader()
    events: list[RetryEvent] = []
    reporter = Reporter(
        Telemetry(None, MeterProvider(metric_readers=[metric_reader])), [events.append]
    )
    monkeypatch.setattr(reporter.telemetry, "_tracing", False)
    made: list[str] = []

    def made_a(what: str) -> Any:  # stands in for a span and for a line's fields
        made.append(what)
        return {}

    monkeypatch.setattr(Telemetry, "step", lambda *_a, **_k: made_a("span"))
    monkeypatch.setattr(lines, "_fields", lambda *_a: made_a("line"))
    logging.getLogger("faststream_retry").setLevel(logging.WARNING)
    try:
        release = RetryEvent.released(
            queue="orders", message_id="m-1", attempt=1, at_ms=1_305, due_ms=1_300, lateness_ms=5
        )
        reporter.record(release, incoming={}, onward={})
        reporter.report(scheduled(), TimeoutError("slow"))
    finally:
        logging.getLogger("faststream_retry").setLevel(logging.NOTSET)
    assert made == []
    assert events == [release, scheduled()]


def test_durations_are_recorded_in_seconds_in_buckets_that_reach_max_delay() -> None:
    """A 90-minute delay under max_delay 2 h lands in a bucket of its own, not in +Inf."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]), max_delay_s=7_200)
    metrics.count(telemetry, scheduled(delay_ms=5_400_000))
    release = RetryEvent.released(
        queue="orders", message_id="m-1", attempt=1, at_ms=1_305, due_ms=1_300, lateness_ms=5
    )
    metrics.count(telemetry, release)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: m.data.data_points[0]
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if isinstance(m.data.data_points[0], HistogramDataPoint)
    }
    planned = points[METRICS.PLANNED_DELAY]
    assert planned.sum == 5_400
    assert tuple(planned.explicit_bounds[-2:]) == (3_600.0, 7_200.0)
    assert tuple(planned.bucket_counts[-2:]) == (1, 0)  # (3600, 7200], then +Inf
    lateness = points[METRICS.LATENESS]
    assert lateness.sum == 0.005
    assert tuple(lateness.explicit_bounds)[:2] == (0.005, 0.01)


@pytest.mark.parametrize(
    ("longest", "last"), [(0.5, (0.25, 0.5)), (600, (300.0, 600.0)), (601, (600.0, 601.0))]
)
def test_the_last_bucket_is_the_longest_value(longest: float, last: tuple[float, ...]) -> None:
    buckets = duration_buckets(longest)
    assert buckets[-2:] == last
    assert list(buckets) == sorted(set(buckets))


def test_the_dlq_gauge_shows_the_last_samples_and_asks_for_new_ones() -> None:
    """Each read shows what was sampled and wakes the samplers; no sample, no series."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]))
    wakes: list[int] = []
    telemetry.on_read.append(lambda: wakes.append(1))

    def shown() -> dict[str, float]:
        data = reader.get_metrics_data()
        return {
            str((p.attributes or {})[ATTR.QUEUE]): p.value
            for r in (data.resource_metrics if data else ())
            for s in r.scope_metrics
            for m in s.metrics
            if m.name == METRICS.DLQ_MESSAGES
            for p in m.data.data_points
            if isinstance(p, NumberDataPoint)
        }

    assert shown() == {}
    telemetry.dlq_depths.update({"orders": 3, "emails": 0})
    assert shown() == {"orders": 3, "emails": 0}
    assert len(wakes) == 2


@pytest.mark.parametrize(
    ("system", "destination"),
    [("redis", "{orders}.dlq"), ("nats", "retry.dlq.orders.billing")],
)
async def test_a_dead_letter_names_where_its_transport_put_it(
    caplog: pytest.LogCaptureFixture, system: str, destination: str
) -> None:
    """On NATS and Redis the letter is not in ``<queue>.dlq``: the line, the span's
    ``faststream_retry.dlq``, the log record's fields and the hook's event all name the
    place the sink published it to."""
    harness = Harness()
    reporter = harness.reporter.on(system)
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    event = dead_lettered(Reason.EXHAUSTED)
    copy = Copy("", "orders.dlq", {})  # what the core names: RabbitMQ's queue
    assert await reporter.publish(event, copy, confirmed, incoming={}, destination=destination)
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.getMessage().startswith(
        f"dead-lettered message m-1 from orders to {destination}: reason=exhausted"
    )
    assert line.retry["dlq"] == destination  # type: ignore[attr-defined]
    (span,) = harness.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR.DLQ] == destination
    assert span.attributes[ATTR.DESTINATION] == destination
    (hooked,) = harness.events
    assert hooked.dlq == destination
    assert "orders.dlq" not in line.getMessage()


async def test_a_rabbitmq_dead_letter_names_its_dlq_queue_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No destination (RabbitMQ): the line says ``<queue>.dlq``, the span the copy's queue."""
    harness = Harness()
    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    event = dead_lettered(Reason.PERMANENT)
    assert await harness.reporter.publish(event, Copy("", "orders.dlq", {}), confirmed, incoming={})
    (line,) = [r for r in caplog.records if r.name == "faststream_retry"]
    assert line.getMessage() == (
        "dead-lettered message m-1 from orders to orders.dlq: reason=permanent "
        "attempt=2/4 error=TimeoutError: slow"
    )
    assert line.retry["dlq"] == "orders.dlq"  # type: ignore[attr-defined]
    (span,) = harness.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR.DLQ] == "orders.dlq"
