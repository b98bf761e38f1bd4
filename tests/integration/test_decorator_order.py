"""``@retry_policy`` above or below ``@broker.publisher``: the handler's policy rules either way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from faststream.rabbit import RabbitRouter

from faststream_retry import Fixed, RetryPolicy, retry_policy
from tests.rabbit import drain, eventually, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import Callable

    from aio_pika.abc import AbstractRobustConnection

    from tests.rabbit import App

pytestmark = pytest.mark.rabbit


async def test_the_policy_rules_above_and_below_the_publisher(
    make_app: Callable[..., App], amqp: AbstractRobustConnection
) -> None:
    """max_attempts=2 from the handler, over a default of 5, in both orders, on a router too.

    Each message is handled twice, then dead-lettered as exhausted at attempt 2; the
    failed calls publish nothing to the publisher's queue.
    """
    app = make_app(default=RetryPolicy(max_attempts=5, backoff=Fixed(0.1)))
    broker = app.broker
    prefix = unique("svc") + "."
    router = RabbitRouter(prefix=prefix)
    out = unique("out")
    channel = await amqp.channel()
    # Durable: the suite's RabbitMQ 4.3 refuses transient queues that are not exclusive.
    await channel.declare_queue(out, durable=True, auto_delete=True)
    calls: dict[str, int] = {}

    def fail(name: str) -> None:
        calls[name] = calls.get(name, 0) + 1
        raise ConnectionError(f"{name} is down")

    below, above = unique("below"), unique("above")

    @broker.subscriber(below)
    @broker.publisher(out)
    @retry_policy(max_attempts=2)
    async def handle_below(body: str) -> str:
        fail("below")
        return body

    @broker.subscriber(above)
    @retry_policy(max_attempts=2)
    @broker.publisher(out)
    async def handle_above(body: str) -> str:
        fail("above")
        return body

    @router.subscriber("below")
    @router.publisher(out)
    @retry_policy(max_attempts=2)
    async def handle_router_below(body: str) -> str:
        fail("router below")
        return body

    @router.subscriber("above")
    @retry_policy(max_attempts=2)
    @router.publisher(out)
    async def handle_router_above(body: str) -> str:
        fail("router above")
        return body

    broker.include_router(router)
    queues = [below, above, f"{prefix}below", f"{prefix}above"]
    await app.start()
    for queue in queues:
        await broker.publish("m", queue=queue, message_id=f"id-{queue}")
    await eventually(
        lambda: sum(e.kind == "dead_lettered" for e in app.events) == len(queues),
        timeout=30,
        what="four dead letters",
    )
    assert calls == {"below": 2, "above": 2, "router below": 2, "router above": 2}
    for queue in queues:
        (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
        headers: dict[str, Any] = headers_of(dead)
        assert (dead.message_id, headers["retry-reason"], headers["retry-attempt"]) == (
            f"id-{queue}",
            "exhausted",
            2,
        )
    assert await queue_depth(amqp, out) == 0
    await channel.close()
