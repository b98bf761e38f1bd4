"""R4: a three-node cluster on loopback, every queue quorum; one node is killed
(SIGKILL) while retries wait and hop. Nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import QueueType, RabbitMessage, RabbitQueue

from faststream_retry import RetryPolicy, Schedule
from faststream_retry.core.events import EventKind
from tests.faults.support import (
    CLUSTER_PORT,
    MAX_ATTEMPTS,
    SCRIPTS,
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
    from collections.abc import Iterator

    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]


def cluster(*args: str) -> str:
    done = subprocess.run(
        ["bash", str(SCRIPTS / "cluster.sh"), *args],
        env={**os.environ, "RMQ_CLUSTER_PORT": str(CLUSTER_PORT)},
        capture_output=True,
        text=True,
        check=False,
    )
    if "needs the rabbitmq-server package" in done.stderr:
        pytest.skip("a cluster needs a local rabbitmq-server (the Debian package), not Docker")
    if done.returncode != 0:
        pytest.fail(f"cluster.sh {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    urls = cluster("start").split()
    assert len(urls) == 3
    yield urls
    cluster("stop")


async def test_a_node_killed_in_a_quorum_cluster_loses_nothing(
    urls: list[str], report: Report
) -> None:
    """1,000 messages on quorum queues (the work queue with a delivery limit and a DLQ
    route); leaders spread over the nodes; node 3 is SIGKILLed mid-retries."""
    workload = Workload(1000)
    queue = unique("r4")
    tally = Tally(workload.ids)
    app = App(
        urls[0],
        queue_type="quorum",
        tick=0.2,
        max_delay=10,
        # The shipped default. Each copy the broker will not confirm while a leader moves
        # costs a redelivery after this pause, so the work queue's limit of 10 allows a
        # 10 s election; the suite's usual 0.2 s allowed 2 s, which a loaded machine
        # exceeds (see docs/guarantees.md, "Quorum queues and the delivery limit").
        publish_failure_pause=1.0,
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([1.5, 2.0])),
    )
    work_queue = RabbitQueue(
        queue,
        durable=True,
        queue_type=QueueType.QUORUM,
        arguments={
            "x-delivery-limit": 10,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": f"{queue}.dlq",
        },
    )

    @app.broker.subscriber(work_queue)
    async def handle(msg: RabbitMessage) -> None:
        workload.behave(msg.message_id, msg.headers)
        tally.processed.append(msg.message_id or "?")

    await app.start()
    cluster("rebalance")
    ours = [line.split() for line in cluster("leaders").splitlines()]
    victim = f"rabbit-test-{CLUSTER_PORT + 2}@localhost"  # node 3
    led = [
        name for name, leader in ours if name.startswith((queue, app.prefix)) and leader == victim
    ]
    assert led, "node 3 leads some of the plugin's queues, so killing it moves leaders"
    watch = DeadLetterWatch(urls[0], f"{queue}.dlq", tally.dead)
    await watch.start()
    try:
        publishing = asyncio.create_task(publish_all(urls[0], queue, workload.ids, batch=50))
        await eventually(
            lambda: sum(e.kind is EventKind.SCHEDULED for e in app.events) >= 200,
            90,
            "retries scheduled",
        )
        cluster("kill", "3")
        await publishing
        try:
            seconds = await wait_settled(tally, 180, "R4")
        except pytest.fail.Exception as failed:
            # Once (a clean-clone CI run on 3.10, beside other jobs) every retry copy, 400,
            # was missing after 180 s, with every queue empty: where they went is the
            # finding. The listing now, then whether they come back later, and when.
            kinds = Counter(str(e.kind) for e in app.events)
            listing = cluster("queues")
            # Shown with the failure even if the wait below runs into the test's timeout.
            print(f"{failed}\nevents: {dict(kinds)}\nqueues:\n{listing}")  # noqa: T201
            late = f"still missing {len(tally.lost)} after 120 s more"
            with contextlib.suppress(pytest.fail.Exception):
                back = 180 + await wait_settled(tally, 120, "R4")
                late = f"all back {back:.0f} s after the wait began"
            pytest.fail(f"{failed}\nevents: {dict(kinds)}\nqueues:\n{listing}\nlater: {late}")
        await stopped("stopping the app", app.stop())
        await count_late(tally, urls[0], [queue, *app.retry_queues(queue)], watch)
    finally:
        await stopped("closing the DLQ watch", watch.stop())
        await stopped("stopping the app", app.stop())
    check_outcomes(workload, tally, watch)
    report.add(
        "R4 quorum cluster",
        f"1 of 3 nodes SIGKILLed, leading {len(led)} of the queues",
        tally,
        seconds,
    )
