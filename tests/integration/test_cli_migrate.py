"""``faststream-retry migrate`` on a real RabbitMQ: every message survives, even a kill -9.

Messages are counted by message id and compared whole (body, headers, properties)
before and after; a killed migration is run again and must leave each message in the
queue at least once, with at most the last batch in flight duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from faststream_retry.core.topology import Route, TopologyOptions, route_specs, tier_name, tier_spec
from faststream_retry.ops.migrate import BATCH
from tests.cli import ROOT, environment, run_cli, script
from tests.rabbit import eventually_async, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

pytestmark = pytest.mark.rabbit

N = 1000
STAMP = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)


def message(i: int) -> aio_pika.Message:
    """A message with every property a dead letter may carry, and nested headers."""
    return aio_pika.Message(
        f"body {i}".encode(),
        message_id=f"m-{i}",
        correlation_id=f"c-{i}",
        content_type="application/json",
        content_encoding="utf-8",
        headers={
            "n": i,
            "retry-reason": "permanent",
            "retry-attempt": 3,
            "nested": {"list": [1, "two"], "flag": True},
        },
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=3,
        reply_to="replies",
        timestamp=STAMP,
        type="order.created",
        app_id="shop",
    )


def seen(m: AbstractIncomingMessage) -> tuple[Any, ...]:
    """What must survive a move: everything but the broker's own delivery facts."""
    return (
        m.message_id,
        m.body,
        dict(m.headers or {}),
        m.correlation_id,
        m.content_type,
        m.content_encoding,
        m.delivery_mode,
        m.priority,
        m.reply_to,
        m.timestamp,
        m.type,
        m.app_id,
    )


async def fill(
    amqp: AbstractRobustConnection,
    queue: str,
    n: int = N,
    *,
    exchange: str = "",
    routing_key: str | None = None,
) -> None:
    """Publish ``n`` messages, confirmed, to ``queue`` (or through ``exchange``)."""
    channel = await amqp.channel()
    target = await channel.get_exchange(exchange) if exchange else channel.default_exchange
    for start in range(0, n, 200):
        await asyncio.gather(
            *(
                target.publish(message(i), routing_key=routing_key or queue)
                for i in range(start, min(n, start + 200))
            )
        )
    await channel.close()


async def take_all(amqp: AbstractRobustConnection, queue: str) -> list[AbstractIncomingMessage]:
    """Get every message of ``queue`` (acked: the queue is left empty)."""
    channel = await amqp.channel()
    q = await channel.declare_queue(queue, passive=True)
    got = []
    while (m := await q.get(no_ack=True, fail=False)) is not None:
        got.append(m)
    await channel.close()
    return got


async def declare(amqp: AbstractRobustConnection, queue: str, arguments: dict[str, Any]) -> None:
    channel = await amqp.channel()
    await channel.declare_queue(queue, durable=True, arguments=arguments)
    await channel.close()


async def has_arguments(
    amqp: AbstractRobustConnection, queue: str, arguments: dict[str, Any]
) -> bool:
    """Whether ``queue`` exists with exactly ``arguments`` (a different declare is a 406)."""
    channel = await amqp.channel()
    try:
        await channel.declare_queue(queue, durable=True, arguments=arguments)
    except ChannelPreconditionFailed:
        return False
    await channel.close()
    return True


async def depth_of(amqp: AbstractRobustConnection, queue: str) -> int | None:
    channel = await amqp.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return None
    with contextlib.suppress(Exception):
        await channel.close()
    return declared.declaration_result.message_count or 0


async def delete(amqp: AbstractRobustConnection, *queues: str) -> None:
    channel = await amqp.channel()
    for queue in queues:
        await channel.queue_delete(queue)
    await channel.close()


def specs(queue: str, queue_type: Any, prefix: str = "retry") -> tuple[dict[str, Any], ...]:
    """The arguments the plugin declares for ``queue``'s ``.retry`` and ``.dlq``."""
    options = TopologyOptions(prefix, 60_000, queue_type)
    return tuple(dict(spec.arguments) for spec in route_specs(Route(queue, ()), options))


async def test_a_dlq_moves_to_quorum_and_back_with_every_message_whole(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """1,000 dead letters keep their ids, bodies, headers and properties both ways."""
    queue = unique("mig")
    dlq = f"{queue}.dlq"
    await declare(amqp, dlq, {"x-queue-type": "classic"})
    await fill(amqp, dlq)
    # A message as sent has the attributes a consumer reads.
    expected = {f"m-{i}": seen(message(i)) for i in range(N)}  # type: ignore[arg-type]

    to_quorum = await run_cli(
        "migrate", dlq, "--queue-type", "quorum", "--yes", "--json", url=rabbit_url
    )
    assert to_quorum.status == 0, to_quorum.stderr
    assert to_quorum.json()["moved_out"] == N
    assert to_quorum.json()["moved_back"] == N
    assert await has_arguments(amqp, dlq, specs(queue, "quorum")[1])
    assert await depth_of(amqp, f"{dlq}.migrating") is None

    to_classic = await run_cli("migrate", dlq, "--queue-type", "classic", "--yes", url=rabbit_url)
    assert to_classic.status == 0, to_classic.stderr
    assert f"migrated '{dlq}' (dlq) to classic: {N} message(s) moved out" in to_classic.stdout
    assert await has_arguments(amqp, dlq, specs(queue, "classic")[1])

    got = await take_all(amqp, dlq)
    assert len(got) == N
    assert {m.message_id: seen(m) for m in got} == expected
    await delete(amqp, dlq)


async def test_a_retry_queue_gets_the_quorum_arguments_with_its_dead_letter_route(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A classic ``.retry`` becomes what ``queue_type="quorum"`` declares, delivery limit included."""
    queue = unique("mig-retry")
    retry = f"{queue}.retry"
    await declare(amqp, retry, specs(queue, "classic")[0])
    await fill(amqp, retry)

    result = await run_cli(
        "migrate", retry, "--queue-type", "quorum", "--delivery-limit", "7", "--yes", url=rabbit_url
    )

    assert result.status == 0, result.stderr
    wanted = {**specs(queue, "quorum")[0], "x-delivery-limit": 7}
    assert wanted["x-dead-letter-routing-key"] == f"{queue}.dlq"
    assert await has_arguments(amqp, retry, wanted)
    assert Counter(m.message_id for m in await take_all(amqp, retry)) == Counter(
        f"m-{i}" for i in range(N)
    )
    await delete(amqp, retry)


async def test_a_tier_keeps_its_messages_routing_keys_and_releases_them_no_earlier(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A classic tier becomes a quorum one, bound to its exchange again. Its messages go
    back to the ``.retry`` queue they were waiting for, their TTL started again: later
    than planned, never earlier."""
    prefix = unique("mt")
    ttl = 3000
    tier = tier_name(prefix, ttl)
    queue = unique("mig-tier")
    classic = dict(tier_spec(ttl, TopologyOptions(prefix, 60_000, "classic")).arguments)
    quorum = dict(tier_spec(ttl, TopologyOptions(prefix, 60_000, "quorum")).arguments)
    channel = await amqp.channel()
    exchange = await channel.declare_exchange(tier, aio_pika.ExchangeType.FANOUT, durable=True)
    declared = await channel.declare_queue(tier, durable=True, arguments=classic)
    await declared.bind(exchange)
    retry = await channel.declare_queue(f"{queue}.retry", durable=True)
    n = 200
    await fill(amqp, tier, n, exchange=tier, routing_key=retry.name)
    started = time.monotonic()

    result = await run_cli(
        "migrate", tier, "--queue-type", "quorum", "--prefix", prefix, "--yes", url=rabbit_url
    )

    assert result.status == 0, result.stderr
    assert await has_arguments(amqp, tier, quorum)
    arrived: dict[str, float] = {}

    async def all_back() -> bool:
        while (m := await retry.get(no_ack=True, fail=False)) is not None:
            arrived.setdefault(str(m.message_id), time.monotonic())
            assert m.routing_key == retry.name
        return len(arrived) == n

    await eventually_async(all_back, timeout=30, what="every message out of the tier")
    assert set(arrived) == {f"m-{i}" for i in range(n)}
    assert min(arrived.values()) >= started + ttl / 1000 - 0.05
    # Bound again: a copy published to the tier's exchange lands in the tier.
    await exchange.publish(aio_pika.Message(b"", message_id="after"), routing_key=retry.name)

    async def in_tier() -> bool:
        return await depth_of(amqp, tier) == 1

    await eventually_async(in_tier, what="the copy published after the migration")
    await delete(amqp, tier, retry.name)
    await channel.exchange_delete(tier)
    await channel.close()


async def test_a_queue_with_consumers_is_refused_and_left_alone(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A consumer means an app runs: it would declare the queue again with the old arguments."""
    dlq = unique("busy") + ".dlq"
    await declare(amqp, dlq, {"x-queue-type": "classic"})
    await fill(amqp, dlq, 5)
    channel = await amqp.channel()
    await channel.set_qos(prefetch_count=1)
    q = await channel.get_queue(dlq)

    async def hold(_: AbstractIncomingMessage) -> None:
        """Keep the delivered message unacked."""

    await q.consume(hold)

    result = await run_cli("migrate", dlq, "--queue-type", "quorum", "--yes", url=rabbit_url)

    assert result.status == 3
    assert f"'{dlq}' has 1 consumer(s)" in result.stderr
    assert "stop every service" in result.stderr
    await channel.close()
    assert await has_arguments(amqp, dlq, {"x-queue-type": "classic"})
    assert await depth_of(amqp, dlq) == 5
    assert await depth_of(amqp, f"{dlq}.migrating") is None
    await delete(amqp, dlq)


async def test_a_dlq_whose_work_queue_is_consumed_is_refused(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Nothing consumes a .dlq: a running app shows on its work queue, whose failures it takes."""
    queue = unique("busywork")
    await declare(amqp, queue, {"x-queue-type": "classic"})
    await declare(amqp, f"{queue}.dlq", {"x-queue-type": "classic"})
    channel = await amqp.channel()
    q = await channel.get_queue(queue)

    async def handle(_: AbstractIncomingMessage) -> None:
        """An app's handler."""

    await q.consume(handle)
    result = await run_cli(
        "migrate", f"{queue}.dlq", "--queue-type", "quorum", "--yes", url=rabbit_url
    )
    assert result.status == 3
    assert f"'{queue}' has 1 consumer(s)" in result.stderr
    await channel.close()
    assert await has_arguments(amqp, f"{queue}.dlq", {"x-queue-type": "classic"})
    await delete(amqp, f"{queue}.dlq")
    await delete(amqp, queue)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("orders", "is not a queue the plugin owns"),
        ("retry.queues", "is the plugin's registry"),
        ("orders.dlq.migrating", "is a migration's temporary queue"),
    ],
)
async def test_a_name_the_plugin_does_not_own_is_refused(
    rabbit_url: str, name: str, why: str
) -> None:
    """Work queues are their applications'; the registry and temporary queues are not moved."""
    result = await run_cli("migrate", name, "--queue-type", "quorum", "--yes", url=rabbit_url)
    assert result.status == 3
    assert why in result.stderr


async def test_a_migration_without_yes_asks_and_a_script_must_pass_it(rabbit_url: str) -> None:
    """It deletes a queue: with no terminal to ask, it does nothing without --yes."""
    result = await run_cli("migrate", "q.dlq", "--queue-type", "quorum", url=rabbit_url)
    assert result.status == 3
    assert "pass --yes" in result.stderr


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["moving out", "moving back"])
async def test_a_migration_killed_mid_way_is_finished_by_running_it_again(
    rabbit_url: str, amqp: AbstractRobustConnection, when: str
) -> None:
    """kill -9 in either move, then the same command: every message is there, and at most
    one batch in flight is there twice."""
    total = 3000
    dlq = unique("killed") + ".dlq"
    temp = f"{dlq}.migrating"
    await declare(amqp, dlq, {"x-queue-type": "classic"})
    await fill(amqp, dlq, total)
    process = subprocess.Popen(
        [*script(), "migrate", dlq, "--queue-type", "quorum", "--yes"],
        env=environment(rabbit_url),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    emptied = False

    async def at_kill_point() -> bool:
        nonlocal emptied
        held, left = await depth_of(amqp, temp), await depth_of(amqp, dlq)
        if when == "moving out":
            return bool(held) and bool(left)
        emptied = emptied or not left  # the queue was emptied (and is being replaced)
        return emptied and bool(left) and bool(held)

    try:
        await eventually_async(at_kill_point, timeout=60, what=f"the migration {when}")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    again = await run_cli(
        "migrate", dlq, "--queue-type", "quorum", "--yes", "--json", url=rabbit_url
    )

    assert again.status == 0, again.stderr
    assert again.json()["resumed"] is True
    ids = Counter(m.message_id for m in await take_all(amqp, dlq))
    assert set(ids) == {f"m-{i}" for i in range(total)}
    duplicates = sum(ids.values()) - total
    print(f"killed {when}: {duplicates} duplicate(s) of {total}")  # noqa: T201 - in the report
    assert duplicates <= BATCH
    assert await depth_of(amqp, temp) is None
    await delete(amqp, dlq)
