"""The wiring checks: what the plugin refuses, or warns of, in how an app is wired.

Run at start over the broker's subscribers, and again for a subscriber that joins a
running broker (``runtime``). Each refusal raises with the fix in its text. ``Middleware``
is what the wiring reads of a ``RetryMiddleware``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core.topology import registry_name
from faststream_retry.errors import RetryConfigError, RetryTopologyError
from faststream_retry.middleware import _internals, nats_subscribers, redis_subscribers
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Iterable

    from faststream import BaseMiddleware
    from faststream._internal.context import ContextRepo
    from faststream.rabbit import RabbitBroker

    from faststream_retry.core.topology import Plan, Route

__all__ = [
    "Middleware",
    "refuse_ack_first",
    "refuse_ack_first_of",
    "refuse_on_plugin_queues",
    "refuse_other_broker",
    "refuse_other_instances",
    "refuse_other_queue_type",
    "refuse_plugin_queues",
    "unsupported",
    "warn_uncovered",
]


class Middleware(Protocol):
    """A ``RetryMiddleware`` as the wiring sees it: FastStream calls it; it has a prefix.

    The wiring cannot name the class: ``middleware.py`` defines it and imports the wiring.
    """

    @property
    def prefix(self) -> str:
        """Return the prefix of the delay tiers."""
        ...

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> BaseMiddleware:  # noqa: ANN401 - FastStream's signature
        """Build the per-message scope."""
        ...


def unsupported(broker: object) -> str | None:
    """Say why the plugin cannot run on ``broker``; ``None``: it can.

    It runs on a ``RabbitBroker``, a ``NatsBroker`` (JetStream subscribers) and a
    ``RedisBroker`` (stream subscribers in a consumer group), and in test mode under
    ``TestRabbitBroker`` and ``TestNatsBroker``, not yet under ``TestRedisBroker``.
    """
    if nats_subscribers.is_nats(broker) or _internals.is_rabbit(broker):
        return None
    kind = type(broker)
    if redis_subscribers.is_redis(broker):
        if not redis_subscribers.under_test_redis(broker):
            return None
        return (
            "test mode under TestRedisBroker is not built yet: RetryMiddleware leaves this "
            f"{kind.__qualname__}'s messages to FastStream, untouched (retry.testing() "
            "records nothing). Test the retries against a real Redis server"
        )
    return (
        f"RetryMiddleware works with FastStream's RabbitBroker (faststream.rabbit), "
        f"NatsBroker (faststream.nats, JetStream subscribers) and RedisBroker "
        f"(faststream.redis, stream subscribers in a consumer group) only, and this broker is a "
        f"{kind.__module__}.{kind.__qualname__}: it leaves this broker's messages to "
        "FastStream, untouched. Take RetryMiddleware out of its middlewares= (and its "
        "routers'). Consumers of RabbitMQ in other languages: the retry worker "
        "(faststream-retry worker)"
    )


def refuse_other_broker(broker: object) -> None:
    """Refuse a broker the plugin does not cover (``install()``)."""
    text = unsupported(broker)
    if text is not None:
        raise RetryConfigError(text)


def refuse_ack_first(broker: RabbitBroker, topology: Plan) -> None:
    """Refuse a covered subscriber that acks before its handler runs."""
    for sub in broker.subscribers:
        route = topology.route(_internals.queue_of(sub) or "")
        if route is not None:
            refuse_ack_first_of(sub, route)


def refuse_ack_first_of(sub: Any, route: Route) -> None:  # noqa: ANN401 - a subscriber
    """Refuse ``sub`` if it acks before its handler runs (nothing left to retry)."""
    if _internals.acks_first(sub):
        raise RetryConfigError(
            f"subscriber of {route.queue!r} uses AckPolicy.ACK_FIRST: the message is "
            "acked before the handler runs, so a failure cannot be retried safely. "
            "Use the default ack policy, or switch retries off for it with "
            "@retry_policy(enabled=False)"
        )


def refuse_other_instances(broker: RabbitBroker, middleware: Middleware) -> None:
    """Refuse a second ``RetryMiddleware`` in any subscriber's stack: both would decide."""
    cls = type(middleware)
    covers: dict[int, tuple[Middleware, list[str]]] = {}
    for sub in broker.subscribers:
        for found in _internals.middlewares_of(sub):
            if isinstance(found, cls):
                _, queues = covers.setdefault(id(found), (found, []))
                queue = _internals.queue_of(sub) or "?"
                if queue not in queues:
                    queues.append(queue)
    if len(covers) < 2:  # one instance, or none yet
        return
    places = "; ".join(
        f"RetryMiddleware(prefix {found.prefix!r}){' (installed)' if found is middleware else ''}"
        f" on {', '.join(sorted(queues))}"
        for found, queues in covers.values()
    )
    raise RetryConfigError(
        f"two RetryMiddleware instances sit on this broker's subscribers: {places}. Each "
        "would decide every failure of the queues it covers, and both would copy it. Use "
        "one instance: pass the same RetryMiddleware to the broker and to the routers "
        "(or to the broker only) and call install() once"
    )


def refuse_other_queue_type(broker: RabbitBroker, topology: Plan) -> None:
    """A subscriber of one of the plugin's own queues (a ``.dlq`` consumer) declared otherwise.

    FastStream declares a subscriber's queue after the plugin declared its own, and
    RabbitMQ refuses the second declaration (406) when type or durability differ:
    named here, with the fix, before anything connects.
    """
    problems = []
    for sub in broker.subscribers:
        name = _internals.queue_of(sub)
        queue = getattr(sub, "queue", None)
        if name is None or queue is None or getattr(queue, "declare", True) is False:
            continue
        try:
            spec = topology.spec(name)
        except KeyError:
            continue
        ours = spec.arguments.get("x-queue-type", "classic")
        theirs = (getattr(queue, "arguments", None) or {}).get("x-queue-type", "classic")
        durable = getattr(queue, "durable", False) is True
        if theirs == ours and durable:
            continue
        fixes = [
            f"declare it RabbitQueue({name!r}, durable=True, queue_type=QueueType.{ours.upper()})",
            f"or RabbitQueue({name!r}, declare=False) to consume it as the plugin declares it",
        ]
        if theirs != ours and theirs in {"classic", "quorum"} and durable:
            fixes.append(f'or pass RetryMiddleware(queue_type="{theirs}")')
        problems.append(
            f"- the subscriber of {name!r} declares it as a {'' if durable else 'non-'}durable "
            f"{theirs} queue; the plugin declares it as a durable {ours} queue: " + ", ".join(fixes)
        )
    if problems:
        raise RetryTopologyError(
            "RabbitMQ would refuse FastStream's declaration of these queues "
            "(406 PRECONDITION_FAILED):\n" + "\n".join(problems)
        )


def refuse_plugin_queues(broker: RabbitBroker, topology: Plan) -> None:
    """Refuse a subscriber of a ``.retry``, a tier or the registry: they are the plugin's.

    A second consumer on ``<queue>.retry`` would take retry copies that then never go
    home, and the plugin would release that consumer's own messages into ``<queue>``.
    (``<queue>.dlq`` is yours to consume.)
    """
    refuse_on_plugin_queues(broker.subscribers, topology)


def refuse_on_plugin_queues(subs: Iterable[Any], topology: Plan) -> None:
    """Refuse those of ``subs`` that consume a queue the plugin consumes itself."""
    ours = {r.retry_queue for r in topology.routes.values()}
    ours |= {topology.tier(ttl) for ttl in topology.tiers.ttls_ms}
    ours.add(registry_name(topology.options.prefix))
    taken = sorted({q for sub in subs if (q := _internals.queue_of(sub)) in ours})
    if taken:
        raise RetryConfigError(
            f"{', '.join(map(repr, taken))}: the plugin consumes "
            f"{'these queues' if len(taken) > 1 else 'this queue'} itself (re-check queues, "
            "delay tiers, the registry); a subscriber of its own would take retry copies "
            "that then never come back. Consume the work queue, or its .dlq, instead"
        )


def warn_uncovered(broker: RabbitBroker, topology: Plan) -> None:
    """Say which subscribers can still lose a failed message, and how to fix each."""
    dlqs = {r.dlq for r in topology.routes.values()}
    for sub in broker.subscribers:
        queue = _internals.queue_of(sub)
        if _internals.server_named(sub):
            log.warning(
                "faststream-retry: a subscriber of a server-named queue (RabbitQueue('')) is "
                "not covered: the broker names the queue only when it is declared. Its "
                "failures are FastStream's (rejected). Give the queue a name to retry them"
            )
        elif queue in dlqs and queue not in topology.routes and _internals.drops_on_error(sub):
            log.warning(
                "faststream-retry: the subscriber of %r rejects a dead letter its handler fails "
                "on (ack policy %s), and a .dlq has no dead-letter exchange: that dead letter "
                "would be gone. Use ack_policy=AckPolicy.MANUAL and ack when done (a failure "
                "then leaves it in the queue), or NACK_ON_ERROR",
                queue,
                getattr(getattr(sub, "ack_policy", None), "name", "?"),
            )
