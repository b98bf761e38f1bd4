"""Retries and dead letters through the engine, on a real server, counted by id."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from faststream_retry.core import headers as h
from tests.rabbit import eventually
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis

    from tests.redis.support import App

pytestmark = pytest.mark.redis

N = 100


async def test_a_failure_comes_back_once_after_its_delay_and_succeeds(
    make_app: Callable[..., App], client: Redis
) -> None:
    """Each message failing once is handled again once, with attempt 1 and its history."""
    app = make_app(fails=lambda _id, attempt: attempt == 1, delay_ms=300)
    await app.start()
    await app.publish(range(N))
    await eventually(lambda: sum(app.done.values()) >= N, what=f"{N} handled after a retry")
    assert app.done == dict.fromkeys(range(N), 1), "each id succeeded exactly once"
    assert {k: [a for a, _ in v] for k, v in app.calls.items()} == {n: [1, 2] for n in range(N)}
    keys = app.engine.keys(app.stream)
    assert await client.zcard(keys.schedule) == 0
    assert await client.hlen(keys.data) == 0
    assert (await client.xpending(app.stream, "g"))["pending"] == 0
    copies = [m for _, m in await read_stream(client, app.stream) if h.ATTEMPT in m.headers]
    assert sorted(json.loads(m.body)["id"] for m in copies) == list(range(N))
    for copy in copies:
        assert h.read_attempt(copy.headers) == 1
        (entry,) = h.read_history(copy.headers)
        assert entry["attempt"] == 1
        # Non-ASCII, which FastStream's own writer garbles: the handler still got a dict.
        assert entry["error"].endswith("σφάλμα ☃")
        assert h.read_text(copy.headers, "content-type") == "application/json"
    assert app.unsettled == 0


async def test_exhausted_messages_land_in_the_dead_letter_stream(
    make_app: Callable[..., App], client: Redis
) -> None:
    """Always failing, each message is called max_attempts times and dead-lettered once."""
    app = make_app(fails=lambda _id, _attempt: True, max_attempts=3, delay_ms=100)
    await app.start()
    await app.publish(range(N))
    dlq = app.engine.keys(app.stream).dlq

    async def all_dead() -> bool:
        return int(await client.xlen(dlq)) >= N

    await until(all_dead, what=f"{N} dead letters in {dlq}")
    letters = [m for _, m in await read_stream(client, dlq)]
    ids = sorted(json.loads(m.body)["id"] for m in letters)
    assert ids == list(range(N)), "each id dead-lettered exactly once"
    for letter in letters:
        assert letter.headers[h.REASON] == "exhausted"
        assert h.read_attempt(letter.headers) == 3
        assert [e["attempt"] for e in h.read_history(letter.headers)] == [1, 2, 3]
        assert letter.headers[h.ORIGIN_QUEUE] == app.stream
        assert letter.headers[h.EXCEPTION].endswith("HandlerError")
    assert {k: len(v) for k, v in app.calls.items()} == dict.fromkeys(range(N), 3)
    assert not app.done
    assert (await client.xpending(app.stream, "g"))["pending"] == 0
    assert await client.zcard(app.engine.keys(app.stream).schedule) == 0


async def test_a_copy_is_never_handled_before_its_delay(
    make_app: Callable[..., App], client: Redis
) -> None:
    """Delays from 0 to 1.5 s: every retry is handled at or after its failure plus its delay."""
    delays = {n: random.choice([0, 50, 200, 700, 1500]) for n in range(N)}
    app = make_app(fails=lambda _id, attempt: attempt == 1)
    app.delay_for = delays.__getitem__
    await app.start()
    await app.publish(range(N))
    await eventually(lambda: sum(app.done.values()) >= N, what="every retry handled")
    early = {
        n: (app.calls[n][1][1] - app.failed_at[(n, 1)], delays[n])
        for n in range(N)
        if app.calls[n][1][1] - app.failed_at[(n, 1)] < delays[n]
    }
    assert not early, f"handled before the delay (waited ms, delay ms): {early}"
    assert await client.zcard(app.engine.keys(app.stream).schedule) == 0


async def test_an_entry_another_producer_wrote_comes_back_as_the_same_message(
    make_app: Callable[..., App], client: Redis
) -> None:
    """Plain fields (no ``__data__``): the handler gets the same dict on its retry."""
    app = make_app(fails=lambda _id, attempt: attempt == 1, delay_ms=100)
    await app.start()
    for n in range(10):
        await client.xadd(app.stream, {"id": str(n), "note": "ünïcode"})
    await eventually(lambda: sum(app.done.values()) >= 10, what="10 handled after a retry")
    assert app.done == dict.fromkeys(range(10), 1)
    assert app.bodies[(3, 1)] == app.bodies[(3, 2)] == {"id": "3", "note": "ünïcode"}


async def test_two_replicas_share_the_stream_and_the_schedule(
    make_app: Callable[..., App], client: Redis
) -> None:
    """Two apps (consumers c1, c2; a mover each): 500 failing once, each handled twice in all."""
    n = 500
    apps = [
        make_app(fails=lambda _id, attempt: attempt == 1, delay_ms=200, consumer=name)
        for name in ("c1", "c2")
    ]
    for app in apps:
        await app.start()
    await apps[0].publish(range(n))

    def done() -> int:
        return sum(sum(app.done.values()) for app in apps)

    await eventually(lambda: done() >= n, timeout=60, what=f"{n} handled after a retry")
    calls = Counter(k for app in apps for k, v in app.calls.items() for _ in v)
    assert calls == dict.fromkeys(range(n), 2), "each handled twice: a failure, then a success"
    assert sum((app.done for app in apps), Counter()) == dict.fromkeys(range(n), 1)
    assert all(app.unsettled == 0 for app in apps)
    assert [app.engine.mover.moved > 0 for app in apps] == [True, True], "both movers moved"
    assert sum(app.engine.mover.moved for app in apps) == n
    assert (await client.xpending(apps[0].stream, "g"))["pending"] == 0
