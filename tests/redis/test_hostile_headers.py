"""Hostile headers on Redis (the RabbitMQ fault suite's S1, on a real redis-server).

Generated header sets (forged ``retry-*`` values, JSON of anything, numbers JSON cannot
hold) arrive at a covered stream, in FastStream's own envelope and in another client's
JSON one. Every entry ends
handled or in the stream's dead letters, once; a subscriber of another stream gets none
of them; nothing is left pending, scheduled or stored.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from hypothesis import strategies as st

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy
from faststream_retry.redis.envelope import DATA_FIELD
from faststream_retry.redis.keys import stream_keys
from tests.rabbit import eventually
from tests.redis.support import read_stream, until
from tests.strategies import draw, header_texts, json_values, shown, text_header_names

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

EXAMPLES = 150

HAND_PICKED: list[dict[str, Any]] = [
    {"retry-attempt": 2**31 + 7, "retry-due": 0},
    {"retry-attempt": -5, "retry-due": -1},
    {"retry-attempt": "1e9", "retry-due": "soon"},
    {"retry-due": 2**80, "retry-attempt": 1},
    {"retry-history": [{"attempt": "x"}, 5, None]},
    {"retry-history": "[" * 5000},
    {"retry-origin-queue": "other-stream", "retry-reason": "permanent"},
    {"traceparent": "00-zz-yy-01", "tracestate": "\u00ff"},
    {"retry-version": 99},
    {"retry-due": float("nan"), "app": [{"x": float("inf")}]},
]


def id_of(body: bytes) -> int:
    """The id in a dead letter's body: its JSON, or FastStream's whole envelope when
    FastStream could not read it (0.7.8 writes a non-ASCII header value's length in
    characters, not bytes, and then reads its own entry as raw bytes)."""
    found = re.search(rb'\{"id": ?(\d+)\}', body)
    assert found is not None, body
    return int(found[1])


async def test_hostile_headers_never_crash_misroute_or_lose(
    redis_url: str, client: Redis, stream: str
) -> None:
    """Each set reaches the handler or the dead letters, once, and nowhere else."""
    other = f"{stream}-other"
    broker = RedisBroker(
        redis_url,
        middlewares=[
            RetryMiddleware(
                RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
                claim_idle=timedelta(seconds=5),
            )
        ],
    )
    failed_once: set[int] = set()
    processed: list[int] = []
    strays: list[Any] = []

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any]) -> None:
        n = int(body["id"])
        if n not in failed_once:
            failed_once.add(n)
            raise ConnectionError("the first delivery fails, so the headers are read")
        processed.append(n)

    @broker.subscriber(stream=StreamSub(other, group="g", consumer="c1"))
    async def sibling(body: Any) -> None:
        strays.append(body)

    generated = draw(
        st.dictionaries(text_header_names, st.one_of(json_values, header_texts), max_size=8),
        EXAMPLES,
    )
    sets = HAND_PICKED + generated
    sent: list[int] = []
    await broker.start()
    try:
        for n, headers in enumerate(sets):
            # FastStream's own format carries text values; another client's JSON envelope
            # (which FastStream reads too) carries any JSON, NaN and 2**80 included.
            as_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in headers.items()}
            await broker.publish({"id": 2 * n}, stream=stream, headers=as_text)
            envelope = {"data": json.dumps({"id": 2 * n + 1}), "headers": headers}
            await client.xadd(stream, {DATA_FIELD: json.dumps(envelope)})
            sent += [2 * n, 2 * n + 1]
        dead: list[int] = []

        async def all_settled() -> bool:
            dead[:] = [id_of(m.body) for _, m in await read_stream(client, stream_keys(stream).dlq)]
            return len(set(processed) | set(dead)) >= len(sent)

        try:
            await until(all_settled, 120, f"{len(sent)} entries handled or dead-lettered")
        except pytest.fail.Exception:
            lost = sorted(set(sent) - set(processed) - set(dead))
            pytest.fail(f"lost, with their headers: {[(n, shown(sets[n // 2])) for n in lost]!r}")
        # The mover and the claimer still work: a plain retry after the storm comes back.
        after = 2 * len(sets)
        await broker.publish({"id": after}, stream=stream)
        sent.append(after)
        await eventually(lambda: after in processed, 15, "a retry after the storm")

        async def nothing_left() -> bool:
            keys = stream_keys(stream)
            return (
                (await client.xpending(stream, "g"))["pending"] == 0
                and await client.zcard(keys.schedule) == 0
                and await client.hlen(keys.data) == 0
            )

        await until(nothing_left, 15, "nothing pending, scheduled or stored")
    finally:
        await broker.stop()
    letters = await read_stream(client, stream_keys(stream).dlq)
    dead = [id_of(m.body) for _, m in letters]
    assert sorted(processed + dead) == sorted(sent), "each entry once, handled or dead"
    assert strays == []
    reasons = {m.headers.get("retry-reason") for _, m in letters}
    # permanent: FastStream could not read its own envelope (below), so the handler's
    # argument failed validation, a permanent error.
    assert reasons <= {"exhausted", "invalid", "permanent"}, reasons
