"""``middlewares=[RetryMiddleware()]`` alone: no ``install()``, and the plugin still runs.

The plugin starts at the first message the broker consumes, before the handler sees
it: it plans, checks and declares as ``install()`` does at the broker's start, and
starts the re-check consumers. Wired so that it must not run, it holds the messages
unacked and says why, once: nothing lost, nothing looping.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import RabbitBroker, RabbitRouter

from faststream_retry import PermanentError, RetryLater, RetryMiddleware
from tests.rabbit import delete_declared, depth_reaches, drain, eventually, queue_depth, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


def five_line_app(
    url: str, prefix: str, queue: str, calls: list[str], *, first: bool
) -> tuple[RetryMiddleware, RabbitBroker]:
    """The five-line app, without install(): ``first`` fails as the first run of the test does."""
    retry = RetryMiddleware(prefix=prefix, tick=timedelta(seconds=1))
    broker = RabbitBroker(url, middlewares=[retry], logger=None, graceful_timeout=5)

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)
        if body == "poison":
            raise PermanentError("malformed")
        if first and body == "flaky" and calls.count("flaky") == 1:
            raise ConnectionError("the database is restarting")
        if first and body == "late":
            # 3 s is no tier (1 s, 2 s, ...): it waits in <queue>.retry between two,
            # where only a running re-check consumer takes it out.
            raise RetryLater(delay=timedelta(seconds=3))

    return retry, broker


async def test_the_five_line_app_without_install_retries_dead_letters_and_survives_a_restart(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """sent = processed + dead-lettered, by id, across a restart of the app."""
    prefix, queue = unique("noinstall"), unique("orders")
    calls: list[str] = []
    retry, broker = five_line_app(rabbit_url, prefix, queue, calls, first=True)
    await broker.start()
    try:
        for body in ["flaky", "poison", "late"]:
            await broker.publish(body, queue=queue, message_id=body)
        # The default policy's first retry waits 1 s, a tier: back home by itself.
        await eventually(lambda: calls.count("flaky") == 2, timeout=30, what="the retry")
        await eventually(lambda: "late" in calls, what="the late message's first call")
    finally:
        await broker.stop()
    dead = await drain(amqp, f"{queue}.dlq", expect=1)
    assert [m.message_id for m in dead] == ["poison"]
    assert dead[0].headers["retry-reason"] == "permanent"

    # The restart: a new process's app, again without install(). The late copy
    # reaches <queue>.retry while nothing runs; the first message the new app
    # consumes starts the plugin, and its re-check consumer releases the copy.
    after: list[str] = []
    retry, broker = five_line_app(rabbit_url, prefix, queue, after, first=False)
    await broker.start()
    try:
        await broker.publish("after", queue=queue, message_id="after")
        await eventually(lambda: sorted(after) == ["after", "late"], timeout=30, what="late")
        for name in [queue, f"{queue}.retry", f"{queue}.dlq"]:
            assert await queue_depth(amqp, name) == 0, name
    finally:
        await broker.stop()
        await delete_declared(amqp, retry, broker)
    processed = {"flaky", "late", "after"}
    assert processed | {"poison"} == {"flaky", "poison", "late", "after"}
    assert calls.count("poison") == 1


async def test_a_late_start_that_must_not_run_holds_the_messages_and_says_why(
    rabbit_url: str, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """Two instances on one broker (refused at an installed start): held unacked, one ERROR, no loop."""
    caplog.set_level(logging.ERROR, logger="faststream_retry")
    first, second = RetryMiddleware(prefix=unique("one")), RetryMiddleware(prefix=unique("two"))
    broker = RabbitBroker(rabbit_url, middlewares=[first], logger=None, graceful_timeout=2)
    router = RabbitRouter(middlewares=[second])
    queue = unique("held")
    calls: list[str] = []

    @router.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)

    broker.include_router(router)
    await broker.start()
    try:
        for body in ["a", "b"]:
            await broker.publish(body, queue=queue)
        await eventually(
            lambda: any("two RetryMiddleware instances" in r.getMessage() for r in caplog.records),
            what="the ERROR",
        )
        await asyncio.sleep(0.5)  # a loop would call the handler or log again meanwhile
        assert calls == []
        assert await queue_depth(amqp, queue) == 0  # held, not requeued
        refusals = [r for r in caplog.records if "cannot run on this broker" in r.getMessage()]
        assert len(refusals) == 1
    finally:
        await broker.stop()
    # Stopping gives them back, as they were.
    await depth_reaches(amqp, queue, 2, "both held messages back in their queue")
    channel = await amqp.channel()
    await channel.queue_delete(queue)
    await channel.close()
