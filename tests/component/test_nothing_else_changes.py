"""Adding the plugin changes nothing else: FastStream's in-memory tests pass as they did.

Each case is one of FastStream's own tests (its RabbitMQ suite was run with the plugin
on every broker, issue 36), rewritten here against a broker with the plugin.
"""

from __future__ import annotations

import gc
import logging
import warnings
from typing import Any
from unittest.mock import AsyncMock

import pytest
from faststream import ExceptionMiddleware
from faststream.rabbit import RabbitBroker, TestRabbitBroker
from pydantic import BaseModel, ValidationError

from faststream_retry import Fixed, PermanentError, RetryConfigError, RetryMiddleware, RetryPolicy


def retry_middleware() -> RetryMiddleware:
    """The middleware FastStream's suite was run with: three attempts, 200 ms apart."""
    return RetryMiddleware(default=RetryPolicy(max_attempts=3, backoff=Fixed(0.2)))


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_a_handlers_exception_comes_out_of_publish_as_without_the_plugin(
    install: bool,
) -> None:
    """FastStream's ``test_exception_raises``: outside ``retry.testing()`` nothing is retried."""
    retry = retry_middleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    if install:
        retry.install(broker)
    calls: list[str] = []

    @broker.subscriber("in")
    async def handler(body: str) -> None:
        calls.append(body)
        raise ValueError(body)

    async with TestRabbitBroker(broker) as br:
        with pytest.raises(ValueError, match="hello"):
            await br.publish("hello", "in")
    assert calls == ["hello"]


async def test_a_validation_error_is_raised_and_the_handler_called_once() -> None:
    """FastStream's docs' ``test_validation_error``: the mock sees one call, publish() raises."""
    retry = retry_middleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    retry.install(broker)

    class User(BaseModel):
        name: str
        user_id: int

    @broker.subscriber("test-queue")
    async def handle(user: User) -> None: ...

    async with TestRabbitBroker(broker) as br:
        with pytest.raises(ValidationError):
            await br.publish("wrong message", queue="test-queue")
        handle.mock.assert_called_once_with("wrong message")


async def test_a_handlers_result_and_publishers_are_as_without_the_plugin() -> None:
    """A handler that succeeds answers a request and feeds its publisher, plugin or not."""
    retry = retry_middleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    retry.install(broker)
    out = broker.publisher("out")

    @broker.subscriber("in")
    @out
    async def handler(body: str) -> str:
        return body.upper()

    async with TestRabbitBroker(broker) as br:
        reply = await br.request("hi", "in")
        assert await reply.decode() == "HI"
        out.mock.assert_called_once_with("HI")


async def test_test_mode_is_one_block_away() -> None:
    """``retry.testing()`` turns test mode on for the block only: before and after, no retry."""
    retry = retry_middleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    calls: list[str] = []

    @broker.subscriber("in")
    async def handler(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    async with TestRabbitBroker(broker) as br:
        with pytest.raises(ConnectionError):
            await br.publish("before", "in")
        with retry.testing() as recorder:
            await br.publish("inside", "in")
        with pytest.raises(ConnectionError):
            await br.publish("after", "in")
    assert calls == ["before", "inside", "inside", "inside", "after"]
    assert [e.reason for e in recorder.dead_letters] == ["exhausted"]


@pytest.mark.fastapi
async def test_fastapis_request_validation_error_comes_out_of_publish() -> None:
    """FastStream's ``TestRouterLocal::test_invalid``, on the deprecated FastAPI router."""
    fastapi = pytest.importorskip("fastapi", reason="the fastapi dependency group")
    testclient = pytest.importorskip("fastapi.testclient", reason="the fastapi dependency group")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "moved to the faststream_fastapi package"
        from faststream.rabbit.fastapi import RabbitRouter  # noqa: PLC0415

    retry = retry_middleware()
    router: Any = RabbitRouter(middlewares=[retry])
    app = fastapi.FastAPI()

    @router.subscriber("in")
    async def hello(msg: int) -> None: ...

    app.include_router(router)
    async with TestRabbitBroker(router.broker) as br:
        with (
            testclient.TestClient(app),
            pytest.raises(fastapi.exceptions.RequestValidationError),
        ):
            await br.publish("hi", "in")


async def test_in_test_mode_an_exception_middleware_before_the_plugin_hears_of_the_failure() -> (
    None
):
    """FastStream's ``test_exception_middleware_*`` in memory: ``[exc_mw, retry]``, installed."""
    retry = retry_middleware()
    exc_mw = ExceptionMiddleware()
    heard: list[str] = []

    @exc_mw.add_handler(ValueError)
    async def on_value_error(exc: ValueError) -> None:
        heard.append(str(exc))

    broker = RabbitBroker(middlewares=[exc_mw, retry], logger=None)
    retry.install(broker)

    @broker.subscriber("in")
    async def handler(body: str) -> None:
        raise ValueError(body)

    async with TestRabbitBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("one", "in")
            await br.publish("two", "in")
    # In test mode the retries are made in one delivery: the middleware hears of it once.
    assert heard == ["one", "two"]
    assert [e.reason for e in recorder.dead_letters] == ["exhausted", "exhausted"]


async def test_a_middleware_inserted_after_install_still_hears_of_the_failures() -> None:
    """``broker.insert_middleware(m)`` after ``install()``: the guard goes back in front of it."""
    retry = retry_middleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    retry.install(broker)
    exc_mw = ExceptionMiddleware()
    heard: list[str] = []

    @exc_mw.add_handler(ValueError)
    async def on_value_error(exc: ValueError) -> None:
        heard.append(str(exc))

    broker.insert_middleware(exc_mw)

    @broker.subscriber("in")
    async def handler(body: str) -> None:
        raise ValueError(body)

    async with TestRabbitBroker(broker) as br:
        with retry.testing():
            for body in ("one", "two"):
                await br.publish(body, "in")
    # The first message's stack was built before the guard went back in front.
    assert heard == ["two"]
    assert [type(m).__name__ for m in broker.middlewares][:2] == ["Guard", "ExceptionMiddleware"]


async def test_a_message_a_failing_handler_publishes_is_settled_on_its_own() -> None:
    """Under TestRabbitBroker a handler's publish is handled inside its call: each message's
    failure is its own, and both are dead-lettered without reaching ``publish()``."""
    retry = retry_middleware()
    exc_mw = ExceptionMiddleware()
    heard: list[str] = []

    @exc_mw.add_handler(PermanentError)
    async def on_permanent(exc: PermanentError) -> None:
        heard.append(str(exc))

    broker = RabbitBroker(middlewares=[exc_mw, retry], logger=None)
    retry.install(broker)

    @broker.subscriber("outer")
    async def outer(body: str) -> None:
        await broker.publish("inner", "inner")
        raise PermanentError("outer failed")

    @broker.subscriber("inner")
    async def inner(body: str) -> None:
        raise PermanentError("inner failed")

    async with TestRabbitBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("outer", "outer")
    assert heard == ["inner failed", "outer failed"]
    assert [e.queue for e in recorder.dead_letters] == ["inner", "outer"]


class KafkaBroker:
    """A broker of a kind the plugin does not cover (Kafka's client is not a test dependency)."""

    def __init__(self) -> None:
        self.middlewares: list[Any] = []


def test_install_refuses_a_broker_it_does_not_cover() -> None:
    """``install()`` on a Kafka broker: one error naming what is supported."""
    broker = KafkaBroker()
    with pytest.raises(RetryConfigError) as caught:
        RetryMiddleware().install(broker)  # type: ignore[type-var]
    text = str(caught.value)
    assert "works with FastStream's RabbitBroker (faststream.rabbit), NatsBroker" in text
    assert "RedisBroker (faststream.redis, stream subscribers in a consumer group)" in text
    assert type(broker).__qualname__ in text
    assert list(broker.middlewares) == []


def test_install_takes_a_redis_broker() -> None:
    """``install()`` on a Redis broker (plain, cluster, sentinel): the middleware goes on it,
    and nothing touches the network before the broker starts."""
    redis = pytest.importorskip("faststream.redis", reason="faststream[redis], a test dependency")
    for broker in (redis.RedisBroker(), redis.RedisClusterBroker()):
        retry = RetryMiddleware()
        assert retry.install(broker) is broker
        assert retry in broker.middlewares


def test_install_takes_a_nats_broker() -> None:
    """``install()`` on a NATS broker: the middleware goes on it; nothing touches the network
    before the broker starts (its JetStream subscribers are covered from then on)."""
    nats = pytest.importorskip("faststream.nats", reason="faststream[nats], a test dependency")
    broker = nats.NatsBroker()
    retry = RetryMiddleware()
    assert retry.install(broker) is broker
    assert retry in broker.middlewares


async def handled_as_without_the_plugin(
    retry: RetryMiddleware, broker: Any, test_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    @broker.subscriber("orders")
    async def handle(body: str) -> str:
        calls.append(body)
        if body == "bad":
            raise ConnectionError(body)
        return body.upper()

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="faststream_retry"):
        async with test_broker(broker) as br:
            with retry.testing() as recorder:
                assert await (await br.request("ok", "orders")).decode() == "OK"
                with pytest.raises(ConnectionError):
                    await br.publish("bad", "orders")
                await br.publish("ok", "orders")
    assert calls == ["ok", "bad", "ok"]
    assert recorder.events == []
    errors = [r.getMessage() for r in caplog.records if r.name == "faststream_retry"]
    assert len(errors) == 1
    assert type(broker).__qualname__ in errors[0]


async def test_a_broker_it_does_not_cover_handles_its_messages_as_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``middlewares=[retry]`` on Redis under ``TestRedisBroker`` (test mode is not built
    there yet): one ERROR at the first message, and every message handled as FastStream
    alone does (the handler runs, its exception comes out). (NATS under ``TestNatsBroker``
    has test mode: test_nats_testing_mode.)"""
    redis = pytest.importorskip("faststream.redis", reason="faststream[redis], a test dependency")
    retry = retry_middleware()
    broker = redis.RedisBroker(middlewares=[retry])
    await handled_as_without_the_plugin(retry, broker, redis.TestRedisBroker, caplog)


async def test_an_installed_redis_broker_under_test_handles_its_messages_as_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``install()`` and ``TestRedisBroker``: the start checks the subscribers, then leaves the
    messages to FastStream, said once; a stream subscriber in a group is handled as without."""
    redis = pytest.importorskip("faststream.redis", reason="faststream[redis], a test dependency")
    retry = retry_middleware()
    broker = redis.RedisBroker()
    retry.install(broker)
    calls: list[str] = []

    @broker.subscriber(stream=redis.StreamSub("orders", group="g", consumer="c1"))
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    with caplog.at_level(logging.ERROR, logger="faststream_retry"):
        async with redis.TestRedisBroker(broker) as br:
            with retry.testing() as recorder, pytest.raises(ConnectionError):
                await br.publish("bad", stream="orders")
    assert calls == ["bad"]
    assert recorder.events == []
    errors = [r.getMessage() for r in caplog.records if r.name == "faststream_retry"]
    assert len(errors) == 1
    assert "test mode under TestRedisBroker is not built yet" in errors[0]


async def test_a_mocked_connection_leaves_no_coroutine_unawaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """FastStream's ``specific/test_declare.py::test_publisher_declare``, with ``install()``."""
    from faststream.rabbit.helpers.declarer import RabbitDeclarerImpl  # noqa: PLC0415

    connection = AsyncMock()

    class Channels:
        async def get_channel(self, channel: object = None) -> AsyncMock:
            return connection

    retry = retry_middleware()
    broker = RabbitBroker()
    retry.install(broker)
    broker._connection = connection
    broker.config.declarer = RabbitDeclarerImpl(Channels())  # type: ignore[arg-type,attr-defined]

    @broker.publisher("q", "q")
    async def f() -> None: ...

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG):
        warnings.simplefilter("always")
        await broker.start()
        await broker.stop()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    connection.declare_queue.assert_awaited_once()
    lines = [r.getMessage() for r in caplog.records if r.name == "faststream_retry"]
    assert not any("version" in line for line in lines)
    assert any("not an aio-pika connection" in line for line in lines)
