"""Metrics on a real broker: every count equals the events that happened."""

from __future__ import annotations

from typing import Any

import pytest
from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from faststream_retry import Fixed, PermanentError, RetryPolicy
from faststream_retry.core.events import EventKind
from faststream_retry.reporting.telemetry import ATTR, METRICS
from tests.rabbit import App, drain, eventually, on_time, unique

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
