"""Hostile entries in a covered stream: read without raising, and never the claimer's end.

Found in review: a 19-byte entry (``{"data": "\\ud800"}``) raised out of the envelope's
parser, and the claimer that claimed it from a dead consumer ended for good, on every
replica in turn: no lost consumer's entry was claimed again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from faststream_retry.redis import envelope
from faststream_retry.redis.engine import RedisRetryEngine
from faststream_retry.redis.keys import stream_keys
from faststream_retry.redis.steps import StreamEntry

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
