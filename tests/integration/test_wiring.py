"""Every way a FastStream app is wired: one failed delivery makes at most one copy.

Routers (with and without prefix, nested, ``include_router(middlewares=...)``), a
handler that settles its own message and then raises, and subscribers started after the
broker: each failure is decided once, a handler's settlement is respected, and nothing
vanishes. Counted exactly, by message id, on a real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream import AckPolicy, BaseMiddleware
from faststream.rabbit import QueueType, RabbitBroker, RabbitMessage, RabbitQueue, RabbitRouter

from faststream_retry import (
    Fixed,
    PermanentError,
    RetryConfigError,
    RetryMiddleware,
    RetryPolicy,
    RetryTopologyError,
    TransientError,
    retry_policy,
)
from tests.rabbit import (
    App,
    consumers,
    delete_declared,
    drain,
    eventually,
    eventually_async,
    queue_depth,
    unique,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

POLICY = RetryPolicy(max_attempts=3, backoff=Fixed(0.1))


def _retry(prefix: str) -> RetryMiddleware:
    return RetryMiddleware(POLICY, prefix=prefix, tick=0.1, max_delay=60, publish_failure_pause=0.2)


@contextlib.asynccontextmanager
async def _running(
    amqp: AbstractRobustConnection, retry: RetryMiddleware, broker: RabbitBroker
) -> AsyncIterator[None]:
    await broker.start()
    try:
        yield
    finally:
        await broker.stop()
        await delete_declared(amqp, retry, broker)


def _wire_router(
    url: str, how: str, retry: RetryMiddleware
) -> tuple[RabbitBroker, Callable[..., Any]]:
    """Return a broker and a subscriber decorator, wired ``how`` (retry placed accordingly)."""
    if how == "router":
        broker = RabbitBroker(url, logger=None)
        router = RabbitRouter(prefix="svc.", middlewares=[retry])
        outer: Any = router
    elif how == "router-and-broker":
        broker = RabbitBroker(url, middlewares=[retry], logger=None)
        router = RabbitRouter(prefix="svc.", middlewares=[retry])
        outer = router
    elif how == "include-router-middlewares":
        broker = RabbitBroker(url, logger=None)
        router = RabbitRouter(prefix="svc.")
        outer = None
    elif how == "nested":
        broker = RabbitBroker(url, middlewares=[retry], logger=None)
        inner = RabbitRouter(prefix="in.", middlewares=[retry])
        router = RabbitRouter(prefix="svc.", middlewares=[retry])
        router.include_router(inner)
        outer = inner
    else:  # pragma: no cover - a typo in the parametrization
        raise AssertionError(how)

    def subscribe(queue: str) -> Callable[..., Any]:
        return (outer or router).subscriber(queue)

    def finish() -> None:
        if how == "include-router-middlewares":
            broker.include_router(router, middlewares=[retry])
        else:
            broker.include_router(router)
        retry.install(broker)

    subscribe.finish = finish  # type: ignore[attr-defined]
    return broker, subscribe


@pytest.mark.parametrize(
    "how", ["router", "router-and-broker", "include-router-middlewares", "nested"]
)
async def test_a_failure_is_decided_once_wherever_the_middleware_sits(
    rabbit_url: str, amqp: AbstractRobustConnection, how: str
) -> None:
    """On a router, on a router and the broker, via include_router, nested: one copy per failure.

    Before, the router's scope and the broker's each published a copy: 2^n dead letters.
    """
    retry = _retry(unique("wire"))
    broker, subscribe = _wire_router(rabbit_url, how, retry)
    calls: Counter[str] = Counter()

    # A name of its own: the four wirings run side by side in parallel workers.
    @subscribe(unique("orders"))
    async def orders(body: str) -> None:
        calls[body] += 1
        if body.startswith("bad"):
            raise PermanentError("malformed order")
        raise TransientError("the stock service is down")

    subscribe.finish()  # type: ignore[attr-defined]
    [queue] = retry.runtime(broker).replan().routes
    async with _running(amqp, retry, broker):
        await broker.publish("late-1", queue=queue)
        await broker.publish("bad-1", queue=queue)
        dead = await drain(amqp, f"{queue}.dlq", expect=2, timeout=30)
        assert sorted(m.body.decode() for m in dead) == ["bad-1", "late-1"]
        assert calls == {"late-1": 3, "bad-1": 1}
        # Nothing else on its way: no copy waits in the work queue, a tier or .retry.
        plan = retry.runtime(broker).plan
        for name in [queue, f"{queue}.retry", *(plan.tier(t) for t in plan.tiers.ttls_ms)]:
            assert await queue_depth(amqp, name) == 0, name


async def test_two_retry_middlewares_on_one_broker_are_refused_at_start(
    rabbit_url: str,
) -> None:
    """Two instances would each decide every failure: start names both and where they sit."""
    first, second = _retry(unique("one")), _retry(unique("two"))
    broker = RabbitBroker(rabbit_url, middlewares=[first], logger=None)
    router = RabbitRouter(prefix="svc.", middlewares=[second])

    @router.subscriber(unique("orders"))
    async def orders(body: str) -> None: ...

    broker.include_router(router)
    first.install(broker)
    with pytest.raises(RetryConfigError) as caught:
        await broker.start()
    await broker.stop()
    text = str(caught.value)
    assert "two RetryMiddleware instances" in text
    assert f"prefix {first.prefix!r}" in text
    assert f"prefix {second.prefix!r}" in text
    assert "svc.orders" in text


@pytest.mark.parametrize("settle", ["ack", "nack", "reject"])
async def test_a_handler_that_settled_its_message_and_raised_gets_no_copy(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    settle: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """AckPolicy.MANUAL with the nack-on-error idiom: the handler's own settlement rules.

    Before, the plugin published a retry copy on top of the handler's nack (which
    requeued the original): every failure doubled the message, a storm.
    """
    retry = _retry(unique("manual"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("manual")
    calls: Counter[str] = Counter()
    done: list[str] = []

    @broker.subscriber(queue, ack_policy=AckPolicy.MANUAL)
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[body] += 1
        if calls[body] < 3:  # a short outage: two failed calls, then it works
            if settle == "ack":
                await message.ack()
            elif settle == "nack":
                await message.nack()  # requeue=True: the handler asks for it back
            else:
                await message.reject()
            raise ConnectionError("the database is restarting")
        done.append(body)
        await message.ack()

    async with _running(amqp, retry, broker):
        await broker.publish("m1", queue=queue)
        if settle == "nack":
            await eventually(lambda: done == ["m1"], what="the requeued message to pass")
            assert calls == {"m1": 3}
        else:
            # ack or reject: the handler let the message go; nothing comes back.
            await eventually(lambda: calls["m1"] == 1, what="the first call")
            assert await drain(amqp, f"{queue}.dlq", expect=0, timeout=1) == []
            assert await queue_depth(amqp, f"{queue}.retry") == 0
            assert calls == {"m1": 1}
        warnings = [r for r in caplog.records if "settled" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert queue in warnings[0].getMessage()


async def test_a_manual_handler_that_raises_without_settling_is_retried(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """AckPolicy.MANUAL, no settlement before the raise: retried as with the default policy."""
    retry = _retry(unique("manual-raise"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("manual-raise")
    calls: list[str] = []

    @broker.subscriber(queue, ack_policy=AckPolicy.MANUAL)
    async def handle(body: str, message: RabbitMessage) -> None:
        calls.append(body)
        if len(calls) < 3:
            raise ConnectionError("the database is restarting")
        await message.ack()

    async with _running(amqp, retry, broker):
        await broker.publish("m1", queue=queue)
        await eventually(lambda: len(calls) == 3, what="two retries")
        assert await drain(amqp, f"{queue}.dlq", expect=0, timeout=1) == []
        assert await queue_depth(amqp, queue) == 0
    assert calls == ["m1"] * 3


async def test_a_subscriber_started_after_the_broker_is_covered(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A late subscriber: .retry and .dlq declared, its retries released, its poison dead-lettered.

    Before, its failed message was rejected by FastStream and lost; nothing was logged.
    """
    retry = _retry(unique("late"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    early = unique("early")

    @broker.subscriber(early)
    async def first(body: str) -> None: ...

    queue = unique("late")
    calls: Counter[str] = Counter()
    done: list[str] = []

    async def late(body: str) -> None:
        calls[body] += 1
        if body == "poison":
            raise PermanentError("never valid")
        if calls[body] < 2:
            raise TransientError("not yet")
        done.append(body)

    async with _running(amqp, retry, broker):
        sub = broker.subscriber(queue, persistent=False)
        sub(late)
        await sub.start()
        await broker.publish("poison", queue=queue)
        await broker.publish("m1", queue=queue)
        dead = await drain(amqp, f"{queue}.dlq", expect=1, timeout=30)
        assert [m.body.decode() for m in dead] == ["poison"]
        await eventually(lambda: done == ["m1"], timeout=30, what="the late retry")
        assert calls == {"poison": 1, "m1": 2}
        assert queue in retry.runtime(broker).plan.routes
        await sub.stop()
        # Stopped with its subscriber: the re-check consumer no longer holds .retry.
        assert await consumers(amqp, f"{queue}.retry") == 0


# 1.5 s on a 100 ms tick is several tiers: each copy waits 800 ms in the first, then
# passes .retry; an app stopped within those 800 ms leaves it there.
PARKING = RetryPolicy(max_attempts=50, backoff=Fixed(1.5))


async def _park_two(amqp: AbstractRobustConnection, url: str, prefix: str, queue: str) -> None:
    """Run an app whose handler keeps failing, then stop it: two copies wait in ``.retry``."""
    first = App(url, prefix=prefix, default=PARKING)

    @first.broker.subscriber(queue)
    async def failing(body: str) -> None:
        raise TransientError("the payment service is down")

    await first.start()
    try:
        await first.broker.publish("m1", queue=queue, message_id="m1")
        await first.broker.publish("m2", queue=queue, message_id="m2")
        await eventually(
            lambda: {e.message_id for e in first.events if e.kind == "scheduled"} >= {"m1", "m2"},
            what="both messages in their first tier",
        )
    finally:
        await first.stop()
    # No re-check consumer now: each copy ends in .retry when its tier expires.
    await eventually_async(
        lambda: _at_least(amqp, f"{queue}.retry", 2), what="both copies in .retry"
    )


async def test_waiting_messages_are_released_after_retries_are_switched_off(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Restarted with @retry_policy(enabled=False): what waited in .retry still comes home.

    Before, nothing consumed ``<queue>.retry`` any more: the messages waited for ever.
    """
    prefix, queue = unique("off"), unique("payments")
    await _park_two(amqp, rabbit_url, prefix, queue)
    second = App(rabbit_url, prefix=prefix)
    got: list[str] = []

    @second.broker.subscriber(queue)
    @retry_policy(enabled=False)
    async def handle(body: str) -> None:
        got.append(body)

    await second.start()
    try:
        await eventually(lambda: sorted(got) == ["m1", "m2"], what="the parked messages")
        assert await queue_depth(amqp, f"{queue}.retry") == 0
        assert await drain(amqp, f"{queue}.dlq", expect=0, timeout=0.5) == []
    finally:
        await second.stop()
        await second.cleanup(amqp)


async def test_retry_queues_nobody_releases_are_reported_at_start(
    rabbit_url: str, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscriber renamed: its old .retry, with messages and no consumer, is named at start.

    Before, the messages stayed in ``<old>.retry`` and nothing said so.
    """
    prefix, old = unique("renamed"), unique("invoices")
    await _park_two(amqp, rabbit_url, prefix, old)
    second = App(rabbit_url, prefix=prefix)

    @second.broker.subscriber(unique("invoices-v2"))
    async def handle(body: str) -> None: ...

    caplog.set_level(logging.WARNING, "faststream_retry")
    await second.start()
    try:
        [line] = [r.getMessage() for r in caplog.records if "no subscriber" in r.getMessage()]
        assert f"{old}.retry (2)" in line
        assert line.startswith("faststream-retry: 2 message(s) wait")
    finally:
        await second.stop()
        await second.cleanup(amqp)
        channel = await amqp.channel()
        for name in (f"{old}.retry", f"{old}.dlq", old):
            await channel.queue_delete(name)
        await channel.close()


async def test_a_late_ack_first_subscriber_is_refused_before_it_consumes(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """ACK_FIRST acks before the handler runs: refused at the late subscriber's start too."""
    retry = _retry(unique("late-ack-first"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("late-ack-first")
    async with _running(amqp, retry, broker):
        sub = broker.subscriber(queue, persistent=False, ack_policy=AckPolicy.ACK_FIRST)
        sub(_never_called)
        with pytest.raises(RetryConfigError, match="ACK_FIRST"):
            await sub.start()
        assert not sub.running


async def _never_called(body: str) -> None:  # pragma: no cover - refused before consuming
    raise AssertionError(body)


async def _at_least(amqp: AbstractRobustConnection, queue: str, count: int) -> bool:
    return await queue_depth(amqp, queue) >= count


async def _waiting(
    amqp: AbstractRobustConnection, retry: RetryMiddleware, broker: Any, queue: str
) -> int:
    plan = retry.runtime(broker).plan
    names = [f"{queue}.retry", *(plan.tier(t) for t in plan.tiers.ttls_ms)]
    return sum([await queue_depth(amqp, name) for name in names])


async def test_a_failure_in_flight_when_its_late_subscriber_stops_makes_one_copy(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Stopping a late subscriber mid-failure: one copy, and no re-check consumer left behind.

    Before, the in-flight failure covered the queue again after the stop had forgotten
    it, and its re-check consumer ran on until the broker stopped.
    """
    retry = _retry(unique("inflight"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("inflight")
    entered, go = asyncio.Event(), asyncio.Event()

    async def slow(body: str) -> None:
        entered.set()
        await go.wait()
        raise TransientError("timed out")

    async with _running(amqp, retry, broker):
        sub = broker.subscriber(queue, persistent=False)
        sub(slow)
        await sub.start()
        await broker.publish("m1", queue=queue)
        await asyncio.wait_for(entered.wait(), 10)
        stopping = asyncio.create_task(sub.stop())
        await eventually(lambda: not sub.running, what="the subscriber to stop taking messages")
        go.set()
        await asyncio.wait_for(stopping, 15)
        assert await consumers(amqp, f"{queue}.retry") == 0

        # The copy waits out its tier and comes home to the queue, which nothing
        # consumes now: exactly one there, none left waiting.
        async def home() -> bool:
            return await queue_depth(amqp, queue) > 0

        await eventually_async(home, what="the copy")
        assert await queue_depth(amqp, queue) == 1
        assert await _waiting(amqp, retry, broker, queue) == 0


async def test_a_late_subscribers_queue_is_in_the_registry(
    rabbit_url: str, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A late subscriber's .retry left with messages is named at the next start without it."""
    prefix, late = unique("late-reg"), unique("late-reg")
    first = App(rabbit_url, prefix=prefix, default=PARKING)

    @first.broker.subscriber(unique("steady"))
    async def steady(body: str) -> None: ...

    async def failing(body: str) -> None:
        raise TransientError("down")

    await first.start()
    try:
        sub = first.broker.subscriber(late, persistent=False)
        sub(failing)
        await sub.start()
        await first.broker.publish("m1", queue=late)
        await eventually(lambda: any(e.kind == "scheduled" for e in first.events), what="a copy")
    finally:
        await first.stop()
    await eventually_async(lambda: _at_least(amqp, f"{late}.retry", 1), what="the copy in .retry")
    second = App(rabbit_url, prefix=prefix)

    @second.broker.subscriber(unique("steady"))
    async def steady_again(body: str) -> None: ...

    caplog.set_level(logging.WARNING, "faststream_retry")
    await second.start()
    try:
        lines = [r.getMessage() for r in caplog.records if "no subscriber" in r.getMessage()]
        assert len(lines) == 1
        assert f"{late}.retry (1)" in lines[0]
    finally:
        await second.stop()
        await second.cleanup(amqp)
        channel = await amqp.channel()
        for name in (f"{late}.retry", f"{late}.dlq", late):
            await channel.queue_delete(name)
        await channel.close()


async def test_a_late_subscriber_with_retries_off_releases_what_waits(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Joining late with @retry_policy(enabled=False): its existing .retry is still released."""
    prefix, queue = unique("late-off"), unique("late-off")
    await _park_two(amqp, rabbit_url, prefix, queue)
    app = App(rabbit_url, prefix=prefix)

    @app.broker.subscriber(unique("steady"))
    async def steady(body: str) -> None: ...

    got: list[str] = []

    @retry_policy(enabled=False)
    async def handle(body: str) -> None:
        got.append(body)

    await app.start()
    try:
        sub = app.broker.subscriber(queue, persistent=False)
        sub(handle)
        await sub.start()
        await eventually(lambda: sorted(got) == ["m1", "m2"], what="the parked messages")
        assert await queue_depth(amqp, f"{queue}.retry") == 0
    finally:
        await app.stop()
        await app.cleanup(amqp)


async def test_a_late_subscriber_whose_queue_mismatches_does_not_start(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Its .dlq exists with other arguments: RetryTopologyError with the migration, not started.

    Before, a raw ChannelPreconditionFailed came out of sub.start() with the subscriber
    already consuming, and every failure of it was requeued once a second for ever.
    """
    retry = _retry(unique("late-406"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("late-406")
    channel = await amqp.channel()
    await channel.declare_queue(f"{queue}.dlq", durable=True, arguments={"x-max-length": 5})
    try:
        async with _running(amqp, retry, broker):
            sub = broker.subscriber(queue, persistent=False)
            sub(_never_called)
            with pytest.raises(RetryTopologyError) as caught:
                await sub.start()
            assert not sub.running
            assert f"queue '{queue}.dlq': argument 'x-max-length'" in str(caught.value)
            assert "To migrate" in str(caught.value)
    finally:
        await channel.queue_delete(f"{queue}.dlq")
        await channel.close()


async def test_a_router_included_after_start_is_followed(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A router included late: what waits in its .retry comes home when it starts, no failure needed.

    And its re-check consumer stops with it. Before, both waited for its first failure.
    """
    prefix, name = unique("late-router"), unique("orders")
    queue = f"svc.{name}"
    await _park_two(amqp, rabbit_url, prefix, queue)
    app = App(rabbit_url, prefix=prefix)

    @app.broker.subscriber(unique("steady"))
    async def steady(body: str) -> None: ...

    got: list[str] = []
    router = RabbitRouter(prefix="svc.")

    @router.subscriber(name)
    async def orders(body: str) -> None:
        got.append(body)

    await app.start()
    try:
        app.broker.include_router(router)
        for sub in router.subscribers:
            await sub.start()
        await eventually(lambda: sorted(got) == ["m1", "m2"], what="the parked messages")
        for sub in router.subscribers:
            await sub.stop()
        assert await consumers(amqp, f"{queue}.retry") == 0
    finally:
        await app.stop()
        await app.cleanup(amqp)


async def test_another_instance_on_a_router_included_late_is_refused(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """include_router at run time with a second RetryMiddleware on the router: refused."""
    retry, other = _retry(unique("one")), _retry(unique("other"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    router = RabbitRouter(prefix="svc.", middlewares=[other])
    router.subscriber(unique("orders"))(_never_called)
    async with _running(amqp, retry, broker):
        with pytest.raises(RetryConfigError, match="two RetryMiddleware instances"):
            broker.include_router(router)


async def test_a_subscriber_of_a_retry_queue_is_refused(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """``<queue>.retry`` is the plugin's: a subscriber of it would steal retry copies.

    Before, start advised ``declare=False``; followed, it ate retry copies for good and
    had its own messages released into the work queue.
    """
    retry = _retry(unique("steal"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("orders")
    broker.subscriber(queue)(_never_called)
    broker.subscriber(f"{queue}.retry")(_never_called)
    with pytest.raises(RetryConfigError, match=r"the plugin consumes this queue itself"):
        await broker.start()
    await broker.stop()


async def test_uncovered_subscribers_are_named_at_start(
    rabbit_url: str, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A .dlq consumer that rejects on error, and a server-named queue: a WARNING for each."""
    retry = _retry(unique("uncovered"))
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("orders")
    other = unique("other")
    broker.subscriber(queue)(_never_called)
    broker.subscriber(other)(_never_called)

    @broker.subscriber(RabbitQueue(f"{queue}.dlq", durable=True, queue_type=QueueType.QUORUM))
    @retry_policy(enabled=False)
    async def rejecting(body: bytes) -> None: ...

    @broker.subscriber(
        RabbitQueue(f"{other}.dlq", durable=True, queue_type=QueueType.QUORUM),
        ack_policy=AckPolicy.MANUAL,
    )
    @retry_policy(enabled=False)
    async def keeping(body: bytes) -> None: ...

    broker.subscriber(RabbitQueue("", exclusive=True, auto_delete=True))(_never_called)
    caplog.set_level(logging.WARNING, "faststream_retry")
    async with _running(amqp, retry, broker):
        lines = [r.getMessage() for r in caplog.records]
        assert any(f"subscriber of '{queue}.dlq' rejects a dead letter" in x for x in lines)
        assert not any(f"'{other}.dlq'" in x for x in lines)  # MANUAL keeps it
        assert any("server-named queue" in x for x in lines)


async def test_install_covers_failures_of_the_brokers_other_middlewares(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """install() adds the middleware outermost: a failure in another middleware is retried.

    Before, it was appended inside them: such a failure was FastStream's, rejected, lost.
    """
    flaky_calls: list[str] = []

    class Flaky(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            flaky_calls.append(msg.message_id)
            if len(flaky_calls) == 1:
                raise ConnectionError("the feature-flag service is down")
            return await call_next(msg)

    retry = _retry(unique("outer"))
    broker = RabbitBroker(rabbit_url, middlewares=[Flaky], logger=None)
    retry.install(broker)
    queue = unique("orders")
    done: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        done.append(body)

    async with _running(amqp, retry, broker):
        await broker.publish("m1", queue=queue, message_id="m1")
        await eventually(lambda: done == ["m1"], what="the retried message")
    assert flaky_calls == ["m1", "m1"]
