"""Dead letters on Redis are reported where they are, on a real server.

- The sink's: the log line and the hook name the stream key ``{S}.dlq`` that holds the
  letter, not RabbitMQ's ``S.dlq`` (an empty key on Redis).
- The claimer's: an entry a dead consumer left, dead-lettered by the claimer, reaches the
  app's hooks, metrics and log as the sink's do: one hook call per letter, by id.
- The claimer's retries too: each entry it schedules again is one ``scheduled`` event
  (a lost consumer: a transient failure, the plugin's own rule), counted and logged, and
  then handled once.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import (
    EventKind,
    Fixed,
    PermanentError,
    RetryEvent,
    RetryMiddleware,
    RetryPolicy,
)
from faststream_retry.core import headers as h
from faststream_retry.redis.claimer import CONSUMER_LOST
from faststream_retry.redis.keys import stream_keys
from faststream_retry.reporting.telemetry import METRICS
from tests.dead_letter_lines import dead_letter_lines
from tests.observed import Observed
from tests.rabbit import eventually
from tests.redis.support import read_stream, until
from tests.redis.test_claimer import N, kill_mid_message

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

DEAD = 4


async def test_the_dead_letter_line_names_the_stream_that_holds_the_letter(
    redis_url: str, client: Redis, stream: str
) -> None:
    """Each line's place is ``{S}.dlq`` and the hook event's ``dlq``; that stream holds the
    letter, by the message id the line names, one each."""
    events: list[RetryEvent] = []
    retry = RetryMiddleware(claim_idle=timedelta(seconds=5), hooks=[events.append])
    broker = RedisBroker(redis_url, middlewares=[retry])
    retry.install(broker)

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any]) -> None:
        raise PermanentError(f"message {body['id']} is bad")

    with dead_letter_lines() as lines:
        await broker.start()
        try:
            for n in range(DEAD):
                await broker.publish({"id": n}, stream=stream, headers={"message_id": f"m-{n}"})
            await eventually(lambda: len(lines.places) == DEAD, what=f"{DEAD} dead-letter lines")
        finally:
            await broker.stop()
    assert set(lines.places) == {f"m-{n}" for n in range(DEAD)}
    for message_id, place in lines.places.items():
        assert place == stream_keys(stream).dlq, lines.lines
        letters = [
            m for _, m in await read_stream(client, place) if m.headers["message_id"] == message_id
        ]
        assert len(letters) == 1, (place, message_id)
        assert letters[0].headers[h.REASON] == "permanent"
    assert not await client.exists(f"{stream}.dlq")
    dead = {e.message_id: e.dlq for e in events if e.kind is EventKind.DEAD_LETTERED}
    assert dead == lines.places


async def test_dead_letters_the_claimer_settles_reach_the_apps_hooks_metrics_and_log(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A consumer killed mid-message, ``max_attempts=1``: the claimer dead-letters all it
    held, and each letter is one hook call, one line naming the ``.dlq`` and one count,
    by entry id; no handler runs."""
    await kill_mid_message(client, redis_url, stream)
    entry_ids = {entry_id for entry_id, _ in await read_stream(client, stream)}
    assert len(entry_ids) == N
    events: list[RetryEvent] = []
    observed = Observed()
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=1),
        claim_idle=timedelta(seconds=1),
        hooks=[events.append],
        **observed.providers(),
    )
    broker = RedisBroker(redis_url, middlewares=[retry])
    retry.install(broker)
    handled: list[Any] = []

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c2"))
    async def handle(body: dict[str, Any]) -> None:
        handled.append(body)

    dlq = stream_keys(stream).dlq
    with dead_letter_lines() as lines:
        await broker.start()
        try:

            async def all_dead() -> bool:
                return int(await client.xlen(dlq)) >= N

            await until(all_dead, timeout=30, what="every entry dead-lettered")
            await eventually(lambda: len(events) >= N, what=f"{N} hook calls")
        finally:
            await broker.stop()
    letters = [m for _, m in await read_stream(client, dlq)]
    assert sorted(json.loads(m.body)["id"] for m in letters) == list(range(N))
    assert [e.kind for e in events] == [EventKind.DEAD_LETTERED] * N
    assert {e.message_id for e in events} == entry_ids, "one hook call per dead letter, by id"
    for event in events:
        assert (event.queue, event.dlq, event.reason) == (stream, dlq, "exhausted")
        assert (event.attempt, event.max_attempts) == (1, 1)
        assert event.exception == CONSUMER_LOST
    assert lines.places == dict.fromkeys(entry_ids, dlq)
    assert observed.counter(METRICS.DEAD_LETTERED) == N
    assert not handled, "no handler ran again"


async def test_retries_the_claimer_schedules_reach_the_apps_hooks_metrics_and_log(
    redis_url: str, client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer killed mid-message, ``max_attempts=3``: the claimer schedules each entry it
    held again, one ``scheduled`` event, one count and one log line each, by entry id,
    before the entry comes back and its handler runs once."""
    await kill_mid_message(client, redis_url, stream)
    entry_ids = {entry_id for entry_id, _ in await read_stream(client, stream)}
    events: list[RetryEvent] = []
    observed = Observed()
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
        claim_idle=timedelta(seconds=1),
        hooks=[events.append],
        **observed.providers(),
    )
    broker = RedisBroker(redis_url, middlewares=[retry])
    retry.install(broker)
    handled: list[int] = []

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c2"))
    async def handle(body: dict[str, Any]) -> None:
        handled.append(body["id"])

    with caplog.at_level("INFO", logger="faststream_retry"):
        await broker.start()
        try:
            await eventually(lambda: len(handled) >= N, timeout=30, what="every entry handled")
        finally:
            await broker.stop()
    assert sorted(handled) == list(range(N)), "each entry handled once"
    scheduled = [e for e in events if e.kind is EventKind.SCHEDULED]
    assert len(scheduled) == N
    assert {e.message_id for e in scheduled} == entry_ids, "one event per claimed entry, by id"
    for event in scheduled:
        assert (event.queue, event.attempt, event.max_attempts) == (stream, 1, 3)
        assert (event.exception, event.classification, event.rule) == (
            CONSUMER_LOST,
            "transient",
            "builtin",
        )
        assert event.delay_ms == 200
        assert event.due_ms is not None
        assert event.due_ms - event.at_ms <= 200
        assert event.error is not None
        assert "without acknowledging it" in event.error
    assert observed.counter(METRICS.SCHEDULED) == N
    lines = [r.getMessage() for r in caplog.records if "retry scheduled" in r.getMessage()]
    assert len(lines) == N, lines[:3]
