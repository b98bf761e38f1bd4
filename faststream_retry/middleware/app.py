"""What the plugin plans for a FastStream app: its broker, ``RetryMiddleware`` and routes.

The FastStream half of ``ops.load_app``: given the object ``module:attribute`` names,
find the broker (a ``RabbitBroker``, or a ``NatsBroker``) and its middleware and plan the
topology, without connecting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from faststream.rabbit import RabbitBroker

from faststream_retry.middleware import _internals, nats_subscribers
from faststream_retry.middleware.middleware import RetryMiddleware

if TYPE_CHECKING:
    from faststream.nats import NatsBroker

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan, Route

__all__ = ["LoadedApp", "broker_of", "planned"]


@dataclass(frozen=True, slots=True)
class LoadedApp:
    """An application as the plugin sees it: what it would declare and for which queues."""

    spec: str
    broker: RabbitBroker | NatsBroker
    middleware: RetryMiddleware
    config: RetryConfig
    plan: Plan
    """What the plugin would declare at start, from the subscribers the app has now."""
    routes: tuple[Route, ...]
    """Every Rabbit subscriber's route, covered by the plan or not (retries off)."""
    handler_names: tuple[tuple[str, ...], ...] = ()
    """The names of each route's handlers: ``handler_names[i]`` are ``routes[i]``'s."""
    url: str | None = None
    """The URL the app's broker connects to (``None``: not known); a ``NatsBroker``'s
    servers, comma-separated."""

    @property
    def nats(self) -> bool:
        """Whether the app's broker is a ``NatsBroker``."""
        return nats_subscribers.is_nats(self.broker)


def planned(spec: str, broker: RabbitBroker | NatsBroker) -> LoadedApp | None:
    """Return what the plugin plans for ``broker`` (``spec`` names it); ``None``: no middleware."""
    middleware = _middleware_of(broker)
    if middleware is None:
        return None
    runtime = middleware.runtime(broker)
    subscribers = [
        (route, _internals.handler_names(sub))
        for sub in broker.subscribers
        if (route := _internals.route_of(sub)) is not None
    ]
    return LoadedApp(
        spec=spec,
        broker=broker,
        middleware=middleware,
        config=runtime.config,
        plan=runtime.replan(),
        routes=tuple(route for route, _ in subscribers),
        handler_names=tuple(names for _, names in subscribers),
        url=(
            nats_subscribers.broker_url(broker)
            if nats_subscribers.is_nats(broker)
            else _internals.broker_url(broker)
        ),
    )


def broker_of(found: object) -> RabbitBroker | NatsBroker | None:
    """Return the broker of an app: its ``broker``, or the first of its brokers.

    A ``FastStream`` app has ``broker``; faststream-fastapi's ``FastStreamAPI`` keeps
    its brokers in ``_brokers`` only.
    """
    if _covered(found):
        return found
    broker = getattr(found, "broker", None)
    if _covered(broker):
        return broker
    for attribute in ("brokers", "_brokers"):
        brokers = getattr(found, attribute, None)
        if isinstance(brokers, (list, tuple)):
            return next((b for b in brokers if _covered(b)), None)
    return None


def _covered(broker: object) -> TypeGuard[RabbitBroker | NatsBroker]:
    """Whether ``broker`` is one the plugin covers: a ``RabbitBroker`` or a ``NatsBroker``."""
    return isinstance(broker, RabbitBroker) or nats_subscribers.is_nats(broker)


def _middleware_of(broker: RabbitBroker | NatsBroker) -> RetryMiddleware | None:
    """Return the broker's ``RetryMiddleware``: installed, passed in, or on a router."""
    candidates = [*broker.middlewares]
    for sub in broker.subscribers:
        candidates.extend(_internals.middlewares_of(sub))
    return next((m for m in candidates if isinstance(m, RetryMiddleware)), None)
