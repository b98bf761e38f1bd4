"""Hostile entries in a covered stream: read without raising, and never the claimer's end.

And an entry no copy can be built for (more headers than FastStream's binary format holds)
is dead-lettered as ``invalid`` with its raw bytes, by the sink and by the claimer, rather
than left pending for ever.

Found in review: a 19-byte entry (``{"data": "\\ud800"}``) raised out of the envelope's
parser, and the claimer that claimed it from a dead consumer ended for good, on every
replica in turn: no lost consumer's entry was claimed again.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from redis.asyncio import Redis

from faststream_retry import EventKind, Reason, RetryEvent, RetryMiddleware, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.redis import envelope
from faststream_retry.redis.engine import RedisRetryEngine
from faststream_retry.redis.keys import stream_keys
from faststream_retry.redis.steps import StreamEntry
from tests.redis.support import read_stream, until

GROUP = "g"

HOSTILE = {
    "json data with a lone surrogate": b'{"data": "\\ud800"}',
    "json header key with a lone surrogate": b'{"data": "x", "headers": {"\\ud800": "v"}}',
    "json body nested 100,000 deep": b"[" * 100_000,
    "binary retry-history nested 5,000 deep": envelope.build(b"x", {"retry-history": "[" * 5000}),
}


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_an_entry_is_read_whatever_its_bytes(data: bytes) -> None:
    """The envelope's parser and the header reader never raise, as their docstrings say."""
    entry = StreamEntry("s", GROUP, "1-0", {envelope.DATA_FIELD: data})
    headers = entry.incoming_headers()
    envelope.build(b"copy", {str(k): str(v) for k, v in headers.items()})


@pytest.mark.redis
async def test_a_hostile_entry_does_not_stop_the_claimer(client: Redis, stream: str) -> None:
    """A dead consumer left a hostile entry before a good one: the pass settles the good one."""
    good = envelope.build(b'{"id": 1}', {"content-type": "application/json"})
    await client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    for data in (HOSTILE["json data with a lone surrogate"], good):
        await client.xadd(stream, {envelope.DATA_FIELD: data})
    reply: Any = await client.xreadgroup(GROUP, "dead", {stream: ">"}, count=10)
    assert sum(len(batch) for _, batch in reply) == 2
    engine = RedisRetryEngine(client, [(stream, GROUP)], claim_idle_ms=1)
    assert engine.claimer is not None
    await asyncio.sleep(0.01)
    await engine.claimer._claim(stream_keys(stream), GROUP)  # the task's body: must not raise
    keys = stream_keys(stream)
    settled = await client.xlen(keys.dlq) if await client.exists(keys.dlq) else 0
    settled += await client.zcard(keys.schedule)
    assert settled >= 1, "the good entry behind the hostile one was settled"


MANY_HEADERS = json.dumps(
    {"data": '{"id": 1}', "headers": {f"h{i}": "v" for i in range(70_000)}}
).encode()
"""A JSON envelope with more headers than FastStream's binary format holds (65,535): no copy
of it can be written, not even a lean dead letter (the lean one keeps the message's headers)."""


def invalid_letter_of(letter: envelope.Envelope, stream: str) -> None:
    """A minimal dead letter: the entry's bytes as they were, the retry state alone."""
    headers = envelope.from_wire(letter.headers)
    assert letter.body == MANY_HEADERS
    assert headers[h.REASON] == "invalid"
    assert headers[h.ORIGIN_QUEUE] == stream
    assert "could not be built" in headers[h.ERROR]
    assert not any(key.startswith("h") and key[1:].isdigit() for key in headers)


@pytest.mark.redis
async def test_an_entry_the_claimer_cannot_copy_is_dead_lettered_as_invalid(
    client: Redis, stream: str
) -> None:
    """A dead consumer left an entry no copy can be built for: the claimer dead-letters it as
    invalid with its raw bytes, rather than leaving it pending for ever."""
    await client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    await client.xadd(stream, {envelope.DATA_FIELD: MANY_HEADERS})
    await client.xreadgroup(GROUP, "dead", {stream: ">"}, count=10)
    engine = RedisRetryEngine(client, [(stream, GROUP)], claim_idle_ms=1)
    assert engine.claimer is not None
    await asyncio.sleep(0.01)
    keys = stream_keys(stream)
    assert await engine.claimer.claim_once(keys, GROUP) == 1
    assert (await client.xpending(stream, GROUP))["pending"] == 0
    ((_, letter),) = await read_stream(client, keys.dlq)
    invalid_letter_of(letter, stream)


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_failed_entry_the_sink_cannot_copy_is_dead_lettered_as_invalid(
    redis_url: str, client: Redis, stream: str
) -> None:
    """FastStream reads the entry and its handler fails; the plugin cannot build its copy, so it
    dead-letters it as invalid with its raw bytes (before: the sink raised, and the entry
    stayed pending, for the claimer to fail on too), and reports it as every dead letter is:
    one hook event, ``invalid``, naming the stream that holds the letter."""
    events: list[RetryEvent] = []
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=3), claim_idle=timedelta(seconds=60), hooks=[events.append]
    )
    broker = RedisBroker(redis_url, middlewares=[retry])
    calls: list[int] = []

    @broker.subscriber(stream=StreamSub(stream, group=GROUP, consumer="c1"))
    async def handle(body: dict[str, Any]) -> None:
        calls.append(body["id"])
        raise ConnectionError("down")

    keys = stream_keys(stream)
    await broker.start()
    try:
        await client.xadd(stream, {envelope.DATA_FIELD: MANY_HEADERS})

        async def lettered() -> bool:
            return bool(await client.exists(keys.dlq)) and await client.xlen(keys.dlq) == 1

        await until(lettered, what="the entry dead-lettered as invalid")
        assert (await client.xpending(stream, GROUP))["pending"] == 0
    finally:
        await broker.stop()
    assert calls == [1]
    ((_, letter),) = await read_stream(client, keys.dlq)
    invalid_letter_of(letter, stream)
    dead = [e for e in events if e.kind is EventKind.DEAD_LETTERED]
    assert [(e.reason, e.dlq) for e in dead] == [(Reason.INVALID, keys.dlq)]
