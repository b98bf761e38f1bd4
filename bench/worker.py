"""A burst of failing messages retried by the retry worker, against the FastStream middleware.

N persistent messages are published at once to a work queue whose consumer fails each one
once and handles it the second time, with a 1 s fixed backoff (one tier: the tick is the
GCD of the delays, 1 s). Three ways, on the same broker in the same run (interleaved
rounds, the order turning from one round to the next, median):

- a FastStream subscriber with ``RetryMiddleware`` that raises ``TransientError`` once;
- a plain aio-pika consumer that rejects once (``requeue=False``), its queue dead-lettering
  into the intake of a ``RetryWorker`` running in this process: the worker sends the copy
  round the 1 s tier into ``<queue>.retry``, and its re-check consumer releases it to the
  queue with a confirmed publish (the default);
- the same with ``direct_release = true``: the tier dead-letters the copy straight into
  the queue, one hop less.

Each rate is N / (first publish to N-th success); the ratio is to the middleware's rate in
the same run. *Lateness* is the second arrival - the first - the 1 s delay: for the worker
it includes the dead-lettering into its intake and the wait there, which *scheduled
after* shows on its own (first failure to the ``SCHEDULED`` event, whose due time starts
the delay). Every prefix and queue is new each round and deleted after it. A message
lost, arriving a third time (handled twice), early, or left in a queue is counted, and the
plugin's events too (N scheduled, no hop, no dead letter), under the table.

    python -m bench.worker [N] [ROUNDS]      (RABBITMQ_URL, default 127.0.0.1:5673)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from faststream.rabbit import Channel, RabbitBroker, RabbitQueue
from rich.console import Console
from rich.table import Table

from bench.recheck import BODY, PREFETCH, URL
from faststream_retry import (
    EventKind,
    Fixed,
    RetryEvent,
    RetryMiddleware,
    RetryPolicy,
    RetryWorker,
    TransientError,
)
from faststream_retry.core import headers as h
from faststream_retry.core.topology import Plan, intake_dlq_name, intake_name, registry_name
from faststream_retry.core.worker_config import worker_config

DELAY_S = 1.0
MAX_ATTEMPTS = 4
GRACE_S = 2.0
"""How long to keep consuming after the N-th success, to see a late duplicate."""
TIMEOUT_S = 300.0

MIDDLEWARE = "FastStream subscriber + RetryMiddleware"
WORKER = "aio-pika consumer + RetryWorker (release via re-check)"
DIRECT = "aio-pika consumer + RetryWorker, direct_release = true"


@dataclass
class Recorder:
    """Fails each message's first arrival, counts the second as its success."""

    n: int
    first: dict[str, float] = field(default_factory=dict)
    first_ms: dict[str, int] = field(default_factory=dict)
    """The first arrival's wall-clock time, to compare with the events' ``at_ms``."""
    calls: dict[str, int] = field(default_factory=dict)
    lateness_ms: list[float] = field(default_factory=list)
    done: int = 0
    extra: int = 0
    last: float = 0.0
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    events: Counter[str] = field(default_factory=Counter)
    release_lateness_ms: list[int] = field(default_factory=list)
    scheduled_after_ms: list[float] = field(default_factory=list)

    def hook(self, event: RetryEvent) -> None:
        """Count the plugin's events: N scheduled, no hop, no dead letter."""
        self.events[event.kind.value] += 1
        failed_ms = self.first_ms.get(event.message_id or "")
        if event.kind is EventKind.SCHEDULED and failed_ms is not None:
            self.scheduled_after_ms.append(event.at_ms - failed_ms)
        if event.kind is EventKind.RELEASED and event.lateness_ms is not None:
            self.release_lateness_ms.append(event.lateness_ms)

    def call(self, message_id: str | None) -> bool:
        """Record an arrival; return whether the consumer must fail it."""
        now = time.perf_counter()
        key = message_id or ""
        calls = self.calls[key] = self.calls.get(key, 0) + 1
        if calls == 1:
            self.first[key] = now
            self.first_ms[key] = h.now_ms()  # as the events' at_ms: whole ms
            return True
        if calls > 2:  # a third arrival: handled twice
            self.extra += 1
            return False
        self.lateness_ms.append((now - self.first[key] - DELAY_S) * 1000)
        self.done += 1
        self.last = now
        if self.done == self.n:
            self.finished.set()
        return False


@dataclass
class Result:
    seconds: float
    rate: float
    p50_ms: float
    max_ms: float
    lost: int
    twice: int
    early: int
    left: int
    events: Counter[str]
    release_p50_ms: float
    scheduled_p50_ms: float


async def publish_burst(connection: AbstractRobustConnection, queue: str, n: int) -> float:
    """Publish N persistent messages with confirms, 500 at a time; return the start."""
    channel = await connection.channel()
    start = time.perf_counter()
    for first in range(0, n, 500):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(BODY, message_id=str(i), delivery_mode=2), routing_key=queue
                )
                for i in range(first, min(n, first + 500))
            )
        )
    await channel.close()
    return start


async def measure(
    connection: AbstractRobustConnection, queue: str, rec: Recorder
) -> tuple[float, bool]:
    """Publish the burst and wait for N successes (then GRACE_S more); return the elapsed."""
    start = await publish_burst(connection, queue, rec.n)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(rec.finished.wait(), TIMEOUT_S)
    complete = rec.done == rec.n
    elapsed = rec.last - start
    await asyncio.sleep(GRACE_S)
    return elapsed, complete


async def delete(
    connection: AbstractRobustConnection, queues: Iterable[str], exchanges: Iterable[str] = ()
) -> int:
    """Delete ``queues`` and ``exchanges``; return how many messages the queues still held."""
    left = 0
    channel = await connection.channel()
    for queue in queues:
        result = await channel.queue_delete(queue)
        left += result.message_count or 0
    for exchange in exchanges:
        await channel.exchange_delete(exchange)
    await channel.close()
    return left


async def delete_plan(connection: AbstractRobustConnection, plan: Plan, *queues: str) -> int:
    """Delete ``queues`` and what the plugin declared for ``plan``; return the messages left.

    The registry (``<prefix>.queues``) holds one record per work queue by design: it is
    deleted, not counted.
    """
    await delete(connection, [registry_name(plan.options.prefix)])
    names = [*queues, *(spec.name for spec in plan.queues)]
    return await delete(connection, names, plan.exchanges)


def median_or_nan(values: Iterable[float]) -> float:
    listed = list(values)
    return statistics.median(listed) if listed else float("nan")


def result(rec: Recorder, elapsed: float, *, complete: bool, left: int) -> Result:
    late = sorted(rec.lateness_ms)
    return Result(
        seconds=elapsed if complete else float("nan"),
        rate=rec.n / elapsed if complete else 0.0,
        p50_ms=median_or_nan(late),
        max_ms=late[-1] if late else float("nan"),
        lost=rec.n - rec.done,
        twice=rec.extra,
        early=sum(1 for x in late if x < 0),
        left=left,
        events=rec.events,
        release_p50_ms=median_or_nan(rec.release_lateness_ms),
        scheduled_p50_ms=median_or_nan(rec.scheduled_after_ms),
    )


async def middleware(connection: AbstractRobustConnection, n: int) -> Result:
    """A FastStream subscriber whose handler raises TransientError once per message."""
    queue, prefix = f"bench-wk-fs-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
    rec = Recorder(n)
    retry = RetryMiddleware(
        default=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=Fixed(DELAY_S)),
        prefix=prefix,
        prefetch=PREFETCH,
        hooks=[rec.hook],
    )
    broker = RabbitBroker(URL, logger=None, default_channel=Channel(prefetch_count=PREFETCH))
    retry.install(broker)
    context = broker.context

    @broker.subscriber(RabbitQueue(queue, durable=True))
    async def handler(body: bytes) -> None:  # noqa: ARG001 - FastStream passes the body
        if rec.call(context.get_local("message").message_id):
            raise TransientError("bench: fails once")

    await broker.start()
    elapsed, complete = await measure(connection, queue, rec)
    await broker.stop()
    left = await delete_plan(connection, retry.runtime(broker).plan, queue)
    return result(rec, elapsed, complete=complete, left=left)


async def worker(connection: AbstractRobustConnection, n: int, *, direct: bool) -> Result:
    """A plain aio-pika consumer that rejects once; a RetryWorker retries its dead letters."""
    queue, prefix = f"bench-wk-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
    rec = Recorder(n)
    config = worker_config(
        {
            "prefix": prefix,
            "prefetch": PREFETCH,
            "defaults": {
                "max_attempts": MAX_ATTEMPTS,
                "backoff": {"kind": "fixed", "delay": DELAY_S},
                "direct_release": direct,
            },
            "queues": [{"name": queue}],
        }
    )
    channel = await connection.channel()
    await channel.declare_queue(
        queue, durable=True, arguments={"x-dead-letter-exchange": intake_name(prefix)}
    )
    await channel.close()
    retry_worker = RetryWorker(config, url=URL, hooks=[rec.hook])
    await retry_worker.start()
    plan = retry_worker.plan

    consumer = await aio_pika.connect_robust(URL)
    consume = await consumer.channel()
    await consume.set_qos(prefetch_count=PREFETCH)

    async def on_message(message: AbstractIncomingMessage) -> None:
        if rec.call(message.message_id):
            await message.reject(requeue=False)
        else:
            await message.ack()

    await (await consume.get_queue(queue)).consume(on_message)
    elapsed, complete = await measure(connection, queue, rec)
    await consumer.close()
    await retry_worker.stop()
    left = await delete_plan(connection, plan, queue, intake_name(prefix), intake_dlq_name(prefix))
    await delete(connection, [], [intake_name(prefix)])
    return result(rec, elapsed, complete=complete, left=left)


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{round(value):,}"


async def main(n: int, rounds: int) -> None:
    connection = await aio_pika.connect_robust(URL)
    runs: dict[str, Callable[[AbstractRobustConnection, int], Awaitable[Result]]] = {
        MIDDLEWARE: middleware,
        WORKER: functools.partial(worker, direct=False),
        DIRECT: functools.partial(worker, direct=True),
    }
    results: dict[str, list[Result]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(rounds):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            res = await runs[name](connection, n)
            results[name].append(res)
            print(
                f"round {round_ + 1}: {name}: {res.seconds:.2f} s, {res.rate:,.0f} msg/s, "
                f"lateness p50 {ms(res.p50_ms)} ms, max {ms(res.max_ms)} ms; "
                f"lost {res.lost}, twice {res.twice}, early {res.early}, left {res.left}; "
                f"events {dict(res.events)}; scheduled p50 {ms(res.scheduled_p50_ms)} ms "
                f"after the first failure; RELEASED events' lateness p50 "
                f"{ms(res.release_p50_ms)} ms",
                file=sys.stderr,
            )
    await connection.close()
    baseline = statistics.median(r.rate for r in results[MIDDLEWARE])
    table = Table(
        title=f"A burst of {n:,} failing once, {DELAY_S:g} s backoff, x {rounds} rounds, "
        f"prefetch {PREFETCH}"
    )
    table.add_column("consumer and retries")
    for column in (
        "median s",
        "median msg/s",
        "runs",
        "ratio to middleware",
        "scheduled after, p50 ms",
        "lateness p50, ms",
        "lateness max, ms",
    ):
        table.add_column(column, justify="right")
    for name, values in results.items():
        median = statistics.median(r.rate for r in values)
        table.add_row(
            name,
            f"{statistics.median(r.seconds for r in values):.2f}",
            f"{median:,.0f}",
            " / ".join(f"{r.rate:,.0f}" for r in values),
            f"{median / baseline:.2f}",
            ms(statistics.median(r.scheduled_p50_ms for r in values)),
            ms(statistics.median(r.p50_ms for r in values)),
            ms(max(r.max_ms for r in values)),
        )
    console = Console(width=150)
    console.print(table)
    console.print(
        "scheduled after: first failure to the copy's scheduling (the worker: its intake); "
        "lateness: 2nd arrival - 1st - the delay. p50: the median of the rounds' medians; "
        "max: the worst of all rounds. Rates of a round with a message lost are 0."
    )
    for name, values in results.items():
        counts = {
            "lost": sum(r.lost for r in values),
            "handled twice": sum(r.twice for r in values),
            "early": sum(r.early for r in values),
            "left in a queue": sum(r.left for r in values),
        }
        events = sum((r.events for r in values), Counter[str]())
        console.print(
            f"{name}: "
            + ", ".join(f"{k} {v}" for k, v in counts.items())
            + "; events: "
            + ", ".join(f"{k} {v}" for k, v in sorted(events.items()))
        )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 2000, args[1] if len(args) > 1 else 3))
