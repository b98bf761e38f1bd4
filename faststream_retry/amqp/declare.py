"""Declaring the plan on the broker, and the startup checks that come before it.

RabbitMQ answers a declaration whose arguments differ from the existing queue's with
``406 PRECONDITION_FAILED`` and closes the channel; FastStream would surface that as a
raw channel error half-way through start. The plugin declares everything first on a
throwaway channel, collects every mismatch, and raises one ``RetryTopologyError`` that
names each queue, the argument and how to migrate.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aio_pika.abc import ExchangeType
from aiormq.exceptions import ChannelPreconditionFailed

from faststream_retry._log import log
from faststream_retry.amqp.channels import RPC_TIMEOUT_S
from faststream_retry.errors import RetryTopologyError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

    from faststream_retry.policy import RetryPolicy
    from faststream_retry.topology import Plan, Route

__all__ = [
    "MIN_VERSION",
    "Mismatch",
    "check_broker",
    "declare_late_route",
    "declare_retry_queue",
    "declare_topology",
    "parse_mismatch",
    "parse_version",
    "work_queue_findings",
]

MIN_VERSION = {"classic": (3, 8), "quorum": (3, 10)}
"""Oldest RabbitMQ per queue type: quorum queues need 3.10 for message TTL and
at-least-once dead-lettering."""

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']*)'"
    r".*?: received (?P<received>.+?) but current is (?P<current>.+?)\"?$"
)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One object whose live arguments differ from what the plugin declares."""

    kind: str
    name: str
    argument: str
    wanted: str
    current: str


def parse_version(text: object) -> tuple[int, int] | None:
    """Return ``(major, minor)`` from a server ``version`` property, or ``None``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def parse_mismatch(reply: str, kind: str, name: str) -> Mismatch:
    """Read RabbitMQ's 406 reply text; falls back to the whole text when it changes."""
    match = _INEQUIVALENT.search(reply)
    if match is None:
        return Mismatch(kind, name, "?", "?", reply)
    return Mismatch(
        match["kind"],
        match["name"],
        match["argument"],
        _value(match["received"]),
        _value(match["current"]),
    )


def _value(text: str) -> str:
    # "the value '5' of type 'byte'", "'quorum'" or "none"
    quoted = re.match(r"(?:the value )?'([^']*)'", text)
    return quoted[1] if quoted else text


async def _declare(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    kind: str,
    name: str,
    arguments: dict[str, Any] | None,
) -> Mismatch | None:
    # A channel per declaration: a 406 closes the channel it happened on. These are
    # a handful of declarations, once, at start.
    channel = await amqp.channel()
    try:
        if kind == "exchange":
            await channel.exchange_declare(name, exchange_type="fanout", durable=True)
        else:
            await channel.queue_declare(name, durable=True, arguments=arguments)
    except ChannelPreconditionFailed as exc:
        return parse_mismatch(str(exc.args[0]), kind, name)
    await channel.close()
    return None


def _show(value: str) -> str:
    return "unset" if value == "none" else repr(value)


def _advice(mismatch: Mismatch, prefix: str) -> str:
    if mismatch.name.startswith(f"{prefix}.delay."):
        return (
            "a tier holds a message for one tier period only: stop the services that use "
            f"prefix {prefix!r}, wait until the queue is empty, delete it (rabbitmqctl "
            "delete_queue) and start again; or choose a new prefix=, whose tiers are new "
            "queues, and let the old tiers drain into their .retry queues"
        )
    return (
        "it may hold messages: stop the services that consume it, move its messages to a "
        "temporary queue (the shovel plugin, or a script), delete it, start the service "
        "so the plugin declares it again, then move the messages back"
    )


async def check_broker(connection: AbstractRobustConnection, plan: Plan) -> tuple[int, int] | None:
    """Check the server version and declare every object of ``plan`` once, collecting mismatches.

    Returns the server's ``(major, minor)`` version, if it could be read.

    Raises:
        RetryTopologyError: the server is too old for the plan's queue type, or some
            object exists with other arguments (each one named, with how to migrate).
    """
    queue_type, prefix = plan.options.queue_type, plan.options.prefix
    transport = connection.transport
    if transport is None:
        raise RetryTopologyError("the broker connection is closed; cannot check the topology")
    amqp = transport.connection
    version_text = amqp.server_properties.get("version")
    if isinstance(version_text, bytes):
        version_text = version_text.decode("utf-8", "replace")
    version = parse_version(version_text)
    if version is None:
        log.warning("faststream-retry: unknown RabbitMQ version %r; not checked", version_text)
    elif version < MIN_VERSION[queue_type]:
        need = ".".join(map(str, MIN_VERSION[queue_type]))
        raise RetryTopologyError(
            f"RabbitMQ {version_text} is too old for queue_type={queue_type!r}: "
            f"it needs {need} or later"
        )
    mismatches: list[Mismatch] = []
    for kind, name, arguments in [
        *(("exchange", name, None) for name in plan.exchanges),
        *(("queue", spec.name, dict(spec.arguments)) for spec in plan.queues),
    ]:
        mismatch = await _declare(amqp, kind, name, arguments)
        if mismatch is not None:
            mismatches.append(mismatch)
    if mismatches:
        raise _mismatch_error(mismatches, prefix)
    return version


def _mismatch_error(mismatches: list[Mismatch], prefix: str) -> RetryTopologyError:
    lines = [
        f"- {m.kind} {m.name!r}: argument {m.argument!r} is {_show(m.current)} on the "
        f"broker, the plugin declares {_show(m.wanted)}. To migrate: {_advice(m, prefix)}"
        for m in mismatches
    ]
    return RetryTopologyError(
        "faststream-retry cannot use queues that exist with other arguments "
        "(RabbitMQ would refuse with 406 PRECONDITION_FAILED):\n" + "\n".join(lines)
    )


async def declare_late_route(
    connection: AbstractRobustConnection, plan: Plan, route: Route
) -> None:
    """Declare the queues of a subscriber that joins the running broker, checked as at start.

    Raises:
        RetryTopologyError: one of them exists with other arguments (named, with how
            to migrate), as ``check_broker`` says at start.
    """
    transport = connection.transport
    if transport is None:
        raise RetryTopologyError(f"the broker connection is closed; cannot cover {route.queue!r}")
    mismatches = []
    for name in (route.retry_queue, route.dlq):
        arguments = dict(plan.spec(name).arguments)
        mismatch = await _declare(transport.connection, "queue", name, arguments)
        if mismatch is not None:
            mismatches.append(mismatch)
    if mismatches:
        raise _mismatch_error(mismatches, plan.options.prefix)


def work_queue_findings(
    routes: Iterable[Route], default: RetryPolicy, version: tuple[int, int] | None
) -> list[tuple[int, str]]:
    """Return ``(log level, text)`` about quorum work queues and their delivery limit.

    The plugin's retries ack and publish a new copy, so they never spend a quorum
    queue's delivery limit; the limit counts only redeliveries (a consumer that
    crashed mid-message, a retry copy that could not be confirmed).
    """
    findings: list[tuple[int, str]] = []

    def add(level: int, *parts: str) -> None:
        findings.append((level, "".join(parts)))

    for route in routes:
        arguments = route.arguments
        if arguments.get("x-queue-type") != "quorum":
            continue
        limit = arguments.get("x-delivery-limit")
        max_attempts = max(p.max_attempts for p in route.policies(default))
        if limit is None:
            if version is not None and version < (4, 0):
                add(
                    logging.WARNING,
                    f"quorum queue {route.queue!r} has no x-delivery-limit: a message ",
                    "that crashes the consumer process is redelivered for ever. Set ",
                    f"x-delivery-limit (max_attempts={max_attempts} is a fair value) ",
                    f"and x-dead-letter-routing-key {route.dlq!r} with ",
                    "x-dead-letter-exchange ''",
                )
            continue
        if "x-dead-letter-exchange" not in arguments:
            add(
                logging.WARNING,
                f"quorum queue {route.queue!r} has x-delivery-limit={limit} and no ",
                "x-dead-letter-exchange in its arguments: unless a policy sets one, ",
                "RabbitMQ drops a message at the limit. Set x-dead-letter-exchange '' ",
                f"and x-dead-letter-routing-key {route.dlq!r}",
            )
        if isinstance(limit, int) and limit < max_attempts:
            add(
                logging.INFO,
                f"quorum queue {route.queue!r}: x-delivery-limit={limit} is below ",
                f"max_attempts={max_attempts}. Retries do not spend it (each one is ",
                "a new copy); it bounds redeliveries after crashes only",
            )
    return findings


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


async def declare_retry_queue(channel: AbstractChannel, plan: Plan, route: Route) -> AbstractQueue:
    """Declare ``route``'s re-check queue on ``channel`` (to consume it there)."""
    return await channel.declare_queue(
        route.retry_queue,
        durable=True,
        arguments=dict(plan.spec(route.retry_queue).arguments),
        timeout=RPC_TIMEOUT_S,
    )
