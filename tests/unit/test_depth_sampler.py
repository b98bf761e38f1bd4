"""When the dead-letter gauge is sampled (``reporting.depths``), whatever the broker measures.

A sampler of a test's own stands in for the broker: what it answers is what the gauge shows,
and the schedule is the one RabbitMQ's, NATS's and Redis's samplers share.
"""

from __future__ import annotations

import asyncio

from faststream_retry import RetryPolicy
from faststream_retry.core.topology import Handler, Plan, Route, TopologyOptions, plan
from faststream_retry.reporting.depths import DepthSampler
from faststream_retry.reporting.telemetry import Telemetry
from tests.rabbit import eventually_async


def plan_of(*queues: str) -> Plan:
    return plan(
        [Route(q, (Handler(None),)) for q in queues],
        RetryPolicy(),
        TopologyOptions("p", 8000, "classic"),
    )


class Answers(DepthSampler):
    """Answers each queue's depth from ``found``; a queue missing there raises (broker away)."""

    def __init__(self, telemetry: Telemetry, current: list[Plan]) -> None:
        super().__init__(telemetry, lambda: current[0])
        self.found: dict[str, int | None] = {}
        self.asked = 0
        self.closed = False

    async def depth(self, route: Route) -> int | None:
        self.asked += 1
        return self.found[route.queue]

    async def close(self) -> None:
        self.closed = True


async def test_the_start_samples_each_read_asks_again_and_the_stop_forgets() -> None:
    telemetry = Telemetry()
    current = [plan_of("orders", "emails", "gone")]
    sampler = Answers(telemetry, current)
    sampler.found = {"orders": 3, "emails": 0, "gone": None}
    sampler.start()

    async def sampled() -> bool:
        return telemetry.dlq_depths == {"orders": 3, "emails": 0}

    # At the start, before any read; a queue that does not exist shows nothing, not 0.
    await eventually_async(sampled, 5.0, "the sample at the start")
    asked = sampler.asked
    await asyncio.sleep(0.05)
    assert sampler.asked == asked, "no read, no new sample"

    # A queue no longer covered is dropped; one that cannot be measured shows no stale figure.
    sampler.found = {"orders": 5}
    current[0] = plan_of("orders", "emails")
    for wake in telemetry.on_read:
        wake()

    async def followed() -> bool:
        return telemetry.dlq_depths == {"orders": 5}

    await eventually_async(followed, 5.0, "the sample after a read")
    await sampler.stop()
    assert telemetry.dlq_depths == {}
    assert telemetry.on_read == []
    assert sampler.closed
