"""The app's connections to Redis cut five times, each where it hurts, under the real app.

A proxy in the test sits between the app process and the server and cuts: before the
retry step's script reaches Redis (the step never ran), after it ran with its reply
dropped (redis-py sends it again: it must not schedule twice), after the mover's script
moved copies with its reply dropped, after a group read delivered entries with its reply
dropped (the entries are pending in the app's name, and it never saw them), and all at
once. Counted by id: nothing lost.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from faststream_retry.redis.lua import MOVE, RETRY_LATER
from tests.faults.support import Timeline, stopped
from tests.redis.cut_proxy import RedisCuttingProxy
from tests.redis.fault_support import (
    Ledger,
    Tally,
    Worker,
    Workload,
    check_outcomes,
    drained,
    late,
    publish,
    record,
    server_of,
    settle,
    until_up,
)

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.fault, pytest.mark.timeout(300)]

N = 400


def sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()  # noqa: S324 - Redis' script id


CUTS = [
    ("the retry step, before it reaches Redis", sha(RETRY_LATER), "before"),
    ("the retry step, its reply dropped", sha(RETRY_LATER), "reply"),
    ("a group read, its reply dropped", b"XREADGROUP", "reply"),
    ("the mover's script, its reply dropped", sha(MOVE), "reply"),
]


async def test_connections_cut_five_times_lose_nothing(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """400 messages through a proxy that cuts the app's connections five times."""
    timeline = Timeline()
    proxy = RedisCuttingProxy(urlsplit(redis_url).port or 6379)
    await proxy.start()
    workload = Workload(N)
    tally = Tally(workload.ids)
    ledger = Ledger(tmp_path / "ledger")
    app = Worker(f"redis://127.0.0.1:{proxy.port}", stream, "c1", ledger.path)
    try:
        await app.start()
        publishing = asyncio.create_task(publish(client, stream, workload.ids, chunk=100))
        for what, needle, when in CUTS:
            connections = proxy.accepted
            fired = proxy.arm(needle, when)
            await asyncio.wait_for(fired.wait(), 60)
            timeline(f"cut: {what}")
            await recovered(proxy, ledger, connections, workload)
        await publishing
        connections = proxy.accepted
        proxy.cut_all()
        timeline("cut: everything")
        await recovered(proxy, ledger, connections, workload)
        seconds = await settle(tally, client, stream, ledger, timeout=120, what="cut connections")
        timeline("settled")

        await drained(client, stream)
        await stopped("stopping the app", app.stop())
        duplicates = await late(client, stream)
        server = await server_of(client)
    finally:
        await stopped("stopping the app", app.stop())
        await proxy.close()
    check_outcomes(workload, tally)
    assert proxy.cuts == 5
    record(
        "connection cut x5",
        server,
        tally,
        duplicates,
        seconds,
        faults="5 cuts: " + ", ".join(w.split(",")[0] for w, _, _ in CUTS) + ", all",
    )


async def recovered(
    proxy: RedisCuttingProxy, ledger: Ledger, connections: int, workload: Workload
) -> None:
    """A new connection, and work done after the cut (ten more processed, or all of them)."""
    processed = len(workload.ids) - len(workload.expected_dead())
    target = min(len(set(ledger.ids())) + 10, processed)

    async def working() -> bool:
        return proxy.accepted > connections and len(set(ledger.ids())) >= target

    await until_up(working, "work after the reconnect")
