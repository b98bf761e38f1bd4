"""Two replicas of the app, each with its mover, moving due copies at once (two processes).

Each copy is moved by one script that adds it to the stream and removes it from the
schedule together: whichever mover runs it, it is moved once. Counted by id and attempt in
the stream itself: no (id, attempt) twice, and sent = processed + dead-lettered.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pytest

from faststream_retry.core import headers as h
from tests.faults.support import stopped
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
)
from tests.redis.support import read_stream

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.fault, pytest.mark.timeout(300)]

N = 400


async def test_two_replicas_move_copies_at_once_never_twice_never_lost(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """400 messages, two app processes on one stream and group: 400 copies and more
    scheduled and moved by both movers; each (id, attempt) enters the stream once."""
    workload = Workload(N)
    tally = Tally(workload.ids)
    ledger = Ledger(tmp_path / "ledger")
    apps = [Worker(redis_url, stream, name, ledger.path) for name in ("r1", "r2")]
    try:
        for app in apps:
            await app.start()
        await publish(client, stream, workload.ids)
        seconds = await settle(tally, client, stream, ledger, timeout=120, what="two replicas")

        await drained(client, stream)
        for app in apps:
            await stopped("stopping a replica", app.stop())
        duplicates = await late(client, stream)
        server = await server_of(client)
    finally:
        for app in apps:
            await stopped("stopping a replica", app.stop())
    check_outcomes(workload, tally)
    entries = await read_stream(client, stream)
    copies = Counter(
        (m.headers["correlation_id"], h.read_attempt(m.headers))
        for _, m in entries
        if h.ATTEMPT in m.headers
    )
    twice = {k: c for k, c in copies.items() if c > 1}
    assert not twice, f"{len(twice)} copies moved more than once: {sorted(twice)[:5]}"
    readers = {r["name"] for r in await client.xinfo_consumers(stream, "g")}
    assert {b"r1", b"r2"} <= readers, "both replicas read"
    assert tally.duplicates == 0
    assert duplicates == 0
    record(
        "two replicas moving at once",
        server,
        tally,
        duplicates,
        seconds,
        faults=f"{len(copies)} copies moved by 2 movers",
    )
