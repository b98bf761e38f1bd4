"""FastAPI on a real RabbitMQ: the plugin on a FastAPI app's broker, started by its lifespan.

A body that fails validation raises FastAPI's ``RequestValidationError`` there (not
pydantic's ``ValidationError``): it is permanent, dead-lettered at attempt 1; a transient
failure in the same app is retried as usual. Both integrations: the ``faststream-fastapi``
package's ``FastStreamAPI`` and the deprecated ``faststream.rabbit.fastapi.RabbitRouter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream.rabbit import RabbitBroker
from pydantic import BaseModel

from faststream_retry import (
    EventKind,
    Fixed,
    RetryEvent,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)
from tests.rabbit import delete_declared, drain, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

pytestmark = [pytest.mark.rabbit, pytest.mark.fastapi]

fastapi = pytest.importorskip(
    "fastapi",
    reason="fastapi comes with the fastapi dependency group (pip install -e . --group fastapi)",
)


class Order(BaseModel):
    id: int


def middleware(events: list[RetryEvent]) -> RetryMiddleware:
    return RetryMiddleware(
        RetryPolicy(max_attempts=4, backoff=Fixed(0.1)),
        prefix=unique("t"),
        tick=0.1,
        max_delay=60,
        publish_failure_pause=0.2,
        hooks=[events.append],
    )


def handler(calls: Counter[int]) -> Callable[[Order], Any]:
    @retry_policy(max_attempts=3)  # the handler's policy travels through FastAPI's wrapping
    async def take_order(order: Order) -> None:
        calls[order.id] += 1
        raise ConnectionError("warehouse down")

    return take_order


async def check(
    amqp: AbstractRobustConnection, queue: str, calls: Counter[int], events: list[RetryEvent]
) -> None:
    """The invalid body: DLQ at attempt 1, permanent; the valid one: 3 calls, exhausted."""
    dead: list[AbstractIncomingMessage] = await drain(amqp, f"{queue}.dlq", expect=2)
    by_id = {m.message_id or "": headers_of(m) for m in dead}
    assert sorted(by_id) == ["invalid", "valid"]
    invalid, valid = by_id["invalid"], by_id["valid"]
    assert (invalid["retry-reason"], invalid["retry-attempt"]) == ("permanent", 1)
    assert invalid["retry-exception"] == "fastapi.exceptions.RequestValidationError"
    assert (valid["retry-reason"], valid["retry-attempt"]) == ("exhausted", 3)
    assert valid["retry-exception"] == "ConnectionError"
    assert calls == {7: 3}  # the invalid body never reached the handler
    scheduled = Counter(e.message_id for e in events if e.kind is EventKind.SCHEDULED)
    assert scheduled == {"valid": 2}
    assert await queue_depth(amqp, queue) == 0


async def publish_both(broker: RabbitBroker, queue: str) -> None:
    await broker.publish({"id": "not a number"}, queue=queue, message_id="invalid")
    await broker.publish({"id": 7}, queue=queue, message_id="valid")


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """Run an ASGI app's lifespan as a server (uvicorn) does: startup, then shutdown."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await asyncio.wait_for(outbox.get(), 30)
    assert started == {"type": "lifespan.startup.complete"}, started
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        stopped = await asyncio.wait_for(outbox.get(), 30)
        await task
        assert stopped == {"type": "lifespan.shutdown.complete"}, stopped


async def test_faststream_fastapi_validation_errors_are_permanent(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """faststream-fastapi: install on the broker, wrap it in FastStreamAPI, run the lifespan."""
    faststream_fastapi = pytest.importorskip(
        "faststream_fastapi", reason="faststream-fastapi is a dev dependency"
    )
    events: list[RetryEvent] = []
    retry = middleware(events)
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("orders")
    calls: Counter[int] = Counter()
    broker.subscriber(queue)(handler(calls))
    # FastStreamAPI adapts the subscribers the broker has: declare them first.
    app = faststream_fastapi.FastStreamAPI(broker, application=fastapi.FastAPI())
    try:
        async with lifespan(app):
            await publish_both(broker, queue)
            await check(amqp, queue, calls, events)
    finally:
        await delete_declared(amqp, retry, broker)


async def test_deprecated_fastapi_router_validation_errors_are_permanent(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """faststream.rabbit.fastapi.RabbitRouter (deprecated in 0.7.8): install on router.broker."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "moved to the faststream_fastapi package"
        from faststream.rabbit.fastapi import RabbitRouter  # noqa: PLC0415

    events: list[RetryEvent] = []
    retry = middleware(events)
    router = RabbitRouter(rabbit_url, middlewares=[retry], logger=None)
    retry.install(router.broker)
    queue = unique("orders")
    calls: Counter[int] = Counter()
    router.subscriber(queue)(handler(calls))
    # As the FastAPI how-to wires it: include_router() brings the router's lifespan along
    # (FastAPI >= 0.112.2 warns that lifespan=router.lifespan_context is not needed).
    app = fastapi.FastAPI()
    app.include_router(router)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            async with lifespan(app):
                await publish_both(router.broker, queue)
                await check(amqp, queue, calls, events)
    finally:
        await delete_declared(amqp, retry, router.broker)
