"""A long outage of a handler's dependency, without and with outage mode: what it costs.

N messages (5,000) arrive, evenly over the first half of a total outage of the handler's
dependency (60 s): every call raises ``ConnectionError`` until the dependency comes back.
The policy is ``Exponential(1 s, x2)`` with ``max_attempts=5``, so a message exhausts its
attempts about 15 s after it arrives. The same workload runs twice on the same broker,
without outage mode and with ``outage_after=20`` (the probe interval is the tick, 1 s
here), on a subscriber with a prefetch of 100. For each run it prints how many messages
were dead-lettered and processed, the handler calls during the outage, and the time from
recovery until every message was processed or dead-lettered; then it checks that every
message ended up in one place, once.

    python -m bench.outage                               (RABBITMQ_URL, default 127.0.0.1:5673)
    OUTAGE_N=500 OUTAGE_S=10 python -m bench.outage      a quick run

Environment: ``OUTAGE_N`` (5000), ``OUTAGE_S`` (60), ``OUTAGE_ARRIVAL_S`` (half of
``OUTAGE_S``), ``OUTAGE_AFTER`` (20), ``OUTAGE_PREFETCH`` (100).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aio_pika
from faststream.rabbit import Channel, RabbitBroker
from rich.console import Console
from rich.table import Table

from bench.recheck import URL, delete, delete_topology
from faststream_retry import EventKind, Exponential, RetryEvent, RetryMiddleware, RetryPolicy

N = int(os.environ.get("OUTAGE_N", "5000"))
OUTAGE_S = float(os.environ.get("OUTAGE_S", "60"))
ARRIVAL_S = float(os.environ.get("OUTAGE_ARRIVAL_S", str(OUTAGE_S / 2)))
AFTER = int(os.environ.get("OUTAGE_AFTER", "20"))
PREFETCH = int(os.environ.get("OUTAGE_PREFETCH", "100"))
POLICY = RetryPolicy(max_attempts=5, backoff=Exponential(initial=1, factor=2))
SETTLE_TIMEOUT_S = 600


@dataclass
class Run:
    """What one run saw."""

    name: str
    calls_during_outage: int = 0
    processed: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    outages: int = 0
    probes: int = 0
    recovery_s: float = 0.0
    """From recovery until every message was processed or dead-lettered (< 0: before it)."""
    wall_s: float = 0.0

    def settled(self) -> int:
        return len(set(self.processed) | set(self.dead))


async def run(name: str, outage_after: int | None) -> Run:
    result = Run(name)
    queue = f"bench-outage-{uuid.uuid4().hex[:6]}"
    broker = RabbitBroker(URL, logger=None, default_channel=Channel(prefetch_count=PREFETCH))
    retry = RetryMiddleware(
        default=POLICY,
        prefix=f"bench-{uuid.uuid4().hex[:6]}",
        max_delay=300,
        outage_after=outage_after,
    )
    retry.install(broker)
    down = True

    def hook(event: RetryEvent) -> None:
        if event.queue != queue:
            return
        if event.kind is EventKind.DEAD_LETTERED and event.message_id is not None:
            result.dead[event.message_id] += 1
        elif event.kind is EventKind.OUTAGE_STARTED:
            result.outages += 1
        elif event.kind is EventKind.OUTAGE_ENDED:
            result.probes += event.probes or 0

    retry.add_hook(hook)

    @broker.subscriber(queue)
    async def handler(body: str) -> None:
        if down:
            result.calls_during_outage += 1
            raise ConnectionError("database down")
        result.processed[body] += 1

    await broker.start()
    started = time.monotonic()
    print(f"{name}: outage of {OUTAGE_S:g} s begins", file=sys.stderr)

    async def arrive() -> None:
        for i in range(N):
            due = started + ARRIVAL_S * i / N
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await broker.publish(f"m{i}", queue=queue, message_id=f"m{i}")

    arrivals = asyncio.create_task(arrive())
    last_settled_at = started
    settled = 0

    async def settle_watch() -> None:
        nonlocal last_settled_at, settled
        while True:
            now_settled = result.settled()
            if now_settled != settled:
                settled, last_settled_at = now_settled, time.monotonic()
            if settled >= N:
                return
            await asyncio.sleep(0.01)

    watch = asyncio.create_task(settle_watch())
    await asyncio.sleep(max(OUTAGE_S - (time.monotonic() - started), 0))
    down = False
    recovered = time.monotonic()
    print(f"{name}: the dependency is back; {result.settled():,} settled", file=sys.stderr)
    await arrivals
    try:
        await asyncio.wait_for(watch, SETTLE_TIMEOUT_S)
    except asyncio.TimeoutError:
        print(f"{name}: only {result.settled():,} of {N:,} settled", file=sys.stderr)
    result.recovery_s = last_settled_at - recovered
    result.wall_s = time.monotonic() - started
    await broker.stop()
    connection = await aio_pika.connect_robust(URL)
    await delete(connection, queue)
    await delete_topology(connection, retry, broker)
    await connection.close()
    return result


def figures(runs: list[Run]) -> Table:
    table = Table(
        title=(
            f"{N:,} messages arriving over {ARRIVAL_S:g} s of a {OUTAGE_S:g} s outage; "
            f"Exponential(1 s, x2), max_attempts=5, prefetch {PREFETCH}"
        )
    )
    for column in (
        "run",
        "dead-lettered",
        "processed",
        "calls during outage",
        "outages / probes",
        "recovery to all settled",
        "lost / twice",
    ):
        table.add_column(column, justify="left" if column == "run" else "right")
    sent = {f"m{i}" for i in range(N)}
    for r in runs:
        lost = len(sent - set(r.processed) - set(r.dead))
        twice = sum(c > 1 for c in (r.processed + r.dead).values())
        recovery = (
            f"{r.recovery_s:.1f} s"
            if r.recovery_s >= 0
            else f"all dead {-r.recovery_s:.1f} s before it"
        )
        table.add_row(
            r.name,
            f"{sum(r.dead.values()):,}",
            f"{sum(r.processed.values()):,}",
            f"{r.calls_during_outage:,}",
            f"{r.outages} / {r.probes}",
            recovery,
            f"{lost} / {twice}",
        )
    return table


async def main() -> None:
    runs = [
        await run("without outage mode", None),
        await run(f"outage_after={AFTER}", AFTER),
    ]
    Console(width=150).print(figures(runs))


if __name__ == "__main__":
    asyncio.run(main())
