"""Find an application's broker, its ``RetryMiddleware`` and the topology it plans.

``module:attribute`` names the object as ``faststream run`` takes it: a ``FastStream``
app (or an ASGI one), a ``RabbitBroker``, or anything with a ``broker`` attribute (a
FastAPI ``RabbitRouter``). Importing the module runs its top level, nothing more: no
connection is made, so this works without a broker.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faststream_retry.ops.common import OperationError, not_on_nats

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp

__all__ = ["load_app"]


def load_app(
    spec: str, *, cwd: Path | None = None, factory: bool = False, nats: bool = False
) -> LoadedApp:
    """Import ``spec`` (``module:attribute``) and return what the plugin plans for it.

    ``factory``: the attribute is a function that builds the app (``faststream run
    --factory``); it is called with no arguments. ``nats``: the caller works on an app
    whose broker is a ``NatsBroker`` too (``doctor`` does; the other operations do not
    yet).

    Raises:
        OperationError: ``spec`` is malformed, cannot be imported, names no Rabbit
            broker (nor a NATS one, with ``nats``), or the broker has no
            ``RetryMiddleware`` (each says which).
    """
    # FastStream is imported when an app is loaded, not with the operator API: the
    # standalone worker's command runs without it.
    from faststream_retry.middleware.app import broker_of  # noqa: PLC0415

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
    if factory:
        found = _build(spec, found)
    broker = broker_of(found)
    if broker is None:
        hint = (
            ": a FastAPI app does not hold its broker; give its RabbitRouter (module:router)"
            if type(found).__name__ == "FastAPI"
            else ""
        )
        raise OperationError(
            f"{spec} is a {type(found).__name__}, not a FastStream app, a RabbitBroker or "
            f"anything with a RabbitBroker in its `broker` attribute{hint}"
        )
    return _planned(spec, broker, nats=nats)


def _planned(spec: str, broker: Any, *, nats: bool) -> LoadedApp:  # noqa: ANN401 - a broker
    """What the plugin plans for ``broker``; a NATS one only if the caller works on NATS."""
    from faststream_retry.middleware.app import planned  # noqa: PLC0415 - FastStream's

    loaded = planned(spec, broker)
    if loaded is None:
        raise OperationError(
            f"{spec}: the broker has no RetryMiddleware (pass it in middlewares= or call "
            "retry.install(broker))"
        )
    if loaded.nats and not nats:
        raise OperationError(not_on_nats(f"{spec}'s broker is a NatsBroker, and this command"))
    return loaded


def _build(spec: str, factory: Any) -> Any:  # noqa: ANN401 - the app's factory and its app
    """Call the app's factory (``faststream run --factory``)."""
    if not callable(factory):
        raise OperationError(f"{spec} is not a factory: --factory needs a function")
    try:
        return factory()
    except Exception as exc:  # the app's own factory failed: say so, not a traceback
        raise OperationError(f"{spec}() raised {type(exc).__name__}: {exc}") from exc
