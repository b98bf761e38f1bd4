"""Outage mode under TestRabbitBroker: off there, so tests written for the plugin run as before."""

from __future__ import annotations

import time

from faststream.rabbit import RabbitBroker, TestRabbitBroker

from faststream_retry import EventKind, Fixed, RetryMiddleware, RetryPolicy


def make() -> tuple[RetryMiddleware, RabbitBroker]:
    retry = RetryMiddleware(
        default=RetryPolicy(max_attempts=3, backoff=Fixed(1)),
        outage_after=1,
        outage_probe=5,
    )
    broker = RabbitBroker(logger=None)
    retry.install(broker)
    return retry, broker


async def test_test_mode_holds_nothing_and_reports_no_outage() -> None:
    """outage_after=1 and a 5 s probe: every failure is still retried at once, every message
    handled in the test's own time, and no outage is reported."""
    retry, broker = make()
    calls: list[str] = []

    @broker.subscriber("orders")
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError("database down")

    started = time.monotonic()
    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            for body in ("a", "b", "c"):
                await broker.publish(body, queue="orders")
    assert time.monotonic() - started < 4, "nothing waited for a probe"
    assert calls == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert [e.reason for e in recorder.dead_letters] == ["exhausted"] * 3
    kinds = {e.kind for e in recorder.events}
    assert EventKind.OUTAGE_STARTED not in kinds
    assert EventKind.OUTAGE_ENDED not in kinds
