"""Copies waiting in the schedule survive a server killed with SIGKILL and started on its AOF."""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from faststream_retry.redis.engine import RedisRetryEngine
from tests.rabbit import eventually
from tests.redis.conftest import start_server, stop_server
from tests.redis.support import read_stream, until
from tests.redis.test_steps import GROUP, copy_ids, pending_entries, schedule

pytestmark = pytest.mark.redis

N = 2000
PORT = int(os.environ.get("REDIS_RESTART_PORT", "6404"))


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
async def test_no_waiting_copy_is_lost_when_the_server_is_killed(appendfsync: str) -> None:
    """2,000 copies scheduled and acknowledged, SIGKILL, restart: each moved back exactly once.

    The originals stay acknowledged. Killing the process loses nothing under either fsync
    policy (Redis writes the AOF before it answers); a machine crash could, under everysec.
    """
    stop_server(PORT)  # one left running (a test stopped midway) is reused, data and all
    url, _ = start_server(PORT, REDIS_APPENDFSYNC=appendfsync, REDIS_FRESH="1")
    client = Redis.from_url(url)
    stream = f"restart-test-{appendfsync}"
    engine = RedisRetryEngine(client, [(stream, GROUP)], cap_s=1.0)
    try:
        entries = await pending_entries(client, stream, N)
        await schedule(engine, entries, delay_ms=6000)
        keys = engine.keys(stream)
        await engine.start()
        assert await client.zcard(keys.schedule) == N, "every copy waiting when the server dies"
        assert (await client.xpending(stream, GROUP))["pending"] == 0
        await asyncio.to_thread(stop_server, PORT, REDIS_SIGNAL="KILL", REDIS_KEEP_DATA="1")
        # Down long enough for the mover to find it down (redis-py's own retries spent).
        await eventually(lambda: engine.mover.failures > 0, what="the mover to see the outage")
        await asyncio.to_thread(start_server, PORT, REDIS_APPENDFSYNC=appendfsync, REDIS_FRESH="0")

        async def all_moved() -> bool:
            try:
                return int(await client.zcard(keys.schedule)) == 0
            except RedisConnectionError:  # this client's connection died with the server
                return False

        await until(all_moved, timeout=60, what="every copy moved after the restart")
        copies = copy_ids(await read_stream(client, stream))
        assert sorted(copies) == list(range(N)), f"{N - len(copies)} copies lost"
        assert copies == Counter(dict.fromkeys(range(N), 1)), "a copy moved twice"
        assert (await client.xpending(stream, GROUP))["pending"] == 0, "an original came back"
        assert engine.mover.moved == N
    finally:
        try:
            await engine.stop()
            await client.aclose()
        finally:
            await asyncio.to_thread(stop_server, PORT)
