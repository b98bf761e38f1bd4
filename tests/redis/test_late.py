"""Subscribers that join a running RedisBroker, on a real server: checked as the start checks
the others, and covered (an engine of their own: the schedule moved back, dead letters
written, their consumer's entries kept alive), counted by id: sent = processed +
dead-lettered."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, RedisRouter, StreamSub
from faststream.redis.annotations import RedisStreamMessage

from faststream_retry import Fixed, RetryConfigError, RetryMiddleware, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.redis.keys import stream_keys
from tests.rabbit import eventually
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

N = 20
FAST = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200)))


class Seen:
    """Each call's attempt by id, and the ids handled."""

    def __init__(self) -> None:
        self.calls: dict[int, list[int]] = {}
        self.done: Counter[int] = Counter()

    async def handle(self, body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = int(body["id"]), h.read_attempt(message.headers)
        self.calls.setdefault(key, []).append(attempt)
        if key < 0 or attempt == 0:
            raise ConnectionError("flaky")
        self.done[key] += 1


async def first_app(
    redis_url: str, stream: str, *, install: bool
) -> tuple[RedisBroker, Callable[[], Awaitable[None]]]:
    """A broker with one subscriber, and what makes the plugin run on it once it started.

    Installed, the plugin starts with the broker; in ``middlewares=`` only, at the first
    message the broker consumes: the first subscriber is sent one, and it is waited for.
    """
    retry = RetryMiddleware(FAST, claim_idle=timedelta(seconds=5))
    broker = RedisBroker(redis_url, middlewares=[retry])
    if install:
        retry.install(broker)
    handled: list[int] = []

    @broker.subscriber(stream=StreamSub(f"{stream}-first", group="g", consumer="c1"))
    async def first(body: dict[str, Any]) -> None:
        handled.append(int(body["id"]))

    async def plugin_running() -> None:
        if not install:
            await broker.publish({"id": 0}, stream=f"{stream}-first")
            await eventually(lambda: handled == [0], what="the first message")

    return broker, plugin_running


async def check_counts(broker: RedisBroker, client: Redis, stream: str, seen: Seen) -> None:
    """Every good message handled once after one retry; the poison one dead-lettered."""
    for n in [*range(N), -1]:
        await broker.publish({"id": n}, stream=stream)
    await eventually(lambda: sum(seen.done.values()) >= N, what="every good message")
    dlq = stream_keys(stream).dlq

    async def one_letter() -> bool:
        return int(await client.xlen(dlq)) >= 1

    await until(one_letter, what="the poison message's dead letter")
    await asyncio.sleep(0.5)  # nothing more comes
    letters = [json.loads(m.body)["id"] for _, m in await read_stream(client, dlq)]
    assert letters == [-1]
    assert seen.done == Counter(range(N)), "each good one once"
    assert all(seen.calls[n] == [0, 1] for n in range(N)), "one retry each, by a copy"
    assert seen.calls[-1] == [0, 1, 2]
    keys = stream_keys(stream)
    assert await client.zcard(keys.schedule) == 0
    assert int((await client.xpending(stream, "g"))["pending"]) == 0


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_a_subscriber_started_on_the_running_broker_is_covered(
    redis_url: str, client: Redis, stream: str, install: bool
) -> None:
    """``broker.subscriber(...)`` then ``await sub.start()`` after the broker started: its
    failures wait in its schedule and are moved back to it, its poison message goes to its
    dead-letter stream."""
    broker, first = await first_app(redis_url, stream, install=install)
    seen = Seen()
    await broker.start()
    try:
        await first()
        sub = broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
        sub(seen.handle)
        await sub.start()
        await check_counts(broker, client, stream, seen)
    finally:
        await broker.stop()


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_a_router_included_late_is_covered(
    redis_url: str, client: Redis, stream: str, install: bool
) -> None:
    """A router included after the start, then ``broker.start()`` again to start it."""
    broker, first = await first_app(redis_url, stream, install=install)
    seen = Seen()
    await broker.start()
    try:
        await first()
        router = RedisRouter()
        router.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))(seen.handle)
        broker.include_router(router)
        await broker.start()
        await check_counts(broker, client, stream, seen)
    finally:
        await broker.stop()


async def test_a_channel_subscriber_joining_with_retries_on_is_refused(
    redis_url: str, stream: str
) -> None:
    """A pub/sub channel subscriber that joins is refused as the start refuses one: its start
    raises with the fix, and it reads nothing."""
    broker, first = await first_app(redis_url, stream, install=True)
    await broker.start()
    try:
        await first()
        sub = broker.subscriber(channel=f"{stream}-channel")

        @sub
        async def late(body: str) -> None: ...

        with pytest.raises(RetryConfigError, match="cannot run on this RedisBroker"):
            await sub.start()
        assert not getattr(sub, "running", False)
    finally:
        await broker.stop()


async def test_a_stream_joining_whose_keys_are_a_covered_stream_s_is_refused(
    redis_url: str, stream: str
) -> None:
    """``{S}`` joining while ``S`` is covered: both would share ``{S}.retry``, ``.retry.data``
    and ``.dlq`` (each one's copies moved into the other), so its start raises, as the
    start refuses the pair, and it reads nothing."""
    broker, first = await first_app(redis_url, stream, install=True)
    await broker.start()
    try:
        await first()
        sub = broker.subscriber(stream=StreamSub(f"{{{stream}-first}}", group="g", consumer="c1"))

        @sub
        async def late(body: dict[str, Any]) -> None: ...

        with pytest.raises(RetryConfigError, match="would share their retry"):
            await sub.start()
        assert not getattr(sub, "running", False)
    finally:
        await broker.stop()
