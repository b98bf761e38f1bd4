"""The smallest app a new user writes, on whichever Python and aio-pika stack this runs on."""

from __future__ import annotations

import platform
from importlib.metadata import version
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import RabbitBroker

from faststream_retry import RetryMiddleware
from tests.rabbit import delete_declared, eventually, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


async def test_the_five_line_app_retries_and_succeeds(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """One subscriber, install(), start(): a failure comes back by itself and then passes.

    On Python 3.10 pip resolves aio-pika 9, aiormq 6 and pamqp 3; the plugin must start
    and retry there as on the newest stack.
    """
    retry = RetryMiddleware(prefix=unique("smallest"))  # every other option at its default
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("orders")
    calls: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)
        if len(calls) == 1:
            raise ConnectionError("the database is restarting")

    await broker.start()
    try:
        await broker.publish("order-1", queue=queue)
        # The default policy waits 1 s before the first retry.
        await eventually(lambda: len(calls) == 2, timeout=30, what="the retried call")
    finally:
        await broker.stop()
        await delete_declared(amqp, retry, broker)
    assert calls == ["order-1", "order-1"], (platform.python_version(), version("aio-pika"))
