"""Spans on a real broker: one trace per message, every attempt, hop and outcome in it."""

from __future__ import annotations

from typing import Any

import pytest
from aio_pika.abc import AbstractRobustConnection
from faststream.rabbit.opentelemetry import RabbitTelemetryMiddleware
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from faststream_retry import Fixed, PermanentError, RetryPolicy
from faststream_retry.core.events import EventKind
from faststream_retry.reporting.telemetry import ATTR
from tests.rabbit import App, drain, eventually, on_time, unique

pytestmark = pytest.mark.rabbit


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def attrs(item: ReadableSpan | Event) -> dict[str, Any]:
    """Return a span's or an event's attributes, typed for asserts."""
    return dict(item.attributes or {})


def scope(span: ReadableSpan) -> str | None:
    """Return the name of the tracer that made ``span``."""
    return span.instrumentation_scope.name if span.instrumentation_scope else None


def parent_of(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return spans.get(span.parent.span_id) if span.parent else None


def chain(spans: list[ReadableSpan], leaf: ReadableSpan) -> list[str]:
    """Names from the root down to ``leaf``."""
    by_id = {s.context.span_id: s for s in spans}
    names = [leaf.name]
    node: ReadableSpan | None = leaf
    while node is not None and (node := parent_of(node, by_id)) is not None:
        names.append(node.name)
    return names[::-1]


@pytest.mark.parametrize(
    "with_faststream_telemetry", [False, True], ids=["plain", "faststream-otel"]
)
async def test_retried_then_succeeded_is_one_trace(
    make_app: Any,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    with_faststream_telemetry: bool,
) -> None:
    """Two transient failures then success: one trace, scheduled -> release -> next attempt.

    The copy goes from its tier straight back to the work queue: the release span is
    made where it arrives, and the next attempt continues from it.
    """
    outer = (
        (RabbitTelemetryMiddleware(tracer_provider=provider),) if with_faststream_telemetry else ()
    )
    app: App = make_app(
        default=RetryPolicy(backoff=Fixed(0.1)), tracer_provider=provider, outer_middlewares=outer
    )
    queue = unique("traced")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ConnectionError(f"db down #{calls}")

    await app.start()
    await app.broker.publish("x", queue=queue)
    await eventually(lambda: calls == 3, what="3 calls")
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == 2, what="2 releases"
    )
    await app.stop()

    spans = list(exporter.get_finished_spans())
    ours = [s for s in spans if scope(s) == "faststream_retry"]
    assert [s.name for s in sorted(ours, key=lambda s: s.start_time or 0)] == [
        f"{queue} retry scheduled",
        f"{queue} retry release",
        f"{queue} retry scheduled",
        f"{queue} retry release",
    ]
    assert len({s.context.trace_id for s in spans}) == 1, "every span in one trace"
    scheduled = [s for s in ours if s.name.endswith("scheduled")]
    released = [s for s in ours if s.name.endswith("release")]
    assert [attrs(s)[ATTR.ATTEMPT] for s in scheduled] == [1, 2]
    for span in scheduled:
        assert span.kind is SpanKind.PRODUCER
        assert attrs(span)[ATTR.DELAY_MS] == 100
        assert attrs(span)[ATTR.TIER_MS] == 100
        assert attrs(span)[ATTR.CLASSIFICATION] == "transient"
        assert attrs(span)[ATTR.RULE] == "builtin"
        assert [e.name for e in span.events] == ["exception"]
    for span in released:
        assert on_time(attrs(span)[ATTR.LATENESS_MS], 100)

    last_release = max(released, key=lambda s: s.start_time or 0)
    if with_faststream_telemetry:
        process = [s for s in spans if s.name.endswith(" process")]
        assert len(process) == 3
        last_process = max(process, key=lambda s: s.start_time or 0)
        # FastStream's process span starts before the plugin sees the delivery, so
        # it continues the scheduled span; the release, reported as the copy arrives
        # from its last tier, is that scheduled span's other child.
        assert chain(spans, last_process)[-5:] == [
            process[0].name,
            f"{queue} retry scheduled",
            process[0].name,
            f"{queue} retry scheduled",
            process[0].name,
        ]
        for span in released:
            assert chain(spans, span)[-2:] == [f"{queue} retry scheduled", span.name]
    else:
        assert chain(spans, last_release) == [
            f"{queue} retry scheduled",
            f"{queue} retry release",
            f"{queue} retry scheduled",
            f"{queue} retry release",
        ]


@pytest.mark.parametrize(
    "with_faststream_telemetry", [False, True], ids=["plain", "faststream-otel"]
)
async def test_dead_letter_span_is_an_error_with_the_exception(
    make_app: Any,
    amqp: AbstractRobustConnection,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    with_faststream_telemetry: bool,
) -> None:
    """A permanent failure: one dead-letter span, status ERROR, the exception recorded."""
    outer = (
        (RabbitTelemetryMiddleware(tracer_provider=provider),) if with_faststream_telemetry else ()
    )
    app: App = make_app(tracer_provider=provider, outer_middlewares=outer)
    queue = unique("traced-dead")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise PermanentError("no such user")

    await app.start()
    await app.broker.publish("x", queue=queue)
    assert len(await drain(amqp, f"{queue}.dlq", expect=1)) == 1
    await app.stop()
    spans = list(exporter.get_finished_spans())
    (dead,) = [s for s in spans if scope(s) == "faststream_retry"]
    assert dead.name == f"{queue} dead-letter"
    assert dead.status.status_code is StatusCode.ERROR
    assert attrs(dead)[ATTR.REASON] == "permanent"
    assert attrs(dead)[ATTR.DLQ] == f"{queue}.dlq"
    assert attrs(dead)[ATTR.ATTEMPT] == 1
    (event,) = dead.events
    assert event.name == "exception"
    assert attrs(event)["exception.type"] == "faststream_retry.errors.PermanentError"
    if with_faststream_telemetry:
        (process,) = [s for s in spans if s.name.endswith(" process")]
        assert dead.parent is not None
        assert dead.parent.span_id == process.context.span_id


async def test_hops_chain_between_scheduled_and_release(
    make_app: Any, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A delay that needs several tiers: scheduled -> hop(s) -> release, one chain."""
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.7)), tracer_provider=provider)
    queue = unique("hops")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("slow")

    await app.start()
    await app.broker.publish("x", queue=queue)
    await eventually(lambda: calls == 2, what="the retried call")
    await eventually(lambda: any(e.kind is EventKind.RELEASED for e in app.events), what="release")
    await app.stop()
    spans = list(exporter.get_finished_spans())
    (release,) = [s for s in spans if s.name == f"{queue} retry release"]
    names = chain(spans, release)
    assert names[0] == f"{queue} retry scheduled"
    assert names[-1] == f"{queue} retry release"
    hops = names[1:-1]
    assert hops, "700 ms from the 400 ms tier needs at least one hop"
    assert set(hops) == {f"{queue} retry hop"}
    for hop in (s for s in spans if s.name == f"{queue} retry hop"):
        assert attrs(hop)[ATTR.TIER_MS] in {100, 200}
        assert 0 < attrs(hop)[ATTR.REMAINING_MS] <= 300
        # The wait is rounded up to the 100 ms tick (core.tiers.Tiers.wait), never further:
        # a hop that came back late (126 ms left, on a loaded CI machine) takes the 200 tier.
        tick_grid = -(-attrs(hop)[ATTR.REMAINING_MS] // 100) * 100
        assert attrs(hop)[ATTR.TIER_MS] <= tick_grid
    assert attrs(release)[ATTR.LATENESS_MS] >= 0
