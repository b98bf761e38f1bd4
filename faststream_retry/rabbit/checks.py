"""The startup checks against the broker: its version, and every object declared once to see.

RabbitMQ answers a declaration whose arguments differ from the existing queue's with
``406 PRECONDITION_FAILED`` and closes the channel; FastStream would surface that as a
raw channel error half-way through start. So before anything else every object of the
plan is declared once, every mismatch (406) and refusal (403) is collected, and one
``RetryTopologyError`` names each object and the fix (the text is
``faststream_retry.core.advice``'s). ``doctor`` runs the same checks without creating
anything.

The declarations are the start's: they create what is missing, and what exists is
only checked (a declaration equal to the live object changes nothing), so the plugin
does not declare the plan again once it passed. They run on a few channels at once
(``CHANNELS``), each declaring one object after another and replaced when a refusal
closes it: a quorum queue takes the broker about 10 ms to create, and one round trip
per object on one channel made a first start of 19 tiers take 0.75 s, and a start of
300 covered queues 6 s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from aiormq.exceptions import (
    ChannelAccessRefused,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
)

from faststream_retry.core.advice import (
    Mismatch,
    Refusal,
    mismatch_text,
    parse_mismatch,
    parse_refusal,
    refused,
)
from faststream_retry.core.topology import queue_specs
from faststream_retry.core.versions import MIN_VERSION, parse_version, too_old
from faststream_retry.errors import RetryTopologyError
from faststream_retry.reporting.log import log

T = TypeVar("T")
R = TypeVar("R")

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from aio_pika.abc import AbstractRobustConnection

    from faststream_retry.core.topology import Plan, QueueType, Route

__all__ = [
    "CHANNELS",
    "Checked",
    "check_broker",
    "check_objects",
    "declare_checked",
    "declare_late_route",
    "raise_for",
]


@dataclass(frozen=True, slots=True)
class Checked:
    """What declaring, or only looking at, every object of a plan found on the broker."""

    mismatches: tuple[Mismatch, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    """``(kind, name)`` of the objects that do not exist (only when looking, never creating)."""


CHANNELS = 8
"""Declarations in flight at once, each on a channel of its own (the broker creates
quorum queues side by side; more channels than this gained nothing on 2 cores)."""


async def declare_checked(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    kind: str,
    name: str,
    arguments: dict[str, Any] | None,
) -> Mismatch | Refusal | None:
    """Declare ``name`` durable, on a channel of its own; return what refused it, if anything.

    A declaration equal to the live object is a no-op, a different one a 406 that
    closes only that channel.
    """
    # A channel per declaration: a 406 or a 403 closes the channel it happened on.
    channel = await amqp.channel()
    found = await _declare_on(channel, kind, name, arguments)
    if found is None:
        await channel.close()
    return found


async def _declare_on(
    channel: Any,  # noqa: ANN401 - aiormq's channel
    kind: str,
    name: str,
    arguments: dict[str, Any] | None,
) -> Mismatch | Refusal | None:
    """Declare ``name`` durable on ``channel``; a refusal (which closes it) is returned."""
    try:
        if kind == "exchange":
            await channel.exchange_declare(name, exchange_type="fanout", durable=True)
        else:
            await channel.queue_declare(name, durable=True, arguments=arguments)
    except ChannelPreconditionFailed as exc:
        return parse_mismatch(str(exc.args[0]), kind, name)
    except ChannelAccessRefused as exc:
        needs = "configure permission"
        if arguments and "x-dead-letter-exchange" in arguments:
            # RabbitMQ also checks read on a queue that dead-letters and write on its
            # dead-letter exchange (the default one, amq.default), with a text that
            # names neither.
            needs += ", and read permission on it and write permission on 'amq.default'"
        return parse_refusal(str(exc.args[0]), kind, name, needs, "declare")
    return None


async def _bind_on(channel: Any, name: str) -> Refusal | None:  # noqa: ANN401 - aiormq's
    # Binding a tier's queue to its exchange needs write on the queue and read on the
    # exchange; RabbitMQ's reply says which of the two is missing.
    try:
        await channel.queue_bind(name, name, routing_key="")
    except ChannelAccessRefused as exc:
        needs = f"write permission on it and read permission on exchange {name!r}"
        return parse_refusal(str(exc.args[0]), "queue", name, needs, "bind")
    return None


async def _each(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    items: Sequence[T],
    act: Callable[[Any, T], Awaitable[R]],
) -> list[R]:
    """Return ``act(channel, item)`` for every item, in order, run on up to ``CHANNELS`` channels.

    Each channel takes the next item when it is done with one; a channel the broker
    closed (a refusal) is replaced before its next item.
    """
    results: dict[int, R] = {}
    todo = iter(enumerate(items))

    async def worker() -> None:
        channel = None
        try:
            for index, item in todo:
                if channel is None or channel.is_closed:
                    channel = await amqp.channel()
                results[index] = await act(channel, item)
        finally:
            if channel is not None and not channel.is_closed:
                await channel.close()

    await asyncio.gather(*(worker() for _ in range(min(CHANNELS, len(items)))))
    return [results[index] for index in range(len(items))]


def _amqp(connection: AbstractRobustConnection, cannot: str) -> Any:  # noqa: ANN401 - aiormq's
    """Return the aiormq connection under ``connection``.

    Raises:
        RetryTopologyError: the connection is closed (the text ends with ``cannot``).
    """
    transport = connection.transport
    if transport is None:
        raise RetryTopologyError(f"the broker connection is closed; {cannot}")
    return transport.connection


async def check_broker(connection: AbstractRobustConnection, plan: Plan) -> tuple[int, int] | None:
    """Check the server version and declare every object of ``plan`` once, collecting mismatches.

    Returns the server's ``(major, minor)`` version, if it could be read.

    Raises:
        RetryTopologyError: the server is too old for the plan's queue type (the
            text names the fix), the connection's user lacks a permission (each
            object named with the permission), or some object exists with other
            arguments (each one named, with how to migrate).
    """
    amqp = _amqp(connection, "cannot check the topology")
    version = _check_version(amqp.server_properties.get("version"), plan.options.queue_type)
    raise_for(await check_objects(amqp, plan), plan.options.prefix, plan.options.queue_type)
    return version


def raise_for(checked: Checked, prefix: str, queue_type: str = "quorum") -> None:
    """Raise what ``check_broker`` raises for ``checked``: refusals first, then mismatches.

    Raises:
        RetryTopologyError: ``checked`` holds a refusal or a mismatch.
    """
    if checked.refusals:
        raise refused(checked.refusals)
    if checked.mismatches:
        raise RetryTopologyError(mismatch_text(list(checked.mismatches), prefix, queue_type))


Declaration: TypeAlias = "tuple[str, str, dict[str, Any] | None]"
"""What to declare: ``(kind, name, arguments)``."""

Found: TypeAlias = "Mismatch | Refusal | tuple[str, str] | None"
"""What declaring one object found: a mismatch, a refusal, ``(kind, name)`` missing, or fine."""


async def check_objects(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    plan: Plan,
    *,
    create: bool = True,
) -> Checked:
    """Declare every object of ``plan`` once and collect what failed.

    With ``create=False`` nothing on the broker is created or changed (``doctor``): an
    object is declared with its planned arguments only if a passive declare finds it.
    A declaration equal to the live object is a no-op and a different one a 406 that
    closes only its own channel. The bindings of the tiers are not checked then: binding
    an unbound queue would change the broker.
    """
    objects: list[Declaration] = [
        *(("exchange", name, None) for name in plan.exchanges),
        *(("queue", spec.name, dict(spec.arguments)) for spec in plan.queues),
    ]

    async def declare(channel: Any, obj: Declaration) -> Found:  # noqa: ANN401 - aiormq's
        kind, name, arguments = obj
        if not create and not await _exists(amqp, kind, name):
            return (kind, name)
        return await _declare_on(channel, kind, name, arguments)

    mismatches: list[Mismatch] = []
    refusals: list[Refusal] = []
    missing: list[tuple[str, str]] = []
    for found in await _each(amqp, objects, declare):
        if isinstance(found, Mismatch):
            mismatches.append(await _other_type(amqp, plan, found))
        elif isinstance(found, Refusal):
            refusals.append(found)
        elif found is not None:
            missing.append(found)
    if create and not refusals:
        refusals = [r for r in await _each(amqp, plan.exchanges, _bind_on) if r]
    return Checked(tuple(mismatches), tuple(refusals), tuple(missing))


async def _exists(amqp: Any, kind: str, name: str) -> bool:  # noqa: ANN401 - aiormq's
    """Return whether ``name`` exists, by a passive declare (it creates nothing)."""
    channel = await amqp.channel()
    try:
        if kind == "exchange":
            await channel.exchange_declare(name, passive=True)
        else:
            await channel.queue_declare(name, passive=True)
    except ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def declare_late_route(
    connection: AbstractRobustConnection, plan: Plan, route: Route
) -> None:
    """Declare the queues of a subscriber that joins the running broker, checked as at start.

    Raises:
        RetryTopologyError: one of them exists with other arguments, or the user may
            not declare it (each named, with the fix), as ``check_broker`` says at start.
    """
    amqp = _amqp(connection, f"cannot cover {route.queue!r}")
    mismatches: list[Mismatch] = []
    refusals: list[Refusal] = []

    async def declare(channel: Any, name: str) -> Mismatch | Refusal | None:  # noqa: ANN401
        return await _declare_on(channel, "queue", name, dict(plan.spec(name).arguments))

    for found in await _each(amqp, (route.retry_queue, route.dlq), declare):
        if isinstance(found, Mismatch):
            mismatches.append(await _other_type(amqp, plan, found))
        elif found is not None:
            refusals.append(found)
    raise_for(
        Checked(tuple(mismatches), tuple(refusals)),
        plan.options.prefix,
        plan.options.queue_type,
    )


async def _other_type(amqp: Any, plan: Plan, mismatch: Mismatch) -> Mismatch:  # noqa: ANN401
    """Say whether the queue is what the other ``queue_type`` declares (an older default).

    RabbitMQ names only the first argument it finds different, seldom ``x-queue-type``
    itself; declaring the other type's arguments tells (it changes nothing: a declaration
    equal to the live queue is a no-op, a different one another 406).
    """
    if mismatch.kind != "queue":
        return mismatch
    other: QueueType = "classic" if plan.options.queue_type == "quorum" else "quorum"
    specs = queue_specs(plan.tiers, plan.routes.values(), replace(plan.options, queue_type=other))
    arguments = next(dict(spec.arguments) for spec in specs if spec.name == mismatch.name)
    if await declare_checked(amqp, "queue", mismatch.name, arguments) is None:
        return replace(mismatch, fits=other)
    return mismatch


def _check_version(version_text: object, queue_type: str) -> tuple[int, int] | None:
    if isinstance(version_text, bytes):
        version_text = version_text.decode("utf-8", "replace")
    version = parse_version(version_text)
    if version is None:
        log.warning("faststream-retry: unknown RabbitMQ version %r; not checked", version_text)
    elif version < MIN_VERSION[queue_type]:
        raise RetryTopologyError(too_old(str(version_text), queue_type))
    return version
