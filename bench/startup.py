"""What the plugin adds to a broker's start and stop, against bare FastStream, side by side.

Each figure is one process's: a fresh Python starts one broker (bare, with ``install()``,
or without it, the plugin starting at the first message), times it, and exits, so no
connection, cache or declared object of one run helps the next in process. Rounds are
interleaved and the median is printed. With ``--before DIR`` each plugin row runs a second
time with ``DIR/faststream_retry`` first on the path (a checkout of an earlier commit),
and the table puts the two side by side.

Rows (the plugin as issue 36 timed it: ``RetryPolicy(max_attempts=3, backoff=Fixed(0.2))``,
whose plan has 19 quorum tiers):

- start, existing topology: ``install()`` + ``broker.start()`` with every queue there;
- start, first ever: the same with a new prefix and new queues, so every tier, ``.retry``
  and ``.dlq`` is created;
- first message, no install: from ``broker.start()`` to the handler's first call, the
  message waiting in its queue, every queue there;
- stop: ``broker.stop()`` of a started broker, nothing in flight.

Each row runs with 1 covered queue and with 300 (``--sizes``). Beside each time, the
number of round trips (AMQP methods that wait for the broker's answer): the machine's
load moves the times, never the count.

    python -m bench.startup [--rounds 3] [--sizes 1,300] [--before DIR]   (RABBITMQ_URL)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

# The checkout to measure, ahead of this one (``python -m`` puts this one first on the path).
if checkout := os.environ.get("BENCH_CHECKOUT"):
    sys.path.insert(0, checkout)

import aio_pika
import aiormq
from faststream.rabbit import RabbitBroker
from rich.console import Console
from rich.table import Table

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy
from faststream_retry.core.topology import registry_name

URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5673/")
ROOT = Path(__file__).resolve().parent.parent
KINDS = ("bare", "plugin")


class Built:
    """A broker with ``queues`` subscribers, bare or with the plugin; its handler's first call."""

    def __init__(self, kind: str, prefix: str, queues: int, *, install: bool) -> None:
        self.retry = RetryMiddleware(
            default=RetryPolicy(max_attempts=3, backoff=Fixed(0.2)), prefix=f"{prefix}-retry"
        )
        self.broker = RabbitBroker(
            URL, logger=None, middlewares=[self.retry] if kind == "plugin" else []
        )
        if kind == "plugin" and install:
            self.retry.install(self.broker)
        self.called = asyncio.Event()
        self.called_at = 0.0

        async def handle(_: str) -> None:
            if not self.called.is_set():
                self.called_at = time.perf_counter()
                self.called.set()

        for i in range(queues):
            self.broker.subscriber(f"{prefix}-q{i}")(handle)


class RoundTrips:
    """Counts the AMQP methods sent that wait for the broker's answer (aiormq's ``rpc``).

    The machine's load moves every time; this count does not, and it says where time
    goes on a quiet one (a round trip is about 0.3 ms on loopback).
    """

    def __init__(self) -> None:
        self.count = 0
        original = aiormq.Channel.rpc

        async def rpc(channel: Any, frame: Any, timeout: Any = None) -> Any:
            if frame.synchronous and not getattr(frame, "nowait", False):
                self.count += 1
            return await original(channel, frame, timeout=timeout)

        aiormq.Channel.rpc = rpc  # type: ignore[method-assign,assignment,unused-ignore]  # aiormq 6.8 types it looser


async def one(scenario: str, kind: str, prefix: str, queues: int) -> dict[str, float]:
    """Run one measurement in this process; return its time in ms and its round trips."""
    built = Built(kind, prefix, queues, install=scenario != "first-message")
    broker = built.broker
    if scenario == "first-message":
        connection = await aio_pika.connect(URL)
        channel = await connection.channel()
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=f"{prefix}-q0")
        await connection.close()
    trips = RoundTrips()
    started = time.perf_counter()
    await broker.start()
    ms = (time.perf_counter() - started) * 1000
    if scenario == "first-message":
        await asyncio.wait_for(built.called.wait(), 60)
        ms = (built.called_at - started) * 1000
    elif scenario == "stop":
        await asyncio.sleep(0.2)
        trips.count = 0
        started = time.perf_counter()
        await broker.stop()
        return {"ms": (time.perf_counter() - started) * 1000, "rpcs": trips.count}
    figures = {"ms": ms, "rpcs": trips.count}
    await broker.stop()
    return figures


def checked(path: str | None) -> None:
    """Fail unless a process given ``path`` runs that checkout's faststream_retry."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_CHECKOUT"}
    if path is not None:
        env["BENCH_CHECKOUT"] = path
    code = "import bench.startup, faststream_retry; print(faststream_retry.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    ).stdout.strip()
    expected = Path(path or ROOT).resolve() / "faststream_retry" / "__init__.py"
    if Path(where).resolve() != expected:
        raise RuntimeError(f"{path or ROOT} would measure {where}")


def spawn(scenario: str, kind: str, prefix: str, queues: int, path: str | None) -> dict[str, float]:
    """Run ``one`` in a new process (``path`` first on sys.path); return its figures."""
    env = dict(os.environ)
    env.pop("BENCH_CHECKOUT", None)
    if path is not None:
        env["BENCH_CHECKOUT"] = path
    done = subprocess.run(
        [sys.executable, "-m", "bench.startup", "--one", scenario, kind, prefix, str(queues)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} {kind} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


async def delete_all(prefix: str, queues: int) -> None:
    """Delete every queue and exchange a run with ``prefix`` declared."""
    built = Built("plugin", prefix, queues, install=False)
    plan = built.retry.runtime(built.broker).plan
    names = [f"{prefix}-q{i}" for i in range(queues)]
    names += [spec.name for spec in plan.queues]
    names.append(registry_name(plan.options.prefix))
    connection = await aio_pika.connect(URL)
    channel = await connection.channel()
    for name in names:
        await channel.queue_delete(name)  # no error for a queue that is not there
    for name in plan.exchanges:
        await channel.exchange_delete(name)
    await connection.close()


Figures = dict[str, list[dict[str, float]]]
"""A row's figures: for each column, one measurement per round."""


def measure(args: argparse.Namespace) -> list[tuple[str, Figures]]:
    """Every row's figures, rounds interleaved across the columns."""
    columns: dict[str, str | None] = {"bare": None, "plugin": None}
    if args.before:
        columns["plugin, before"] = str(Path(args.before).resolve())
    for path in columns.values():
        checked(path)
    rows: list[tuple[str, Figures]] = []
    for queues in (int(size) for size in args.sizes.split(",")):
        existing = f"bench-start-{uuid.uuid4().hex[:6]}"
        # The existing topology: one plugin start creates it, outside the figures.
        spawn("start", "plugin", existing, queues, None)
        try:
            for scenario, label in (
                ("start", "start, existing topology"),
                ("first", "start, first ever"),
                ("first-message", "first message, no install"),
                ("stop", "stop"),
            ):
                figures: Figures = {column: [] for column in columns}
                for _ in range(args.rounds):
                    for column, path in columns.items():
                        kind = "bare" if column == "bare" else "plugin"
                        prefix = existing
                        if scenario == "first":
                            prefix = f"bench-first-{uuid.uuid4().hex[:6]}"
                        try:
                            figures[column].append(spawn(scenario, kind, prefix, queues, path))
                        finally:
                            if scenario == "first":
                                asyncio.run(delete_all(prefix, queues))
                rows.append((f"{label}, {queues} {'queue' if queues == 1 else 'queues'}", figures))
                print(rows[-1], file=sys.stderr, flush=True)
        finally:
            asyncio.run(delete_all(existing, queues))
    return rows


def cell(runs: list[dict[str, float]]) -> str:
    """``median ms (min) / round trips``."""
    ms = [run["ms"] for run in runs]
    trips = statistics.median(run["rpcs"] for run in runs)
    return f"{statistics.median(ms):,.0f} ({min(ms):,.0f}) / {trips:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1,300", help="covered queues per row, comma-separated")
    parser.add_argument("--before", help="a checkout whose faststream_retry to compare with")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        scenario, kind, prefix, queues = args.one
        print(json.dumps(asyncio.run(one(scenario, kind, prefix, int(queues)))))
        return
    rows = measure(args)
    table = Table(
        title=f"start and stop: median ms (fastest) / round trips, {args.rounds} processes each"
    )
    table.add_column("row")
    for column in rows[0][1]:
        table.add_column(column, justify="right")
    table.add_column("plugin - bare", justify="right")
    if args.before:
        table.add_column("before - bare", justify="right")
    for label, figures in rows:
        medians = {c: statistics.median(run["ms"] for run in runs) for c, runs in figures.items()}
        cells = [cell(runs) for runs in figures.values()]
        cells.append(f"{medians['plugin'] - medians['bare']:+,.0f}")
        if args.before:
            cells.append(f"{medians['plugin, before'] - medians['bare']:+,.0f}")
        table.add_row(label, *cells)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
