"""No stall: 10,000 copies waiting 60 s do not slow 1,000 good messages.

A copy waits in the schedule (a sorted set), not in the group's pending list, and the
mover sleeps until the head is due: FastStream's reads see nothing of them. The 10,000 are
written as the retry step writes them, with a pipeline; then 1,000 good messages are
handled beside them, against the same 1,000 with nothing waiting, in the same app process.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from faststream_retry.core import headers as h
from faststream_retry.redis import envelope
from faststream_retry.redis.keys import stream_keys
from tests.faults.support import stopped
from tests.redis.fault_support import (
    Ledger,
    Tally,
    Worker,
    publish,
    record,
    server_of,
    until_up,
)

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.fault, pytest.mark.timeout(300)]

WAITING = 10_000
GOOD = 1000
DELAY_MS = 60_000


def good(prefix: str) -> list[str]:
    """Ids the workload processes at once (``i % 10 == 5``)."""
    return [f"{prefix}{i * 10 + 5:05d}" for i in range(GOOD)]


async def handled(client: Redis, stream: str, ledger: Ledger, ids: list[str]) -> float:
    """Publish ``ids`` and return the seconds until the app processed them all."""
    started = time.monotonic()
    await publish(client, stream, ids)
    wanted = set(ids)

    async def done() -> bool:
        return wanted <= set(ledger.ids())

    await until_up(done, f"{len(ids)} good messages", timeout=120)
    return time.monotonic() - started


async def _none_pending(client: Redis, stream: str) -> bool:
    return int((await client.xpending(stream, "g"))["pending"]) == 0


async def test_ten_thousand_waiting_copies_do_not_slow_good_messages(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """The 1,000 good ones are handled within seconds, none of the 10,000 comes back early,
    and the group's pending list stays empty while they wait."""
    ledger = Ledger(tmp_path / "ledger")
    app = Worker(redis_url, stream, "c1", ledger.path)
    keys = stream_keys(stream)
    try:
        await app.start()
        alone = await handled(client, stream, ledger, good("a"))
        seconds, micros = await client.time()
        due = seconds * 1000 + micros // 1000 + DELAY_MS
        pipe = client.pipeline(transaction=False)
        for i in range(WAITING):
            m = f"w{i:05d}"
            headers = {
                "content-type": "application/json",
                "correlation_id": m,
                h.ATTEMPT: "1",
                h.DUE: str(due),
            }
            copy = envelope.build(json.dumps({"id": m}).encode(), headers)
            pipe.hset(keys.data, f"{m}/g", copy)
            pipe.zadd(keys.schedule, {f"{m}/g": due})
        written = time.monotonic()
        await pipe.execute()
        written = time.monotonic() - written
        assert await client.zcard(keys.schedule) == WAITING
        beside = await handled(client, stream, ledger, good("b"))
        # The last handled ones' XACK goes beside their handlers (redis.acks): awaited.
        await until_up(lambda: _none_pending(client, stream), "nothing held in the group", 30)
        assert await client.zcard(keys.schedule) == WAITING, "no copy moved before its time"
        assert not [m for m in ledger.ids() if m.startswith("w")], "no copy handled early"
        # Long before the copies are due: good messages stuck behind them would wait the 60 s.
        # (How fast beside how fast alone is the row's figure, not a bound: the machine's.)
        assert beside < DELAY_MS / 1000 - 10, f"1,000 good ones took {beside:.1f} s beside 10,000"
        server = await server_of(client)
    finally:
        await stopped("stopping the app", app.stop())
        await client.delete(keys.schedule, keys.data)
    tally = Tally(good("b"), processed=good("b"))
    record(
        "10,000 copies waiting 60 s, 1,000 good",
        server,
        tally,
        0,
        beside,
        faults=f"good alone {alone:.1f} s, beside the copies {beside:.1f} s "
        f"({beside / alone:.2f}x); 10,000 written in {written:.2f} s",
    )
