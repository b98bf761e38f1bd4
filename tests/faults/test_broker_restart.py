"""R1: the broker stops and starts (gracefully, then by SIGKILL) while retries wait and
while the re-check consumer is busy. Nothing is lost."""

from __future__ import annotations

import asyncio
import subprocess
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import QueueType, RabbitMessage, RabbitQueue

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
    wait_settled,
)
from tests.integration.conftest import App, eventually, unique

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


@pytest.mark.parametrize(
    ("queue_type", "crash"),
    [("classic", False), ("quorum", True)],
    ids=["classic-graceful", "quorum-sigkill"],
)
async def test_broker_restarts_lose_nothing(
    node: Node, report: Report, queue_type: str, *, crash: bool
) -> None:
    """2,000 messages; retries of 3 and 4 s; the broker stops and starts while they wait
    in the tiers, and again while the re-check consumer releases them.

    The second stop is a SIGKILL only with quorum queues: a classic queue dead-letters
    at most once, so a hard crash while a message expires out of a tier can lose it
    (seen here: 1 of 2,000 in 1 of 9 runs). See docs/guarantees.md.
    """
    workload = Workload(2000)
    queue = unique("r1")
    tally = Tally(workload.ids)
    app = App(
        node.url,
        broker_options={"reconnect_interval": 1.0},
        queue_type=queue_type,
        tick=0.5,  # tiers 0.5, 1, 2 s...: a 3-4 s delay takes hops through re-check
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([3, 4])),
    )
    work_queue = RabbitQueue(
        queue,
        durable=True,
        queue_type=QueueType.QUORUM if queue_type == "quorum" else QueueType.CLASSIC,
    )

    @app.broker.subscriber(work_queue)
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
        await eventually(lambda: count(EventKind.SCHEDULED) >= 600, 60, "retries scheduled")
        await asyncio.to_thread(node.stop, keep_data=True)
        await asyncio.to_thread(node.start, fresh=False)
        # Once releases flow again, crash the broker in the middle of them.
        released = count(EventKind.RELEASED) + count(EventKind.HOP)
        await eventually(
            lambda: count(EventKind.RELEASED) + count(EventKind.HOP) >= released + 100,
            90,
            "the re-check consumer busy again",
        )
        if crash:
            await asyncio.to_thread(node.kill)
        else:
            await asyncio.to_thread(node.stop, keep_data=True)
        await asyncio.to_thread(node.start, fresh=False)
        try:
            seconds = await wait_settled(tally, 120, "R1")
        except pytest.fail.Exception as failed:
            listing = subprocess.run(
                [
                    str(node.base / "ctl"),
                    "-q",
                    "list_queues",
                    "name",
                    "messages_ready",
                    "messages_unacknowledged",
                    "consumers",
                ],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            channels = subprocess.run(
                [
                    str(node.base / "ctl"),
                    "-q",
                    "list_channels",
                    "connection",
                    "number",
                    "consumer_count",
                    "messages_unacknowledged",
                    "confirm",
                ],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            pytest.fail(f"{failed}\nqueues:\n{listing}\nchannels:\n{channels}")
    finally:
        await watch.stop()
        await app.stop()
    check_outcomes(workload, tally)
    second = "1 SIGKILL/start" if crash else "another graceful restart"
    report.add(f"R1 broker restart, {queue_type}", f"1 graceful restart + {second}", tally, seconds)
