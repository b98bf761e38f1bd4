"""Find an application's broker, its ``RetryMiddleware`` and the topology it plans.

``module:attribute`` names the object as ``faststream run`` takes it: a ``FastStream``
app (or an ASGI one), a ``RabbitBroker``, or anything with a ``broker`` attribute (a
FastAPI ``RabbitRouter``). Importing the module runs its top level, nothing more: no
connection is made, so this works without a broker.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faststream.rabbit import RabbitBroker

from faststream_retry import _faststream
from faststream_retry.middleware import RetryMiddleware
from faststream_retry.ops.common import OperationError

if TYPE_CHECKING:
    from faststream_retry.config import RetryConfig
    from faststream_retry.topology import Plan, Route

__all__ = ["LoadedApp", "load_app"]


@dataclass(frozen=True, slots=True)
class LoadedApp:
    """An application as the plugin sees it: what it would declare and for which queues."""

    spec: str
    broker: RabbitBroker
    middleware: RetryMiddleware
    config: RetryConfig
    plan: Plan
    """What the plugin would declare at start, from the subscribers the app has now."""
    routes: tuple[Route, ...]
    """Every Rabbit subscriber's route, covered by the plan or not (retries off)."""
    handler_names: tuple[tuple[str, ...], ...] = ()
    """The names of each route's handlers: ``handler_names[i]`` are ``routes[i]``'s."""


def load_app(spec: str, *, cwd: Path | None = None) -> LoadedApp:
    """Import ``spec`` (``module:attribute``) and return what the plugin plans for it.

    Raises:
        OperationError: ``spec`` is malformed, cannot be imported, names no Rabbit
            broker, or the broker has no ``RetryMiddleware`` (each says which).
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        hint = (
            " (the retry worker has no app: it runs from its --config)"
            if spec.endswith(".toml")
            else ""
        )
        raise OperationError(
            f"the app is given as module:attribute (like faststream run), got {spec!r}{hint}"
        )
    folder = str((cwd or Path.cwd()).resolve())
    if folder not in sys.path:
        # As `faststream run` does: the app's module is found from where the command runs.
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OperationError(f"cannot import {module_name!r} from {folder}: {exc}") from exc
    except Exception as exc:  # the app's own top level failed: say so, not a traceback
        raise OperationError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    missing = object()
    for part in attribute.split("."):
        found = getattr(found, part, missing)
        if found is missing:
            raise OperationError(f"{module_name!r} has no attribute {attribute!r}")
    broker = _broker_of(found)
    if broker is None:
        raise OperationError(
            f"{spec} is a {type(found).__name__}, not a FastStream app, a RabbitBroker or "
            "anything with a RabbitBroker in its `broker` attribute"
        )
    middleware = _middleware_of(broker)
    if middleware is None:
        raise OperationError(
            f"{spec}: the broker has no RetryMiddleware (pass it in middlewares= or call "
            "retry.install(broker))"
        )
    runtime = middleware.runtime(broker)
    subscribers = [
        (route, _faststream.handler_names(sub))
        for sub in broker.subscribers
        if (route := _faststream.route_of(sub)) is not None
    ]
    return LoadedApp(
        spec=spec,
        broker=broker,
        middleware=middleware,
        config=runtime.config,
        plan=runtime.replan(),
        routes=tuple(route for route, _ in subscribers),
        handler_names=tuple(names for _, names in subscribers),
    )


def _broker_of(found: object) -> RabbitBroker | None:
    """Return the Rabbit broker of an app: its ``broker``, or the first of its brokers.

    A ``FastStream`` app has ``broker``; faststream-fastapi's ``FastStreamAPI`` keeps
    its brokers in ``_brokers`` only.
    """
    if isinstance(found, RabbitBroker):
        return found
    broker = getattr(found, "broker", None)
    if isinstance(broker, RabbitBroker):
        return broker
    for attribute in ("brokers", "_brokers"):
        brokers = getattr(found, attribute, None)
        if isinstance(brokers, (list, tuple)):
            return next((b for b in brokers if isinstance(b, RabbitBroker)), None)
    return None


def _middleware_of(broker: RabbitBroker) -> RetryMiddleware | None:
    """Return the broker's ``RetryMiddleware``: installed, passed in, or on a router."""
    candidates = [*broker.middlewares]
    for sub in broker.subscribers:
        candidates.extend(_faststream.middlewares_of(sub))
    return next((m for m in candidates if isinstance(m, RetryMiddleware)), None)
