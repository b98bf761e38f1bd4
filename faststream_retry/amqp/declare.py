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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aio_pika.abc import ExchangeType
from aiormq.exceptions import (
    ChannelAccessRefused,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
)

from faststream_retry.amqp.channels import RPC_TIMEOUT_S, close_quietly
from faststream_retry.core.topology import queue_specs
from faststream_retry.core.versions import MIN_VERSION, parse_version, too_old
from faststream_retry.errors import RetryTopologyError
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Iterable

    from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.core.topology import Plan, QueueType, Route

__all__ = [
    "MIN_VERSION",
    "Checked",
    "Mismatch",
    "Refusal",
    "check_broker",
    "check_objects",
    "declare_late_route",
    "declare_retry_queue",
    "declare_topology",
    "mismatch_text",
    "owns",
    "parse_mismatch",
    "parse_refusal",
    "parse_version",
    "raise_for",
    "redeclare",
    "refused",
    "too_old",
    "work_queue_findings",
]

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']*)'"
    r".*?: received (?P<received>.+?) but current is (?P<current>.+?)\"?$"
)


_REFUSED = re.compile(
    r"(?:(?P<permission>configure|write|read) )?access to (?P<kind>queue|exchange) "
    r"'(?P<name>[^']*)' in vhost '(?P<vhost>[^']*)' refused for user '(?P<user>[^']*)'"
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One object the connection's user may not use as the plugin needs (a 403)."""

    kind: str
    name: str
    permission: str
    doing: str
    """What the plugin was doing: ``declare``, ``bind``, ``consume``."""
    detail: str
    """RabbitMQ's reply text."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One object whose live arguments differ from what the plugin declares."""

    kind: str
    name: str
    argument: str
    wanted: str
    current: str
    fits: str | None = None
    """The other ``queue_type`` whose declaration the live queue matches, if it does."""


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


def parse_refusal(reply: str, kind: str, name: str, needs: str, doing: str) -> Refusal:
    """Read RabbitMQ's 403 reply text, which usually names the permission and the object.

    ``kind`` and ``name`` are the object of the plugin's own operation and ``needs`` what
    that operation requires; they stand when the text does not name them (RabbitMQ
    3.10 names no permission for a refused read, nor for its check of a queue's
    dead-letter exchange).
    """
    match = _REFUSED.search(reply)
    if match is None:
        return Refusal(kind, name, needs, doing, reply)
    permission = match["permission"]
    needs = needs if permission is None else f"{permission} permission"
    return Refusal(match["kind"], match["name"], needs, doing, reply)


def refused(refusals: Iterable[Refusal]) -> RetryTopologyError:
    """Return the error that names each refused object and the permission it needs."""
    lines = [
        f"- {r.kind} {r.name!r}: to {r.doing} it, the user needs {r.permission}. "
        f"RabbitMQ said: {r.detail}"
        for r in refusals
    ]
    return RetryTopologyError(
        "faststream-retry's RabbitMQ user lacks permissions it needs (403 ACCESS_REFUSED):\n"
        + "\n".join(lines)
        + "\nGrant them with rabbitmqctl set_permissions; the README's 'Permissions' "
        "section lists the configure, write and read patterns the plugin needs"
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
) -> Mismatch | Refusal | None:
    # A channel per declaration: a 406 or a 403 closes the channel it happened on.
    # These are a handful of declarations, once, at start.
    channel = await amqp.channel()
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
    await channel.close()
    return None


async def _bind(amqp: Any, name: str) -> Refusal | None:  # noqa: ANN401 - aiormq's connection
    # Binding a tier's queue to its exchange needs write on the queue and read on the
    # exchange; RabbitMQ's reply says which of the two is missing.
    channel = await amqp.channel()
    try:
        await channel.queue_bind(name, name, routing_key="")
    except ChannelAccessRefused as exc:
        needs = f"write permission on it and read permission on exchange {name!r}"
        return parse_refusal(str(exc.args[0]), "queue", name, needs, "bind")
    await channel.close()
    return None


def _show(value: str) -> str:
    return "unset" if value == "none" else repr(value)


def _names(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _fits(fits: str, them: str) -> str:
    """What queues that are what ``queue_type=fits`` declares are, and how to keep them."""
    if fits == "quorum":
        return (
            f'what the default queue_type="quorum" declares. To keep {them}: drop '
            'queue_type="classic" (or pass queue_type="quorum")'
        )
    return (
        f'what queue_type="{fits}" declares (the plugin\'s default before "quorum"; it '
        f'dead-letters at most once). To keep {them}: pass RetryMiddleware(queue_type="{fits}")'
    )


def _is_tier(mismatch: Mismatch, prefix: str) -> bool:
    return mismatch.kind == "queue" and mismatch.name.startswith(f"{prefix}.delay.")


def _migration(*, tier: bool, prefix: str, queue_type: str) -> str:
    command = (
        f"faststream-retry migrate <queue> --queue-type {queue_type} --prefix {prefix} "
        "(the cli extra) moves its messages to a temporary queue and back, with confirms, "
        "declaring it as the plugin does"
    )
    if tier:
        return (
            "a tier holds a message for one tier period only: stop the services that use "
            f"prefix {prefix!r}, wait until the tier is empty, delete it (rabbitmqctl "
            "delete_queue) and start again; or choose a new prefix=, whose tiers are new "
            "queues, and let the old tiers drain into their .retry queues; or, with the "
            f"services stopped, {command} (its messages wait their tier period again)"
        )
    return f"it may hold messages: stop the services that consume it, then {command}"


_MISMATCH_HEAD = (
    "faststream-retry cannot use queues that exist with other arguments "
    "(RabbitMQ would refuse with 406 PRECONDITION_FAILED):"
)


def mismatch_text(mismatches: list[Mismatch], prefix: str, queue_type: str = "quorum") -> str:
    """Say what differs and what to do, once for each group of objects the same holds for.

    A service upgraded without changing its options finds every tier with the same
    difference: one line names them all, not one paragraph per tier.
    """
    differences: dict[tuple[str, str, str, str], list[str]] = {}
    for m in mismatches:
        differences.setdefault((m.kind, m.argument, m.current, m.wanted), []).append(m.name)
    lines = [_MISMATCH_HEAD]
    for (kind, argument, current, wanted), names in differences.items():
        lines.append(
            f"- {kind if len(names) == 1 else kind + 's'} {_names(names)}: argument "
            f"{argument!r} is {_show(current)} on the broker, the plugin declares {_show(wanted)}"
        )
    fitting: dict[str, list[str]] = {}
    for m in mismatches:
        if m.fits is not None:
            fitting.setdefault(m.fits, []).append(m.name)
    for fits, names in fitting.items():
        one = len(names) == 1
        if len(names) == len(mismatches):
            which = "It is" if one else "All of them are"
        else:
            which = f"{_names(names)} {'is' if one else 'are'}"
        lines.append(
            f"{which} {_fits(fits, 'it' if one else 'them')}, for every queue the plugin declares."
        )
    lines.append(f"To migrate{' instead' if fitting else ''}, for each queue:")
    tiers = [m.name for m in mismatches if _is_tier(m, prefix)]
    if tiers:
        lines.append(
            f"- the tiers ({prefix}.delay.*): "
            + _migration(tier=True, prefix=prefix, queue_type=queue_type)
        )
    others = [m.name for m in mismatches if not _is_tier(m, prefix)]
    if others:
        lines.append(
            f"- {_names(others)}: {_migration(tier=False, prefix=prefix, queue_type=queue_type)}"
        )
    return "\n".join(lines)


async def check_broker(connection: AbstractRobustConnection, plan: Plan) -> tuple[int, int] | None:
    """Check the server version and declare every object of ``plan`` once, collecting mismatches.

    Returns the server's ``(major, minor)`` version, if it could be read.

    Raises:
        RetryTopologyError: the server is too old for the plan's queue type (the
            text names the fix), the connection's user lacks a permission (each
            object named with the permission), or some object exists with other
            arguments (each one named, with how to migrate).
    """
    transport = connection.transport
    if transport is None:
        raise RetryTopologyError("the broker connection is closed; cannot check the topology")
    amqp = transport.connection
    version = _check_version(amqp.server_properties.get("version"), plan.options.queue_type)
    raise_for(await check_objects(amqp, plan), plan.options.prefix, plan.options.queue_type)
    return version


@dataclass(frozen=True, slots=True)
class Checked:
    """What declaring, or only looking at, every object of a plan found on the broker."""

    mismatches: tuple[Mismatch, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    """``(kind, name)`` of the objects that do not exist (only when looking, never creating)."""


def raise_for(checked: Checked, prefix: str, queue_type: str = "quorum") -> None:
    """Raise what ``check_broker`` raises for ``checked``: refusals first, then mismatches.

    Raises:
        RetryTopologyError: ``checked`` holds a refusal or a mismatch.
    """
    if checked.refusals:
        raise refused(checked.refusals)
    if checked.mismatches:
        raise RetryTopologyError(mismatch_text(list(checked.mismatches), prefix, queue_type))


async def check_objects(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    plan: Plan,
    *,
    create: bool = True,
) -> Checked:
    """Declare every object of ``plan`` once, each on a throwaway channel, and collect what failed.

    With ``create=False`` nothing on the broker is created or changed (``doctor``): an
    object is declared with its planned arguments only if a passive declare finds it.
    A declaration equal to the live object is a no-op and a different one a 406 that
    closes only its own channel. The bindings of the tiers are not checked then: binding
    an unbound queue would change the broker.
    """
    mismatches: list[Mismatch] = []
    refusals: list[Refusal] = []
    missing: list[tuple[str, str]] = []
    for kind, name, arguments in [
        *(("exchange", name, None) for name in plan.exchanges),
        *(("queue", spec.name, dict(spec.arguments)) for spec in plan.queues),
    ]:
        if not create and not await _exists(amqp, kind, name):
            missing.append((kind, name))
            continue
        found = await _declare(amqp, kind, name, arguments)
        if isinstance(found, Mismatch):
            mismatches.append(await _other_type(amqp, plan, found))
        elif found is not None:
            refusals.append(found)
    if create and not refusals:
        refusals = [r for r in [await _bind(amqp, name) for name in plan.exchanges] if r]
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
    transport = connection.transport
    if transport is None:
        raise RetryTopologyError(f"the broker connection is closed; cannot cover {route.queue!r}")
    amqp = transport.connection
    mismatches: list[Mismatch] = []
    refusals: list[Refusal] = []
    for name in (route.retry_queue, route.dlq):
        found = await _declare(amqp, "queue", name, dict(plan.spec(name).arguments))
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
    if await _declare(amqp, "queue", mismatch.name, arguments) is None:
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
                    "x-dead-letter-exchange '' (on a queue that exists, by a policy, which ",
                    "needs no redeclaring: rabbitmqctl set_policy <name> ",
                    f"'^{route.queue}$' '{{\"delivery-limit\": {max_attempts}, ",
                    '"dead-letter-exchange": "", ',
                    f'"dead-letter-routing-key": "{route.dlq}"}}\' --apply-to queues; ',
                    "a policy is not visible to this check)",
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


def owns(plan: Plan, exchange: str, routing_key: str) -> bool:
    """Return whether a publish to ``exchange``/``routing_key`` targets the plugin's own objects.

    A tier exchange, or the default exchange to a ``<queue>.retry`` or ``<queue>.dlq``
    of the plan. A work queue is its application's: the plugin never declares one.
    """
    if exchange:
        return exchange in plan.exchanges
    return any(routing_key in (route.retry_queue, route.dlq) for route in plan.routes.values())


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
