"""Entries of a consumer killed mid-message come back through the claimer, counted as an attempt.

A graceful stop is not a loss: what its handlers hold is kept alive until they drained, and
the rest of its read is delivered afresh, no attempt spent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import RetryMiddleware, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.redis.claimer import CONSUMER_LOST, Claimer
from faststream_retry.redis.keys import CLAIMER, stream_keys
from tests.rabbit import eventually
from tests.redis.fault_support import message
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

    from tests.redis.support import App

pytestmark = pytest.mark.redis

CONSUMER = Path(__file__).with_name("dying_consumer.py")
N = 20


async def kill_mid_message(client: Redis, redis_url: str, stream: str) -> None:
    """Run a consumer that reads N entries and hangs in the first; SIGKILL it there."""
    started = f"{stream}:started"
    doomed = subprocess.Popen(
        [sys.executable, str(CONSUMER)],
        env={**os.environ, "REDIS_URL": redis_url, "STREAM": stream, "STARTED": started},
        cwd=Path(__file__).resolve().parents[2],
    )
    try:

        async def group_exists() -> bool:
            return bool(await client.exists(stream)) and bool(await client.xinfo_groups(stream))

        await until(group_exists, timeout=30, what="the doomed consumer's group")
        # One transaction: the consumer's blocked read takes all of them at once. FastStream's
        # older JSON envelope, which the transport reads too.
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


async def test_entries_of_a_consumer_killed_mid_message_are_claimed_and_handled_once(
    make_app: Callable[..., App], client: Redis, redis_url: str, stream: str
) -> None:
    """SIGKILL while its handler runs: all it read is handled once by another consumer."""
    await kill_mid_message(client, redis_url, stream)
    app = make_app(fails=lambda _id, _attempt: False, claim_idle_ms=1000, consumer="c2")
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


async def test_a_lost_delivery_on_the_last_attempt_is_dead_lettered(
    make_app: Callable[..., App], client: Redis, redis_url: str, stream: str
) -> None:
    """max_attempts=1: the claim spends the only attempt, so each entry goes to the .dlq."""
    await kill_mid_message(client, redis_url, stream)
    app = make_app(
        fails=lambda _id, _attempt: False, claim_idle_ms=1000, consumer="c2", max_attempts=1
    )
    await app.start()
    dlq = app.engine.keys(stream).dlq

    async def all_dead() -> bool:
        return bool(await client.exists(dlq)) and int(await client.xlen(dlq)) >= N

    await until(all_dead, timeout=30, what="every entry dead-lettered")
    letters = [m for _, m in await read_stream(client, dlq)]
    assert sorted(json.loads(m.body)["id"] for m in letters) == list(range(N))
    for letter in letters:
        assert letter.headers[h.REASON] == "exhausted"
        assert letter.headers[h.EXCEPTION] == CONSUMER_LOST
        assert h.read_attempt(letter.headers) == 1
    assert not app.calls, "no handler ran again"
    assert (await client.xpending(stream, "g"))["pending"] == 0


async def test_entries_read_in_a_live_replicas_name_and_never_handled_are_claimed(
    make_app: Callable[..., App], client: Redis, stream: str
) -> None:
    """A group read whose reply never reached the replica (a cut connection; redis-py sent
    the read again) leaves entries pending in its name that no handler will see. The replica
    lives on, but keeps alive only what its handlers hold: they are claimed and handled."""
    app = make_app(fails=lambda _id, _attempt: False, claim_idle_ms=1000, consumer="c1")
    await app.start()
    await app.publish(range(3))
    await eventually(lambda: sum(app.done.values()) >= 3, what="the first three handled")
    # The lost reply: read as c1, after the replica began, and dropped. One transaction, so
    # the app's blocked read is served after it, and finds nothing left.
    pipe = client.pipeline(transaction=True)
    for n in range(3, 3 + N):
        pipe.xadd(stream, message(str(n)))  # type: ignore[arg-type]
    pipe.xreadgroup("g", "c1", {stream: ">"})
    *_, stolen = await pipe.execute()
    assert len(stolen[0][1]) == N
    await eventually(lambda: sum(app.done.values()) >= 3 + N, timeout=30, what="claimed, handled")
    assert app.done == dict.fromkeys(range(3 + N), 1)
    assert {k: [a for a, _ in v] for k, v in app.calls.items() if k >= 3} == {
        n: [2] for n in range(3, 3 + N)
    }, "each handled once, its lost delivery counted"


def replica(
    redis_url: str, stream: str, handle: Callable[[dict[str, Any]], Awaitable[None]], **policy: Any
) -> RedisBroker:
    """One replica of an app, its plugin installed (its claimer runs from the start)."""
    retry = RetryMiddleware(RetryPolicy(**policy), claim_idle=timedelta(seconds=1))
    broker = RedisBroker(redis_url, middlewares=[retry], graceful_timeout=15)
    retry.install(broker)
    consumer = f"c-{uuid.uuid4().hex[:6]}"
    broker.subscriber(stream=StreamSub(stream, group="g", consumer=consumer))(handle)
    return broker


async def backlog(client: Redis, stream: str, n: int) -> None:
    await client.xgroup_create(stream, "g", id="$", mkstream=True)
    pipe = client.pipeline(transaction=True)
    for i in range(n):
        pipe.xadd(stream, message(str(i)))  # type: ignore[arg-type]
    await pipe.execute()


@pytest.mark.timeout(120)
async def test_a_graceful_stop_hands_what_no_handler_ran_on_to_the_next_replica(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A rolling deploy: a backlog read at once, the replica stopped after its first handler
    started. The rest of its read is delivered afresh, no attempt spent: at max_attempts=1
    the next replica handles each once, and nothing is dead-lettered (before: the 19 were
    claimed as lost attempts and dead-lettered, no handler having run on them)."""
    handled: list[int] = []
    started = asyncio.Event()

    async def handle(body: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(0.3)
        handled.append(int(body["id"]))

    await backlog(client, stream, N)
    first = replica(redis_url, stream, handle, max_attempts=1)
    await first.start()
    await asyncio.wait_for(started.wait(), 10)
    await first.stop()  # the handler in hand finishes; the rest of the read was dropped
    assert len(handled) == 1
    second = replica(redis_url, stream, handle, max_attempts=1)
    dlq = f"{{{stream}}}.dlq"
    await second.start()
    try:

        async def all_settled() -> bool:
            dead = int(await client.xlen(dlq)) if await client.exists(dlq) else 0
            return len(handled) + dead >= N and await _none_pending(client, stream)

        await until(all_settled, timeout=60, what="every message handled or dead-lettered")
    finally:
        await second.stop()
    assert not await client.exists(dlq), f"dead-lettered unhandled; handled {sorted(handled)}"
    assert sorted(handled) == list(range(N)), "each handled once"


@pytest.mark.timeout(120)
async def test_a_handler_still_draining_at_a_stop_is_not_claimed_by_another_replica(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A stop waits for running handlers (FastStream's graceful_timeout), and their entries are
    kept alive until then: a handler running longer than claim_idle after the stop began is
    not claimed and run again by another replica (before: the keep-alive stopped first)."""
    calls: list[int] = []
    started = asyncio.Event()

    async def slow(body: dict[str, Any]) -> None:
        calls.append(int(body["id"]))
        started.set()
        await asyncio.sleep(3)

    async def other(body: dict[str, Any]) -> None:
        calls.append(int(body["id"]))

    await backlog(client, stream, 1)
    first = replica(redis_url, stream, slow, max_attempts=3)
    await first.start()
    await asyncio.wait_for(started.wait(), 10)
    second = replica(redis_url, stream, other, max_attempts=3)
    await second.start()
    try:
        await first.stop()  # drains the 3 s handler, claim_idle (1 s) three times over
        await until(lambda: _none_pending(client, stream), what="nothing pending")
        await asyncio.sleep(1.5)  # a copy the other replica's claim made would be back
    finally:
        await second.stop()
    assert calls == [0], "handled once, by the replica that read it"
    assert await client.xlen(stream) == 1, "no copy made"


async def _none_pending(client: Redis, stream: str) -> bool:
    return int((await client.xpending(stream, "g"))["pending"]) == 0


async def test_an_entry_whose_step_runs_beside_its_handler_is_kept_alive(
    client: Redis, stream: str
) -> None:
    """A retry's step runs after its handler's turn (redis.settling): until it acknowledges
    the entry, the keep-alive resets the entry's idle time as for a running handler, so no
    other replica claims it meanwhile. An entry no handler holds and no step settles, below
    the last one a handler started, is left to grow idle (claimed as a lost attempt)."""
    keys = stream_keys(stream)
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    claimer = Claimer(
        client,
        [(keys, "g")],
        consumer=CLAIMER,
        idle_ms=1000,
        settle=_settle_nothing,
        own=[(keys, "g", "c1")],
    )
    ids = [_str(await client.xadd(stream, message(str(n)))) for n in range(3)]  # type: ignore[arg-type]
    await client.xreadgroup("g", "c1", {stream: ">"})
    stepping, forgotten, last = ids
    with claimer.holding(stream, "c1", last):
        pass  # the last entry's handler ran: entries below it are no longer read ahead

    async def idle(entry_id: str) -> int:
        (row,) = await client.xpending_range(stream, "g", min=entry_id, max=entry_id, count=1)
        return int(row["time_since_delivered"])

    async def both_idle() -> bool:
        return min([await idle(stepping), await idle(forgotten)]) >= 300

    await until(both_idle, what="both entries idle for 300 ms")
    kept_at = time.monotonic()
    with claimer.settling(stream, stepping):
        await claimer.keep_alive_once(keys, "g", "c1")
    stepping_idle = await idle(stepping)
    since_kept_ms = (time.monotonic() - kept_at) * 1000
    # Reset by the pass, so idle no longer than since it began (a loaded machine can take
    # 300 ms between two commands: a run here saw 314).
    assert stepping_idle <= since_kept_ms + 2, "its step runs: kept alive"
    assert await idle(forgotten) >= 300, "neither held nor stepping: left to grow idle"


async def _settle_nothing(_entry: object) -> None:
    raise AssertionError("nothing is claimed here")


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
