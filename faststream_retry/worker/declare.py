"""The worker's intake on the broker: its exchange and queues, declared and checked.

``<prefix>.intake`` is an internal fanout exchange (only RabbitMQ's dead-lettering can
publish to it) bound to the queue of the same name; ``<prefix>.intake.dlq`` keeps what
the worker refuses. They are checked once at start, where a refusal becomes a message
naming the fix, and declared again on every (re)open of the worker's channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aio_pika import ExchangeType
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from faststream_retry.core.topology import intake_dlq_name
from faststream_retry.errors import RetryTopologyError
from faststream_retry.rabbit.channels import RPC_TIMEOUT_S, close_quietly

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractRobustConnection

    from faststream_retry.core.worker_config import WorkerConfig

__all__ = ["check_intake", "declare_intake", "intake_arguments"]


def intake_arguments(config: WorkerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the arguments of the intake queue and of the intake's DLQ."""
    options = config.retry.topology
    base: dict[str, Any] = {"x-queue-type": options.queue_type}
    if options.queue_type != "quorum":
        return dict(base), dict(base)
    # A delivery that crashes the worker again and again ends in the intake's DLQ,
    # never nowhere; at-least-once so a node failing meanwhile cannot drop it.
    return {
        **base,
        "x-delivery-limit": options.delivery_limit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": intake_dlq_name(config.prefix),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }, dict(base)


async def declare_intake(channel: AbstractChannel, config: WorkerConfig) -> None:
    """Declare the intake exchange (internal: only dead-lettering can publish to it) and queues."""
    name = config.intake
    arguments, dlq_arguments = intake_arguments(config)
    await channel.declare_queue(
        intake_dlq_name(config.prefix), durable=True, arguments=dlq_arguments, timeout=RPC_TIMEOUT_S
    )
    exchange = await channel.declare_exchange(
        name, ExchangeType.FANOUT, durable=True, internal=True, timeout=RPC_TIMEOUT_S
    )
    queue = await channel.declare_queue(
        name, durable=True, arguments=arguments, timeout=RPC_TIMEOUT_S
    )
    await queue.bind(exchange, routing_key="", timeout=RPC_TIMEOUT_S)


async def check_intake(connection: AbstractRobustConnection, config: WorkerConfig) -> None:
    """Declare the intake objects at start; a refusal becomes a message naming the fix.

    Raises:
        RetryTopologyError: one of them exists with other arguments, or the user may not
            declare it.
    """
    channel = await connection.channel()
    try:
        await declare_intake(channel, config)
    except ChannelPreconditionFailed as exc:
        raise RetryTopologyError(
            f"the worker's intake ({config.intake}, {intake_dlq_name(config.prefix)}) exists "
            f"with other arguments: {exc.args[0] if exc.args else exc}. Another prefix or "
            "queue_type was used before: set the same in the config, or delete those objects "
            "once they are empty"
        ) from exc
    except ChannelAccessRefused as exc:
        raise RetryTopologyError(
            f"the worker may not declare its intake ({config.intake}): "
            f"{exc.args[0] if exc.args else exc}. Give its user configure, write and read "
            f"permissions on '^{config.prefix}\\.'"
        ) from exc
    finally:
        await close_quietly(channel)
