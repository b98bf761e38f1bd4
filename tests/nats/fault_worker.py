"""The NATS fault suite's app, a process of its own so that a test can SIGKILL it.

    python -m tests.nats.fault_worker SERVERS STREAM SUBJECT PREFIX REPLICAS LEDGER EVENTS

A real FastStream ``NatsBroker`` with the real ``RetryMiddleware`` (installed), one
durable pull subscriber on a work-queue stream of ``REPLICAS`` replicas, running the
fault suite's workload (``tests.faults.support.Workload``: a message's fate depends only
on its id and attempt). Appends each processed id to LEDGER and each retry event's kind
to EVENTS (``O_APPEND`` writes of one line: a kill never leaves half a line), and prints
``ready`` once consuming. SERVERS: comma-separated URLs (a cluster's nodes).
"""

from __future__ import annotations

import asyncio
import os
import sys

from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js.api import ConsumerConfig, RetentionPolicy

from faststream_retry import RetryMiddleware, RetryPolicy, Schedule
from faststream_retry.core.events import RetryEvent
from tests.faults.support import MAX_ATTEMPTS, Workload

TICK_S = 0.2
MAX_DELAY_S = 10
BATCH = 20
"""The work consumer's pull batch: what the app has in hand from it at most."""
MAX_ACK_PENDING = 40
ACK_WAIT_S = 6.0
"""Shorter than JetStream's 30 s default, so that a delivery lost with a killed app or a
cut connection comes back soon (the suite's time); longer than ``PUBLISH_TIMEOUT_S``."""
PUBLISH_TIMEOUT_S = 3.0
DURABLE = "work"


def appender(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def work_stream(stream: str, subject: str, replicas: int) -> JStream:
    """The work stream: work-queue retention, so what stays in it is what was never acked."""
    return JStream(
        stream, subjects=[subject], retention=RetentionPolicy.WORK_QUEUE, num_replicas=replicas
    )


async def main(  # noqa: PLR0917 - the command line's arguments
    servers: str, stream: str, subject: str, prefix: str, replicas: str, ledger: str, events: str
) -> None:
    workload = Workload(0)
    ledger_fd, events_fd = appender(ledger), appender(events)

    def on_event(event: RetryEvent) -> None:
        os.write(events_fd, f"{event.kind.value}\n".encode())

    # publish_failure_pause and delivery_limit as shipped (1 s, 20): a copy the server does
    # not confirm while a cluster elects a new leader is placed again for 20 s before its
    # message is dead-lettered as stuck; the suite's RabbitMQ app's 0.2 s allowed 4 s, which
    # an election on a loaded machine outlasts (seen: 6 of 1,000 dead-lettered as stuck).
    retry = RetryMiddleware(
        prefix=prefix,
        tick=TICK_S,
        max_delay=MAX_DELAY_S,
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([1.0, 1.4])),
        hooks=[on_event],
        publish_timeout=PUBLISH_TIMEOUT_S,
    )
    broker = NatsBroker(
        servers.split(","),
        middlewares=[retry],
        reconnect_time_wait=1,
        max_reconnect_attempts=-1,
        logger=None,
    )
    retry.install(broker)

    @broker.subscriber(
        subject,
        stream=work_stream(stream, subject, int(replicas)),
        durable=DURABLE,
        pull_sub=PullSub(batch_size=BATCH),
        config=ConsumerConfig(ack_wait=ACK_WAIT_S, max_ack_pending=MAX_ACK_PENDING),
    )
    async def handle(msg: NatsMessage) -> None:
        await asyncio.sleep(0.002)  # a handler call takes a moment: kills land inside one
        workload.behave(msg.message_id, msg.headers)
        os.write(ledger_fd, f"{msg.message_id}\n".encode())

    await broker.start()
    print("ready", flush=True)  # noqa: T201 - the parent waits for this line
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(15, stop.set)  # SIGTERM: a clean stop
    await stop.wait()
    await broker.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
