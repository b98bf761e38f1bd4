"""A FastStream consumer that takes every message of a stream and hangs in the first one.

Run as a subprocess by tests/redis/test_claimer.py, which kills it with SIGKILL while
its handler runs: every entry it read stays pending in its name. ``REDIS_URL``,
``STREAM``; ``STARTED`` is the key it increments when its handler starts.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from faststream.redis import RedisBroker, StreamSub
from redis.asyncio import Redis

URL = os.environ["REDIS_URL"]
STREAM = os.environ["STREAM"]
broker = RedisBroker(URL)
client = Redis.from_url(URL)


@broker.subscriber(stream=StreamSub(STREAM, group="g", consumer="doomed"))
async def handle(body: Any) -> None:
    """Say it started, then never finish."""
    await client.incr(os.environ["STARTED"])
    await asyncio.sleep(3600)


async def main() -> None:
    """Start, and run until killed."""
    await broker.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
