"""``RetryMiddleware(dlq_max_length=...)`` on a real Redis: the ``.dlq`` keeps about that
many letters, the newest; past the cap the oldest are trimmed (``MAXLEN ~``: whole nodes
of ``stream-node-max-entries``, 100 by default, so it runs over by less than one node)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import PermanentError, RetryMiddleware
from faststream_retry.redis.keys import stream_keys
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

SENT = 300
CAP = 10


async def dead_letter_all(redis_url: str, client: Redis, stream: str, **options: Any) -> list[int]:
    """Dead-letter SENT messages one after another; return the ids the ``.dlq`` holds, in order."""
    retry = RetryMiddleware(claim_idle=timedelta(seconds=5), **options)
    broker = RedisBroker(redis_url, middlewares=[retry])
    retry.install(broker)
    seen: list[int] = []

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any]) -> None:
        seen.append(int(body["id"]))
        raise PermanentError(f"message {body['id']} is bad")

    dlq = stream_keys(stream).dlq
    await broker.start()
    try:
        for n in range(SENT):
            await broker.publish({"id": n}, stream=stream)

        async def all_settled() -> bool:
            info = await client.xinfo_groups(stream)
            return len(seen) == SENT and all(int(g["pending"]) == 0 for g in info)

        await until(all_settled, timeout=60, what=f"{SENT} messages dead-lettered")
    finally:
        await broker.stop()
    return [json.loads(m.body)["id"] for _, m in await read_stream(client, dlq)]


async def test_past_the_cap_the_oldest_dead_letters_are_trimmed(
    redis_url: str, client: Redis, stream: str
) -> None:
    """300 letters, cap 10: fewer than 10 + one node are kept, at least 10, and they are the
    newest, in order: the oldest went."""
    kept = await dead_letter_all(redis_url, client, stream, dlq_max_length=CAP)
    config = await client.config_get("stream-node-max-entries")
    node = int(config.get("stream-node-max-entries") or 100)
    assert CAP <= len(kept) < CAP + node, len(kept)
    assert kept == list(range(SENT - len(kept), SENT)), "the newest kept, the oldest trimmed"


async def test_with_no_cap_every_dead_letter_is_kept(
    redis_url: str, client: Redis, stream: str
) -> None:
    """``dlq_max_length=None``: all 300 letters stay."""
    kept = await dead_letter_all(redis_url, client, stream, dlq_max_length=None)
    assert kept == list(range(SENT))


async def test_a_cap_lower_than_what_the_dlq_holds_deletes_nothing_at_the_next_letter(
    redis_url: str, client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """300 letters kept with no cap, then a start with cap 10 (a lowered dlq_max_length):
    a warning names the .dlq and the fix, and the next 300 letters trim nothing (600 kept):
    only the operator deletes dead letters."""
    assert len(await dead_letter_all(redis_url, client, stream, dlq_max_length=None)) == SENT
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        kept = await dead_letter_all(redis_url, client, stream, dlq_max_length=CAP)
    assert kept == list(range(SENT)) * 2, "no dead letter trimmed"
    said = [r.getMessage() for r in caplog.records if "cap is not applied" in r.getMessage()]
    assert len(said) == 1, said
    assert f"{stream_keys(stream).dlq} holds {SENT} dead letters" in said[0]
    assert "dlq export/replay" in said[0]
