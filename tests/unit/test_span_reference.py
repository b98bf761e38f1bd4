"""The tracing how-to's tables list every attribute the spans carry, and nothing else.

Every way a step is made (the core's step builders, as the middleware, the re-check
consumer and the worker's intake call them) and an outage go through the real reporter
into an in-memory exporter; the attributes each span name carries, over all of them, are
what docs/how-to/tracing.md's two tables say.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.classify import Classification
from faststream_retry.core.decision import Action, Decision
from faststream_retry.core.events import Reason, RetryEvent, Rule, Verdict
from faststream_retry.core.intake import DeadLetter, Retry
from faststream_retry.core.topology import Handler, Route, TopologyOptions, plan
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry

if TYPE_CHECKING:
    from faststream_retry.core.steps import Copy, Step

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "tracing.md"
HOME = Route("orders", (Handler(None),))
PLAN = plan([HOME], RetryPolicy(backoff=Fixed(1)), TopologyOptions("p", 8000, "classic"))
NOW = 100_000
TRANSIENT = Classification(Verdict.TRANSIENT, Rule.BUILTIN)


def documented() -> dict[str, set[str]]:
    """Each span's attributes as the page's tables list them (every span's rows added)."""
    text = PAGE.read_text()
    rows = re.findall(r"^\| `<queue> ([^`]+)`[^|]*\|[^|]*\|(.*)\|$", text, re.MULTILINE)
    spans = {name: set(re.findall(r"`([a-z_.]+)`", cell)) for name, cell in rows}
    common = dict(re.findall(r"^\| `(messaging\.[a-z_.]+)` \| ([^|]*)\|$", text, re.MULTILINE))
    assert spans, "the page has no span table"
    assert common, "the page has no table of the messaging attributes"
    for name, attributes in spans.items():
        # A cell's values in backquotes are not names (`success`, `invalid`, ...).
        attributes &= {a for a in attributes if "." in a}
        for attribute, on in common.items():
            every = on.startswith(("every span:", "every span ("))
            if every or (on.startswith("every span that publishes") and name != "outage"):
                attributes.add(attribute)
    return spans


async def confirmed(_: Copy) -> bool:
    return True


async def carried() -> dict[str, set[str]]:
    """Each span's attributes, over every way the plugin makes it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reporter = Reporter(Telemetry(provider, None), [])
    incoming = {h.ATTEMPT: 1, h.DUE: NOW - 5}
    failure = ConnectionError("down")

    def failed(action: Action, reason: Reason | None = None) -> Step:
        decision = Decision(action, 2, 5, TRANSIENT, 1000, reason)
        return steps.failed(
            PLAN, HOME, decision, failure, message_id="m", incoming=incoming, now_ms=NOW
        )

    def recheck(due: int) -> Step:
        return steps.recheck(PLAN, HOME, "m", {**incoming, h.DUE: due}, now_ms=NOW)

    record = h.FailureRecord(attempt=2, at_ms=NOW, exception="rejected", error="x", delay_ms=1000)
    made = [
        failed(Action.RETRY_LATER),
        failed(Action.DEAD_LETTER, Reason.EXHAUSTED),
        recheck(NOW + 3000),  # a hop
        recheck(NOW - 5),  # a release
        recheck(NOW + 10**9),  # invalid
        steps.intake(PLAN, HOME, "m", incoming, Retry("orders", 2, 5, 1000, record)),
        steps.intake(
            PLAN, HOME, "m", incoming, DeadLetter("orders", 2, 5, Reason.PERMANENT, record)
        ),
    ]
    stuck = steps.stuck(
        HOME, made[3], {"x-delivery-count": 9}, now_ms=NOW, limit=3, max_delay_ms=1, outcome="x"
    )
    assert stuck is not None
    for step in [*made, stuck]:
        await reporter.publish(
            step.event, step.copy, confirmed, incoming=incoming, tier_ms=step.tier_ms
        )
    decision = Decision(Action.RETRY_NOW, 2, 5, TRANSIENT)
    immediate = steps.in_process("orders", "m", decision, failure, NOW, immediate=True)
    reporter.record(immediate, incoming=incoming, exception=failure)
    arrived = RetryEvent.released(
        queue="orders", message_id="m", attempt=1, at_ms=NOW, due_ms=NOW - 5, lateness_ms=5
    )
    reporter.record(arrived, incoming=incoming, onward={})
    started = RetryEvent.outage_started(
        queue="orders",
        message_id="m",
        attempt=3,
        at_ms=NOW,
        max_attempts=5,
        probe_ms=1000,
        exception="ConnectionError",
        error="down",
        failures=20,
    )
    span = reporter.outage(started, after=20)
    ended = RetryEvent.outage_ended(
        queue="orders",
        message_id="m",
        at_ms=NOW,
        probe_ms=1000,
        failures=1,
        probes=2,
        duration_ms=5,
    )
    reporter.outage(ended, span)

    found: dict[str, set[str]] = {}
    for finished in exporter.get_finished_spans():
        name = finished.name.removeprefix("orders ")
        found.setdefault(name, set()).update(dict(finished.attributes or {}))
    return found


async def test_the_tracing_reference_lists_every_attribute_every_span_carries() -> None:
    spans = await carried()
    assert set(spans) == {"retry scheduled", "retry hop", "retry release", "dead-letter", "outage"}
    assert documented() == spans


def test_a_span_row_names_attributes_in_full() -> None:
    """Each attribute in the span table is a name a dashboard selects on: full, dotted."""
    for attributes in documented().values():
        for attribute in attributes:
            assert attribute.startswith(("faststream_retry.", "messaging.")), attribute
