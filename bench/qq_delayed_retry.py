"""RabbitMQ 4.3's delayed retries of a quorum queue, as a FastStream (AMQP 0.9.1) consumer sees.

Each scenario declares a fresh quorum queue with `x-delayed-retry-type/-min/-max`, a delivery
limit and a dead-letter route to `<queue>.dlq`, publishes to it, and lets a plain FastStream
subscriber (no faststream-retry) fail in one way: an exception under `AckPolicy.NACK_ON_ERROR`
(`basic.nack`, requeue), `msg.reject(requeue=True)` (`basic.reject`, requeue), an exception
under FastStream's default ack policy, or a consumer whose channel closes with the message
unacked. It prints, per delivery, the time since the publish, the gap to the delivery before,
`redelivered` and the broker's `x-delivery-count` / `x-acquired-count` headers, and where the
message ended. docs/rabbitmq-4.3-delayed-retry.md has its output and what it means. Needs
RabbitMQ >= 4.3: an older broker shows no delay.

    python -m bench.qq_delayed_retry      (RABBITMQ_URL, default 127.0.0.1:5673)
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import aio_pika
from faststream import AckPolicy
from faststream.rabbit import Channel, QueueType, RabbitBroker, RabbitMessage, RabbitQueue
from faststream.rabbit.schemas.queue import QuorumQueueArgs

URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5673/")
MIN_MS = 500
MAX_MS = 2000
LIMIT = 3
WAIT_S = 20.0
COUNTERS = ("x-delivery-count", "x-acquired-count")


@dataclass
class Delivery:
    """One delivery of a message to the handler."""

    body: str
    at: float
    redelivered: bool
    counters: dict[str, Any]


@dataclass
class Log:
    """The deliveries a scenario saw, and an event set when it has seen what it waits for."""

    start: float = field(default_factory=time.monotonic)
    deliveries: list[Delivery] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, msg: RabbitMessage) -> Delivery:
        """Record a delivery to a FastStream handler."""
        return self.add_raw(msg.raw_message)

    def add_raw(self, raw: aio_pika.abc.AbstractIncomingMessage) -> Delivery:
        """Record a delivery to a plain aio-pika consumer."""
        d = Delivery(
            body=raw.body.decode(),
            at=time.monotonic() - self.start,
            redelivered=bool(raw.redelivered),
            counters={k: v for k, v in (raw.headers or {}).items() if k in COUNTERS},
        )
        self.deliveries.append(d)
        return d


def queue(
    name: str, kind: str, *, min_ms: int = MIN_MS, max_ms: int | None = MAX_MS, limit: int = LIMIT
) -> RabbitQueue:
    """A quorum queue with delayed retries of `kind`, a delivery limit and a dead-letter route."""
    arguments: dict[str, Any] = {
        "x-delayed-retry-type": kind,
        "x-delayed-retry-min": min_ms,
        "x-delivery-limit": limit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": f"{name}.dlq",
    }
    if max_ms is not None:
        arguments["x-delayed-retry-max"] = max_ms
    # FastStream 0.7's QuorumQueueArgs predates 4.3: it has no x-delayed-retry-* keys.
    return RabbitQueue(
        name,
        durable=True,
        queue_type=QueueType.QUORUM,
        arguments=cast("QuorumQueueArgs", arguments),
    )


async def declare_dlq(name: str) -> None:
    """Declare `<name>.dlq` first: RabbitMQ drops a message dead-lettered to no queue."""
    async with await aio_pika.connect(URL) as conn:
        ch = await conn.channel()
        await ch.declare_queue(f"{name}.dlq", durable=True, arguments={"x-queue-type": "quorum"})


async def dead_letter(
    name: str, timeout: float, stop: asyncio.Event
) -> tuple[float, dict[str, Any]] | None:
    """The first message of `<name>.dlq` within `timeout` s: when it came, its death and counters.

    Gives up half a second after `stop` is set (the handler is done: a dead letter on its way has
    that long to show up).
    """
    async with await aio_pika.connect(URL) as conn:
        ch = await conn.channel()
        dlq = await ch.get_queue(f"{name}.dlq", ensure=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop.is_set():
                deadline = min(deadline, time.monotonic() + 0.5)
            got = await dlq.get(no_ack=True, fail=False)
            if got is not None:
                hdr = got.headers or {}
                return time.monotonic(), {
                    "x-first-death-reason": hdr.get("x-first-death-reason"),
                    **{k: hdr[k] for k in COUNTERS if k in hdr},
                }
            await asyncio.sleep(0.01)
    return None


async def cleanup(name: str) -> None:
    """Delete the scenario's two queues."""
    async with await aio_pika.connect(URL) as conn:
        ch = await conn.channel()
        for q in (name, f"{name}.dlq"):
            await ch.queue_delete(q)


def report(title: str, log: Log, dead: tuple[float, dict[str, Any]] | None) -> None:
    """Print one scenario's deliveries and where its message ended."""
    print(f"\n## {title}")
    last: dict[str, float] = {}
    for d in log.deliveries:
        gap = d.at - last[d.body] if d.body in last else None
        last[d.body] = d.at
        gap_s = "" if gap is None else f"gap {gap * 1000:6.0f} ms"
        print(
            f"  {d.body:>3}  t={d.at * 1000:6.0f} ms  {gap_s:>14}  "
            f"redelivered={d.redelivered!s:<5}  {d.counters}"
        )
    if dead is None:
        print("  dead-lettered: nothing")
    else:
        print(f"  dead-lettered at t={(dead[0] - log.start) * 1000:.0f} ms: {dead[1]}")


Handler = Callable[[RabbitMessage, Log], Awaitable[None]]
Action = Callable[[RabbitMessage], Awaitable[None]]


async def run(
    title: str,
    kind: str,
    handler: Handler,
    *,
    ack_policy: AckPolicy = AckPolicy.NACK_ON_ERROR,
    bodies: tuple[str, ...] = ("m",),
    prefetch: int = 10,
    min_ms: int = MIN_MS,
    limit: int = LIMIT,
    max_ms: int | None = MAX_MS,
) -> None:
    """One scenario: a fresh queue, the bodies published, a FastStream subscriber runs `handler`."""
    name = f"qq-delayed-{uuid.uuid4().hex[:8]}"
    log = Log()
    await declare_dlq(name)
    broker = RabbitBroker(URL, logger=None)

    @broker.subscriber(
        queue(name, kind, min_ms=min_ms, max_ms=max_ms, limit=limit),
        ack_policy=ack_policy,
        channel=Channel(prefetch_count=prefetch),
    )
    async def handle(msg: RabbitMessage) -> None:
        await handler(msg, log)

    async with broker:
        await broker.start()
        log.start = time.monotonic()
        for body in bodies:
            await broker.publish(body, name)
        dead = await dead_letter(name, WAIT_S, log.done)
    report(title, log, dead)
    await cleanup(name)


def fail_until(calls: int, action: Action | None = None) -> Handler:
    """A handler that fails its first `calls - 1` deliveries (it raises, or runs `action`)."""

    async def handler(msg: RabbitMessage, log: Log) -> None:
        d = log.add(msg)
        if len([x for x in log.deliveries if x.body == d.body]) >= calls:
            log.done.set()
            return
        if action is None:
            msg_ = f"delivery {len(log.deliveries)} fails"
            raise RuntimeError(msg_)
        await action(msg)

    return handler


async def reject_requeue(msg: RabbitMessage) -> None:
    """`basic.reject`, requeue: the one 0.9.1 requeue that 4.3 counts as a failed delivery."""
    await msg.reject(requeue=True)


async def head_of_line(msg: RabbitMessage, log: Log) -> None:
    """`a` is nacked once; the others are handled; done when every body has been handled."""
    d = log.add(msg)
    if d.body == "a" and sum(x.body == "a" for x in log.deliveries) == 1:
        await msg.nack(requeue=True)
        return
    if {"a", "b", "c"} <= {x.body for x in log.deliveries[1:]}:
        log.done.set()


async def channel_close(kind: str) -> None:
    """A consumer whose channel closes with the message unacked (a crash), until the DLQ."""
    name = f"qq-delayed-{uuid.uuid4().hex[:8]}"
    log = Log()
    await declare_dlq(name)
    async with await aio_pika.connect(URL) as conn:
        ch = await conn.channel()
        await ch.declare_queue(name, durable=True, arguments=queue(name, kind).arguments)
        log.start = time.monotonic()
        await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=name)
        dead = asyncio.create_task(dead_letter(name, WAIT_S, log.done))
        while not dead.done():
            crash = await conn.channel()
            await crash.set_qos(prefetch_count=1)
            got: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
            await (await crash.get_queue(name, ensure=False)).consume(got.put)
            delivered = asyncio.create_task(got.get())
            await asyncio.wait({delivered, dead}, return_when=asyncio.FIRST_COMPLETED)
            if delivered.done():
                log.add_raw(delivered.result())
            else:
                delivered.cancel()
            await crash.close()
    report(f"channel closed with the message unacked, type {kind}", log, dead.result())
    await cleanup(name)


async def main() -> None:
    """Every scenario, in turn."""
    print(f"RABBITMQ_URL {URL}")
    print(f"unless a title says otherwise: -min {MIN_MS} ms, -max {MAX_MS} ms, limit {LIMIT}")
    nack = "raise, AckPolicy.NACK_ON_ERROR (basic.nack requeue), type"
    await run(f"{nack} all", "all", fail_until(6))
    await run(f"{nack} failed", "failed", fail_until(6))
    await run(f"{nack} returned", "returned", fail_until(6))
    reject = "msg.reject(requeue=True) (basic.reject requeue), type"
    await run(f"{reject} all", "all", fail_until(10, reject_requeue))
    await run(
        "msg.reject(requeue=True), type failed, -max 1200 ms, x-delivery-limit 6",
        "failed",
        fail_until(10, reject_requeue),
        max_ms=1200,
        limit=6,
    )
    await run(
        "msg.reject(requeue=True), type failed, no -max, x-delivery-limit 6",
        "failed",
        fail_until(10, reject_requeue),
        max_ms=None,
        limit=6,
    )
    await run(f"{reject} returned", "returned", fail_until(10, reject_requeue))
    await run(
        "raise, FastStream's default AckPolicy.REJECT_ON_ERROR (basic.reject), type all",
        "all",
        fail_until(6),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
    )
    await channel_close("all")
    await run(
        "head of line: a, b, c published, a nacked once; -min 2000 ms, prefetch 1, type all",
        "all",
        head_of_line,
        bodies=("a", "b", "c"),
        prefetch=1,
        min_ms=2000,
    )


if __name__ == "__main__":
    asyncio.run(main())
