"""The Redis pages' examples (examples/docs/redis_*.py), run on a real server, counted by id.

Each test imports an example as a user would (``REDIS_URL`` names the server), replaces
its stand-ins (``save``, ``send_mail``, ...) with recorders, and checks what the page
says it does: sent = handled + dead-lettered, by id, the keys the topology page names,
the copy the wire-format page shows, and that reading the dead letters moves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from faststream.redis import BinaryMessageFormatV1, RedisBroker, StreamSub
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from faststream_retry import Fixed, RetryConfigError, RetryMiddleware, RetryPolicy
from faststream_retry.redis.claimer import CONSUMER_LOST
from faststream_retry.redis.keys import stream_keys
from tests.rabbit import eventually
from tests.redis.conftest import SCRIPTS
from tests.redis.support import until
from tests.redis.test_middleware import running

if TYPE_CHECKING:
    from collections.abc import Iterator

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def fresh(client: Redis, *streams: str) -> None:
    """Remove the streams and every key of theirs an earlier run left."""
    for stream in streams:
        keys = stream_keys(stream)
        await client.delete(stream, keys.schedule, keys.data, keys.dlq)


Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def xrange(client: Redis, stream: str) -> Entries:
    """Every entry of ``stream`` (redis-py types XRANGE's reply loosely)."""
    return cast("Entries", await client.xrange(stream))


def parse(fields: dict[bytes, bytes]) -> tuple[bytes, dict[str, Any]]:
    """A FastStream entry's body and headers, as FastStream's own parser reads them."""
    return BinaryMessageFormatV1.parse(fields[b"__data__"])


async def dead_letters(client: Redis, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """Each dead letter of ``stream``: its body's id and its headers."""
    out = []
    for _, fields in await xrange(client, stream_keys(stream).dlq):
        body, headers = parse(fields)
        out.append((json.loads(body)["id"], headers))
    return out


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def one_message_id_per_message(client: Redis, dead: list[tuple[str, dict[str, Any]]]) -> None:
    """Every attempt of a message, its copies and its dead letter share one message_id."""
    by_body: dict[str, set[str]] = defaultdict(set)
    for _, fields in await xrange(client, "orders"):
        body, headers = parse(fields)
        if "message_id" in headers:
            by_body[json.loads(body)["id"]].add(headers["message_id"])
    for ident, headers in dead:
        if ident.startswith("down"):
            assert by_body[ident] == {headers["message_id"]}


async def test_the_getting_started_app_retries_then_dead_letters_and_the_reader_moves_nothing(
    redis_url: str,
    client: Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """getting-started-redis.md: a failure comes back after 1 s, then 2 s; the third failed
    attempt, and a PermanentError at once, land in {orders}.dlq, body untouched. The copy
    waits in {orders}.retry as the topology and wire-format pages say. how-to/redis.md:
    listing the dead letters moves nothing."""
    await fresh(client, "orders")
    monkeypatch.setenv("REDIS_URL", redis_url)
    example = importlib.reload(importlib.import_module("examples.docs.redis_orders"))
    calls: dict[str, list[float]] = defaultdict(list)
    saved: list[str] = []

    async def save(order: dict[str, str]) -> None:
        calls[order["id"]].append(time.monotonic())
        kind = order["id"].split("-")[0]
        if kind == "down" or (kind == "flaky" and len(calls[order["id"]]) == 1):
            raise ConnectionError("the database is restarting")
        saved.append(order["id"])

    monkeypatch.setattr(example, "save", save)
    good = [f"{kind}-{i}" for kind in ("ok", "flaky") for i in range(10)]
    bad = [f"{kind}-{i}" for kind in ("down", "anonymous") for i in range(3)]
    keys = stream_keys("orders")
    caplog.set_level(logging.INFO)
    async with running(example.broker) as broker:
        for ident in good + bad:
            order = {"id": ident, "customer": "" if ident.startswith("anonymous") else "c"}
            await broker.publish(order, stream="orders")

        # topology and wire format: a copy waits in the sorted set, scored by its due time.
        async def waiting() -> bool:
            return int(await client.zcard(keys.schedule)) > 0

        await until(waiting, what="a copy in {orders}.retry")
        head = await client.zrange(keys.schedule, 0, 0, withscores=True)
        member, score = cast("list[tuple[bytes, float]]", head)[0]
        entry_id, group = member.decode().split("/")
        assert group == "billing"
        assert re.fullmatch(r"\d+-\d+", entry_id)
        copy = cast("bytes", await client.hget(keys.data, member))
        body, headers = BinaryMessageFormatV1.parse(copy)
        assert json.loads(body)["id"].split("-")[0] in {"flaky", "down"}
        assert headers["retry-attempt"] == "1"
        assert int(headers["retry-due"]) <= int(score) <= int(headers["retry-due"]) + 1000
        assert json.loads(headers["retry-history"])[0]["exception"] == "ConnectionError"
        assert headers["message_id"]
        assert headers["content-type"] == "application/json"

        async def settled() -> bool:
            return len(saved) >= len(good) and int(await client.xlen(keys.dlq)) >= len(bad)

        await until(settled, 30, "20 saved and 6 dead letters")
        await asyncio.sleep(1.0)  # and nothing more comes
        left = int(await client.zcard(keys.schedule)), int(await client.hlen(keys.data))
        pending = (await client.xpending("orders", "billing"))["pending"]
    dead = await dead_letters(client, "orders")
    # Counted by id: each sent order saved or dead-lettered, once.
    assert sorted(saved + [i for i, _ in dead]) == sorted(good + bad)
    assert len(set(saved)) == len(saved)
    assert left == (0, 0)
    assert pending == 0
    for ident in good:
        assert len(calls[ident]) == (2 if ident.startswith("flaky") else 1)
        if ident.startswith("flaky"):
            assert gaps(calls[ident])[0] >= 1.0  # back in 1 s, never early
    for ident in bad:
        if ident.startswith("down"):
            assert len(calls[ident]) == 3
            first, second = gaps(calls[ident])
            assert first >= 1.0
            assert second >= 2.0
        else:
            assert ident not in calls  # PermanentError before save: no retry
    for ident, headers in dead:
        assert headers["retry-origin-queue"] == "orders"
        if ident.startswith("down"):
            assert (headers["retry-reason"], headers["retry-attempt"]) == ("exhausted", "3")
            assert headers["retry-exception"] == "ConnectionError"
            assert headers["retry-traceback"].startswith("Traceback (most recent call last)")
        else:
            assert (headers["retry-reason"], headers["retry-attempt"]) == ("permanent", "1")
            assert headers["retry-error"] == f"order {ident} names no customer"
    await one_message_id_per_message(client, dead)
    started = [m for r in caplog.records if "(Redis)" in (m := r.getMessage())]
    assert started == [
        (
            "faststream-retry (Redis): delays held to the ms up to 1 d, claim after 1 min, "
            "dead letters capped near 100,000 a stream (the oldest trimmed past it), "
            "1 covered: orders"
        )
    ]

    # how-to/redis.md: reading them takes nothing off the stream and makes no group.
    from examples.docs.redis_read_dead_letters import list_dead_letters  # noqa: PLC0415

    before = await client.xinfo_stream(keys.dlq)
    capsys.readouterr()
    listed = await list_dead_letters(redis_url, "orders")
    again = await list_dead_letters(redis_url, "orders")
    after = await client.xinfo_stream(keys.dlq)
    for field in ("length", "first-entry", "last-entry", "groups"):
        assert after[field] == before[field], field
    assert after["groups"] == 0
    assert listed == again
    assert [json.loads(letter["body"])["id"] for letter in listed] == [i for i, _ in dead]
    assert [(letter["retry-reason"], letter["retry-attempt"]) for letter in listed] == [
        ("exhausted", 3) if i.startswith("down") else ("permanent", 1) for i, _ in dead
    ]
    assert all(len(letter["retry-history"]) == letter["retry-attempt"] for letter in listed)
    assert len(capsys.readouterr().out.splitlines()) == 2 * len(dead)
    assert await list_dead_letters(redis_url, "no-such-stream") == []


async def test_the_refusal_on_the_page_is_the_one_the_start_raises(
    redis_url: str, client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """getting-started-redis.md shows the error a pub/sub channel and a list get, verbatim;
    the channel with retries off and the stream in a group are not named, and the start
    reads nothing."""
    await client.delete("emails")
    monkeypatch.setenv("REDIS_URL", redis_url)
    example = importlib.reload(importlib.import_module("examples.docs.redis_refused"))
    with pytest.raises(RetryConfigError) as refused:
        await example.broker.start()
    await example.broker.stop()
    text = str(refused.value)
    page = (DOCS / "getting-started-redis.md").read_text()
    shown = re.search(
        r"```\n(faststream-retry cannot run on this RedisBroker:\n.*?)\n```", page, re.DOTALL
    )
    assert shown, "the error on the page"
    # The same lines; their order is the order FastStream keeps its subscribers in.
    head, *lines = text.splitlines()
    page_head, *page_lines = shown[1].splitlines()
    assert (head, sorted(lines)) == (page_head, sorted(page_lines)), text
    assert "'metrics'" not in text
    assert "mailer" not in text
    assert len(text.splitlines()) == 3
    assert await client.exists("emails") == 0, "nothing started: no group was made"


async def test_the_billing_example_router_policies_and_dead_letter_consumer(
    redis_url: str, client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """how-to/redis.md: a router's prefix is in the stream's name and in its keys; the
    mailer's @retry_policy (5 attempts, InvalidAddress permanent) and the ledger's default
    (3); the dead-letter consumer alerts once per mailer dead letter, which stays in its
    stream after its ack."""
    issued, paid = "billing.invoices.issued", "billing.invoices.paid"
    await fresh(client, issued, paid)
    monkeypatch.setenv("REDIS_URL", redis_url)
    example = importlib.reload(importlib.import_module("examples.docs.redis_billing"))
    calls: dict[str, int] = defaultdict(int)
    done: list[str] = []
    alerts: list[tuple[str, str, str]] = []

    async def work(invoice: dict[str, str]) -> None:
        ident = invoice["id"]
        calls[ident] += 1
        kind = ident.split("-")[1]
        if kind == "down" or (kind == "flaky" and calls[ident] < 3):
            raise ConnectionError("down")
        done.append(ident)

    async def alert_on_call(body: bytes, reason: str, error: str) -> None:
        alerts.append((json.loads(body)["id"], reason, error))

    monkeypatch.setattr(example, "send_mail", work)
    monkeypatch.setattr(example, "book", work)
    monkeypatch.setattr(example, "alert_on_call", alert_on_call)
    mails = [f"mail-{kind}-{i}" for kind in ("ok", "flaky", "down", "bad") for i in range(3)]
    payments = [f"paid-{kind}-{i}" for kind in ("ok", "down") for i in range(3)]
    async with running(example.broker) as broker:
        for ident in mails:
            email = "nowhere" if "-bad-" in ident else "a@example.com"
            await broker.publish({"id": ident, "email": email}, stream=issued)
        for ident in payments:
            await broker.publish({"id": ident}, stream=paid)
        await eventually(lambda: len(alerts) >= 6, timeout=30, what="6 alerts")
        await eventually(lambda: len(done) >= 9, timeout=10, what="9 handled")

        async def ledger_dead() -> bool:
            return int(await client.xlen(stream_keys(paid).dlq)) >= 3

        await until(ledger_dead, what="the ledger's 3 dead letters")
        await asyncio.sleep(1.0)  # and nothing more comes
        on_call = {g["name"]: g for g in await client.xinfo_groups(stream_keys(issued).dlq)}
    dead = {i: (issued, h) for i, h in await dead_letters(client, issued)}
    dead |= {i: (paid, h) for i, h in await dead_letters(client, paid)}
    # Counted by id: handled or dead-lettered, once; one alert per mailer dead letter.
    assert sorted(done + list(dead)) == sorted(mails + payments)
    assert len(set(done)) == len(done)
    assert sorted(a[0] for a in alerts) == sorted(i for i in dead if i.startswith("mail"))
    expected = {
        "mail-down": (issued, "exhausted", "5"),
        "mail-bad": (issued, "permanent", "1"),
        "paid-down": (paid, "exhausted", "3"),
    }
    for ident, (stream, headers) in dead.items():
        origin, reason, attempts = expected[ident.rsplit("-", 1)[0]]
        assert stream == origin
        assert headers["retry-origin-queue"] == origin
        assert (headers["retry-reason"], headers["retry-attempt"]) == (reason, attempts)
        assert calls[ident] == (0 if reason == "permanent" else int(attempts))
    for ident in mails:
        if "-flaky-" in ident:
            assert calls[ident] == 3
    assert {e for i, _, e in alerts if "-bad-" in i} == {"nowhere"}
    # Acknowledged in on-call, and still there: a stream keeps what a group has read.
    assert on_call[b"on-call"]["pending"] == 0
    assert int(await client.xlen(stream_keys(issued).dlq)) == 6
    # The dead-letter consumer's stream is not covered: no schedule of its own.
    assert await client.exists(stream_keys(stream_keys(issued).dlq).schedule) == 0
    assert await client.exists("invoices.issued", stream_keys("invoices.issued").dlq) == 0


def test_the_slots_on_the_pages_are_redis_cluster_s() -> None:
    """reference/redis-topology.md's table: every key of a stream in its slot (CRC16 of the
    hash tag, as a cluster node computes it)."""
    page = (DOCS / "reference" / "redis-topology.md").read_text()
    rows = re.findall(
        r"^\| `([^`]+)` \| (\d+) \| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|$", page, re.MULTILINE
    )
    assert len(rows) >= 3, "the slot table"
    for stream, slot, schedule, data, dlq in rows:
        keys = stream_keys(stream)
        assert (keys.schedule, keys.data, keys.dlq) == (schedule, data, dlq)
        assert {key_slot(k.encode()) for k in (stream, schedule, data, dlq)} == {int(slot)}


_REPLICA = """
import asyncio, os, time
from datetime import timedelta
from faststream.redis import RedisBroker, StreamSub
from redis import Redis
from faststream_retry import Fixed, RetryMiddleware, RetryPolicy

stream, mode = os.environ["STREAM"], os.environ["MODE"]
calls = Redis.from_url(os.environ["REDIS_URL"])
retry = RetryMiddleware(
    RetryPolicy(max_attempts=5, backoff=Fixed(0.1)), claim_idle=timedelta(seconds=1)
)
broker = retry.install(RedisBroker(os.environ["REDIS_URL"], middlewares=[retry]))


@broker.subscriber(stream=StreamSub(stream, group="g", consumer="slow"))
async def handle(body: dict) -> None:
    calls.rpush(stream + ":calls", "slow")
    if mode == "blocks":
        time.sleep(4)  # the event loop stops: no keep-alive
    else:
        await asyncio.sleep(4)  # the loop turns: kept alive
    calls.rpush(stream + ":returned", "slow")


async def main() -> None:
    async with broker:
        await broker.start()
        await asyncio.Event().wait()


asyncio.run(main())
"""


@pytest.mark.parametrize(("mode", "handled"), [("awaits", 1), ("blocks", 2)])
async def test_a_handler_longer_than_claim_idle_is_claimed_only_if_it_blocks_its_loop(
    redis_url: str, client: Redis, stream: str, mode: str, handled: int
) -> None:
    """how-to/redis.md: claim_idle bounds how long a replica may stop answering, not how
    long a handler runs. A handler awaiting 4 s with claim_idle 1 s is kept alive and runs
    once, with another replica's claimer running; one blocking its loop 4 s is claimed by
    the other replica and handled again (a ConsumerLost attempt in its history)."""
    log = f"{stream}:calls"
    slow = subprocess.Popen(
        [sys.executable, "-c", _REPLICA],
        env={**os.environ, "REDIS_URL": redis_url, "STREAM": stream, "MODE": mode},
        cwd=DOCS.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    other = RetryMiddleware(RetryPolicy(max_attempts=5, backoff=Fixed(0.1)), claim_idle=1)
    broker = other.install(RedisBroker(redis_url, middlewares=[other]))

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="other"))
    async def handle(body: dict[str, Any]) -> None:
        await client.rpush(log, "other")

    try:

        async def slow_called() -> bool:
            return int(await client.llen(log)) >= 1

        async def group_made() -> bool:
            with contextlib.suppress(Exception):
                return bool(await client.xinfo_groups(stream))
            return False

        await until(group_made, timeout=30, what="the slow replica's group")
        await client.xadd(stream, {"__data__": b'{"data": "{\\"id\\": 1}"}'})
        await until(slow_called, timeout=30, what="the slow replica's call")
        async with running(broker):

            async def slow_returned_and_all_called() -> bool:
                returned = int(await client.llen(f"{stream}:returned")) >= 1
                return returned and int(await client.llen(log)) >= handled

            await until(slow_returned_and_all_called, timeout=30, what=f"{handled} calls")
            await asyncio.sleep(2.0)  # claim_idle and more: nothing else comes
            calls = [c.decode() for c in cast("list[bytes]", await client.lrange(log, 0, -1))]
            pending = (await client.xpending(stream, "g"))["pending"]
    finally:
        slow.kill()
        slow.wait(timeout=30)
        await client.delete(log, f"{stream}:returned")
    assert len(calls) == handled, calls
    assert pending == 0
    if mode == "blocks":
        assert calls[0] == "slow"
    # The second call was the claimed entry's copy: a lost attempt in its history.
    copies = [parse(fields)[1] for _, fields in await xrange(client, stream)][1:]
    assert [
        [e["exception"] for e in json.loads(headers["retry-history"])] for headers in copies
    ] == ([[CONSUMER_LOST]] if mode == "blocks" else [])


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """``REDIS_CLUSTER_URL``, or scripts/redis/cluster.sh's three masters on
    ``REDIS_CLUSTER_PORT`` (test_cluster.py's), started and stopped here."""
    url = os.environ.get("REDIS_CLUSTER_URL")
    if url:
        yield url
        return
    script = ["bash", str(SCRIPTS / "cluster.sh")]
    env = {**os.environ, "REDIS_CLUSTER_PORT": os.environ.get("REDIS_CLUSTER_PORT", "6407")}
    started = subprocess.run(
        [*script, "start"], capture_output=True, text=True, check=False, env=env
    )
    if started.returncode != 0:
        pytest.fail(f"the cluster did not start:\n{started.stderr[-2000:]}")
    try:
        yield started.stdout.split()[0]
    finally:
        subprocess.run([*script, "stop"], capture_output=True, check=False, env=env)


async def test_the_cluster_example_keeps_each_tenant_in_one_slot(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """how-to/redis.md: on a Redis Cluster, RedisClusterBroker with the tagged streams of one
    tenant: each failure retried or dead-lettered with no CROSSSLOT, counted by id, every key
    in the tag's slot."""
    cluster = RedisCluster.from_url(cluster_url)
    streams = ("{tenant-7}.orders", "{tenant-7}.refunds")
    try:
        for stream in streams:
            keys = stream_keys(stream)
            for key in (stream, keys.schedule, keys.data, keys.dlq):
                await cluster.delete(key)
        monkeypatch.setenv("REDIS_CLUSTER_URL", cluster_url)
        example = importlib.reload(importlib.import_module("examples.docs.redis_cluster"))
        calls: dict[str, int] = defaultdict(int)
        done: list[str] = []

        async def work(order: dict[str, str]) -> None:
            ident = order["id"]
            calls[ident] += 1
            if ident.startswith("down") or calls[ident] == 1:
                raise ConnectionError("down")
            done.append(ident)

        monkeypatch.setattr(example, "save", work)
        monkeypatch.setattr(example, "refund", work)
        sent = {
            s: [f"{kind}-{s[-7:]}-{i}" for kind in ("ok", "down") for i in range(5)]
            for s in streams
        }
        async with running(example.broker) as broker:
            for stream, ids in sent.items():
                for ident in ids:
                    await broker.publish({"id": ident}, stream=stream)

            async def settled() -> bool:
                dead = [int(await cluster.xlen(stream_keys(s).dlq)) for s in streams]
                return len(done) >= 10 and sum(dead) >= 10

            await until(settled, 60, "10 handled and 10 dead letters")
            await asyncio.sleep(1.0)  # and nothing more comes
        dead = []
        for stream in streams:
            keys = stream_keys(stream)
            slots = {key_slot(k.encode()) for k in (stream, keys.schedule, keys.data, keys.dlq)}
            assert slots == {key_slot(b"tenant-7")}
            for _, fields in cast("Entries", await cluster.xrange(keys.dlq)):
                body, headers = parse(fields)
                assert headers["retry-origin-queue"] == stream
                dead.append(json.loads(body)["id"])
            assert await cluster.zcard(keys.schedule) == 0
        assert sorted(done + dead) == sorted(i for ids in sent.values() for i in ids)
        assert sorted(dead) == sorted(i for i in done + dead if i.startswith("down"))
        assert len(set(done)) == len(done)
        # RetryMiddleware()'s default policy: its max_attempts, then a dead letter
        assert {i: calls[i] for i in dead} == dict.fromkeys(dead, RetryPolicy().max_attempts)
    finally:
        await cluster.aclose()
