"""``faststream-retry status`` on Redis: undelivered entries, scheduled copies, dead letters.

A real app dead-letters some messages and schedules the others a minute ahead; ``status``
(``--url redis://``, and ``--app`` with the app's own server) counts them in the shape it
has on RabbitMQ, reading nothing from a group.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import PermanentError, RetryLater, RetryMiddleware
from faststream_retry.ops.redis_status import stream_of_key
from faststream_retry.redis.keys import stream_keys
from tests.cli import run_cli
from tests.redis.support import until

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

STATUS_KEYS = {
    "format",
    "system",
    "prefix",
    "queues_from",
    "tiers_from",
    "queues",
    "tiers",
    "notes",
}
DEPTH_KEYS = {"name", "exists", "messages", "consumers"}


async def failing_app(redis_url: str, stream: str, client: Redis) -> None:
    """Run an app until 3 messages are dead letters and 4 wait in the schedule."""
    broker = RedisBroker(redis_url, middlewares=[RetryMiddleware()], logger=None)  # type: ignore[arg-type]

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, Any]) -> None:
        if body["id"] < 3:
            raise PermanentError("no")
        raise RetryLater(60)

    keys = stream_keys(stream)
    await broker.start()
    try:
        for i in range(7):
            await broker.publish({"id": i}, stream=stream)

        async def settled() -> bool:
            dead = int(await client.xlen(keys.dlq))
            return dead == 3 and int(await client.zcard(keys.schedule)) == 4

        await until(settled, 30, "3 dead letters and 4 scheduled copies")
    finally:
        await broker.stop()


def test_a_key_names_its_stream() -> None:
    """``{orders}.dlq`` and ``{orders}.retry`` mean ``orders``; a tagged name keeps its tag."""
    assert stream_of_key("{orders}.dlq") == "orders"
    assert stream_of_key("{orders}.retry") == "orders"
    assert stream_of_key("{tenant}.orders.dlq") == "{tenant}.orders"
    assert stream_of_key("orders") == "orders"


async def test_status_counts_scheduled_copies_and_dead_letters(
    redis_url: str, stream: str, client: Redis
) -> None:
    """The stream's row: 0 undelivered, 1 consumer, 4 in .retry, 3 in .dlq; no tiers; nothing read."""
    await failing_app(redis_url, stream, client)
    keys = stream_keys(stream)
    before = await client.xrange(keys.dlq)
    done = await run_cli("status", "--url", redis_url, "--json", url=None)
    assert done.status == 0, done.stderr
    found = done.json()
    assert set(found) == STATUS_KEYS | {"broker"}
    assert found["system"] == "redis"
    assert found["prefix"] is None, "Redis keys have no prefix: null, not an invented one"
    assert found["tiers"] == []
    assert found["queues_from"] == ["server"]
    (row,) = [r for r in found["queues"] if r["queue"] == stream]
    for part in ("work", "retry", "dlq"):
        assert set(row[part]) == DEPTH_KEYS
    assert row["work"] == {"name": stream, "exists": True, "messages": 0, "consumers": 1}
    assert row["retry"] == {"name": keys.schedule, "exists": True, "messages": 4, "consumers": None}
    assert row["dlq"] == {"name": keys.dlq, "exists": True, "messages": 3, "consumers": None}
    assert any("no delay tiers" in note for note in found["notes"])
    assert await client.xrange(keys.dlq) == before
    assert await client.xinfo_groups(keys.dlq) == [], "no group made on the dead letters"

    named = await run_cli("status", keys.dlq, "--url", redis_url, "--json", url=None)
    assert named.json()["queues"] == [row]
    table = await run_cli("status", stream, "--url", redis_url, url=None)
    assert table.status == 0, table.stderr
    assert stream in table.stdout
    assert "delay tiers" not in table.stdout.split("note:")[0], "no tiers table on Redis"


async def test_status_app_reads_its_own_redis_server(
    redis_url: str, stream: str, client: Redis, tmp_path: Path
) -> None:
    """``status --app`` and ``dlq list --app`` of a RedisBroker app read the app's server and
    group (status refused the app; dlq had no --app)."""
    await failing_app(redis_url, stream, client)
    (tmp_path / "redisapp.py").write_text(
        textwrap.dedent(
            f"""
            from faststream.redis import RedisBroker, StreamSub
            from faststream_retry import RetryMiddleware
            broker = RedisBroker({redis_url!r}, middlewares=[RetryMiddleware()])

            @broker.subscriber(stream=StreamSub({stream!r}, group="g", consumer="c1"))
            async def handle(body: dict) -> None: ...
            """
        )
    )
    done = await run_cli("status", "--app", "redisapp:broker", "--json", url=None, cwd=tmp_path)
    assert done.status == 0, done.stderr
    found = done.json()
    assert found["queues_from"] == ["app"]
    assert [r["queue"] for r in found["queues"]] == [stream]
    assert found["queues"][0]["dlq"]["messages"] == 3
    listed = await run_cli(
        "dlq", "list", stream, "--app", "redisapp:broker", "--json", url=None, cwd=tmp_path
    )
    assert listed.status == 0, listed.stderr
    assert len(listed.json()["dead_letters"]) == 3, "the app's server, no --url"
    wrong = await run_cli(
        "status", "--app", "redisapp:broker", "--url", "nats://127.0.0.1:1", url=None, cwd=tmp_path
    )
    assert wrong.status == 3
    assert "RedisBroker" in wrong.stderr
