"""Adding the plugin changes nothing else, on a real broker: FastStream's own tests, and more.

FastStream's RabbitMQ suite was run with the plugin on every broker (issue 36). Its
failures that were not the plugin doing its job are rewritten here: a middleware listed
before the plugin that never heard of a failure, and handlers that kept starting after
``broker.stop()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
from faststream import BaseMiddleware, ExceptionMiddleware
from faststream.rabbit import RabbitBroker
from faststream.rabbit.annotations import RabbitMessage

from faststream_retry import EventKind, Fixed, RetryEvent, RetryMiddleware, RetryPolicy
from tests.rabbit import delete_declared, drain, eventually, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from types import TracebackType

    from aio_pika.abc import AbstractRobustConnection
    from faststream.message import StreamMessage

pytestmark = pytest.mark.rabbit


class Observer:
    """A middleware that only watches: it records each failure it sees leave, and never handles it."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware:
        failures = self.failures

        class Scope(BaseMiddleware):
            async def after_processed(
                self,
                exc_type: type[BaseException] | None = None,
                exc_val: BaseException | None = None,
                exc_tb: TracebackType | None = None,
            ) -> bool | None:
                if exc_val is not None:
                    failures.append(str(exc_val))
                return False

        return Scope(msg, context=context)


@pytest.fixture
async def made(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> AsyncIterator[Callable[..., tuple[RetryMiddleware, RabbitBroker]]]:
    """Build a broker with the plugin (three attempts, 200 ms apart), stop and delete it after."""
    built: list[tuple[RetryMiddleware, RabbitBroker]] = []

    def make(
        order: Callable[[RetryMiddleware], list[Any]], *, install: bool, **options: Any
    ) -> tuple[RetryMiddleware, RabbitBroker]:
        retry = RetryMiddleware(
            default=RetryPolicy(max_attempts=3, backoff=Fixed(0.2)),
            prefix=unique("same"),
            tick=0.1,
            max_delay=1,
        )
        broker = RabbitBroker(rabbit_url, middlewares=order(retry), **options)
        if install:
            retry.install(broker)
        built.append((retry, broker))
        return retry, broker

    yield make
    for retry, broker in built:
        await broker.stop()
        await delete_declared(amqp, retry, broker)


def dead_letters(retry: RetryMiddleware) -> list[RetryEvent]:
    events: list[RetryEvent] = []
    retry.add_hook(lambda e: events.append(e) if e.kind is EventKind.DEAD_LETTERED else None)
    return events


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
@pytest.mark.parametrize("retry_first", [False, True], ids=["exc-mw-first", "retry-first"])
async def test_an_exception_middleware_hears_of_every_failed_delivery_wherever_it_sits(
    made: Callable[..., tuple[RetryMiddleware, RabbitBroker]],
    amqp: AbstractRobustConnection,
    caplog: pytest.LogCaptureFixture,
    install: bool,
    retry_first: bool,
) -> None:
    """Each of the 3 deliveries fails; ``ExceptionMiddleware``'s handler hears of each, in either
    order; one dead letter; FastStream neither logs the failures nor settles them again."""
    exc_mw = ExceptionMiddleware()
    heard: list[str] = []

    @exc_mw.add_handler(ValueError)
    async def on_value_error(exc: ValueError) -> None:
        heard.append(str(exc))

    def order(retry: RetryMiddleware) -> list[Any]:
        return [retry, exc_mw] if retry_first else [exc_mw, retry]

    access = logging.getLogger(unique("access"))
    retry, broker = made(order, install=install, logger=access)
    dead = dead_letters(retry)
    queue = unique("orders")
    calls: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)
        raise ValueError(f"boom {len(calls)}")

    with caplog.at_level(logging.DEBUG, logger=access.name):
        await broker.start()
        await broker.publish("x", queue=queue, message_id="m1")
        await eventually(lambda: len(dead) == 1, timeout=30, what="the dead letter")
        await broker.stop()
    assert calls == ["x", "x", "x"]
    assert heard == ["boom 1", "boom 2", "boom 3"]
    assert [m.message_id for m in await drain(amqp, f"{queue}.dlq", expect=1)] == ["m1"]
    assert await queue_depth(amqp, queue) == 0
    faststream_lines = [r for r in caplog.records if r.getMessage().startswith("ValueError")]
    assert faststream_lines == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.CRITICAL] == []


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_an_observer_listed_before_the_plugin_sees_every_failure_and_nothing_is_settled_twice(
    made: Callable[..., tuple[RetryMiddleware, RabbitBroker]],
    amqp: AbstractRobustConnection,
    caplog: pytest.LogCaptureFixture,
    install: bool,
) -> None:
    """A middleware that only watches (a failure log, an alert) hears of each failure; FastStream
    logs none of them (but the first delivery's, without install(): its stack had no guard)."""
    observer = Observer()
    access = logging.getLogger(unique("access"))
    retry, broker = made(lambda retry: [observer, retry], install=install, logger=access)
    dead = dead_letters(retry)
    queue = unique("orders")

    @broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        raise ConnectionError(f"down {msg.headers.get('retry-attempt', 0)}")

    with caplog.at_level(logging.DEBUG, logger=access.name):
        await broker.start()
        await broker.publish("x", queue=queue, message_id="m1")
        await eventually(lambda: len(dead) == 1, timeout=30, what="the dead letter")
        await broker.stop()
    assert observer.failures == ["down 0", "down 1", "down 2"]
    assert [m.message_id for m in await drain(amqp, f"{queue}.dlq", expect=1)] == ["m1"]
    faststream_lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("ConnectionError")
    ]
    assert faststream_lines == ([] if install else ["ConnectionError: down 0"])
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.CRITICAL] == []


async def test_an_exception_middleware_hears_of_a_decoder_error_without_install(
    made: Callable[..., tuple[RetryMiddleware, RabbitBroker]],
) -> None:
    """FastStream's ``test_exception_middleware_decoder_error``: the plugin appended after it."""
    exc_mw = ExceptionMiddleware()
    heard = asyncio.Event()

    @exc_mw.add_handler(ValueError)
    async def on_value_error(exc: ValueError) -> None:
        heard.set()

    async def decoder(msg: StreamMessage[Any], original: Callable[..., Awaitable[Any]]) -> Any:
        raise ValueError

    _retry, broker = made(lambda retry: [exc_mw, retry], install=False, decoder=decoder)
    queue = unique("decoded")

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ZeroDivisionError

    await broker.start()
    await broker.publish("", queue)
    await asyncio.wait_for(heard.wait(), 10)


class Arrivals:
    """A middleware that notes when each delivery reached the subscriber, before its handler."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware:
        arrivals = self.at

        class Scope(BaseMiddleware):
            async def on_receive(self) -> None:
                arrivals[id(self.msg)] = time.perf_counter()

        return Scope(msg, context=context)


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_no_delivery_reaches_a_handler_once_stop_is_called(
    made: Callable[..., tuple[RetryMiddleware, RabbitBroker]],
    amqp: AbstractRobustConnection,
    install: bool,
) -> None:
    """FastStream's ``test_metrics[nacked status without exception]``: a handler that nacks its
    message (requeue) has it back at once; from ``stop()`` on, no delivery reaches a handler
    (one that arrived before may start a moment later: its decoding can wait for a thread)."""
    arrivals = Arrivals()
    _retry, broker = made(lambda retry: [arrivals, retry], install=install, logger=None)
    queues = [unique("nacked") for _ in range(4)]
    handled: list[float] = []

    for queue in queues:

        @broker.subscriber(queue)
        async def handle(body: str, msg: RabbitMessage) -> None:
            handled.append(arrivals.at[id(msg.raw_message)])
            await msg.nack()

    await broker.start()
    for queue in queues:
        await broker.publish("again", queue)
    await eventually(lambda: len(handled) >= 40, what="the handlers going round")
    called = time.perf_counter()
    await broker.stop()
    assert [t for t in handled if t > called] == []
    for queue in queues:  # requeued, not lost
        assert len(await drain(amqp, queue, expect=1)) == 1


async def test_stops_in_the_middle_of_retries_lose_nothing_and_copy_nothing_twice(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """200 messages that fail twice each (0.3 s apart: through a tier, ``.retry`` and the
    re-check consumer); the app stops and starts three times while they go round. Every
    message is processed, exactly once, and none is dead-lettered."""
    prefix, queue = unique("stops"), unique("stops")
    sent = [f"m{i}" for i in range(200)]
    processed: list[str] = []

    def build() -> tuple[RetryMiddleware, RabbitBroker]:
        retry = RetryMiddleware(
            default=RetryPolicy(max_attempts=5, backoff=Fixed(0.3)), prefix=prefix, tick=0.1
        )
        broker = RabbitBroker(rabbit_url, logger=None, graceful_timeout=10)
        retry.install(broker)

        @broker.subscriber(queue)
        async def handle(body: str, msg: RabbitMessage) -> None:
            if msg.headers.get("retry-attempt", 0) < 2:
                raise ConnectionError("down")
            processed.append(body)

        return retry, broker

    retry, broker = build()
    try:
        await broker.start()
        for body in sent:
            await broker.publish(body, queue, message_id=body)
        for stop in (40, 80, 120):  # processed when each stop comes

            def reached(count: int = stop) -> bool:
                return len(processed) >= count

            await eventually(reached, timeout=60, what=f"{stop} processed")
            await broker.stop()
            retry, broker = build()
            await broker.start()
        await eventually(lambda: len(set(processed)) == len(sent), timeout=60, what="all")
        await asyncio.sleep(1)  # a copy made twice would come home within a second
    finally:
        await broker.stop()
        await delete_declared(amqp, retry, broker)
    assert sorted(processed) == sorted(sent)
