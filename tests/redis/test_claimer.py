"""Entries of a consumer killed mid-message come back through the claimer, counted as an attempt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.redis.claimer import CONSUMER_LOST
from tests.rabbit import eventually
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis

    from tests.redis.support import App

CONSUMER = Path(__file__).with_name("dying_consumer.py")
N = 20


async def test_entries_of_a_consumer_killed_mid_message_are_claimed_and_handled_once(
    make_app: Callable[..., App], client: Redis, redis_url: str, stream: str
) -> None:
    """SIGKILL while its handler runs: all it read is handled once by another consumer."""
    started = f"{stream}:started"
    root = Path(__file__).resolve().parents[2]
    doomed = subprocess.Popen(
        [sys.executable, str(CONSUMER)],
        env={**os.environ, "REDIS_URL": redis_url, "STREAM": stream, "STARTED": started},
        cwd=root,
    )
    try:

        async def group_exists() -> bool:
            return bool(await client.exists(stream)) and bool(await client.xinfo_groups(stream))

        await until(group_exists, timeout=30, what="the doomed consumer's group")
        app = make_app(fails=lambda _id, _attempt: False, claim_idle_ms=1000, consumer="c2")
        # One transaction: the consumer's blocked read takes all of them at once.
        pipe = client.pipeline(transaction=True)
        for n in range(N):
            envelope_ = {
                "data": json.dumps({"id": n}),
                "headers": {"content-type": "application/json"},
            }
            pipe.xadd(stream, {"__data__": json.dumps(envelope_)})
        await pipe.execute()

        async def all_pending_in_doomed() -> bool:
            info = await client.xpending(stream, "g")
            return bool(await client.get(started)) and info["pending"] == N

        await until(all_pending_in_doomed, what=f"{N} entries pending in the doomed consumer")
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
    await app.start()
    await eventually(lambda: sum(app.done.values()) >= N, timeout=30, what="every entry handled")
    assert app.done == dict.fromkeys(range(N), 1), "each entry handled exactly once"
    assert {k: [a for a, _ in v] for k, v in app.calls.items()} == {n: [2] for n in range(N)}
    assert (await client.xpending(stream, "g"))["pending"] == 0
    copies = [m for _, m in await read_stream(client, stream) if h.ATTEMPT in m.headers]
    assert len(copies) == N
    for copy in copies:
        (entry,) = h.read_history(copy.headers)
        assert entry["exception"] == CONSUMER_LOST
        assert h.read_attempt(copy.headers) == 1
    assert app.engine.claimer is not None
    assert app.engine.claimer.claimed == N
