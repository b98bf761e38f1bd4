"""Declaring the plan on the broker, exactly as ``core.topology`` plans it.

The tiers with their exchanges and bindings, and each route's ``.retry`` and ``.dlq``.
These declarations run on the plugin's own channels once the startup checks
(``faststream_retry.rabbit.checks``) have passed, and again after every reopen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aio_pika.abc import ExchangeType

from faststream_retry.rabbit.channels import RPC_TIMEOUT_S, close_quietly

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractRobustConnection

    from faststream_retry.core.topology import Plan, Route

__all__ = [
    "declare_route",
    "declare_topology",
    "redeclare",
]


async def declare_topology(channel: AbstractChannel, plan: Plan) -> None:
    """Declare every tier (exchange, queue, binding) and each route's ``.retry`` and ``.dlq``.

    Safe to run again: it runs after every reopen of the plugin's channels.
    """
    timeout = RPC_TIMEOUT_S
    for ttl in plan.tiers.ttls_ms:
        name = plan.tier(ttl)
        exchange = await channel.declare_exchange(
            name, ExchangeType.FANOUT, durable=True, timeout=timeout
        )
        queue = await channel.declare_queue(
            name, durable=True, arguments=dict(plan.spec(name).arguments), timeout=timeout
        )
        await queue.bind(exchange, routing_key="", timeout=timeout)
    for route in plan.routes.values():
        await declare_route(channel, plan, route)


async def declare_route(channel: AbstractChannel, plan: Plan, route: Route) -> None:
    """Declare ``route``'s ``.retry`` and ``.dlq`` queues as ``plan`` specifies them."""
    for name in (route.retry_queue, route.dlq):
        await channel.declare_queue(
            name, durable=True, arguments=dict(plan.spec(name).arguments), timeout=RPC_TIMEOUT_S
        )


async def redeclare(connection: AbstractRobustConnection, plan: Plan) -> None:
    """Declare the whole plan again, on a channel of its own.

    A channel of its own: should RabbitMQ refuse (a queue someone declared again
    with other arguments, a permission taken away), the error closes that channel
    only, never the publish channel.
    """
    channel = await connection.channel()
    try:
        await declare_topology(channel, plan)
    finally:
        await close_quietly(channel)
