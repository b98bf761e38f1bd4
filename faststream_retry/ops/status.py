"""``status``: how many messages wait where, per work queue and per delay tier.

Counts come from passive declares: they change nothing, create nothing, and count the
*ready* messages of a queue (a message a consumer holds unacked is not in them). Which
queues: the ones named, an app's, or the registry's; which tiers: an app's plan and the
management API's listing, since AMQP cannot list queues.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core.defaults import PREFIX
from faststream_retry.core.topology import (
    dlq_name,
    is_retry_or_dlq,
    looks_like_intake,
    retry_queue_name,
    tier_name,
    tier_ttl,
    work_queue_of,
)
from faststream_retry.ops.common import name_problem, shown_name
from faststream_retry.ops.management import list_queues
from faststream_retry.rabbit.probe import depth
from faststream_retry.rabbit.registry import registered_queues

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aio_pika.abc import AbstractConnection

    from faststream_retry.middleware.app import LoadedApp

__all__ = ["Depth", "QueueStatus", "Status", "TierStatus", "status"]

FORMAT = 1
"""The version of the JSON shape ``Status.to_json`` returns; it changes only by adding."""


@dataclass(frozen=True, slots=True)
class Depth:
    """One queue's ready messages and consumers; both ``None`` when it does not exist."""

    name: str
    messages: int | None
    consumers: int | None

    @property
    def exists(self) -> bool:
        """Return whether the queue exists."""
        return self.messages is not None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"name", "exists", "messages", "consumers"}`` (counts null when missing)."""
        return {
            "name": self.name,
            "exists": self.exists,
            "messages": self.messages,
            "consumers": self.consumers,
        }


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """A work queue, its ``.retry`` queue (waiting for a re-check) and its ``.dlq``."""

    queue: str
    work: Depth
    retry: Depth
    dlq: Depth

    def to_json(self) -> dict[str, Any]:
        """Return ``{"queue", "work", "retry", "dlq"}``, each but the first a ``Depth``."""
        return {
            "queue": self.queue,
            "work": self.work.to_json(),
            "retry": self.retry.to_json(),
            "dlq": self.dlq.to_json(),
        }


@dataclass(frozen=True, slots=True)
class TierStatus:
    """A delay tier: its TTL and depth (shared by every queue of the prefix)."""

    ttl_ms: int
    depth: Depth
    undeliverable: int | None = None
    """Copies whose TTL ran out and whose queue would not take them (deleted, or
    refusing), held in the quorum tier's dead-letter backlog; the management API
    counts them, AMQP does not (``None``: not asked)."""

    def to_json(self) -> dict[str, Any]:
        """Return the tier's ``Depth`` fields with ``ttl_ms`` and ``undeliverable``."""
        return {**self.depth.to_json(), "ttl_ms": self.ttl_ms, "undeliverable": self.undeliverable}


@dataclass(frozen=True, slots=True)
class Status:
    """What ``status`` found: see ``to_json`` for the stable shape.

    ``queues_from``: ``arguments``, ``app`` or ``registry`` (plus ``management`` when
    its listing added queues). ``tiers_from``: ``app`` and/or ``management``; empty
    when the tiers could not be listed. ``notes`` say what the numbers cannot.
    ``system``: ``rabbitmq``, ``nats`` or ``redis`` (``ops.nats_status``,
    ``ops.redis_status``); ``prefix`` is ``None`` on Redis, whose keys have none.
    """

    prefix: str | None
    queues_from: tuple[str, ...]
    tiers_from: tuple[str, ...]
    queues: tuple[QueueStatus, ...]
    tiers: tuple[TierStatus, ...]
    notes: tuple[str, ...]
    system: str = "rabbitmq"

    def to_json(self) -> dict[str, Any]:
        """Return the status as JSON-able data, format ``FORMAT``."""
        return {
            "format": FORMAT,
            "system": self.system,
            "prefix": self.prefix,
            "queues_from": list(self.queues_from),
            "tiers_from": list(self.tiers_from),
            "queues": [q.to_json() for q in self.queues],
            "tiers": [t.to_json() for t in self.tiers],
            "notes": list(self.notes),
        }


async def _queues(
    connection: AbstractConnection,
    queues: Sequence[str],
    *,
    app: LoadedApp | None,
    listed: list[str] | None,
    prefix: str,
    notes: list[str],
) -> tuple[list[str], tuple[str, ...]]:
    """Return the work queues to show and where they came from; add notes."""
    if queues:
        return [work_queue_of(q) for q in queues], ("arguments",)
    if app is not None:
        return sorted(app.plan.routes), ("app",)
    registry = await registered_queues(connection, prefix)
    if registry.note:
        notes.append(registry.note)
    names = list(registry.queues)
    if listed is not None:
        owners = {work_queue_of(n) for n in listed if is_retry_or_dlq(n)}
        more = sorted(owners - set(names))
        if more:
            return names + more, ("registry", "management")
    return names, ("registry",)


def _tiers(
    app: LoadedApp | None, listed: list[str] | None, prefix: str, notes: list[str]
) -> tuple[set[int], tuple[str, ...]]:
    """Return the TTLs of the tiers to show and where they came from; add notes."""
    ttls: set[int] = set()
    tiers_from: list[str] = []
    if app is not None:
        ttls |= set(app.plan.tiers.ttls_ms)
        tiers_from.append("app")
    if listed is not None:
        ttls |= {ttl for name in listed if (ttl := tier_ttl(name, prefix)) is not None}
        tiers_from.append("management")
    if not tiers_from:
        notes.append(
            "the delay tiers cannot be listed over AMQP: give --app or --management-url to see them"
        )
    elif ttls:
        notes.append(
            f"the tiers are shared by every queue with prefix {prefix!r}: "
            "how many of their messages belong to each queue is not known"
        )
    return ttls, tuple(tiers_from)


def undeliverable_notes(tiers: Sequence[TierStatus]) -> list[str]:
    """Say which tiers hold copies they cannot hand back, and what that costs."""
    return [
        f"{tier.depth.name} holds {tier.undeliverable} copies whose queue would not take "
        "them (deleted, or refusing): RabbitMQ tries again every "
        "180 s, and from 32 of them the tier releases nothing for any queue. Declare the "
        "queue again (start its service), or see the guarantees page"
        for tier in tiers
        if tier.undeliverable
    ]


def _nameable(names: list[str], notes: list[str]) -> list[str]:
    """Return the names whose queues AMQP can ask about; a note names each of the others.

    A registry record is anyone's message (whoever may publish to the vhost), and a
    name the client cannot send would make every look fail.
    """
    kept = []
    for name in names:
        problem = next(
            (p for q in (name, retry_queue_name(name), dlq_name(name)) if (p := name_problem(q))),
            None,
        )
        if problem is None:
            kept.append(name)
        else:
            notes.append(f"left out the queue {shown_name(name)}: {problem}")
    return kept


async def _depth(connection: AbstractConnection, name: str) -> Depth:
    found = await depth(connection, name)
    if found is None:
        return Depth(name, None, None)
    return Depth(name, found.messages, found.consumers)


async def status(
    connection: AbstractConnection,
    queues: Sequence[str] = (),
    *,
    app: LoadedApp | None = None,
    management_url: str | None = None,
    vhost: str = "/",
    prefix: str = PREFIX,
) -> Status:
    """Count the messages of work queues, their ``.retry`` and ``.dlq``, and the tiers.

    The queues are ``queues`` if given (a ``.retry`` or ``.dlq`` name means its work
    queue), else ``app``'s covered queues, else those the registry ``<prefix>.queues``
    names (read without consuming it), with, given ``management_url``, every queue a
    ``.retry`` or ``.dlq`` there belongs to. The tiers are ``app``'s plan's and, given
    ``management_url``, every ``<prefix>.delay.<ms>`` queue in ``vhost``. ``app``'s
    prefix wins over ``prefix``. Nothing is consumed, created or changed.

    Raises:
        OperationError: the management API could not be read.
    """
    notes: list[str] = []
    if app is not None:
        prefix = app.plan.options.prefix
    listed: list[str] | None = None
    backlog: dict[str, int] | None = None
    if management_url is not None:
        found = await asyncio.to_thread(list_queues, management_url, vhost)
        listed = [row.name for row in found]
        backlog = {row.name: row.undeliverable for row in found}
    names, queues_from = await _queues(
        connection, queues, app=app, listed=listed, prefix=prefix, notes=notes
    )
    ttls, tiers_from = _tiers(app, listed, prefix, notes)
    names = _nameable(names, notes)
    notes.append("counts are ready messages: those a consumer holds unacked are not counted")
    notes.extend(
        f"{name} is the retry worker's intake: it has no .retry of its own (its "
        "messages' retries wait in the tiers, then go back to each one's work queue)"
        for name in dict.fromkeys(names)
        if looks_like_intake(name)
    )
    rows = [
        QueueStatus(
            name,
            await _depth(connection, name),
            await _depth(connection, retry_queue_name(name)),
            await _depth(connection, dlq_name(name)),
        )
        for name in dict.fromkeys(names)
    ]
    tiers = [
        TierStatus(
            ttl,
            await _depth(connection, tier_name(prefix, ttl)),
            None if backlog is None else backlog.get(tier_name(prefix, ttl), 0),
        )
        for ttl in sorted(ttls)
    ]
    notes.extend(undeliverable_notes(tiers))
    if tiers and backlog is None:
        notes.append(
            "copies a quorum tier could not hand back to their queue (deleted, or refusing "
            "them) are not counted over AMQP: give --management-url to see them"
        )
    return Status(prefix, queues_from, tiers_from, tuple(rows), tuple(tiers), tuple(notes))
