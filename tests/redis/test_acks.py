"""A handled entry's XACK beside the handlers (redis.acks), against a real server.

Each test slows the plugin's ``XACK`` (a slow link to Redis) so that many successes are
handled while one is in flight; the server counts the commands (``INFO commandstats``).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream import AckPolicy, BaseMiddleware
from faststream.exceptions import AckMessage, NackMessage, RejectMessage
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisStreamMessage
from redis.asyncio import Redis

from faststream_retry import RetryMiddleware
from faststream_retry.redis import acks
from tests.redis.support import fill_backlog, until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

N = 300
XACK_LATENCY_S = 0.05


@pytest.fixture
def slow_xack(monkeypatch: pytest.MonkeyPatch) -> float:
    """Every XACK of the plugin's waits ``XACK_LATENCY_S`` before it is sent."""
    send = acks.Acks._send

    async def slow(self: acks.Acks, *args: Any) -> None:
        await asyncio.sleep(XACK_LATENCY_S)
        await send(self, *args)

    monkeypatch.setattr(acks.Acks, "_send", slow)
    return XACK_LATENCY_S


@pytest.fixture
def xacks(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Every XACK sent by any client of this process (FastStream's and the plugin's): the
    number of ids of each, by stream (the server's counts mix in the other tests')."""
    sent: dict[str, list[int]] = {}
    xack = Redis.xack

    def counted(self: Redis, name: Any, groupname: Any, *ids: Any) -> Any:
        key = name.decode() if isinstance(name, bytes) else str(name)
        sent.setdefault(key, []).append(len(ids))
        return xack(self, name, groupname, *ids)

    monkeypatch.setattr(Redis, "xack", counted)
    return sent


async def _pending(client: Redis, stream: str) -> int:
    return int((await client.xpending(stream, "g"))["pending"])


def _broker(
    redis_url: str,
    stream: str,
    handled: set[int],
    *,
    ack_policy: AckPolicy = AckPolicy.REJECT_ON_ERROR,
    outer: list[Any] | None = None,
) -> RedisBroker:
    retry = RetryMiddleware(claim_idle=timedelta(seconds=30))
    broker = RedisBroker(redis_url, middlewares=[*(outer or []), retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"), ack_policy=ack_policy)
    async def handle(body: dict[str, Any]) -> None:
        handled.add(body["id"])

    retry.install(broker)
    return broker


async def test_successes_are_acknowledged_in_few_xacks_beside_their_handlers(
    redis_url: str, client: Redis, stream: str, slow_xack: float, xacks: dict[str, list[int]]
) -> None:
    """300 handled entries, the plugin's XACK 50 ms slow: every one acknowledged, each
    once, in far fewer XACKs than entries (FastStream sends one an entry, in the handler's
    turn), and the handlers did not wait for them (300 x 50 ms would be 15 s)."""
    await fill_backlog(client, stream, N)
    handled: set[int] = set()
    broker = _broker(redis_url, stream, handled)
    await broker.start()
    try:
        started = asyncio.get_running_loop().time()
        await until(lambda: _done(handled), what="every entry handled")
        took = asyncio.get_running_loop().time() - started
        await until(lambda: _none_pending(client, stream), what="every entry acknowledged")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    assert handled == set(range(N))
    sent = xacks[stream]
    assert sum(sent) == N, "each entry in one XACK"
    assert len(sent) < N // 10, f"{len(sent)} XACKs for {N} entries"
    assert took < N * slow_xack / 3, f"handled in {took:.1f} s"


async def test_the_stop_waits_for_every_handled_entrys_xack(
    redis_url: str, client: Redis, stream: str, slow_xack: float
) -> None:
    """Stopped as soon as every entry is handled, the XACKs of many still queued: once
    ``broker.stop()`` returned, none is pending (left pending, each would be claimed and
    handled again)."""
    del slow_xack
    await fill_backlog(client, stream, N)
    handled: set[int] = set()
    broker = _broker(redis_url, stream, handled)
    await broker.start()
    try:
        await until(lambda: _done(handled), what="every entry handled")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    assert await _pending(client, stream) == 0


async def test_a_manual_ack_subscriber_s_entries_are_left_to_its_handler(
    redis_url: str, client: Redis, stream: str
) -> None:
    """``AckPolicy.MANUAL``: FastStream acknowledges nothing, and neither does the plugin."""
    await fill_backlog(client, stream, 20)
    handled: set[int] = set()
    broker = _broker(redis_url, stream, handled, ack_policy=AckPolicy.MANUAL)
    await broker.start()
    try:
        await until(lambda: _done(handled, 20), what="every entry handled")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    assert await _pending(client, stream) == 20


class RaisesAfter(BaseMiddleware):
    """An app's middleware, outside the plugin, that fails after the handler succeeded."""

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
        result = await call_next(msg)
        if json.loads(msg.body)["id"] % 2:
            raise RuntimeError("the app's middleware failed after the handler")
        return result


async def test_an_entry_a_middleware_outside_fails_is_left_as_faststream_leaves_it(
    redis_url: str, client: Redis, stream: str
) -> None:
    """The plugin acknowledges where FastStream would: after every middleware of the app.
    One that raises after the handler succeeded leaves the entry unacknowledged, as
    without the plugin (FastStream's reject on Redis sends no XACK): the odd ids stay
    pending, the even ones are acknowledged."""
    await fill_backlog(client, stream, 20)
    handled: set[int] = set()
    broker = _broker(redis_url, stream, handled, outer=[RaisesAfter])
    await broker.start()
    try:
        await until(lambda: _done(handled, 20), what="every entry handled")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    pending = await client.xpending_range(stream, "g", min="-", max="+", count=100)
    assert len(pending) == 10


async def _done(handled: set[int], n: int = N) -> bool:
    return len(handled) >= n


async def _none_pending(client: Redis, stream: str) -> bool:
    return await _pending(client, stream) == 0


async def _acks_itself(msg: RedisStreamMessage) -> None:
    await msg.ack()


async def _nacks_itself(msg: RedisStreamMessage) -> None:
    await msg.nack()


async def _raises_ack(msg: RedisStreamMessage) -> None:
    raise AckMessage


async def _raises_nack(msg: RedisStreamMessage) -> None:
    raise NackMessage


async def _raises_reject(msg: RedisStreamMessage) -> None:
    raise RejectMessage


async def _returns(msg: RedisStreamMessage) -> None:
    del msg


@pytest.mark.parametrize(
    "case",
    [
        (AckPolicy.REJECT_ON_ERROR, _acks_itself, 0),
        (AckPolicy.REJECT_ON_ERROR, _nacks_itself, 10),
        (AckPolicy.REJECT_ON_ERROR, _raises_ack, 0),
        (AckPolicy.REJECT_ON_ERROR, _raises_nack, 10),
        (AckPolicy.REJECT_ON_ERROR, _raises_reject, 10),
        (AckPolicy.ACK, _returns, 0),
        (AckPolicy.NACK_ON_ERROR, _returns, 0),
        (AckPolicy.NACK_ON_ERROR, _nacks_itself, 10),
    ],
)
async def test_the_handler_s_own_decision_and_the_ack_policy_are_kept(
    redis_url: str,
    client: Redis,
    stream: str,
    case: tuple[AckPolicy, Callable[[RedisStreamMessage], Awaitable[None]], int],
) -> None:
    """What a handler decides itself (``msg.ack()``, ``msg.nack()``, ``AckMessage``,
    ``NackMessage``, ``RejectMessage``) is what FastStream does with it, batched XACKs or
    not: the plugin queues only a success nobody settled, under every policy that
    acknowledges one (a nack or a reject leaves a Redis entry pending, as FastStream does)."""
    ack_policy, decides, left_pending = case
    await fill_backlog(client, stream, 10)
    handled: set[int] = set()
    retry = RetryMiddleware(claim_idle=timedelta(seconds=30))
    broker = RedisBroker(redis_url, middlewares=[retry])

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"), ack_policy=ack_policy)
    async def handle(body: dict[str, Any], msg: RedisStreamMessage) -> None:
        handled.add(body["id"])
        await decides(msg)

    retry.install(broker)
    await broker.start()
    try:
        await until(lambda: _done(handled, 10), what="every entry handled")
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    assert await _pending(client, stream) == left_pending


@pytest.mark.parametrize("stops_first", [False, True], ids=["broker-stops", "subscriber-stops"])
async def test_a_late_subscriber_s_xacks_are_awaited_at_the_stop(
    redis_url: str, client: Redis, stream: str, slow_xack: float, stops_first: bool
) -> None:
    """A subscriber that joins the running broker has an engine of its own, and its
    successes' XACKs are queued there (``engine_of``): stopped as soon as its backlog is
    handled (the broker, or the subscriber alone and then the broker), none is left
    pending."""
    del slow_xack
    await fill_backlog(client, stream, N)
    handled: set[int] = set()
    retry = RetryMiddleware(claim_idle=timedelta(seconds=30))
    broker = RedisBroker(redis_url, middlewares=[retry])

    @broker.subscriber(stream=StreamSub(f"{stream}-first", group="g", consumer="c1"))
    async def first(body: dict[str, Any]) -> None:
        del body

    retry.install(broker)
    await broker.start()
    try:
        sub = broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))

        @sub
        async def late(body: dict[str, Any]) -> None:
            handled.add(body["id"])

        await sub.start()
        await until(lambda: _done(handled), what="every entry handled")
        if stops_first:
            await asyncio.wait_for(sub.stop(), 30)
    finally:
        await asyncio.wait_for(broker.stop(), 30)
    assert await _pending(client, stream) == 0
