"""R3: the app's connection is cut mid-publish, mid-ack and at random; it recovers by
itself (robust reconnect, topology and consumers declared again). Nothing is lost."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from faststream.rabbit import RabbitMessage

from faststream_retry import RetryPolicy, Schedule
from faststream_retry.core.events import EventKind
from tests.faults.proxy import BASIC_ACK, BASIC_PUBLISH, CuttingProxy
from tests.faults.support import (
    MAX_ATTEMPTS,
    DeadLetterWatch,
    Tally,
    Workload,
    check_outcomes,
    count_late,
    publish_all,
    stopped,
    wait_settled,
)
from tests.rabbit import App, eventually, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]


async def test_cut_connections_lose_nothing(
    rabbit_url: str, amqp: AbstractRobustConnection, report: Report
) -> None:
    """1,000 messages through a proxy that cuts: twice just before a publish of the
    plugin's, twice just before an ack, once everything at once."""
    proxy = CuttingProxy(urlsplit(rabbit_url).port or 5672)
    await proxy.start()
    workload = Workload(1000)
    queue = unique("r3")
    tally = Tally(workload.ids)
    app = App(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
        broker_options={"reconnect_interval": 0.5},
        # A stop waits up to publish_timeout for what is on its way, an ack sent on a cut
        # connection among it (aiormq's write to a dead connection never returns); at the
        # default 30 s that alone fills the test's 30 s bound on a stop, as in R1.
        publish_timeout=10,
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([0.5, 0.8])),
    )

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        await asyncio.sleep(0.002)
        workload.behave(msg.message_id, msg.headers)
        tally.processed.append(msg.message_id or "?")

    def progress() -> int:
        return len(tally.processed) + sum(e.kind is not EventKind.HOP for e in app.events)

    async def recovered(connections: int) -> None:
        # A new connection, not only work: handlers also finish what was prefetched on
        # the cut one, so work alone can come before the reconnect (and a cut_all then
        # finds nothing to cut).
        before = progress()
        await eventually(
            lambda: proxy.accepted > connections and progress() >= before + 20,
            60,
            "work after the reconnect",
        )

    await app.start()
    watch = DeadLetterWatch(rabbit_url, f"{queue}.dlq", tally.dead)
    await watch.start()
    try:
        publishing = asyncio.create_task(publish_all(rabbit_url, queue, workload.ids, batch=50))
        for method in (BASIC_PUBLISH, BASIC_ACK, BASIC_PUBLISH, BASIC_ACK):
            connections = proxy.accepted  # the one to be cut is among them
            fired = proxy.arm(method)
            await asyncio.wait_for(fired.wait(), 60)
            await recovered(connections)
        connections = proxy.accepted
        proxy.cut_all()
        await recovered(connections)
        await publishing
        seconds = await wait_settled(tally, 120, "R3")
        assert app.retry.runtime(app.broker).connected
        await stopped("stopping the app", app.stop())
        await count_late(tally, rabbit_url, [queue, *app.retry_queues(queue)], watch)
    finally:
        await stopped("closing the DLQ watch", watch.stop())
        await stopped("stopping the app", app.stop())
        await app.cleanup(amqp)
        await proxy.close()
    check_outcomes(workload, tally, watch)
    assert proxy.cuts == 5
    assert proxy.accepted >= 1 + proxy.cuts, "the app reconnected after every cut"
    report.add(
        "R3 connection cut", f"{proxy.cuts} cuts (2 mid-publish, 2 mid-ack, 1 all)", tally, seconds
    )
