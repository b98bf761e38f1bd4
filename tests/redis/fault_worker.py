"""A replica of the fault suite's app: RetryMiddleware on a RedisBroker, run as a process.

    REDIS_URL=... STREAM=... CONSUMER=... LEDGER=... python -m tests.redis.fault_worker

One stream subscriber in group ``g`` under consumer ``CONSUMER`` (each replica its own),
the real middleware (``claim_idle`` 1 s, the least it takes), the fault suite's workload
(``tests.faults.support.Workload``). A success appends the id to ``LEDGER`` (one
``O_APPEND`` line, written before the handler returns: a kill after it and before
FastStream's ``XACK`` counts the id twice). Touches ``READY`` once consuming; SIGTERM stops
it gracefully, SIGKILL is the test's crash.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisStreamMessage

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy
from tests.faults.support import Workload

MAX_ATTEMPTS = 6
"""Two transient failures, the fault's lost deliveries (a claim counts as an attempt: three
kills at most), and still one to succeed."""
DELAY = timedelta(milliseconds=int(os.environ.get("DELAY_MS", "300")))
"""Each retry's delay; ``DELAY_MS`` sets it (a restart wants copies waiting when it hits)."""


async def main() -> None:
    """Consume until SIGTERM."""
    stream, consumer = os.environ["STREAM"], os.environ["CONSUMER"]
    ledger = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    workload = Workload(0)
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Fixed(DELAY)),
        claim_idle=timedelta(seconds=1),
    )
    broker = RedisBroker(os.environ["REDIS_URL"], middlewares=[retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer=consumer))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        workload.behave(str(body["id"]), message.headers)
        os.write(ledger, f"{body['id']}\n".encode())

    retry.install(broker)
    await broker.start()
    Path(os.environ["READY"]).touch()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await broker.stop()


if __name__ == "__main__":
    asyncio.run(main())
