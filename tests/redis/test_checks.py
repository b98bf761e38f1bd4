"""The engine refuses at start what the server cannot hold safely, naming the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from redis.exceptions import ResponseError

from faststream_retry.core import headers as h
from faststream_retry.errors import RetryConfigError, RetryTopologyError
from faststream_retry.redis import envelope
from faststream_retry.redis.engine import RedisRetryEngine
from faststream_retry.redis.steps import StreamEntry

if TYPE_CHECKING:
    from redis.asyncio import Redis


pytestmark = pytest.mark.redis


async def test_a_supported_server_passes_and_says_what_it_is(client: Redis, stream: str) -> None:
    """Redis 7.0 or later, or Valkey; the checks read no CONFIG."""
    engine = RedisRetryEngine(client, [(stream, "g")])
    await engine.start()
    await engine.stop()
    assert engine.server is not None
    assert engine.server.flavour in {"redis", "valkey"}
    assert engine.server.version is not None
    assert engine.server.version >= (7, 0)


async def test_an_eviction_policy_that_may_drop_the_schedule_is_refused(
    client: Redis, stream: str
) -> None:
    """allkeys-lru: the step's keys could be evicted; the error says noeviction."""
    before = str((await client.config_get("maxmemory-policy"))["maxmemory-policy"])
    await client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(RetryTopologyError, match="maxmemory-policy noeviction"):
            await RedisRetryEngine(client, [(stream, "g")]).start()
    finally:
        await client.config_set("maxmemory-policy", before)


async def test_a_stream_two_groups_read_is_refused(client: Redis, stream: str) -> None:
    """A copy goes back into the stream, where every group would read it again."""
    await client.xgroup_create(stream, "g", mkstream=True)
    await client.xgroup_create(stream, "other", mkstream=True)
    with pytest.raises(RetryTopologyError, match="read by 2 consumer groups"):
        await RedisRetryEngine(client, [(stream, "g")]).start()
    with pytest.raises(RetryConfigError, match="a stream of its own"):
        RedisRetryEngine(client, [(stream, "g"), (stream, "other")])


def test_a_stream_name_no_hash_tag_can_follow_is_refused_before_start(client: Redis) -> None:
    """Refused when the engine is built, before anything is sent."""
    with pytest.raises(RetryConfigError, match="hash tag"):
        RedisRetryEngine(client, [("a}b", "g")])


async def test_a_full_server_refuses_a_retry_whole_and_lets_a_dead_letter_through(
    client: Redis, stream: str
) -> None:
    """Under noeviction past maxmemory: new messages refused, and each step done whole or not.

    A retry's script is refused before it writes anything: its entry stays pending (nothing
    lost) and a full server does not grow by a copy per failing entry of the backlog. A dead
    letter's is flagged allow-oom and goes through, acknowledging its entry; the mover's
    XADD is refused, so a copy already scheduled waits there until memory is freed.
    """
    await client.xgroup_create(stream, "g", id="$", mkstream=True)
    for _ in range(3):
        await client.xadd(stream, {envelope.DATA_FIELD: envelope.build(b"{}", {})})
    reply: Any = await client.xreadgroup("g", "c", {stream: ">"})
    ((_, rows),) = reply
    scheduled, refused, dead = (StreamEntry(stream, "g", i.decode(), f) for i, f in rows)
    engine = RedisRetryEngine(client, [(stream, "g")])
    keys = engine.keys(stream)
    assert await engine.retry_later(scheduled, delay_ms=0, headers={h.ATTEMPT: 1}) is not None
    await client.config_set("maxmemory", "1")
    try:
        with pytest.raises(ResponseError, match="maxmemory"):
            await client.xadd(stream, {"new": "message"})
        with pytest.raises(ResponseError, match="maxmemory"):
            await engine.retry_later(refused, delay_ms=0, headers={h.ATTEMPT: 1})
        assert await client.zcard(keys.schedule) == 1, "the refused retry wrote nothing"
        assert await engine.dead_letter(dead, headers={h.REASON: "exhausted"}) is True
        assert (await client.xpending(stream, "g"))["pending"] == 1, "the refused one"
        assert await client.xlen(keys.dlq) == 1
        with pytest.raises(ResponseError, match="maxmemory"):
            await engine.mover.move_once(keys)
        assert await client.zcard(keys.schedule) == 1
    finally:
        await client.config_set("maxmemory", "0")
    assert (await engine.mover.move_once(keys))[0] == 1
