"""Metrics on a real broker: every count equals the events that happened."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from faststream_retry import Fixed, PermanentError, RetryPolicy
from faststream_retry.core.events import EventKind
from faststream_retry.reporting.telemetry import ATTR, METRICS
from tests.rabbit import App, drain, eventually, eventually_async, on_time, unique

pytestmark = pytest.mark.rabbit


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def total(found: dict[str, list[Any]], name: str, **attributes: Any) -> int:
    return sum(
        p.value
        for p in found.get(name, [])
        if all(p.attributes.get(k) == v for k, v in attributes.items())
    )


async def test_counts_match_what_happened(make_app: Any, amqp: AbstractRobustConnection) -> None:
    """Two transient failures then success, plus one permanent failure, counted exactly."""
    reader = InMemoryMetricReader()
    app: App = make_app(
        default=RetryPolicy(backoff=Fixed(0.1)),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    queue = unique("metered")
    calls: dict[str, int] = {"flaky": 0, "bad": 0}

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls[body] += 1
        if body == "bad":
            raise PermanentError("bad payload")
        if calls[body] <= 2:
            raise TimeoutError("slow dependency")

    await app.start()
    await app.broker.publish("flaky", queue=queue)
    await app.broker.publish("bad", queue=queue)
    await eventually(lambda: calls["flaky"] == 3, what="3 calls of the flaky message")
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == 2, what="2 releases"
    )
    assert len(await drain(amqp, f"{queue}.dlq", expect=1)) == 1

    found = points(reader)
    q = {ATTR.QUEUE: queue}
    assert total(found, METRICS.FAILURES, **q, **{ATTR.CLASSIFICATION: "transient"}) == 2
    assert total(found, METRICS.FAILURES, **q, **{ATTR.CLASSIFICATION: "permanent"}) == 1
    assert total(found, METRICS.SCHEDULED, **q) == 2
    assert total(found, METRICS.RELEASED, **q) == 2
    assert total(found, METRICS.DEAD_LETTERED, **q, **{ATTR.REASON: "permanent"}) == 1
    assert total(found, METRICS.DEAD_LETTERED, **q, **{ATTR.REASON: "exhausted"}) == 0
    # Durations in seconds.
    (planned,) = found[METRICS.PLANNED_DELAY]
    assert (planned.count, planned.sum) == (2, 0.2)
    (lateness,) = found[METRICS.LATENESS]
    assert lateness.count == 2
    assert on_time(lateness.min * 1000, 100)
    assert on_time(lateness.max * 1000, 100)


async def test_the_dlq_gauge_is_there_at_the_first_read_and_follows_the_reads(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Sampled once at start (a restarted app's first scrape has it), then after each read."""
    from tests.integration.test_cli_dlq import seed  # noqa: PLC0415

    reader = InMemoryMetricReader()
    app: App = make_app(meter_provider=MeterProvider(metric_readers=[reader]))
    queue = unique("gauged")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise PermanentError(body)

    await app.start()
    await app.broker.publish("a", queue=queue)
    await app.broker.publish("b", queue=queue)
    await eventually(
        lambda: sum(e.kind is EventKind.DEAD_LETTERED for e in app.events) == 2,
        what="2 dead letters",
    )
    await app.broker.stop()
    # A new start of the same app, with 2 dead letters waiting and a third seeded.
    await seed(amqp, queue, [("c", "permanent", b"c", "text/plain")])
    reader = InMemoryMetricReader()
    again: App = make_app(meter_provider=MeterProvider(metric_readers=[reader]))
    again.broker.subscriber(queue)(handle)
    await again.start()
    telemetry = again.retry._plugin.reporter.telemetry
    await eventually(lambda: queue in telemetry.dlq_depths, what="the sample at start")
    assert total(points(reader), METRICS.DLQ_MESSAGES, **{ATTR.QUEUE: queue}) == 3
    await again.broker.publish("d", queue=queue)
    await eventually(
        lambda: any(e.kind is EventKind.DEAD_LETTERED for e in again.events), what="a 4th"
    )
    await asyncio.sleep(0)  # the read asks for a sample; the next read shows it

    async def shows_four() -> bool:
        return total(points(reader), METRICS.DLQ_MESSAGES, **{ATTR.QUEUE: queue}) == 4

    await eventually_async(shows_four, what="the 4th in the gauge")
