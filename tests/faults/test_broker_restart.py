"""R1: the broker stops and starts (gracefully, then by SIGKILL) while retries wait and
while the re-check consumer is busy. Nothing is lost."""

from __future__ import annotations

import asyncio
import subprocess
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import QueueType, RabbitMessage, RabbitQueue

from faststream_retry import Exponential, RetryPolicy
from faststream_retry.core.events import EventKind
from tests.faults.support import (
    MAX_ATTEMPTS,
    RESTART_PORT,
    DeadLetterWatch,
    Node,
    Tally,
    Timeline,
    Workload,
    check_outcomes,
    count_late,
    dump_tasks,
    publish_all,
    stopped,
    wait_settled,
)
from tests.rabbit import App, eventually, unique

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    node = Node(RESTART_PORT)
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
    """2,000 messages; retries after about 3 and 15 s; the broker stops and starts while they wait
    in the tiers, and again while the re-check consumer releases them.

    The second stop is a SIGKILL only with quorum queues: a classic queue dead-letters
    at most once, so a hard crash while a message expires out of a tier can lose it
    (seen here: 1 of 2,000 in 1 of 9 runs). See docs/guarantees.md.
    """
    # Classic queues dead-letter at most once: across a restart one can lose a message
    # that expires out of a tier (1 of 2,000, in 1 run of 20 and then in 2 of 3). That is the
    # documented limit of queue_type="classic" and why quorum is the default; the row
    # shows it. More than that would be a bug of the plugin's.
    may_lose = 2 if queue_type == "classic" else 0
    workload = Workload(2000)
    queue = unique("r1")
    tally = Tally(workload.ids)
    app = App(
        node.url,
        broker_options={"reconnect_interval": 1.0},
        queue_type=queue_type,
        tick=0.5,  # tiers 0.5, 1, 2 s...: each delay takes hops through re-check
        # A stop waits up to publish_timeout for copies whose confirms are on their way;
        # at the default 30 s that alone fills the test's 30 s bound on a stop (CI once
        # saw the stop after the SIGKILL go past it).
        publish_timeout=10,
        # Retries after 1.5-4.5 s, then 7.5-20 s: the second wave outlasts a restart on
        # a loaded machine (up to 20 s seen) and is spread out, so when the broker is
        # back releases are still to come and the second fault lands among them.
        default=RetryPolicy(
            max_attempts=MAX_ATTEMPTS,
            backoff=Exponential(3, factor=5, maximum=20, jitter=0.5),
        ),
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

    phase = Timeline()
    await app.start()
    watch = DeadLetterWatch(node.url, f"{queue}.dlq", tally.dead)
    await watch.start()
    try:
        phase("publishing")
        await publish_all(node.url, queue, workload.ids)
        phase("waiting for retries to be scheduled")
        # 40 % of the messages fail first; wait until most wait in the tiers.
        await eventually(lambda: count(EventKind.SCHEDULED) >= 600, 60, "retries scheduled")
        phase("graceful restart")
        await asyncio.to_thread(node.stop, keep_data=True)
        await asyncio.to_thread(node.start, fresh=False)
        phase("waiting for the re-check consumer")
        # Once releases flow again, crash the broker in the middle of them: after 100, or
        # half of the copies still out if fewer (on a loaded machine publishing once took
        # 33 s and the restart 25 s, and most retries had run their course by then).
        released = count(EventKind.RELEASED) + count(EventKind.HOP)
        out = count(EventKind.SCHEDULED) - count(EventKind.RELEASED)
        phase(f"{out} copies out, {released} released or hopped so far")
        if out > 0:
            await eventually(
                lambda: (
                    count(EventKind.RELEASED) + count(EventKind.HOP)
                    >= released + min(100, (out + 1) // 2)
                ),
                90,
                "the re-check consumer busy again",
            )
        phase("SIGKILL" if crash else "graceful stop")
        if crash:
            await asyncio.to_thread(node.kill)
        else:
            await asyncio.to_thread(node.stop, keep_data=True)
        await asyncio.to_thread(node.start, fresh=False)
        phase("waiting until settled")
        try:
            seconds = await wait_settled(tally, 120, "R1", may_lose=may_lose)
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
        phase("counting late duplicates")
        await stopped("stopping the app", app.stop())
        await count_late(tally, node.url, [queue, *app.retry_queues(queue)], watch)
    except pytest.fail.Exception:
        dump_tasks()
        raise
    finally:
        phase("stopping")
        await stopped("closing the DLQ watch", watch.stop())
        await stopped("stopping the app", app.stop())
    check_outcomes(workload, tally, watch, may_lose=may_lose)
    second = "1 SIGKILL/start" if crash else "another graceful restart"
    report.add(f"R1 broker restart, {queue_type}", f"1 graceful restart + {second}", tally, seconds)
