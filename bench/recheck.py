"""Hops per second through the re-check consumer, against the bare loops it is built from.

Each loop moves N persistent messages from one queue to another, each with a confirmed
publish and then an ack, on the same broker in the same run (interleaved, several
rounds, median). The table gives each one's rate and its ratio to the raw aio-pika
loop; ratios are what to compare across machines, not absolute rates. The re-check
consumer runs four ways: releasing due messages and sending not-yet-due ones round a
tier, each with the plugin's queues classic and quorum (the default); the last lines give
the cost of quorum, quorum / classic, for each.

    python -m bench.recheck [N] [ROUNDS]      (RABBITMQ_URL, default 127.0.0.1:5673)
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from faststream.rabbit import Channel, RabbitBroker
from rich.console import Console
from rich.table import Table

from faststream_retry import EventKind, RetryEvent, RetryMiddleware
from faststream_retry.core import headers as h

RELEASE = "faststream-retry re-check, release (.retry to work queue), {} queues"
HOP = "faststream-retry re-check, hop (.retry to a tier), {} queues"
URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5673/")
PREFETCH = 200
BODY = b"x" * 512


async def fill(
    connection: AbstractRobustConnection,
    queue: str,
    n: int,
    headers: dict[str, Any],
    *,
    declare: bool = True,
) -> None:
    channel = await connection.channel()
    if declare:
        await channel.declare_queue(queue, durable=True)
    for start in range(0, n, 500):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(BODY, headers=headers, delivery_mode=2), routing_key=queue
                )
                for _ in range(start, min(n, start + 500))
            )
        )
    await channel.close()


async def delete(connection: AbstractRobustConnection, *queues: str) -> None:
    channel = await connection.channel()
    for queue in queues:
        await channel.queue_delete(queue)
    await channel.close()


async def wait_count(counter: Callable[[], int], n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while counter() < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {counter()} of {n} moved")
        await asyncio.sleep(0.005)


async def raw_aio_pika(connection: AbstractRobustConnection, n: int) -> float:
    """Consume, publish to another queue with a confirm, then ack: the bare loop."""
    src, dst = f"bench-raw-{uuid.uuid4().hex[:6]}", f"bench-raw-dst-{uuid.uuid4().hex[:6]}"
    await fill(connection, src, n, {})
    consume = await connection.channel()
    await consume.set_qos(prefetch_count=PREFETCH)
    publish = await connection.channel(publisher_confirms=True)
    await publish.declare_queue(dst, durable=True)
    done = 0

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal done
        await publish.default_exchange.publish(
            aio_pika.Message(message.body, headers=message.headers, delivery_mode=2),
            routing_key=dst,
        )
        await message.ack()
        done += 1

    queue = await consume.get_queue(src)
    start = time.perf_counter()
    tag = await queue.consume(on_message)
    await wait_count(lambda: done, n)
    elapsed = time.perf_counter() - start
    await queue.cancel(tag)
    await consume.close()
    await publish.close()
    await delete(connection, src, dst)
    return n / elapsed


async def faststream_republish(connection: AbstractRobustConnection, n: int) -> float:
    """A plain FastStream subscriber that republishes with broker.publish (persistent)."""
    src, dst = f"bench-fs-{uuid.uuid4().hex[:6]}", f"bench-fs-dst-{uuid.uuid4().hex[:6]}"
    await fill(connection, src, n, {})
    channel = await connection.channel()
    await channel.declare_queue(dst, durable=True)
    await channel.close()
    broker = RabbitBroker(URL, logger=None, default_channel=Channel(prefetch_count=PREFETCH))
    done = 0

    @broker.subscriber(src)
    async def handler(body: bytes) -> None:
        nonlocal done
        await broker.publish(body, queue=dst, persist=True)
        done += 1

    start = time.perf_counter()
    await broker.start()
    await wait_count(lambda: done, n)
    elapsed = time.perf_counter() - start
    await broker.stop()
    await delete(connection, src, dst)
    return n / elapsed


async def recheck(
    connection: AbstractRobustConnection, n: int, queue_type: str, step: EventKind
) -> float:
    """The plugin's re-check consumer moving messages out of ``<queue>.retry``.

    ``RELEASED``: already-due messages, to their (classic) work queue. ``HOP``: messages
    due in an hour, each sent round a tier (a queue of ``queue_type``).
    """
    origin = f"bench-rc-{uuid.uuid4().hex[:6]}"
    released = 0

    def count(event: RetryEvent) -> None:
        nonlocal released
        if event.kind is step:
            released += 1

    retry = RetryMiddleware(
        prefix=f"bench-{uuid.uuid4().hex[:6]}",
        prefetch=PREFETCH,
        hooks=[count],
        queue_type=queue_type,
    )
    broker = RabbitBroker(URL, logger=None)
    retry.install(broker)

    @broker.subscriber(origin)
    async def handler(body: bytes) -> None: ...

    channel = await connection.channel()
    await channel.declare_queue(origin, durable=True)
    await channel.close()
    # Only the plugin's side runs: the origin queue is not consumed, so the
    # process does nothing but re-check hops, like the two loops above.
    runtime = retry.runtime(broker)
    await runtime.start(await broker.connect(), runtime.replan())
    # The plugin declared .retry (classic or quorum); fill it before consuming.
    due_ms = 1 if step is EventKind.RELEASED else h.now_ms() + 3_600_000
    due = {h.ATTEMPT: 1, h.DUE: due_ms, "app": "kept"}
    await fill(connection, f"{origin}.retry", n, due, declare=False)
    start = time.perf_counter()
    await runtime.start_consumers()
    await wait_count(lambda: released, n)
    elapsed = time.perf_counter() - start
    await runtime.stop()
    await broker.stop()
    await delete(connection, origin)
    await delete_topology(connection, retry, broker)
    return n / elapsed


async def delete_topology(
    connection: AbstractRobustConnection, retry: RetryMiddleware, broker: RabbitBroker
) -> None:
    """Delete every queue and exchange the plugin planned for ``broker``."""
    topology = retry.runtime(broker).plan
    channel = await connection.channel()
    for spec in topology.queues:
        await channel.queue_delete(spec.name)
    for exchange in topology.exchanges:
        await channel.exchange_delete(exchange)
    await channel.close()


async def main(n: int, rounds: int) -> None:
    connection = await aio_pika.connect_robust(URL)
    runs: dict[str, Callable[[AbstractRobustConnection, int], Awaitable[float]]] = {
        "raw aio-pika: consume, confirmed publish, ack": raw_aio_pika,
        "FastStream subscriber + broker.publish": faststream_republish,
        RELEASE.format("classic"): functools.partial(
            recheck, queue_type="classic", step=EventKind.RELEASED
        ),
        RELEASE.format("quorum"): functools.partial(
            recheck, queue_type="quorum", step=EventKind.RELEASED
        ),
        HOP.format("classic"): functools.partial(recheck, queue_type="classic", step=EventKind.HOP),
        HOP.format("quorum"): functools.partial(recheck, queue_type="quorum", step=EventKind.HOP),
    }
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name, run in runs.items():
            rate = await run(connection, n)
            rates[name].append(rate)
            print(f"round {round_ + 1}: {name}: {rate:,.0f} msg/s", file=sys.stderr)
    await connection.close()
    baseline = statistics.median(rates[next(iter(runs))])
    table = Table(title=f"Re-check hops, {n:,} messages x {rounds} rounds, prefetch {PREFETCH}")
    table.add_column("loop")
    table.add_column("median msg/s", justify="right")
    table.add_column("runs", justify="right")
    table.add_column("ratio to raw", justify="right")
    for name, values in rates.items():
        median = statistics.median(values)
        table.add_row(
            name,
            f"{median:,.0f}",
            " / ".join(f"{v:,.0f}" for v in values),
            f"{median / baseline:.2f}",
        )
    console = Console()
    console.print(table)
    for what in (RELEASE, HOP):
        cost = statistics.median(rates[what.format("quorum")]) / statistics.median(
            rates[what.format("classic")]
        )
        console.print(f"{what.format('quorum / classic')}: {cost:.2f}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 5000, args[1] if len(args) > 1 else 3))
