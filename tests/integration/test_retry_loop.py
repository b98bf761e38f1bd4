"""The retry loop end to end, on a real RabbitMQ: TTL tiers, re-check, DLQ, confirms."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from faststream.rabbit import ExchangeType, RabbitExchange, RabbitMessage, RabbitQueue

from faststream_retry import (
    Exponential,
    Fixed,
    PermanentError,
    RetryLater,
    RetryPolicy,
    retry_policy,
)
from faststream_retry.core.events import EventKind
from faststream_retry.core.topology import tier_name
from tests.rabbit import App, drain, eventually, headers_of, on_time, queue_depth, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


async def test_transient_twice_then_success(make_app: Any, amqp: AbstractRobustConnection) -> None:
    """Two transient failures come back after at least their planned delays, then succeed."""
    app: App = make_app()
    queue = unique("orders")
    calls: list[float] = []

    @app.broker.subscriber(queue)
    @retry_policy(backoff=Exponential(initial=0.3, factor=2), max_attempts=5)
    async def handle(body: dict[str, Any]) -> None:
        calls.append(time.time())
        if len(calls) <= 2:
            raise ConnectionError("database down")

    await app.start()
    await app.broker.publish({"id": 1}, queue=queue)
    await eventually(lambda: len(calls) == 3, what="3 handler calls")

    planned = [e.delay_ms for e in app.events if e.kind is EventKind.SCHEDULED]
    assert planned == [300, 600]
    gaps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(calls)]
    for gap, delay in zip(gaps_ms, planned, strict=True):
        assert gap >= delay, (gaps_ms, planned)
        assert on_time(gap - delay, delay), f"late by {gap - delay:.0f} ms"
    # A release is reported once its publish is confirmed, which can be after the
    # handler already has the message: wait for the report, not only the call.
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == 2,
        what="both releases reported",
    )
    lateness = [e.lateness_ms for e in app.events if e.kind is EventKind.RELEASED]
    assert len(lateness) == 2
    assert all(x is not None and on_time(x, d) for x, d in zip(lateness, planned, strict=True)), (
        lateness
    )
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []


async def test_permanent_failure_goes_to_dlq_untouched(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A permanent failure: one call, then one DLQ copy with body, ids and headers intact."""
    app: App = make_app()
    queue = unique("webhooks")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("payload names no URL")

    await app.start()
    await app.broker.publish(
        {"id": 7},
        queue=queue,
        message_id="msg-7",
        correlation_id="corr-7",
        headers={"tenant": "acme", "x-death": "forged"},
    )
    dead = await drain(amqp, f"{queue}.dlq", expect=1)
    assert calls == 1
    assert len(dead) == 1
    msg = dead[0]
    assert msg.body == b'{"id":7}'
    assert msg.message_id == "msg-7"
    assert msg.correlation_id == "corr-7"
    assert msg.content_type == "application/json"
    headers = msg.headers
    assert headers["tenant"] == "acme"
    assert "x-death" not in headers
    assert headers["retry-reason"] == "permanent"
    assert headers["retry-exception"] == "faststream_retry.errors.PermanentError"
    assert headers["retry-error"] == "payload names no URL"
    assert "PermanentError" in str(headers["retry-traceback"])
    assert headers["retry-origin-queue"] == queue
    assert headers["retry-attempt"] == 1
    assert await queue_depth(amqp, queue) == 0


async def test_exhausted_after_max_attempts(make_app: Any, amqp: AbstractRobustConnection) -> None:
    """A transient failure that never passes: max_attempts calls, then DLQ as exhausted."""
    app: App = make_app()
    queue = unique("email")
    calls = 0

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.1))
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        raise TimeoutError(f"smtp timeout #{calls}")

    await app.start()
    await app.broker.publish("hello", queue=queue)
    dead = await drain(amqp, f"{queue}.dlq", expect=1)
    assert calls == 3
    assert len(dead) == 1
    headers = headers_of(dead[0])
    assert headers["retry-reason"] == "exhausted"
    assert headers["retry-attempt"] == 3
    history = headers["retry-history"]
    assert [entry["attempt"] for entry in history] == [1, 2, 3]
    assert [entry["error"] for entry in history] == [
        "smtp timeout #1",
        "smtp timeout #2",
        "smtp timeout #3",
    ]
    assert headers["retry-first-failed-at"] <= headers["retry-last-failed-at"]


async def test_fanout_retry_reaches_only_the_failing_queue(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Two queues on one fanout exchange; one fails once: the other is called exactly once."""
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    exchange = RabbitExchange(unique("notify"), type=ExchangeType.FANOUT, auto_delete=True)
    flaky_q, steady_q = unique("flaky"), unique("steady")
    flaky_calls = steady_calls = 0

    @app.broker.subscriber(RabbitQueue(flaky_q), exchange)
    async def flaky(body: str) -> None:
        nonlocal flaky_calls
        flaky_calls += 1
        if flaky_calls == 1:
            raise ConnectionError("smtp down")

    @app.broker.subscriber(RabbitQueue(steady_q), exchange)
    async def steady(body: str) -> None:
        nonlocal steady_calls
        steady_calls += 1

    await app.start()
    await app.broker.publish("event", exchange=exchange)
    await eventually(lambda: flaky_calls == 2, what="the retry of the flaky queue")
    await eventually(lambda: steady_calls >= 1, what="the steady queue")
    assert await queue_depth(amqp, steady_q) == 0
    assert await queue_depth(amqp, flaky_q) == 0
    assert steady_calls == 1
    assert flaky_calls == 2


async def test_short_retry_is_not_blocked_by_a_long_one(make_app: Any) -> None:
    """Head-of-line: a 1 s retry scheduled after an 8 s retry comes back after about 1 s."""
    app: App = make_app(tick=0.5)
    queue = unique("hol")
    seen: dict[str, list[float]] = {"slow": [], "fast": []}

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        seen[body].append(time.monotonic())
        if len(seen[body]) == 1:
            raise RetryLater(delay=8 if body == "slow" else 1)

    await app.start()
    await app.broker.publish("slow", queue=queue)
    await eventually(lambda: len(seen["slow"]) == 1, what="the slow message's first call")
    await app.broker.publish("fast", queue=queue)
    await eventually(lambda: len(seen["fast"]) == 2, timeout=12, what="the fast retry")
    assert seen["fast"][1] - seen["fast"][0] >= 1.0, "never early"
    # Not held behind the long one: back before the 8 s retry was even due.
    assert seen["fast"][1] < seen["slow"][0] + 8.0
    assert len(seen["slow"]) == 1, "the 8 s retry must still be waiting"
    await eventually(lambda: len(seen["slow"]) == 2, timeout=12, what="the slow retry")
    assert seen["slow"][1] - seen["slow"][0] >= 8.0


async def test_forged_header_never_moves_a_message_to_another_queue(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A message injected into <queue>.retry naming another queue goes back to <queue> only."""
    app: App = make_app()
    queue, victim = unique("mine"), unique("victim")
    mine: list[bytes] = []
    stolen: list[bytes] = []

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        mine.append(msg.body)

    @app.broker.subscriber(victim)
    async def handle_victim(msg: RabbitMessage) -> None:
        stolen.append(msg.body)

    await app.start()
    channel = await amqp.channel()
    hostile: dict[str, Any] = {
        "retry-origin-queue": victim,
        "retry-due": "soon",
        "retry-attempt": -500,
        "x-death": [{"queue": victim, "count": 99}],
        "x-first-death-queue": victim,
    }
    await channel.default_exchange.publish(
        aio_pika.Message(b"forged", headers=hostile), routing_key=f"{queue}.retry"
    )
    await channel.default_exchange.publish(
        aio_pika.Message(b"forged-2", headers={"retry-due": 2**62}),
        routing_key=f"{queue}.retry",
    )
    dead = await drain(amqp, f"{queue}.dlq", expect=1)
    await eventually(lambda: len(mine) >= 1, what="the forged message in its own queue")
    await channel.close()
    assert mine == [b"forged"]
    assert stolen == []
    assert [m.body for m in dead] == [b"forged-2"]
    assert dead[0].headers["retry-reason"] == "invalid"
    assert await queue_depth(amqp, victim) == 0


async def test_restart_while_messages_wait_in_backoff_loses_nothing(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The consuming app stops while retries wait; a new one picks them all up."""
    queue = unique("restart")
    sent = [f"m{i}" for i in range(30)]
    processed: list[str] = []
    failed_once: set[str] = set()

    def build() -> App:
        app: App = make_app(prefix=prefix, default=RetryPolicy(backoff=Fixed(1.0)))

        @app.broker.subscriber(queue)
        async def handle(body: str) -> None:
            if body not in failed_once:
                failed_once.add(body)
                raise ConnectionError("down")
            processed.append(body)

        return app

    prefix = unique("t")
    first = build()
    await first.start()
    for body in sent:
        await first.broker.publish(body, queue=queue)
    await eventually(
        lambda: sum(e.kind is EventKind.SCHEDULED for e in first.events) == len(sent),
        what="all first failures scheduled",
    )
    await first.stop()
    # While nobody consumes, every copy expires out of its tier into <queue>.retry.
    for _ in range(300):
        if await queue_depth(amqp, f"{queue}.retry") == len(sent):
            break
        await asyncio.sleep(0.05)
    assert await queue_depth(amqp, f"{queue}.retry") == len(sent)
    assert processed == []

    second = build()
    await second.start()
    await eventually(lambda: len(processed) == len(sent), what="every message processed")
    assert sorted(processed) == sorted(sent)
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []


class Deliveries:
    """What a handler saw of each delivery: (redelivered, retry-attempt), and when."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bool | None, Any]] = []
        self.times: list[float] = []

    def record(self, msg: RabbitMessage) -> None:
        self.deliveries.append((msg.raw_message.redelivered, msg.headers.get("retry-attempt")))
        self.times.append(time.monotonic())


async def test_unroutable_retry_copy_does_not_ack_the_original(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A tier queue replaced under the running app: the copy is returned, the original kept.

    The replacement (a classic queue, not bound to the tier exchange) makes every copy
    unroutable, and the plugin cannot declare its own tier over it (406): the repair
    fails. The original is held, unacked, and its copy placed again after each pause; the
    handler is not run again. Stopped meanwhile, the app hands the original back.
    """
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("unroutable")
    seen = Deliveries()

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        seen.record(msg)
        raise ConnectionError("down")

    await app.start()
    channel = await amqp.channel()
    tier = tier_name(app.prefix, 100)
    await channel.queue_delete(tier)
    await channel.declare_queue(tier, durable=True, arguments={"x-queue-type": "classic"})
    await app.broker.publish("keep me", queue=queue)
    await eventually(lambda: len(seen.deliveries) == 1, what="the first delivery")
    # Five pauses (publish_failure_pause 0.2 s): requeued, it would have run five times more.
    await asyncio.sleep(1.0)
    assert seen.deliveries == [(False, None)]  # the handler ran once
    stopping = asyncio.get_running_loop().time()
    await app.stop()
    assert asyncio.get_running_loop().time() - stopping < 1.0, "a held message delays no stop"
    # Handed back at the stop, to no handler: the intake stopped first.
    assert seen.deliveries == [(False, None)]
    assert not any(e.kind is EventKind.SCHEDULED for e in app.events)
    assert await queue_depth(amqp, queue) == 1  # handed back, unacked
    assert await app.waiting(amqp, queue) == 0
    await channel.close()


async def test_immediate_retries_stay_in_process(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """immediate=1: the second call happens in the same delivery, no tier involved."""
    app: App = make_app()
    queue = unique("immediate")
    calls = 0

    @app.broker.subscriber(queue)
    @retry_policy(immediate=1, backoff=Fixed(5))
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("blip")

    await app.start()
    await app.broker.publish("x", queue=queue)
    await eventually(lambda: calls == 2, timeout=3, what="the in-process retry")
    assert [(e.kind, e.immediate) for e in app.events] == [(EventKind.SCHEDULED, True)]
    assert await app.waiting(amqp, queue) == 0, "no copy in any tier: the retry was in-process"
    assert await queue_depth(amqp, queue) == 0


async def test_failure_during_graceful_shutdown_still_gets_its_copy(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A handler failing while the broker stops: its retry copy is confirmed, the original acked."""
    app: App = make_app(
        default=RetryPolicy(backoff=Fixed(30)), broker_options={"graceful_timeout": 10}
    )
    queue = unique("shutdown")
    entered = asyncio.Event()
    release = asyncio.Event()
    subscriber = app.broker.subscriber(queue)

    @subscriber
    async def handle(body: str) -> None:
        entered.set()
        await release.wait()
        raise ConnectionError("failed while we were shutting down")

    await app.start()
    await app.broker.publish("x", queue=queue)
    await asyncio.wait_for(entered.wait(), timeout=10)
    stopping = asyncio.create_task(app.stop())
    # FastStream marks the subscriber stopped, then waits for the handler in flight.
    await eventually(lambda: not subscriber.running, what="stop() in FastStream's graceful wait")
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, timeout=20)
    scheduled = [e for e in app.events if e.kind is EventKind.SCHEDULED]
    assert len(scheduled) == 1, app.events
    assert await queue_depth(amqp, queue) == 0, "the original was acked"
    tiers = app.retry.runtime(app.broker).plan.tiers
    assert tiers is not None
    assert await queue_depth(amqp, tier_name(app.prefix, tiers.pick(30_000))) == 1


async def test_one_log_line_per_decision_and_none_per_hop(
    make_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry that takes several hops logs one INFO line; the hops stay at DEBUG."""
    app: App = make_app()
    queue = unique("logged")
    calls = 0

    @app.broker.subscriber(queue)
    @retry_policy(backoff=Fixed(0.7))  # 700 ms on a 100 ms tick: 400 + 200 + 100
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("slow")

    caplog.set_level("DEBUG", logger="faststream_retry")
    await app.start()
    await app.broker.publish("x", queue=queue, message_id="m-1")
    await eventually(lambda: calls == 2, what="the retried call")
    await eventually(
        lambda: any(e.kind is EventKind.RELEASED for e in app.events), what="the release report"
    )
    mine = [r for r in caplog.records if r.name == "faststream_retry"]
    info = [r for r in mine if r.levelname == "INFO" and "scheduled" in r.getMessage()]
    assert len(info) == 1
    assert info[0].retry == {  # type: ignore[attr-defined]
        "event": "scheduled",
        "queue": queue,
        "message_id": "m-1",
        "attempt": 1,
        "max_attempts": 5,
        "delay_ms": 700,
        "reason": None,
        "exception": "TimeoutError",
        "rule": "builtin",
    }
    hops = [r for r in mine if r.getMessage().startswith("re-check")]
    assert len(hops) == 3  # two hops and the release
    assert all(r.levelname == "DEBUG" for r in hops)


class BreaksOnce:
    """A custom backoff whose first call raises, as a buggy user strategy would."""

    def __init__(self) -> None:
        self.calls = 0

    def delay_ms(self, n: int, rand: Any) -> int:
        self.calls += 1
        if self.calls == 1:
            raise ZeroDivisionError("a bug in the user's backoff")
        return 100

    def named_delays_ms(self) -> tuple[int, ...]:
        return (100,)


async def test_a_failing_decision_requeues_the_original(
    make_app: Any, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A backoff that raises loses nothing: logged, the original requeued after the pause."""
    app: App = make_app(default=RetryPolicy(backoff=BreaksOnce()))
    queue = unique("decision-error")
    seen = Deliveries()

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        seen.record(msg)
        if len(seen.deliveries) < 3:
            raise ConnectionError("down")

    await app.start()
    await app.broker.publish("keep me", queue=queue, message_id="m-1")
    await eventually(lambda: len(seen.deliveries) == 3, what="requeue, then a scheduled retry")
    # The requeued original, then the retry copy of its second failure.
    assert seen.deliveries == [(False, None), (True, None), (False, 1)]
    assert seen.times[1] - seen.times[0] >= 0.2, "requeued only after publish_failure_pause"
    assert "retry decision failed for message m-1" in caplog.text
    await eventually(lambda: len(app.events) == 2, what="the release reported")
    assert [e.kind for e in app.events] == [EventKind.SCHEDULED, EventKind.RELEASED]
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0
