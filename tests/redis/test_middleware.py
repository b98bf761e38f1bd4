"""RetryMiddleware on a RedisBroker, against a real server: the user API of the other brokers,
counted by id (sent = processed + dead-lettered).

The apps are wired as users wire them: ``RedisBroker(url, middlewares=[retry])`` (the
plugin starts at the first message) unless a test says ``install()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter, defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream import AckPolicy
from faststream.redis import RedisBroker, RedisRouter, StreamSub
from faststream.redis.annotations import RedisStreamMessage
from redis.asyncio import Redis

from faststream_retry import (
    EventKind,
    Fixed,
    PermanentError,
    RetryConfigError,
    RetryEvent,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)
from faststream_retry.core import headers as h
from faststream_retry.redis.claimer import CONSUMER_LOST
from faststream_retry.redis.keys import stream_keys
from tests.rabbit import eventually
from tests.redis.support import fill_backlog, read_stream, until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

FAST = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200)))
N = 60


class LinkDownError(ConnectionError):
    """The handler's transient failure in these tests."""


class Counted:
    """What a replica's handlers saw: the attempt of each call by id, successes, events."""

    def __init__(self) -> None:
        self.calls: dict[int, list[int]] = defaultdict(list)
        self.at: dict[tuple[int, int], int] = {}
        self.done: Counter[int] = Counter()
        self.events: list[RetryEvent] = []

    def call(self, body: dict[str, Any], message: RedisStreamMessage) -> tuple[int, int]:
        key, attempt = int(body["id"]), h.read_attempt(message.headers) + 1
        self.calls[key].append(attempt)
        self.at[(key, attempt)] = h.now_ms()
        return key, attempt

    def kinds(self) -> Counter[str]:
        return Counter(str(e.kind) for e in self.events)


def middleware(counted: Counted, default: RetryPolicy = FAST, **options: Any) -> RetryMiddleware:
    # Long enough that a loaded machine's late keep-alive is not a lost consumer (at 1 s
    # the claimer took live entries under load: 99 scheduled of 120); the claim test
    # sets its own.
    options.setdefault("claim_idle", timedelta(seconds=5))
    return RetryMiddleware(default, hooks=[counted.events.append], **options)


@contextlib.asynccontextmanager
async def running(broker: RedisBroker) -> AsyncIterator[RedisBroker]:
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def publish(broker: RedisBroker, stream: str, ids: range) -> None:
    for n in ids:
        await broker.publish({"id": n}, stream=stream)


async def letters(client: Redis, stream: str) -> list[tuple[int, dict[str, Any]]]:
    """The dead letters of ``stream``: each one's id and headers."""
    return [
        (int(json.loads(m.body)["id"]), m.headers)
        for _, m in await read_stream(client, stream_keys(stream).dlq)
    ]


async def settled(client: Redis, stream: str, group: str = "g") -> None:
    """Nothing pending in the group, nothing waiting in the schedule."""
    keys = stream_keys(stream)
    assert (await client.xpending(stream, group))["pending"] == 0
    assert await client.zcard(keys.schedule) == 0
    assert await client.hlen(keys.data) == 0


async def dead_count(client: Redis, stream: str, n: int) -> None:
    dlq = stream_keys(stream).dlq

    async def enough() -> bool:
        return int(await client.xlen(dlq)) >= n

    await until(enough, what=f"{n} dead letters in {dlq}")


@pytest.mark.parametrize("install", [False, True], ids=["in-middlewares", "installed"])
async def test_a_failure_is_retried_after_its_delay_and_succeeds(
    redis_url: str, client: Redis, stream: str, install: bool
) -> None:
    """Each message failing once is handled again once, its delay after, then acknowledged."""
    counted = Counted()
    retry = middleware(counted)
    broker = RedisBroker(redis_url, middlewares=[retry])
    if install:
        retry.install(broker)

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if attempt == 1:
            raise LinkDownError(f"message {key}")
        counted.done[key] += 1

    async with running(broker):
        await publish(broker, stream, range(N))
        await eventually(lambda: sum(counted.done.values()) >= N, what=f"{N} handled after a retry")
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
    assert counted.done == dict.fromkeys(range(N), 1), "each id succeeded exactly once"
    assert counted.calls == {n: [1, 2] for n in range(N)}
    for n in range(N):
        assert counted.at[(n, 2)] - counted.at[(n, 1)] >= 195, "never before its delay"
    await settled(client, stream)
    assert await letters(client, stream) == []
    assert counted.kinds() == {"scheduled": N, "released": N}


async def _pending_ids_are(client: Redis, stream: str, n: int) -> bool:
    return int((await client.xpending(stream, "g"))["pending"]) == n


async def _pending_zero(client: Redis, stream: str) -> bool:
    return int((await client.xpending(stream, "g"))["pending"]) == 0


async def test_exhausted_messages_land_in_the_dead_letter_stream(
    redis_url: str, client: Redis, stream: str
) -> None:
    """Always failing: max_attempts calls, then one dead letter per id with the retry record."""
    counted = Counted()
    broker = RedisBroker(redis_url, middlewares=[middleware(counted)])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, _ = counted.call(body, message)
        raise LinkDownError(f"message {key}")

    async with running(broker):
        await publish(broker, stream, range(N))
        await dead_count(client, stream, N)
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
    dead = await letters(client, stream)
    assert sorted(n for n, _ in dead) == list(range(N)), "sent = processed (0) + dead, by id"
    for _, headers in dead:
        assert headers[h.REASON] == "exhausted"
        assert h.read_attempt(headers) == 3
        assert [e["attempt"] for e in h.read_history(headers)] == [1, 2, 3]
        assert headers[h.ORIGIN_QUEUE] == stream
        assert headers[h.EXCEPTION].endswith("LinkDownError")
    assert counted.calls == {n: [1, 2, 3] for n in range(N)}
    assert not counted.done
    await settled(client, stream)
    assert counted.kinds() == {"scheduled": 2 * N, "released": 2 * N, "dead_lettered": N}


async def test_a_permanent_error_is_dead_lettered_at_once(
    redis_url: str, client: Redis, stream: str
) -> None:
    """PermanentError: one call, one dead letter; the other messages are handled as usual."""
    counted = Counted()
    broker = RedisBroker(redis_url, middlewares=[middleware(counted)])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, _ = counted.call(body, message)
        if key % 2:
            raise PermanentError(f"message {key} is bad")
        counted.done[key] += 1

    async with running(broker):
        await publish(broker, stream, range(N))
        await dead_count(client, stream, N // 2)
        await eventually(lambda: sum(counted.done.values()) >= N // 2, what="the good ones")
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
    dead = await letters(client, stream)
    assert sorted(n for n, _ in dead) == list(range(1, N, 2))
    assert sorted(counted.done) == list(range(0, N, 2))
    assert all(headers[h.REASON] == "permanent" for _, headers in dead)
    assert counted.calls == {n: [1] for n in range(N)}, "never retried"
    await settled(client, stream)


async def test_retry_later_waits_as_long_as_the_handler_asked(
    redis_url: str, client: Redis, stream: str
) -> None:
    """RetryLater(0.6 s) beats the policy's 30 s backoff, and the copy is never early."""
    counted = Counted()
    slow = RetryPolicy(max_attempts=3, backoff=Fixed(30))
    broker = RedisBroker(redis_url, middlewares=[middleware(counted, slow)])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if attempt == 1:
            raise RetryLater(delay=timedelta(milliseconds=600))
        counted.done[key] += 1

    async with running(broker):
        await publish(broker, stream, range(20))
        await eventually(
            lambda: sum(counted.done.values()) >= 20, what="20 handled after RetryLater"
        )
    assert counted.calls == {n: [1, 2] for n in range(20)}
    for n in range(20):
        assert counted.at[(n, 2)] - counted.at[(n, 1)] >= 595
    assert {e.delay_ms for e in counted.events if e.kind is EventKind.SCHEDULED} == {600}
    await settled(client, stream)


async def test_each_handler_keeps_its_own_policy(
    redis_url: str, client: Redis, stream: str
) -> None:
    """@retry_policy on one stream's handler; the default on another's; off on a third's."""
    counted = Counted()
    default = RetryPolicy(max_attempts=4, backoff=Fixed(0.1))
    broker = RedisBroker(redis_url, middlewares=[middleware(counted, default)])
    short, plain, off = f"{stream}-short", f"{stream}-plain", f"{stream}-off"
    off_calls: list[int] = []

    @broker.subscriber(stream=StreamSub(short, group="g", consumer="c1"))
    @retry_policy(max_attempts=2, backoff=Fixed(0.1))
    async def short_handler(body: dict[str, Any], message: RedisStreamMessage) -> None:
        counted.call(body, message)
        raise LinkDownError("short")

    @broker.subscriber(stream=StreamSub(plain, group="g", consumer="c1"))
    async def plain_handler(body: dict[str, Any], message: RedisStreamMessage) -> None:
        counted.call({"id": 1000 + int(body["id"])}, message)
        raise LinkDownError("plain")

    @broker.subscriber(stream=StreamSub(off, group="g", consumer="c1"))
    @retry_policy(enabled=False)
    async def off_handler(body: dict[str, Any]) -> None:
        off_calls.append(int(body["id"]))
        raise LinkDownError("off")

    async with running(broker):
        await publish(broker, short, range(10))
        await publish(broker, plain, range(10))
        await publish(broker, off, range(3))
        await dead_count(client, short, 10)
        await dead_count(client, plain, 10)
        await eventually(lambda: len(off_calls) >= 3, what="the handler with retries off")
    assert {k: v for k, v in counted.calls.items() if k < 1000} == {n: [1, 2] for n in range(10)}
    assert {k - 1000: v for k, v in counted.calls.items() if k >= 1000} == {
        n: [1, 2, 3, 4] for n in range(10)
    }
    assert sorted(n for n, _ in await letters(client, short)) == list(range(10))
    assert sorted(n for n, _ in await letters(client, plain)) == list(range(10))
    # Retries off: FastStream's own handling (a stream has no reject), nothing of the plugin's.
    assert off_calls == [0, 1, 2]
    assert await client.exists(stream_keys(off).dlq) == 0
    await settled(client, short)
    await settled(client, plain)


async def test_a_routers_prefixed_stream_is_covered(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A subscriber on RedisRouter(prefix=...): its stream is the prefixed one, its policy kept."""
    counted = Counted()
    retry = middleware(counted)
    broker = RedisBroker(redis_url, middlewares=[retry])
    prefix = f"pre{uuid.uuid4().hex[:6]}-"
    router = RedisRouter(prefix=prefix)
    full = f"{prefix}{stream}"

    @router.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    @retry_policy(max_attempts=2)
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if key % 2 or attempt == 1:
            raise LinkDownError(f"message {key}")
        counted.done[key] += 1

    broker.include_router(router)
    async with running(broker):
        await publish(broker, full, range(20))
        await dead_count(client, full, 10)
        await eventually(lambda: sum(counted.done.values()) >= 10, what="the even ones")
        await until(lambda: _pending_zero(client, full), what="nothing pending")
    assert sorted(counted.done) == list(range(0, 20, 2))
    dead = await letters(client, full)
    assert sorted(n for n, _ in dead) == list(range(1, 20, 2))
    assert {headers[h.ORIGIN_QUEUE] for _, headers in dead} == {full}
    assert counted.calls == {n: [1, 2] for n in range(20)}
    assert await client.exists(stream_keys(stream).dlq) == 0, "nothing under the bare name"
    await settled(client, full)


def refusing_broker(redis_url: str, stream: str, retry: RetryMiddleware) -> RedisBroker:
    """A broker with one covered stream and every kind of subscriber that cannot be."""
    broker = RedisBroker(redis_url, middlewares=[retry])

    def nothing() -> Callable[[Any], Any]:
        async def handle(body: Any) -> None: ...

        return handle

    broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))(nothing())
    broker.subscriber(f"{stream}-channel")(nothing())
    broker.subscriber(list=f"{stream}-list")(nothing())
    broker.subscriber(stream=f"{stream}-nogroup")(nothing())
    broker.subscriber(f"{stream}-channel-off")(retry_policy(enabled=False)(nothing()))
    return broker


async def test_a_channel_a_list_and_a_stream_without_group_are_refused_at_start(
    redis_url: str, client: Redis, stream: str
) -> None:
    """install(): the start fails with one error naming each and its fix; nothing is consumed."""
    retry = middleware(Counted())
    broker = refusing_broker(redis_url, stream, retry)
    retry.install(broker)
    await client.xgroup_create(stream, "g", id="$", mkstream=True)
    await client.xadd(stream, {"__data__": b"{}"})
    with pytest.raises(RetryConfigError) as refused:
        await broker.start()
    await broker.stop()
    text = str(refused.value)
    assert text.startswith("faststream-retry cannot run on this RedisBroker:")
    assert f"channel '{stream}-channel'" in text
    assert f"list '{stream}-list'" in text
    assert f"stream '{stream}-nogroup' reads it without a consumer group" in text
    assert "StreamSub(" in text
    assert "@retry_policy(enabled=False)" in text
    assert f"'{stream}-channel-off'" not in text, "retries off: nothing to refuse"
    assert len(text.splitlines()) == 4, text
    # Refused before FastStream read anything: the entry was never delivered.
    assert (await client.xpending(stream, "g"))["pending"] == 0


async def test_without_install_a_refused_broker_holds_its_messages(
    redis_url: str, client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """middlewares= only: the first message finds the refusal, is held (pending), said once."""
    calls: list[Any] = []
    retry = middleware(Counted())
    broker = RedisBroker(redis_url, middlewares=[retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: Any) -> None:
        calls.append(body)

    @broker.subscriber(f"{stream}-channel")
    async def on_channel(body: Any) -> None: ...

    with caplog.at_level(logging.ERROR, logger="faststream_retry"):
        async with running(broker):
            await publish(broker, stream, range(2))
            await until(
                lambda: _has_refusal(caplog, f"{stream}-channel"), what="the refusal, logged"
            )
            # The first is held in its handler's place, pending; the second waits behind it.
            assert (await client.xpending(stream, "g"))["pending"] >= 1
            assert await client.xlen(stream) == 2
    assert calls == []
    assert sum("cannot run on this broker" in r.getMessage() for r in caplog.records) == 1


async def _has_refusal(caplog: pytest.LogCaptureFixture, name: str) -> bool:
    return any(name in r.getMessage() for r in caplog.records)


async def test_two_replicas_move_the_copies_at_once_none_lost_none_twice(
    redis_url: str, client: Redis, stream: str
) -> None:
    """Two apps on one stream and group, each with its mover: every copy moved exactly once."""
    n = 200
    replicas: list[tuple[RedisBroker, RetryMiddleware, Counted]] = []
    for consumer in ("c1", "c2"):
        counted = Counted()
        retry = middleware(counted)
        broker = RedisBroker(redis_url, middlewares=[retry])
        replicas.append((broker, retry, counted))

        def handler(counted: Counted) -> Callable[..., Any]:
            async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
                key, attempt = counted.call(body, message)
                if attempt < 3:
                    raise LinkDownError(f"message {key}")
                counted.done[key] += 1

            return handle

        broker.subscriber(stream=StreamSub(stream, group="g", consumer=consumer))(handler(counted))
        retry.install(broker)
    async with running(replicas[0][0]), running(replicas[1][0]):
        await publish(replicas[0][0], stream, range(n))

        def done() -> int:
            return sum(sum(c.done.values()) for _, _, c in replicas)

        await eventually(lambda: done() >= n, timeout=120, what=f"{n} handled on the third attempt")
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
        movers = [r.runtime(b).live.engine.mover for b, r, _ in replicas]  # type: ignore[union-attr]
        moved = [m.moved for m in movers]
        wakes = [m.wakes for m in movers]
    done_by_id: Counter[int] = Counter()
    calls: dict[int, list[int]] = defaultdict(list)
    for _, _, counted in replicas:
        done_by_id.update(counted.done)
        for key, attempts in counted.calls.items():
            calls[key].extend(attempts)
    assert done_by_id == dict.fromkeys(range(n), 1), "each id succeeded exactly once"
    assert {k: sorted(v) for k, v in calls.items()} == {k: [1, 2, 3] for k in range(n)}
    assert sum(moved) == 2 * n, f"each copy moved exactly once: {moved}"
    assert all(w > 0 for w in wakes), f"both movers ran: {wakes}"
    assert await client.xlen(stream) == 3 * n, "n originals and 2n copies, no more"
    assert all(c.calls for _, _, c in replicas), "both replicas handled messages"
    await settled(client, stream)


async def test_a_step_redis_refuses_leaves_the_entry_pending_until_it_is_claimed(
    redis_url: str, client: Redis, stream: str
) -> None:
    """The schedule's hash is a string (an operator's SET): the step is refused with nothing
    done, the failure goes on up, the entry stays pending; once the key is fixed the claimer
    brings each entry back as a lost attempt, and each is handled, none lost, none twice."""
    counted = Counted()
    broker = RedisBroker(
        redis_url, middlewares=[middleware(counted, claim_idle=timedelta(seconds=1))]
    )
    keys = stream_keys(stream)
    await client.set(keys.data, "an operator's mistake")

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if attempt == 1:
            raise LinkDownError(f"message {key}")
        counted.done[key] += 1

    async with running(broker):
        await publish(broker, stream, range(20))
        await eventually(lambda: len(counted.calls) >= 20, what="20 first attempts")
        assert (await client.xpending(stream, "g"))["pending"] == 20, "refused: kept pending"
        assert not [e for e in counted.events if e.kind is EventKind.SCHEDULED]
        await client.delete(keys.data)
        await eventually(lambda: sum(counted.done.values()) >= 20, timeout=60, what="claimed back")
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
    assert counted.done == dict.fromkeys(range(20), 1)
    assert counted.calls == {n: [1, 2] for n in range(20)}
    copies = [m for _, m in await read_stream(client, stream) if h.ATTEMPT in m.headers]
    assert len(copies) == 20
    for copy in copies:
        (entry,) = h.read_history(copy.headers)
        assert entry["exception"] == CONSUMER_LOST
    await settled(client, stream)


async def test_a_step_redis_refuses_stays_pending_under_ack_policy_ack(
    redis_url: str, client: Redis, stream: str
) -> None:
    """AckPolicy.ACK acknowledges after an error too: the refused step's message is still
    left pending for the claimer, FastStream's own XACK sending nothing (before: 0 pending,
    nothing stored, the message lost)."""
    keys = stream_keys(stream)
    await client.set(keys.data, "an operator's mistake")
    broker = RedisBroker(
        redis_url, middlewares=[middleware(Counted(), claim_idle=timedelta(seconds=30))]
    )
    done: list[int] = []

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"), ack_policy=AckPolicy.ACK)
    async def handle(body: dict[str, Any]) -> None:
        if body["id"] == 0:
            raise LinkDownError("down")
        done.append(body["id"])

    async with running(broker):
        await publish(broker, stream, range(2))
        await eventually(lambda: bool(done), what="the second message (after the first's step)")
        # The second's XACK goes beside its handler (redis.acks): once it is in, the
        # first's entry is the one left.
        await until(lambda: _pending_ids_are(client, stream, 1), what="the second acknowledged")
        (left,) = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        entries: list[tuple[bytes, Any]] = await client.xrange(stream, count=1)  # type: ignore[assignment]
        assert left["message_id"] == entries[0][0], "the first one acked"
        assert not await client.exists(keys.schedule)


async def test_a_copy_too_large_for_the_format_becomes_a_lean_dead_letter(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A message whose own header alone is 70,000 bytes (an older producer's JSON envelope):
    its retry copy cannot be written, so it is dead-lettered as invalid, the header left out
    and named, the rest of the record kept; the other messages are retried as usual."""
    counted = Counted()
    broker = RedisBroker(redis_url, middlewares=[middleware(counted)])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if attempt == 1:
            raise LinkDownError(f"message {key}")
        counted.done[key] += 1

    async with running(broker):
        for n in range(4):
            headers = {"content-type": "application/json", "correlation_id": str(n)}
            if n == 0:
                headers["big"] = "x" * 70_000
            envelope = {"data": json.dumps({"id": n}), "headers": headers}
            await client.xadd(stream, {"__data__": json.dumps(envelope)})
        await dead_count(client, stream, 1)
        await eventually(lambda: sum(counted.done.values()) >= 3, what="the three others")
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
    ((key, headers),) = await letters(client, stream)
    assert key == 0
    assert headers[h.REASON] == "invalid"
    assert headers[h.EXCEPTION] == "faststream_retry.HeadersTooLarge"
    assert "big" not in headers
    assert headers[h.ERROR].startswith(
        "Left out to fit in FastStream's binary format (65,535 bytes): 'big' (70,0"
    )
    assert "it had failed with tests.redis" in headers[h.ERROR]
    assert counted.done == dict.fromkeys(range(1, 4), 1)
    assert counted.calls == {0: [1], 1: [1, 2], 2: [1, 2], 3: [1, 2]}
    await settled(client, stream)


async def test_the_broker_stops_at_once_while_copies_come_back_every_millisecond(
    redis_url: str, stream: str
) -> None:
    """RetryLater(0) keeps the mover and the scripts busy without pause; stop() still returns
    at once, five times over (a cancellation redis-py swallowed left it waiting for ever)."""
    for turn in range(5):
        assert await _stop_while_looping(redis_url, f"{stream}-{turn}") < 5


async def _stop_while_looping(redis_url: str, stream: str) -> float:
    """Start an app whose copies loop at 1 ms, and return how long its stop() took."""
    counted = Counted()
    retry = middleware(counted, RetryPolicy(max_attempts=100_000))
    broker = RedisBroker(redis_url, middlewares=[retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        counted.call(body, message)
        raise RetryLater(delay=0)

    await broker.start()
    try:
        await publish(broker, stream, range(20))
        await eventually(lambda: sum(map(len, counted.calls.values())) >= 300, what="a loop")
    finally:
        started = time.monotonic()
        await asyncio.wait_for(broker.stop(), 30)
    return time.monotonic() - started


async def test_a_settled_failure_is_acknowledged_once_by_its_step(
    redis_url: str, client: Redis, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's script acknowledges the entry; FastStream sends no XACK of its own after it
    (a round trip per failure that acknowledged nothing).

    Counted by the clients of this process, for this stream: no ``XACK`` command at all (the
    scripts' own are inside ``EVALSHA``), and nothing pending. The server's ``INFO
    commandstats`` counted the other tests' too when they ran beside it.
    """
    sent: list[int] = []
    xack = Redis.xack

    def counted_xack(self: Redis, name: Any, groupname: Any, *ids: Any) -> Any:
        if (name.decode() if isinstance(name, bytes) else str(name)) == stream:
            sent.append(len(ids))
        return xack(self, name, groupname, *ids)

    monkeypatch.setattr(Redis, "xack", counted_xack)
    counted = Counted()
    broker = RedisBroker(redis_url, middlewares=[middleware(counted)])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, _ = counted.call(body, message)
        raise PermanentError(f"message {key}")

    async with running(broker):
        await publish(broker, stream, range(N))
        await dead_count(client, stream, N)
        await until(lambda: _pending_zero(client, stream), what="nothing pending")
        assert sent == [], "an XACK besides the steps' scripts"
    assert sorted(n for n, _ in await letters(client, stream)) == list(range(N))


BURST = 300
STEP_LATENCY_S = 1.0
"""A slow server's answer to each retry step: several are in flight when the stop comes."""


def _burst_broker(redis_url: str, stream: str, counted: Counted) -> RedisBroker:
    # 5 s: no copy comes back before the stop, which the test makes within about 1 s.
    retry = middleware(counted, RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=5))))
    broker = RedisBroker(redis_url, middlewares=[retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        key, attempt = counted.call(body, message)
        if attempt == 1:
            raise LinkDownError(f"message {key}")
        counted.done[key] += 1

    retry.install(broker)
    return broker


async def test_a_stop_in_the_middle_of_a_burst_loses_nothing(
    redis_url: str, client: Redis, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failure's step runs beside its handler (redis.settling); the stop awaits every one
    still in flight before the client closes. Stopped after 100 of 300 first attempts, with
    each step 1 s slow: every failed message's copy is stored and its entry acknowledged
    (nothing left pending as a lost attempt), the rest of the read released; a second start
    handles every id exactly once more: sent = processed, none lost, none twice."""
    from faststream_retry.redis import steps  # noqa: PLC0415 - the step slowed for this test

    original = steps.retry_later

    async def slow(*args: Any, **kwargs: Any) -> tuple[int, int]:
        await asyncio.sleep(STEP_LATENCY_S)
        return await original(*args, **kwargs)

    monkeypatch.setattr(steps, "retry_later", slow)
    await fill_backlog(client, stream, BURST)
    counted = Counted()
    broker = _burst_broker(redis_url, stream, counted)
    await broker.start()
    try:
        await eventually(lambda: len(counted.calls) >= 100, what="100 first attempts")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    failed = set(counted.calls)
    assert all(calls == [1] for calls in counted.calls.values())
    keys = stream_keys(stream)
    assert (await client.xpending(stream, "g"))["pending"] == 0, "each step ran to its XACK"
    assert await client.zcard(keys.schedule) == len(failed), "a copy per failure, stored"
    assert counted.kinds() == {"scheduled": len(failed)}, "each reported once its script answered"
    monkeypatch.setattr(steps, "retry_later", original)
    again = Counted()
    async with running(_burst_broker(redis_url, stream, again)):
        await eventually(
            lambda: sum(again.done.values()) >= BURST, timeout=60, what=f"{BURST} handled"
        )
    assert again.done == dict.fromkeys(range(BURST), 1), "sent = processed: each id once"
    for key in range(BURST):
        assert again.calls[key] == ([2] if key in failed else [1, 2]), key
    await settled(client, stream)
