"""Each broker's spans name it: ``messaging.system`` and ``messaging.destination.name``.

The runtime that made an event passes its broker's word (``Reporter.on``) and, on NATS
and Redis, where the copy went; the reporting imports no broker to know it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from faststream.nats import NatsBroker
from faststream.rabbit import RabbitBroker
from faststream.redis import RedisBroker

from faststream_retry import Reason, RetryEvent, RetryMiddleware, Rule, Verdict
from faststream_retry.core.steps import Copy
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import ATTR, Telemetry
from tests.observed import Observed

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan


class Harness(Observed):
    """A reporter as a middleware makes it (RabbitMQ's unless bound), to this test's SDK."""

    def __init__(self) -> None:
        super().__init__()
        self.reporter = Reporter(Telemetry(self.tracer_provider, self.meter_provider), [])

    def only_span(self) -> ReadableSpan:
        (span,) = self.exporter.get_finished_spans()
        return span


def scheduled(queue: str = "orders") -> RetryEvent:
    return RetryEvent.scheduled(
        queue=queue,
        message_id="m-1",
        attempt=1,
        at_ms=1_000,
        max_attempts=3,
        delay_ms=500,
        due_ms=1_500,
        exception="builtins.TimeoutError",
        error="slow",
        rule=Rule.BUILTIN,
        classification=Verdict.TRANSIENT,
    )


def dead(queue: str = "orders") -> RetryEvent:
    return RetryEvent.dead_lettered(
        queue=queue,
        message_id="m-1",
        attempt=3,
        at_ms=2_000,
        reason=Reason.EXHAUSTED,
        exception="builtins.TimeoutError",
        error="slow",
        max_attempts=3,
        rule=Rule.BUILTIN,
        classification=Verdict.TRANSIENT,
    )


async def confirmed(_: Copy) -> bool:
    return True


async def test_rabbitmq_spans_keep_the_exchange_and_the_routing_key() -> None:
    """Unchanged on RabbitMQ: system rabbitmq, the exchange published to, the routing key."""
    harness = Harness()
    copy = Copy("p.delay.400", "orders.retry", {})
    await harness.reporter.publish(scheduled(), copy, confirmed, incoming={}, tier_ms=400)
    attributes = harness.only_span().attributes or {}
    assert attributes[ATTR.SYSTEM] == "rabbitmq"
    assert attributes[ATTR.DESTINATION] == "p.delay.400"
    assert attributes[ATTR.ROUTING_KEY] == "orders.retry"


@pytest.mark.parametrize(
    ("system", "destination"),
    [("nats", "p.delay.400.W.d"), ("redis", "{orders}.retry")],
)
async def test_a_retry_on_nats_or_redis_names_its_broker_and_where_the_copy_went(
    system: str, destination: str
) -> None:
    """The broker's word and the subject or key; no RabbitMQ routing key on another broker."""
    harness = Harness()
    reporter = harness.reporter.on(system)
    copy = Copy("p.delay.400", "orders.retry", {})  # the core's RabbitMQ-shaped address
    await reporter.publish(
        scheduled(), copy, confirmed, incoming={}, tier_ms=400, destination=destination
    )
    attributes = harness.only_span().attributes or {}
    assert attributes[ATTR.SYSTEM] == system
    assert attributes[ATTR.DESTINATION] == destination
    assert ATTR.ROUTING_KEY not in attributes


async def test_a_dead_letter_on_nats_names_its_dead_letter_subject() -> None:
    harness = Harness()
    copy = Copy("", "orders.dlq", {})
    await harness.reporter.on("nats").publish(
        dead(), copy, confirmed, incoming={}, destination="p.dlq.W.d"
    )
    span = harness.only_span()
    assert span.name == "orders dead-letter"
    assert (span.attributes or {})[ATTR.SYSTEM] == "nats"
    assert (span.attributes or {})[ATTR.DESTINATION] == "p.dlq.W.d"


def test_an_in_process_retry_on_redis_says_redis() -> None:
    """A step with no copy (immediate) still names the broker; it names no destination."""
    harness = Harness()
    event = RetryEvent.scheduled(
        queue="orders",
        message_id="m-1",
        attempt=1,
        at_ms=1_000,
        max_attempts=3,
        delay_ms=0,
        due_ms=None,
        exception="builtins.TimeoutError",
        error="slow",
        rule=Rule.BUILTIN,
        classification=Verdict.TRANSIENT,
        immediate=True,
    )
    harness.reporter.on("redis").record(event, incoming={})
    attributes = harness.only_span().attributes or {}
    assert attributes[ATTR.SYSTEM] == "redis"
    assert ATTR.DESTINATION not in attributes


def test_an_outage_span_names_its_broker() -> None:
    harness = Harness()
    event = RetryEvent.outage_started(
        queue="orders",
        message_id="m-1",
        attempt=1,
        at_ms=1_000,
        max_attempts=3,
        probe_ms=100,
        exception="builtins.ConnectionError",
        error="down",
        failures=5,
    )
    span = harness.reporter.on("nats").outage(event, after=5)
    assert span is not None
    span.end()
    assert (harness.only_span().attributes or {})[ATTR.SYSTEM] == "nats"


def test_a_bound_reporter_shares_the_instruments_hooks_and_warnings() -> None:
    """One middleware on several brokers: one set of instruments, hooks and once-only lines."""
    harness = Harness()
    nats = harness.reporter.on("nats")
    assert harness.reporter.on("rabbitmq") is harness.reporter
    assert nats.telemetry is harness.reporter.telemetry
    assert nats.hooks is harness.reporter.hooks
    assert nats.log_retry_traceback == harness.reporter.log_retry_traceback
    nats.warn_once("k", "once")
    assert "k" in harness.reporter._warned


@pytest.mark.parametrize(
    ("broker", "system"),
    [(RabbitBroker, "rabbitmq"), (NatsBroker, "nats"), (RedisBroker, "redis")],
)
def test_each_brokers_runtime_reports_as_that_broker(broker: type, system: str) -> None:
    """The middleware's runtime per broker passes its broker's word to every span it makes."""
    retry = RetryMiddleware()
    assert retry.runtime(broker()).reporter.system == system
