"""Every name on the broker, and the plan of everything the plugin declares (pure).

Every queue and exchange name the package uses is built here (a work queue's ``.retry``
and ``.dlq``, the tiers, the registry, the worker's intake, an operator command's lock,
a migration's temporary queue), and read back here: which work queue a name belongs to,
whether it is a tier, one of the machinery's own.

The plan is worked out from the work queues and their handlers' policies, before any
connection exists: the tick and the tiers, and every queue with its arguments. The
adapters declare exactly what it says, and the startup checks compare it with the broker.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.core.defaults import DELIVERY_LIMIT, QUEUE_TYPE, QueueType
from faststream_retry.core.policy import HandlerPolicy, RetryPolicy, effective_policy
from faststream_retry.core.tiers import Tiers, compute_tick_ms

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DLQ_SUFFIX",
    "INTAKE_SUFFIX",
    "LOCK_PREFIX",
    "MAX_NAME_BYTES",
    "MIGRATING_SUFFIX",
    "RETRY_SUFFIX",
    "Handler",
    "Plan",
    "QueueSpec",
    "QueueType",
    "Route",
    "TopologyOptions",
    "dlq_name",
    "dlq_of",
    "dlq_owner",
    "intake_dlq_name",
    "intake_name",
    "is_dlq",
    "is_own_queue",
    "is_retry_or_dlq",
    "is_retry_queue",
    "lock_name",
    "looks_like_intake",
    "merge_routes",
    "migrating_name",
    "migrating_of",
    "plan",
    "queue_specs",
    "registry_name",
    "retry_queue_name",
    "route_specs",
    "tier_name",
    "tier_spec",
    "tier_ttl",
    "work_queue_of",
]

MAX_NAME_BYTES = 255
"""The longest queue name AMQP allows, in UTF-8 bytes."""

RETRY_SUFFIX = ".retry"
"""A work queue's re-check queue is the work queue's name and this."""
DLQ_SUFFIX = ".dlq"
"""A work queue's dead-letter queue is the work queue's name and this."""
INTAKE_SUFFIX = ".intake"
"""The retry worker's intake is the prefix and this."""
MIGRATING_SUFFIX = ".migrating"
"""A migration's temporary queue is the migrated queue's name and this."""
LOCK_PREFIX = "faststream-retry.lock."
"""An operator command's lock queue is this and the queue's name (or its hash)."""


def retry_queue_name(queue: str) -> str:
    """Return the re-check queue of work queue ``queue``."""
    return queue + RETRY_SUFFIX


def dlq_name(queue: str) -> str:
    """Return the dead-letter queue of work queue ``queue``."""
    return queue + DLQ_SUFFIX


def is_retry_queue(name: str) -> bool:
    """Return whether ``name`` has the shape of a work queue's re-check queue."""
    return name.endswith(RETRY_SUFFIX)


def is_dlq(name: str) -> bool:
    """Return whether ``name`` has the shape of a work queue's dead-letter queue."""
    return name.endswith(DLQ_SUFFIX)


def is_retry_or_dlq(name: str) -> bool:
    """Return whether ``name`` has the shape of a work queue's ``.retry`` or ``.dlq``."""
    return is_retry_queue(name) or is_dlq(name)


def is_own_queue(name: str, prefix: str) -> bool:
    """Return whether ``name`` belongs to the retry machinery, never to an application.

    A ``.retry`` or ``.dlq``, or any name under ``prefix`` (its tiers, its registry,
    the worker's intake): sending a message back to one of those would be a loop.
    """
    return is_retry_or_dlq(name) or name.startswith(prefix + ".")


def work_queue_of(name: str) -> str:
    """Return the work queue ``name`` means: itself, or the owner of a ``.retry`` or ``.dlq``."""
    for suffix in (RETRY_SUFFIX, DLQ_SUFFIX):
        owner = name.removesuffix(suffix)
        if owner != name and owner:
            return owner
    return name


def dlq_of(queue: str) -> str:
    """Return the dead-letter queue meant by ``queue``: a work queue or a ``.dlq`` itself."""
    return queue if is_dlq(queue) else dlq_name(queue)


def dlq_owner(dlq: str) -> str:
    """Return the queue whose dead letters ``dlq`` holds: ``dlq`` without ``.dlq``."""
    return dlq.removesuffix(DLQ_SUFFIX)


def intake_name(prefix: str) -> str:
    """Return the retry worker's intake exchange and queue, where work queues dead-letter."""
    return prefix + INTAKE_SUFFIX


def intake_dlq_name(prefix: str) -> str:
    """Return the queue for intake deliveries the worker refuses (reason ``invalid``)."""
    return dlq_name(intake_name(prefix))


def looks_like_intake(queue: str) -> bool:
    """Return whether ``queue`` (or its ``.dlq``) is shaped like a worker's intake's ``.dlq``.

    Of any prefix: an operator's command does not know the worker's.
    """
    return dlq_owner(dlq_of(queue)).endswith(INTAKE_SUFFIX)


def lock_name(queue: str) -> str:
    """Return the name of the lock queue of ``queue`` (at most ``MAX_NAME_BYTES``)."""
    name = LOCK_PREFIX + queue
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    return LOCK_PREFIX + hashlib.sha256(queue.encode()).hexdigest()


def migrating_name(queue: str) -> str:
    """Return the temporary queue of ``queue``'s migration: derived, so a rerun finds it."""
    return queue + MIGRATING_SUFFIX


def migrating_of(name: str) -> str | None:
    """Return the queue whose migration's temporary queue ``name`` is; ``None`` if it is none."""
    queue = name.removesuffix(MIGRATING_SUFFIX)
    return None if queue == name else queue


def registry_name(prefix: str) -> str:
    """Return the queue that records every work queue the plugin covered, one message each."""
    return f"{prefix}.queues"


def tier_name(prefix: str, ttl_ms: int) -> str:
    """Return the name of the delay tier exchange and queue with this TTL."""
    return f"{prefix}.delay.{ttl_ms}"


def tier_ttl(name: str, prefix: str) -> int | None:
    """Return the TTL of ``name`` if it is a tier of ``prefix`` (``tier_name``'s inverse)."""
    match = re.fullmatch(rf"{re.escape(prefix)}\.delay\.([1-9][0-9]*)", name)
    return None if match is None else int(match[1])


@dataclass(frozen=True, slots=True)
class Handler:
    """One handler of a work queue.

    ``selector`` is whatever tells the handler's messages apart when a queue has
    several (FastStream's filter); the plan only carries it for the adapter.
    """

    policy: HandlerPolicy | None
    selector: object = None


@dataclass(frozen=True, slots=True)
class Route:
    """A work queue, its handlers, and the arguments its owner declared it with.

    ``known`` says whether those arguments are what the queue really has. The retry
    worker serves queues whose declarations it cannot see (another team's, a policy's);
    their copies take the re-check step home, whose release the queue confirms.
    ``transient``: its owner declares it neither durable nor exclusive.
    """

    queue: str
    handlers: tuple[Handler, ...]
    arguments: Mapping[str, Any] = field(default_factory=dict)
    known: bool = True
    transient: bool = False
    retry_queue: str = field(init=False)
    dlq: str = field(init=False)

    def __post_init__(self) -> None:
        """Derive the names of the queue's re-check and dead-letter queues."""
        object.__setattr__(self, "retry_queue", retry_queue_name(self.queue))
        object.__setattr__(self, "dlq", dlq_name(self.queue))

    @property
    def home_from_tier(self) -> bool:
        """Whether a copy's last tier may dead-letter it straight into this queue.

        Not for a queue declared to refuse publishes when full (``x-overflow``
        ``reject-publish``): a quorum tier would keep the refused copies and retry them
        only every few minutes, and its dead-letter worker, stuck on them, would hold
        up every other queue's copies in that shared tier. Its copies take the
        re-check step instead, whose release waits in a tier again when refused. Nor
        for a queue whose arguments are not ``known``: it may be such a queue.
        """
        overflow = self.arguments.get("x-overflow")
        return self.known and overflow not in ("reject-publish", "reject-publish-dlx")

    def policies(self, default: RetryPolicy) -> list[RetryPolicy]:
        """Return the effective policy of each handler."""
        return [effective_policy(h.policy, default) for h in self.handlers]

    def enabled(self, default: RetryPolicy) -> bool:
        """Return whether any handler of the queue has retries on."""
        return any(p.enabled for p in self.policies(default))


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue the plugin declares: its name and arguments (always durable)."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TopologyOptions:
    """The middleware options that shape the topology."""

    prefix: str
    max_delay_ms: int
    queue_type: QueueType = QUEUE_TYPE
    delivery_limit: int = DELIVERY_LIMIT
    tick_ms: int | None = None
    """An explicit tick; ``None`` means the GCD of the delays the policies name."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything the plugin declares for a set of work queues."""

    options: TopologyOptions
    tiers: Tiers
    routes: Mapping[str, Route]
    queues: tuple[QueueSpec, ...]

    def route(self, queue: str) -> Route | None:
        """Return the route of ``queue``, if the plugin covers it."""
        return self.routes.get(queue)

    def spec(self, name: str) -> QueueSpec:
        """Return the spec of the queue called ``name`` (a ``KeyError`` if it is not planned)."""
        for spec in self.queues:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def tier(self, ttl_ms: int) -> str:
        """Return the name of the tier exchange (and queue) with this TTL."""
        return tier_name(self.options.prefix, ttl_ms)

    def with_route(self, route: Route) -> Plan:
        """Return this plan covering ``route`` too, on the same tiers (a late subscriber).

        The tiers stay: the exchanges and queues in use cannot change under running
        consumers. The new route's delays are rounded up to the tick like any other.
        """
        routes = {**self.routes, route.queue: route}
        specs = route_specs(route, self.options)
        names = {spec.name for spec in specs}
        kept = tuple(spec for spec in self.queues if spec.name not in names)
        return Plan(self.options, self.tiers, routes, kept + specs)

    def without(self, queue: str) -> Plan:
        """Return this plan without the route of ``queue`` (its subscriber stopped)."""
        route = self.routes.get(queue)
        if route is None:
            return self
        gone = {route.retry_queue, route.dlq}
        routes = {q: r for q, r in self.routes.items() if q != queue}
        kept = tuple(spec for spec in self.queues if spec.name not in gone)
        return Plan(self.options, self.tiers, routes, kept)

    @property
    def exchanges(self) -> tuple[str, ...]:
        """Return the tier exchanges, one per tier, each bound to its queue."""
        return _tier_names(self.options.prefix, self.tiers.ttls_ms)

    def owns(self, exchange: str, routing_key: str) -> bool:
        """Return whether a publish to ``exchange``/``routing_key`` is to the plugin's objects.

        A tier exchange, or the default exchange to a ``<queue>.retry`` or ``<queue>.dlq``
        of the plan. A work queue is its application's: the plugin never declares one.
        """
        if exchange:
            return exchange in self.exchanges
        return any(routing_key in (route.retry_queue, route.dlq) for route in self.routes.values())


def merge_routes(routes: Iterable[Route]) -> dict[str, Route]:
    """Return one route per queue: several subscribers of one queue, their handlers joined."""
    merged: dict[str, Route] = {}
    for route in routes:
        known = merged.get(route.queue)
        merged[route.queue] = (
            route
            if known is None
            else Route(
                route.queue,
                known.handlers + route.handlers,
                known.arguments,
                known.known and route.known,
                known.transient or route.transient,
            )
        )
    return merged


def plan(routes: Iterable[Route], default: RetryPolicy, options: TopologyOptions) -> Plan:
    """Plan the topology for ``routes``.

    Routes of the same queue (several subscribers of one queue) are merged. Queues
    whose every handler has retries switched off are left out. The tick is the GCD of
    every delay the default and the handlers' policies name (see ``compute_tick_ms``).
    """
    covered = {q: r for q, r in merge_routes(routes).items() if r.enabled(default)}
    delays = list(default.backoff.named_delays_ms())
    for route in covered.values():
        for policy in route.policies(default):
            delays.extend(policy.backoff.named_delays_ms())
    tiers = Tiers.build(compute_tick_ms(delays, options.tick_ms), options.max_delay_ms)
    return Plan(options, tiers, covered, queue_specs(tiers, covered.values(), options))


def queue_specs(
    tiers: Tiers, routes: Iterable[Route], options: TopologyOptions
) -> tuple[QueueSpec, ...]:
    """Return every queue the plugin declares, with its arguments: tiers first."""
    specs = [tier_spec(ttl, options) for ttl in tiers.ttls_ms]
    for route in routes:
        specs.extend(route_specs(route, options))
    return tuple(specs)


def tier_spec(ttl_ms: int, options: TopologyOptions) -> QueueSpec:
    """Return the tier queue with this TTL and its arguments."""
    base, safe_dl = _base_arguments(options)
    # One queue-wide TTL per tier queue: RabbitMQ expires messages only at the head of
    # a queue, so mixed per-message TTLs in one queue would hold a short wait behind a
    # long one. No routing-key override on the DLX: an expired message goes back by
    # its own key, `<queue>.retry`.
    return QueueSpec(
        tier_name(options.prefix, ttl_ms),
        {**base, "x-message-ttl": ttl_ms, "x-dead-letter-exchange": "", **safe_dl},
    )


def _base_arguments(options: TopologyOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the arguments of every queue, and the at-least-once dead-lettering ones."""
    base: dict[str, Any] = {"x-queue-type": options.queue_type}
    # Quorum queues dead-letter at most once by default: a message expiring out of a
    # tier while a node fails could vanish. At-least-once needs reject-publish
    # overflow (RabbitMQ >= 3.10).
    safe_dl: dict[str, Any] = (
        {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        if options.queue_type == "quorum"
        else {}
    )
    return base, safe_dl


def route_specs(route: Route, options: TopologyOptions) -> tuple[QueueSpec, ...]:
    """Return ``route``'s ``.retry`` and ``.dlq`` queues with their arguments."""
    base, safe_dl = _base_arguments(options)
    retry_args = dict(base)
    if options.queue_type == "quorum":
        # The re-check consumer acks and republishes, so only redeliveries (a crashed
        # consumer, a copy that could not be confirmed) count. At the limit the
        # message goes to the DLQ, never nowhere.
        retry_args |= {
            "x-delivery-limit": options.delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": route.dlq,
            **safe_dl,
        }
    return (QueueSpec(route.retry_queue, retry_args), QueueSpec(route.dlq, dict(base)))


@functools.cache
def _tier_names(prefix: str, ttls_ms: tuple[int, ...]) -> tuple[str, ...]:
    # Built once per plan, not per released message (each arrival is checked against them).
    return tuple(tier_name(prefix, ttl) for ttl in ttls_ms)
