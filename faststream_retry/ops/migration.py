"""What ``migrate`` may move and how (pure: no broker imports).

Which names the plugin owns and in which role (told by ``topology``'s readings of a
name), the arguments a queue gets in its new type (exactly what ``topology`` plans),
and the steps left to do given what exists: a migration killed at any point is
finished by running it again, because every state it passes through is told apart by what exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from faststream_retry.core import headers as h
from faststream_retry.core.topology import (
    QueueSpec,
    Route,
    TopologyOptions,
    is_retry_queue,
    migrating_of,
    registry_name,
    route_specs,
    tier_spec,
    tier_ttl,
    work_queue_of,
)

if TYPE_CHECKING:
    from faststream_retry.core.defaults import QueueType

__all__ = [
    "ROUTING_KEY_HEADER",
    "Look",
    "Owned",
    "Step",
    "copy_headers",
    "owned",
    "restored_headers",
    "steps",
    "target_spec",
    "temp_arguments",
]

Role = Literal["tier", "retry", "dlq"]
Look = Literal["missing", "target", "other"]
"""A queue as a look at the broker found it: absent, with the target arguments, or not."""
Step = Literal["drain", "replace", "back", "cleanup"]
"""``drain``: move every message into the temporary queue; ``replace``: delete the queue
and declare it with the target arguments (a tier bound to its exchange again);
``back``: move every message back; ``cleanup``: delete the empty temporary queue."""

ROUTING_KEY_HEADER = "retry-migrate-routing-key"
"""Where a message's routing key waits in the temporary queue.

A tier dead-letters an expired message by the routing key it was published with
(``<queue>.retry`` or ``<queue>``); the move to the temporary queue changes it, so it
is kept here and restored on the way back.
"""


@dataclass(frozen=True, slots=True)
class Owned:
    """A queue the plugin owns, and its role."""

    name: str
    role: Role
    ttl_ms: int | None = None
    """A tier's TTL."""
    queue: str | None = None
    """The work queue of a ``.retry`` or ``.dlq``."""


def owned(name: str, prefix: str) -> Owned | str:
    """Return ``name``'s role, or why ``migrate`` refuses it.

    The plugin owns its tiers (``<prefix>.delay.<ms>``) and each work queue's ``.retry``
    and ``.dlq``. Not the work queues (their applications declare them), not its
    registry (always classic), and not a temporary queue of a migration.
    """
    ttl = tier_ttl(name, prefix)
    if ttl is not None:
        return Owned(name, "tier", ttl_ms=ttl)
    hint = (
        f"migrate moves the queues the plugin declares: <queue>.retry, <queue>.dlq and the "
        f"tiers {prefix}.delay.<ms> (pass --prefix if the app's prefix is not {prefix!r})"
    )
    migrated = migrating_of(name)
    if migrated is not None:
        return (
            f"{name!r} is a migration's temporary queue: run migrate on "
            f"{migrated!r} to finish that migration"
        )
    if name == registry_name(prefix):
        return f"{name!r} is the plugin's registry, a classic queue whatever queue_type says"
    queue = work_queue_of(name)
    if queue != name:
        return Owned(name, "retry" if is_retry_queue(name) else "dlq", queue=queue)
    return (
        f"{name!r} is not a queue the plugin owns: {hint}. A work queue is its "
        "application's own: change its arguments where the subscriber declares it"
    )


def target_spec(queue: Owned, queue_type: QueueType, prefix: str, delivery_limit: int) -> QueueSpec:
    """Return the queue with exactly the arguments ``topology`` plans for its role and type."""
    options = TopologyOptions(
        prefix=prefix, max_delay_ms=0, queue_type=queue_type, delivery_limit=delivery_limit
    )
    if queue.role == "tier":
        assert queue.ttl_ms is not None  # noqa: S101 - owned() sets it for a tier
        return tier_spec(queue.ttl_ms, options)
    assert queue.queue is not None  # noqa: S101 - owned() sets it for .retry and .dlq
    retry, dlq = route_specs(Route(queue.queue, ()), options)
    return retry if queue.role == "retry" else dlq


def temp_arguments(quorum: bool) -> dict[str, Any]:
    """Return the temporary queue's arguments: quorum where the broker has it.

    Replicated and durable, so a broker restart or a node lost mid-way loses nothing.
    No delivery limit is set; RabbitMQ 3.x sets none either.
    """
    return {"x-queue-type": "quorum" if quorum else "classic"}


def steps(source: Look, temp_exists: bool) -> tuple[Step, ...]:
    """Return what is left to do, from what exists now.

    The queue has other arguments: move it all out (a temporary queue that exists
    already holds what a killed run moved), replace it, move it all back. It is gone
    and the temporary queue exists: the kill came between the delete and the declare.
    It has the target arguments and the temporary queue exists: the kill came while
    moving back. Neither exists: there is nothing to migrate (``ValueError``).
    """
    if source == "other":
        return ("drain", "replace", "back", "cleanup")
    if source == "missing":
        if not temp_exists:
            raise ValueError("neither the queue nor its temporary queue exists")
        return ("replace", "back", "cleanup")
    return ("back", "cleanup") if temp_exists else ()


def copy_headers(headers: dict[str, Any] | None, routing_key: str) -> dict[str, Any]:
    """Return the headers of a message's copy in the temporary queue."""
    kept = h.without_broker_counts(headers)
    kept[ROUTING_KEY_HEADER] = routing_key
    return kept


def restored_headers(headers: dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """Return the headers of a message moved back, and the routing key it had."""
    kept = h.without_broker_counts(headers)
    routing_key = kept.pop(ROUTING_KEY_HEADER, None)
    if isinstance(routing_key, bytes):
        routing_key = routing_key.decode("utf-8", "replace")
    return kept, routing_key if isinstance(routing_key, str) else None
