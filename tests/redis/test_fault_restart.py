"""Redis restarted under the real app: SIGTERM, and SIGKILL with ``appendfsync always`` and
``everysec``, while copies wait in the schedule and messages are in flight.

Counted by id: sent = processed + dead-lettered, nothing lost. Killing the server's process
loses nothing under either fsync policy: Redis writes each command to the AOF (``write``)
before it answers, and the kernel keeps what was written. ``everysec`` gives up only the
fsync, which matters on a crash of the machine (docs/explanation/redis-design.md,
Durability); that cannot be produced here, so the everysec row measures the process kill.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from faststream_retry.redis.keys import stream_keys
from tests.faults.support import Timeline, stopped
from tests.redis.conftest import start_server, stop_server
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

pytestmark = [pytest.mark.redis, pytest.mark.fault, pytest.mark.timeout(300)]

PORT = int(os.environ.get("REDIS_RESTART_PORT", "6404"))
N = 400


@pytest.mark.parametrize(
    ("signal", "appendfsync"),
    [("TERM", "always"), ("KILL", "always"), ("KILL", "everysec")],
    ids=["sigterm", "sigkill-always", "sigkill-everysec"],
)
async def test_redis_restarted_under_the_app_loses_nothing(
    signal: str, appendfsync: str, tmp_path: Path
) -> None:
    """400 messages; the server stopped (SIGTERM) or killed (SIGKILL) once copies wait in
    the schedule and the app is mid-burst, started again on its AOF: every id processed or
    dead-lettered, none lost, the group and the schedule empty at the end."""
    timeline = Timeline()
    stop_server(PORT)  # one left running by a test stopped midway would be reused, data and all
    url, _ = start_server(PORT, REDIS_APPENDFSYNC=appendfsync, REDIS_FRESH="1")
    client = Redis.from_url(url)
    stream = f"fault-restart-{signal.lower()}-{appendfsync}"
    keys = stream_keys(stream)
    workload = Workload(N)
    tally = Tally(workload.ids)
    ledger = Ledger(tmp_path / "ledger")
    # Copies wait 1 s: whatever the machine's pace, some are in the schedule at the fault.
    app = Worker(url, stream, "c1", ledger.path, DELAY_MS="1000")
    try:
        server = await server_of(client)
        await app.start()
        await publish(client, stream, workload.ids)
        timeline("published")

        async def mid_burst() -> bool:
            return int(await client.zcard(keys.schedule)) >= 10 and len(ledger.ids()) >= 50

        await until_up(mid_burst, "copies waiting and messages handled")
        waiting = int(await client.zcard(keys.schedule))
        timeline(f"SIG{signal} with {waiting} copies waiting, {len(ledger.ids())} processed")
        await asyncio.to_thread(stop_server, PORT, REDIS_SIGNAL=signal, REDIS_KEEP_DATA="1")
        # Down long enough that the app's commands fail (redis-py's own retries spent).
        await asyncio.sleep(2)
        await asyncio.to_thread(start_server, PORT, REDIS_APPENDFSYNC=appendfsync, REDIS_FRESH="0")
        timeline("started again")
        seconds = await settle(
            tally, client, stream, ledger, timeout=120, what=f"SIG{signal} {appendfsync}"
        )
        timeline("settled")

        await drained(client, stream)
        await stopped("stopping the app", app.stop())
        duplicates = await late(client, stream)
    finally:
        await stopped("stopping the app", app.stop())
        await client.aclose()
        await asyncio.to_thread(stop_server, PORT)
    check_outcomes(workload, tally)
    record(
        f"Redis SIG{signal}, appendfsync {appendfsync}",
        server,
        tally,
        duplicates,
        seconds,
        faults=f"1 SIG{signal} with {waiting} copies waiting",
    )
