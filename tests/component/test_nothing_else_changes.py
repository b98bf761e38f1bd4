"""Adding the plugin changes nothing else: FastStream's in-memory tests pass as they did.

Each case is one of FastStream's own tests (its RabbitMQ suite was run with the plugin
on every broker, issue 36), rewritten here against a broker with the plugin.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from faststream.rabbit import RabbitBroker, TestRabbitBroker
from pydantic import BaseModel, ValidationError

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy


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
