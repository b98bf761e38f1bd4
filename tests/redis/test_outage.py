"""Outage mode on a real Redis: a stream whose dependency is down takes one entry per probe,
spends no attempt while it waits, and loses or doubles nothing.

The dependency is a flag the handler reads. While it is down every call fails with a
transient ``ConnectionError``; the policy (4 attempts, 0.2 s apart) would dead-letter every
message within a second without outage mode. Counted by id: sent = processed + dead-lettered,
with nothing dead-lettered and each processed once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisStreamMessage

from faststream_retry import EventKind, RetryMiddleware
from faststream_retry.core import headers as h
from faststream_retry.redis.keys import stream_keys
from tests.outage_support import POLICY, Dependency, N
from tests.rabbit import eventually
from tests.redis.support import until

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


def app(redis_url: str, stream: str, dependency: Dependency[int], **options: Any) -> RedisBroker:
    retry = RetryMiddleware(
        POLICY,
        outage_after=3,
        outage_probe=0.3,
        claim_idle=timedelta(seconds=5),
        hooks=[dependency.events.append],
        **options,
    )
    broker = RedisBroker(redis_url, middlewares=[retry])

    # Ten calls at once: several entries wait at the gate side by side.
    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"), max_workers=10)
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        dependency.call(int(body["id"]), h.read_attempt(message.headers))

    return broker


async def settled(client: Redis, stream: str) -> bool:
    keys = stream_keys(stream)
    pending = int((await client.xpending(stream, "g"))["pending"])
    return pending == 0 and await client.zcard(keys.schedule) == 0


async def test_outage_mode_holds_the_stream_until_the_dependency_is_back(
    redis_url: str, client: Redis, stream: str
) -> None:
    """After 3 transient failures one entry per 0.3 s probe reaches the handler; an entry held
    past outage_hold is parked in the schedule (a hop, its attempt unchanged), never left to
    the claimer; once the dependency is back every message is processed once, none dead."""
    dependency: Dependency[int] = Dependency()
    broker = app(redis_url, stream, dependency, outage_hold=1.0)
    await broker.start()
    try:
        for n in range(N):
            await broker.publish({"id": n}, stream=stream)
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_STARTED) != [], what="outage mode"
        )
        switched = time.monotonic()
        # The dependency stays down 3 s (the outage, not a wait for a condition): ten
        # messages at a time wait at the gate, each parked after 1 s.
        await asyncio.sleep(3)
        parked = len(dependency.kinds(EventKind.HOP))
        calls = dependency.probes_since(switched)
        window = time.monotonic() - switched
        dependency.down = False
        await eventually(
            lambda: sum(dependency.processed.values()) >= N, timeout=60, what="every message"
        )
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_ENDED) != [], what="the mode's end"
        )
        await until(lambda: settled(client, stream), what="nothing pending or scheduled")
        await asyncio.sleep(0.5)  # nothing more comes
    finally:
        await broker.stop()
    assert len(calls) <= window / 0.3 + 2, (len(calls), window)
    assert dependency.processed == Counter(range(N)), "every message processed, each once"
    assert await client.xlen(stream_keys(stream).dlq) == 0
    # The wait spent no attempt: only the calls made before the switch and the probes did.
    assert max(dependency.attempts.values()) < POLICY.max_attempts
    assert all(e.attempt < POLICY.max_attempts for e in dependency.kinds(EventKind.HOP))
    # Parked, never left pending to the claimer (which counts a lost attempt): each
    # attempt a message carries is a handler call that failed.
    assert dependency.attempts == {n: dependency.failed[n] for n in range(N)}, "no attempt lost"
    assert parked >= 10, parked


async def test_a_stop_parks_the_held_entries_and_a_restart_processes_them_once(
    redis_url: str, client: Redis, stream: str
) -> None:
    """The broker stops in outage mode: every entry waiting at the gate is parked at once
    (into the schedule, its attempt unchanged; the stop not held up by them), and the next
    start processes each message once, none dead. The entries FastStream had read ahead but
    not handed to a handler stay pending, as without outage mode: the claimer takes them
    (claim_idle, 5 s here)."""
    dependency: Dependency[int] = Dependency()
    broker = app(redis_url, stream, dependency)  # outage_hold 5 min: only the stop parks
    await broker.start()
    try:
        for n in range(N):
            await broker.publish({"id": n}, stream=stream)
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_STARTED) != [], what="outage mode"
        )
        switched = time.monotonic()
        await eventually(
            lambda: len(dependency.probes_since(switched)) >= 2,
            timeout=20,
            what="two probes",
        )
        started = time.monotonic()
    finally:
        await broker.stop()
    stopped_in = time.monotonic() - started
    assert stopped_in < 5, stopped_in
    parked = len(dependency.kinds(EventKind.HOP))
    assert parked >= 5, parked
    assert await client.zcard(stream_keys(stream).schedule) >= parked

    dependency.down = False
    again = app(redis_url, stream, dependency)
    await again.start()
    try:
        await eventually(
            lambda: sum(dependency.processed.values()) >= N, timeout=60, what="every message"
        )
        await until(lambda: settled(client, stream), what="nothing pending or scheduled")
        await asyncio.sleep(0.5)
    finally:
        await again.stop()
    assert dependency.processed == Counter(range(N))
    assert await client.xlen(stream_keys(stream).dlq) == 0
    assert max(dependency.attempts.values()) < POLICY.max_attempts
