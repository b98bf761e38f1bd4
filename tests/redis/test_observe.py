"""What a RedisBroker's retries tell OpenTelemetry, on a real server: spans that say
``messaging.system = redis`` and the key each copy went to, and the dead-letter gauge
reading the ``.dlq``'s real length."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisStreamMessage

from faststream_retry import Fixed, PermanentError, RetryMiddleware, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.redis.keys import stream_keys
from faststream_retry.reporting.telemetry import ATTR
from tests.observed import Observed
from tests.rabbit import eventually
from tests.redis.support import until

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

RETRIED = 5
DEAD = 3


async def test_a_retried_and_a_dead_lettered_message_say_redis_and_their_keys(
    redis_url: str, client: Redis, stream: str
) -> None:
    """Retry spans name the schedule, dead-letter spans the ``.dlq``, releases the broker;
    the gauge reads what ``XLEN`` of the ``.dlq`` says, scrape after scrape."""
    observed = Observed()
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
        claim_idle=timedelta(seconds=5),
        **observed.providers(),
    )
    broker = RedisBroker(redis_url, middlewares=[retry])
    retry.install(broker)
    done: set[int] = set()

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
        n = int(body["id"])
        if n >= RETRIED:
            raise PermanentError(f"message {n} is bad")
        if h.read_attempt(message.headers) == 0:
            raise ConnectionError(f"message {n}: link down")
        done.add(n)

    keys = stream_keys(stream)
    await broker.start()
    try:
        for n in range(RETRIED + DEAD):
            await broker.publish({"id": n}, stream=stream)
        await eventually(lambda: len(done) == RETRIED, what="every retried message handled")

        async def all_dead() -> bool:
            return int(await client.xlen(keys.dlq)) == DEAD

        await until(all_dead, what=f"{DEAD} dead letters")
        # The gauge shows what the read before asked for: scrape until it has caught up.
        await eventually(
            lambda: observed.dead_letter_gauge().get(stream) == DEAD,
            what=f"the gauge at the .dlq's {DEAD}",
        )
        await client.xtrim(keys.dlq, maxlen=1)  # an operator replayed two of them
        await eventually(
            lambda: observed.dead_letter_gauge().get(stream) == 1, what="the gauge following"
        )
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()
    assert done == set(range(RETRIED))
    scheduled = observed.attributes("retry scheduled")
    assert len(scheduled) == RETRIED
    for attributes in scheduled:
        assert attributes[ATTR.SYSTEM] == "redis"
        assert attributes[ATTR.DESTINATION] == keys.schedule
        assert ATTR.ROUTING_KEY not in attributes
    dead = observed.attributes("dead-letter")
    assert len(dead) == DEAD
    for attributes in dead:
        assert attributes[ATTR.SYSTEM] == "redis"
        assert attributes[ATTR.DESTINATION] == keys.dlq
        assert attributes[ATTR.QUEUE] == stream
    assert len(observed.spans("retry release")) == RETRIED
    assert observed.systems() == {"redis"}
    assert stream not in observed.dead_letter_gauge(), "a stopped app shows no stale depth"
