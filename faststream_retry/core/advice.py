"""What an operator is told when the broker refuses the plugin's objects, with the fix (pure).

RabbitMQ answers a declaration whose arguments differ from the live object's with
``406 PRECONDITION_FAILED`` and one the user may not make with ``403 ACCESS_REFUSED``,
each with a reply text. This module reads those texts (``parse_mismatch``,
``parse_refusal``) and writes everything said about them, once: the start's
``RetryTopologyError`` (``mismatch_text``, ``refused``), ``doctor``'s findings
(``mismatch_advice``, ``refusal_advice``), the ``faststream-retry migrate`` commands, and
the start's advice on quorum work queues' delivery limits (``work_queue_findings``) and on
work queues declared in ways RabbitMQ 4.x deprecates or refuses (``series_advice``).
The checks that collect the replies are in ``faststream_retry.rabbit.checks``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.core.defaults import DELIVERY_LIMIT
from faststream_retry.core.topology import is_retry_queue, tier_ttl
from faststream_retry.errors import RetryTopologyError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.core.topology import Route, TopologyOptions

__all__ = [
    "Advice",
    "Mismatch",
    "Refusal",
    "migrate_command",
    "mismatch_advice",
    "mismatch_text",
    "parse_mismatch",
    "parse_refusal",
    "refusal_advice",
    "refused",
    "series_advice",
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

_PRECONDITION_FAILED = "406 PRECONDITION_FAILED"
_ACCESS_REFUSED = "403 ACCESS_REFUSED"
_PERMISSIONS = (
    "rabbitmqctl set_permissions; "
    "https://faststream-retry.readthedocs.io/en/latest/reference/topology/#permissions lists the"
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


@dataclass(frozen=True, slots=True)
class Advice:
    """What was found, why it matters and what to do: one finding's text."""

    what: str
    why: str
    fix: str


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
        f"faststream-retry's RabbitMQ user lacks permissions it needs ({_ACCESS_REFUSED}):\n"
        + "\n".join(lines)
        + f"\nGrant them with {_PERMISSIONS} configure, write and read patterns the plugin needs"
    )


def refusal_advice(refusal: Refusal) -> Advice:
    """Say which object the app's user may not use as the plugin needs, and what to grant."""
    return Advice(
        f"{refusal.kind} {refusal.name!r}: the user may not {refusal.doing} it",
        f"the app refuses to start ({_ACCESS_REFUSED}). RabbitMQ said: {refusal.detail}",
        f"grant {refusal.permission} ({_PERMISSIONS} patterns the plugin needs)",
    )


def _show(value: str) -> str:
    return "unset" if value == "none" else repr(value)


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _difference(kind: str, names: list[str], mismatch: Mismatch, declarer: str) -> str:
    """Say what differs: ``kind`` (made plural for several) ``names``, the argument, both values."""
    return (
        f"{kind if len(names) == 1 else kind + 's'} {_names(names)}: argument "
        f"{mismatch.argument!r} is {_show(mismatch.current)} on the broker, the {declarer} "
        f"declares {_show(mismatch.wanted)}"
    )


def _keep(queue_type: str) -> str:
    return f'pass RetryMiddleware(queue_type="{queue_type}")'


def _command(name: str, queue_type: str, prefix: str) -> str:
    return f"faststream-retry migrate {name} --queue-type {queue_type} --prefix {prefix}"


def migrate_command(name: str, options: TopologyOptions, *, retry_queue: bool) -> str:
    """Return the ``faststream-retry migrate`` command that gives ``name`` the planned arguments."""
    command = _command(name, options.queue_type, options.prefix)
    quorum = options.queue_type == "quorum"
    if (
        retry_queue and quorum and options.delivery_limit != DELIVERY_LIMIT
    ):  # the default goes unsaid
        command += f" --delivery-limit {options.delivery_limit}"
    return command


def _fits(fits: str, them: str) -> str:
    """What queues that are what ``queue_type=fits`` declares are, and how to keep them."""
    if fits == "quorum":
        return (
            f'what the default queue_type="quorum" declares. To keep {them}: drop '
            'queue_type="classic" (or pass queue_type="quorum")'
        )
    return (
        f'what queue_type="{fits}" declares (the plugin\'s default before "quorum"; it '
        f"dead-letters at most once). To keep {them}: {_keep(fits)}"
    )


def _migrate(prefix: str, queue_type: str) -> str:
    return (
        f"{_command('<queue>', queue_type, prefix)} (the cli extra) moves its messages to a "
        "temporary queue and back, with confirms, declaring it as the plugin does"
    )


def _tier_migration(prefix: str, queue_type: str) -> str:
    return (
        "a tier holds a message for one tier period only: stop the services that use "
        f"prefix {prefix!r}, wait until the tier is empty, delete it (rabbitmqctl "
        "delete_queue) and start again; or choose a new prefix=, whose tiers are new "
        "queues, and let the old tiers drain into their .retry queues; or, with the "
        f"services stopped, {_migrate(prefix, queue_type)} (its messages wait their tier "
        "period again)"
    )


def _queue_migration(prefix: str, queue_type: str) -> str:
    return "it may hold messages: stop the services that consume it, then " + _migrate(
        prefix, queue_type
    )


def _is_tier(mismatch: Mismatch, prefix: str) -> bool:
    return mismatch.kind == "queue" and tier_ttl(mismatch.name, prefix) is not None


def mismatch_text(mismatches: list[Mismatch], prefix: str, queue_type: str = "quorum") -> str:
    """Say what differs and what to do, once for each group of objects the same holds for.

    A service upgraded without changing its options finds every tier with the same
    difference: one line names them all, not one paragraph per tier.
    """
    differences: dict[tuple[str, str, str, str], list[Mismatch]] = {}
    for m in mismatches:
        differences.setdefault((m.kind, m.argument, m.current, m.wanted), []).append(m)
    lines = [
        (
            "faststream-retry cannot use queues that exist with other arguments "
            f"(RabbitMQ would refuse with {_PRECONDITION_FAILED}):"
        )
    ]
    for same in differences.values():
        first = same[0]
        lines.append(f"- {_difference(first.kind, [m.name for m in same], first, 'plugin')}")
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
    if any(_is_tier(m, prefix) for m in mismatches):
        lines.append(f"- the tiers ({prefix}.delay.*): {_tier_migration(prefix, queue_type)}")
    others = [m.name for m in mismatches if not _is_tier(m, prefix)]
    if others:
        lines.append(f"- {_names(others)}: {_queue_migration(prefix, queue_type)}")
    return "\n".join(lines)


def mismatch_advice(mismatch: Mismatch, options: TopologyOptions) -> Advice:
    """Say what differs on one object, and how to migrate it (or keep it) under ``options``."""
    why = f"the app refuses to start: RabbitMQ answers its declaration with {_PRECONDITION_FAILED}"
    if mismatch.fits is not None:
        why += f"; the queue is what queue_type={mismatch.fits!r} declares"
    if mismatch.kind == "exchange":
        fix = (
            "an exchange holds no messages: stop the services that use prefix "
            f"{options.prefix!r}, delete it (rabbitmqadmin delete exchange name={mismatch.name}, "
            "or the management UI: rabbitmqctl cannot delete exchanges) and start the app, "
            "which declares it again"
        )
    else:
        fix = "stop every service that consumes it, then run: " + migrate_command(
            mismatch.name, options, retry_queue=is_retry_queue(mismatch.name)
        )
        if mismatch.fits is not None:
            fix += f" (or keep it: {_keep(mismatch.fits)})"
    return Advice(_difference(mismatch.kind, [mismatch.name], mismatch, "app"), why, fix)


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


def transient_queue_advice(name: str) -> Advice:
    """Return the advice on work queue ``name``, declared transient and not exclusive."""
    return Advice(
        f"queue {name!r} is declared transient (durable=False) and not exclusive",
        "a broker restart deletes it with every message in it, and the "
        "retry copies on their way back to it find no queue; RabbitMQ 4.x "
        "deprecates such queues and refuses them where "
        "deprecated_features.permit.transient_nonexcl_queues = false",
        f"declare it RabbitQueue({name!r}, durable=True) (a new name, or "
        "delete the queue first: RabbitMQ refuses to redeclare it durable)",
    )


def series_advice(
    routes: Iterable[Route], version: tuple[int, int] | None
) -> list[tuple[str, Advice]]:
    """Return ``(queue, advice)`` for work queues declared as RabbitMQ 4.x will not have them.

    Measured on 4.3.6: a classic queue of ``x-queue-version`` 1 is refused (406), and a
    transient queue that is not exclusive is a deprecated feature, permitted by default
    and refused once an operator denies it (RabbitMQ closes the connection). ``x-queue-mode``
    and a global QoS are taken, even with ``global_qos`` denied; the plugin asks for none of
    these. ``version``: the broker's, which
    says whether the refusal is here already or comes with an upgrade.
    """
    found: list[tuple[str, Advice]] = []
    upgraded = version is not None and version >= (4, 3)
    for route in routes:
        name = route.queue
        if route.transient:
            found.append((name, transient_queue_advice(name)))
        if str(route.arguments.get("x-queue-version")) == "1":
            found.append(
                (
                    name,
                    Advice(
                        f"queue {name!r} is declared with x-queue-version=1",
                        "RabbitMQ 4.3 removed classic queue version 1 and refuses the "
                        "declaration (406 PRECONDITION_FAILED)"
                        + ("" if upgraded else ": this app will not start after an upgrade"),
                        "declare it without x-queue-version (version 2 is the only one "
                        "from 4.3 on)",
                    ),
                )
            )
    return found
