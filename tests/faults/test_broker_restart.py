"""R1: the broker stops and starts (gracefully, then by SIGKILL) while retries wait and
while the re-check consumer is busy. Nothing is lost."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import RabbitMessage

from faststream_retry import RetryPolicy, Schedule
from faststream_retry.events import EventKind
from tests.faults.support import (
    MAX_ATTEMPTS,
    DeadLetterWatch,
    Node,
    Tally,
    Workload,
    check_outcomes,
    publish_all,
    until,
    wait_settled,
)
from tests.integration.conftest import App, unique

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    node = Node(5690)
    node.start(fresh=True)
    yield node
    node.stop()


async def test_broker_restarts_lose_nothing(node: Node, report: Report) -> None:
    """2,000 messages; retries of 3 and 4 s; a graceful restart while they wait in the
    tiers, a SIGKILL and start while the re-check consumer releases them."""
    workload = Workload(2000)
    queue = unique("r1")
    tally = Tally(workload.ids)
    app = App(
        node.url,
        tick=0.5,  # tiers 0.5, 1, 2 s...: a 3-4 s delay takes hops through re-check
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([3, 4])),
    )

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        workload.behave(msg.message_id, msg.headers)
        tally.processed.append(msg.message_id or "?")

    def count(kind: EventKind) -> int:
        return sum(e.kind is kind for e in app.events)

    await app.start()
    watch = DeadLetterWatch(node.url, f"{queue}.dlq", tally.dead)
    await watch.start()
    try:
        await publish_all(node.url, queue, workload.ids)
        # 40 % of the messages fail first; wait until most wait in the tiers.
        await until(lambda: count(EventKind.SCHEDULED) >= 600, 60, "retries scheduled")
        await asyncio.to_thread(node.stop, keep_data=True)
        await asyncio.to_thread(node.start, fresh=False)
        # Once releases flow again, crash the broker in the middle of them.
        released = count(EventKind.RELEASED) + count(EventKind.HOP)
        await until(
            lambda: count(EventKind.RELEASED) + count(EventKind.HOP) >= released + 100,
            90,
            "the re-check consumer busy again",
        )
        await asyncio.to_thread(node.kill)
        await asyncio.to_thread(node.start, fresh=False)
        seconds = await wait_settled(tally, 180, "R1")
    finally:
        await watch.stop()
        await app.stop()
    check_outcomes(workload, tally)
    report.add("R1 broker restart", "1 graceful restart + 1 SIGKILL/start", tally, seconds)
