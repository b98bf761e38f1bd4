"""The app of R2, run as a process of its own so the test can SIGKILL it.

    python -m tests.faults.worker URL QUEUE PREFIX LEDGER EVENTS

Appends each processed id to LEDGER and each retry event's kind to EVENTS (O_APPEND
writes of one line: a kill never leaves half a line), prints ``ready`` once consuming.
"""

from __future__ import annotations

import asyncio
import os
import sys

from faststream.rabbit import RabbitBroker, RabbitMessage

from faststream_retry import RetryMiddleware, RetryPolicy, Schedule
from faststream_retry.core.events import RetryEvent
from tests.faults.support import MAX_ATTEMPTS, Workload

TICK_S = 0.2
MAX_DELAY_S = 10


def appender(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


async def main(url: str, queue: str, prefix: str, ledger: str, events: str) -> None:
    workload = Workload(0)
    ledger_fd, events_fd = appender(ledger), appender(events)

    def on_event(event: RetryEvent) -> None:
        os.write(events_fd, f"{event.kind.value}\n".encode())

    retry = RetryMiddleware(
        prefix=prefix,
        tick=TICK_S,
        max_delay=MAX_DELAY_S,
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Schedule([1.0, 1.4])),
        hooks=[on_event],
        publish_failure_pause=0.2,
    )
    broker = RabbitBroker(url, middlewares=[retry], logger=None)
    retry.install(broker)

    @broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        await asyncio.sleep(0.002)  # a handler call takes a moment: kills land inside one
        workload.behave(msg.message_id, msg.headers)
        os.write(ledger_fd, f"{msg.message_id}\n".encode())

    await broker.start()
    print("ready", flush=True)  # noqa: T201 - the parent waits for this line
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
