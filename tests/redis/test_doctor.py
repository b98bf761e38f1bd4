"""``faststream-retry doctor`` on a real Redis: the server, what a crash can lose with its
persistence, and each covered stream, changing nothing. The app is a module written into
the test's folder, the command a subprocess, as an operator runs it. The persistence cases
run on a server of the test's own (``REDIS_DOCTOR_PORT``), its settings changed with
``CONFIG SET`` between runs."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from tests.cli import run_cli
from tests.redis.conftest import start_server, stop_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

APP = """
from faststream import FastStream
from faststream.redis import RedisBroker, StreamSub
from faststream_retry import RetryMiddleware

retry = RetryMiddleware()
broker = RedisBroker({url!r}, middlewares=[retry])
app = FastStream(broker)


@broker.subscriber(stream=StreamSub({stream!r}, group="ship", consumer="c1"))
async def handle(body: str) -> None: ...
"""

CHANNEL = """

@broker.subscriber(channel="pings")
async def pings(body: str) -> None: ...
"""

NOT_RABBIT = "amqp://guest:guest@127.0.0.1:1/"
"""The RabbitMQ the test session's RABBITMQ_URL would name: never the Redis app's server."""


def by_check(report: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for finding in report["findings"]:
        found.setdefault(finding["check"], []).append(finding)
    return found


async def snapshot(client: Redis, stream: str) -> dict[str, Any]:
    """What doctor must leave as it found it: the stream, its group, schedule and dead letters."""
    groups = await client.xinfo_groups(stream)
    return {
        "keys": sorted(await client.keys(f"*{stream}*")),
        "entries": await client.xrange(stream),
        "groups": [(g["name"], g["pending"], g["last-delivered-id"]) for g in groups],
        "schedule": await client.zrange(f"{{{stream}}}.retry", 0, -1, withscores=True),
        "dlq": await client.xrange(f"{{{stream}}}.dlq"),
    }


async def test_doctor_reports_the_server_its_durability_and_each_stream_changing_nothing(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """The suite's server (AOF, appendfsync always): the server fit, nothing acknowledged lost;
    the stream's pending entry, its schedule with one copy overdue, its dead letter, each
    counted; warnings only (exit 0), RABBITMQ_URL set and ignored; nothing changed."""
    (tmp_path / "shop.py").write_text(APP.format(url=redis_url, stream=stream))
    await client.xgroup_create(stream, "ship", id="0", mkstream=True)
    await client.xadd(stream, {"__data__": b"a"})
    await client.xadd(stream, {"__data__": b"b"})
    await client.xreadgroup("ship", "c1", {stream: ">"}, count=1)  # pending, never acked
    await client.zadd(f"{{{stream}}}.retry", {"1-0/ship": 1, "2-0/ship": 2**52})
    await client.xadd(f"{{{stream}}}.dlq", {"__data__": b"dead"})
    before = await snapshot(client, stream)

    done = await run_cli("doctor", "shop:app", "--json", url=NOT_RABBIT, cwd=tmp_path)

    assert done.status == 0, done.stderr
    report = done.json()
    assert (report["system"], report["app"], report["status"]) == ("redis", "shop:app", "warning")
    assert report["broker"].split("/")[2] == redis_url.split("/")[2]  # the app's server
    found = by_check(report)
    (server,) = found["server"]
    assert server["severity"] == "ok"
    assert "a primary, scripting allowed, maxmemory-policy noeviction" in server["what"]
    (durable,) = found["durability"]
    assert (durable["severity"], durable["what"]) == (
        "ok",
        (
            "a crash loses nothing acknowledged: every write is on disk before Redis answers "
            "(appendonly yes, appendfsync always)"
        ),
    )
    (line,) = found["stream"]
    assert line["what"] == (
        f"stream {stream!r}, group 'ship': 1 pending, 2 waiting in '{{{stream}}}.retry', "
        f"1 dead letter(s) in '{{{stream}}}.dlq' (capped near 100,000: past it the oldest are "
        "trimmed)"
    )
    (overdue,) = found["overdue"]
    assert overdue["what"].startswith(f"1 of the 2 copies in '{{{stream}}}.retry' are more")
    (dead,) = found["dead-letters"]
    assert dead["subject"] == f"{{{stream}}}.dlq"
    assert await snapshot(client, stream) == before


async def test_doctor_shows_the_dead_letter_cap_and_warns_near_it(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """The app's ``dlq_max_length`` is in the stream's line; a ``.dlq`` at 90 % of it is a
    warning that says new letters delete the oldest, and how to keep them."""
    app = APP.format(url=redis_url, stream=stream)
    (tmp_path / "shop.py").write_text(
        app.replace("RetryMiddleware()", "RetryMiddleware(dlq_max_length=10)")
    )
    await client.xgroup_create(stream, "ship", id="0", mkstream=True)
    for _ in range(9):
        await client.xadd(f"{{{stream}}}.dlq", {"__data__": b"dead"})

    done = await run_cli("doctor", "shop:app", "--json", url=None, cwd=tmp_path)

    assert done.status == 0, done.stderr
    found = by_check(done.json())
    (line,) = found["stream"]
    assert line["what"].endswith(
        f"9 dead letter(s) in '{{{stream}}}.dlq' (capped near 10: past it the oldest are trimmed)"
    )
    (dead,) = found["dead-letters"]
    assert dead["severity"] == "warning"
    assert "at the cap each new dead letter deletes the oldest, which are lost" in dead["why"]
    assert "raise RetryMiddleware(dlq_max_length=...)" in dead["fix"]


async def test_doctor_names_a_missing_group_and_a_refused_subscriber(
    redis_url: str, stream: str, tmp_path: Path
) -> None:
    """A stream its app never started on: the group is missing (a warning); a channel
    subscriber with retries on is the start's refusal (action, exit 1), the fix named."""
    (tmp_path / "shop.py").write_text(APP.format(url=redis_url, stream=stream) + CHANNEL)

    done = await run_cli("doctor", "shop:app", "--json", url=None, cwd=tmp_path)

    assert done.status == 1, done.stderr
    found = by_check(done.json())
    (missing,) = found["missing"]
    assert missing["what"] == f"stream {stream!r} has no consumer group 'ship' yet"
    (wiring,) = found["wiring"]
    assert wiring["severity"] == "action"
    assert "channel 'pings'" in wiring["what"]
    assert "StreamSub('pings', group=..., consumer=...)" in wiring["what"]


@pytest.fixture(scope="module")
def other_url() -> Any:
    """A server of this module's own, AOF on with appendfsync everysec; stopped at the end."""
    port = int(os.environ.get("REDIS_DOCTOR_PORT", "6416"))
    url, ours = start_server(port, REDIS_APPENDFSYNC="everysec")
    try:
        yield url
    finally:
        if ours:
            stop_server(port)


@pytest.fixture
async def other(other_url: str) -> AsyncIterator[Redis]:
    """A client of that server; its persistence and role are put back after each test."""
    connection = Redis.from_url(other_url, decode_responses=True)
    try:
        yield connection
    finally:
        await connection.replicaof("NO", "ONE")
        await connection.config_set("maxmemory-policy", "noeviction")
        await connection.config_set("appendfsync", "everysec")
        await connection.config_set("save", "")
        await connection.config_set("appendonly", "yes")
        await connection.config_set("no-appendfsync-on-rewrite", "no")
        await connection.config_set("min-replicas-to-write", "0")
        await connection.acl_deluser("doctor")
        await connection.aclose()


async def durability_of(url: str) -> tuple[int, dict[str, str]]:
    """Run ``doctor --url`` on the server alone; its exit status and durability finding."""
    done = await run_cli("doctor", "--url", url, "--json", url=None)
    assert done.status in (0, 1), done.stderr
    (finding,) = by_check(done.json())["durability"]
    return done.status, finding


async def test_doctor_says_what_each_persistence_setting_loses(
    other_url: str, other: Redis
) -> None:
    """everysec: up to about 2 s (ok); always with no-appendfsync-on-rewrite yes: a warning;
    RDB alone: since the last snapshot, its rules named; neither: everything; each a line
    of its own, read from the server as it runs."""
    status, finding = await durability_of(other_url)
    assert (status, finding["severity"]) == (0, "ok")
    assert finding["what"].startswith("a crash can lose up to about 2 s of acknowledged writes")
    assert "appendfsync always" in finding["fix"]

    await other.config_set("appendfsync", "always")
    _, finding = await durability_of(other_url)
    assert (finding["severity"], finding["fix"]) == ("ok", "")
    await other.config_set("no-appendfsync-on-rewrite", "yes")
    _, finding = await durability_of(other_url)
    assert finding["severity"] == "warning"
    assert "no-appendfsync-on-rewrite yes suspends the fsync" in finding["what"]
    await other.config_set("no-appendfsync-on-rewrite", "no")
    await other.config_set("appendfsync", "everysec")

    await other.config_set("appendonly", "no")
    await other.config_set("save", "60 1")
    _, finding = await durability_of(other_url)
    assert finding["severity"] == "warning"
    assert finding["what"].startswith("a crash loses every write since the last RDB snapshot")
    assert "(appendonly no, save '60 1'; the last one was " in finding["what"]

    await other.config_set("save", "")
    _, finding = await durability_of(other_url)
    assert finding["what"].startswith("a restart or crash loses everything")

    await other.config_set("appendonly", "yes")
    await other.config_set("appendfsync", "no")
    _, finding = await durability_of(other_url)
    assert finding["what"].endswith("(appendonly yes, appendfsync no)")


async def test_doctor_says_when_config_is_denied(other_url: str, other: Redis) -> None:
    """A user whose ACL denies CONFIG (as managed services do): the refusal quoted, the AOF's
    state still read from INFO; the password never printed."""
    await other.acl_setuser(
        "doctor", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all", "-config"]
    )
    url = other_url.replace("redis://", "redis://doctor:s3cret@")
    done = await run_cli("doctor", "--url", url, url=None)
    assert done.status == 0, done.stderr
    assert "s3cret" not in done.stdout + done.stderr
    _, finding = await durability_of(url)
    assert finding["severity"] == "warning"
    assert "the AOF is on, but its fsync policy could not be read" in finding["what"]
    assert "CONFIG GET refused: " in finding["what"]
    assert "no permissions to run the 'config|get' command" in finding["what"]


async def test_doctor_refuses_an_evicting_server_and_a_replica(
    other_url: str, other: Redis
) -> None:
    """allkeys-lru may drop schedules; a replica cannot be written: each needs action (exit 1),
    named with its fix."""
    await other.config_set("maxmemory-policy", "allkeys-lru")
    await other.replicaof("127.0.0.1", "1")  # a primary that is not there: still a replica
    done = await run_cli("doctor", "--url", other_url, "--json", url=None)
    assert done.status == 1, done.stderr
    said = " | ".join(f["what"] for f in by_check(done.json())["server"])
    assert "maxmemory-policy is allkeys-lru" in said
    assert "set maxmemory-policy noeviction" in said
    assert "the server is a slave, which cannot be written to: point the app at the primary" in said


async def test_doctor_says_a_failover_loses_what_the_replicas_had_not_received(
    other_url: str, other: Redis
) -> None:
    """A primary with a replica: a failover finding (a warning) whatever appendfsync says,
    min-replicas-to-write named; none without a replica.

    The replica is a connection that asked for the replication stream (REPLCONF, PSYNC),
    as a replica's first words are: the server counts it in connected_slaves.

    Found in review: doctor read only the role, and said "nothing acknowledged".
    """
    done = await run_cli("doctor", "--url", other_url, "--json", url=None)
    assert "failover" not in by_check(done.json())
    host, port = other_url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"REPLCONF listening-port 1\r\n")
        assert await reader.readline() == b"+OK\r\n"
        writer.write(b"PSYNC ? -1\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"+FULLRESYNC")
        await other.config_set("appendfsync", "always")
        done = await run_cli("doctor", "--url", other_url, "--json", url=None)
        (said,) = by_check(done.json())["failover"]
        assert said["severity"] == "warning"
        assert said["what"].startswith("a failover to one of its 1 replica(s) loses")
        assert "min-replicas-to-write is off" in said["what"]
        await other.config_set("min-replicas-to-write", "1")
        done = await run_cli("doctor", "--url", other_url, "--json", url=None)
        (said,) = by_check(done.json())["failover"]
        assert (
            "min-replicas-to-write 1 bounds it to about min-replicas-max-lag (10 s)"
            in (said["what"])
        )
    finally:
        writer.close()
        await other.config_set("min-replicas-to-write", "0")
