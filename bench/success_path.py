"""What the middleware costs a handler that succeeds: every message pays this.

A FastStream subscriber that just returns, consuming N prefilled messages, without and
with RetryMiddleware installed, and with its outage mode on (each message then passes
its queue's gate) (same broker, same run, interleaved rounds, median). Each rate runs
from the first handler call to the last: the broker's start, where the plugin declares its
topology, is paid once, not by every message.

    python -m bench.success_path [N] [ROUNDS]      (RABBITMQ_URL, default 127.0.0.1:5673)
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from faststream import BaseMiddleware
from faststream.rabbit import Channel, RabbitBroker
from rich.console import Console
from rich.table import Table

from bench.recheck import PREFETCH, URL, delete, delete_topology, fill, wait_count
from faststream_retry import RetryMiddleware


class NoopMiddleware(BaseMiddleware):
    """The floor: what FastStream charges for any middleware at all."""


async def consume(
    connection: AbstractRobustConnection,
    n: int,
    *,
    with_retry: bool,
    noop: bool = False,
    outage: bool = False,
) -> float:
    queue = f"bench-ok-{uuid.uuid4().hex[:6]}"
    await fill(connection, queue, n, {})
    broker = RabbitBroker(
        URL,
        logger=None,
        default_channel=Channel(prefetch_count=PREFETCH),
        middlewares=[NoopMiddleware] if noop else [],
    )
    retry = (
        RetryMiddleware(prefix=f"bench-{uuid.uuid4().hex[:6]}", outage_after=20 if outage else None)
        if with_retry
        else None
    )
    if retry is not None:
        retry.install(broker)
    done = 0
    first = last = 0.0

    @broker.subscriber(queue)
    async def handler(body: bytes) -> None:  # noqa: ARG001 - FastStream passes the body
        nonlocal done, first, last
        last = time.perf_counter()
        if not done:
            first = last
        done += 1

    await broker.start()
    await wait_count(lambda: done, n)
    # From the first call to the last: the broker's start (the plugin declares its
    # topology then) is not what every message pays.
    elapsed = last - first
    await broker.stop()
    await delete(connection, queue)
    if retry is not None:
        await delete_topology(connection, retry, broker)
    return (n - 1) / elapsed


async def main(n: int, rounds: int) -> None:
    connection = await aio_pika.connect_robust(URL)
    variants: dict[str, dict[str, bool]] = {
        "bare FastStream subscriber": {"with_retry": False},
        "with a no-op BaseMiddleware": {"with_retry": False, "noop": True},
        "with RetryMiddleware": {"with_retry": True},
        "with RetryMiddleware(outage_after=20)": {"with_retry": True, "outage": True},
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name, options in variants.items():
            rate = await consume(connection, n, **options)
            rates[name].append(rate)
            print(f"round {round_ + 1}: {name}: {rate:,.0f} msg/s", file=sys.stderr)
    await connection.close()
    baseline = statistics.median(rates["bare FastStream subscriber"])
    table = Table(title=f"Success path, {n:,} messages x {rounds} rounds, prefetch {PREFETCH}")
    for column in ("subscriber", "median msg/s", "runs", "ratio to bare"):
        table.add_column(column, justify="left" if column == "subscriber" else "right")
    for name, values in rates.items():
        median = statistics.median(values)
        table.add_row(
            name,
            f"{median:,.0f}",
            " / ".join(f"{v:,.0f}" for v in values),
            f"{median / baseline:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 10000, args[1] if len(args) > 1 else 3))
