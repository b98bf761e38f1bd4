"""Every FastStream internal the plugin touches, in one place, each one checked.

FastStream 0.7 has no public way to reach a subscriber's handler functions, the router
prefix of its queue or the producer TestRabbitBroker swaps in. The plugin reads them here
and nowhere else. ``check()`` exercises each one on a throwaway broker when a middleware
is installed and raises ``RetryConfigError`` naming the FastStream version and the
missing name: a rename upstream must stop the service at start, not make handler
policies fall back to the default or prefixed queues lose their retries in silence.

========================================================  ===================================
private name                                              what the plugin reads with it
========================================================  ===================================
``SubscriberUsecase._outer_config.prefix``                the router prefix of a queue's name
``SubscriberUsecase._outer_config.broker_middlewares``    the middlewares of a subscriber's routers
``SubscriberUsecase.calls``                               the handlers of a subscriber
``HandlerItem.filter``, ``HandlerItem.handler``           which handler a message is for; the
                                                          wrapper ``@retry_policy`` decorated
                                                          above ``@broker.publisher``
``HandlerCallWrapper._declared_call`` (0.7.6 on),         the function ``@retry_policy``
``HandlerCallWrapper._original_call`` (0.7.5)             decorated
``SubscriberUsecase.ack_policy``                          refusing ``AckPolicy.ACK_FIRST``
``SubscriberUsecase.running`` (``consume`` takes no       stopping the intake at once when
message while it is false; FastStream's stop sets it      the broker stops (``stop_intake``)
first, in a task of each subscriber's own)
``BrokerUsecase.config.logger`` (``LoggerState``:         the broker's logger, which the
``.log(...)``, ``.logger`` falsy until set up)            plugin's lines go through
                                                          (``reporting.log``)
``LoggerState.logger.logger`` (the ``logging.Logger``     its level, which the plugin's lines
in ``RealLoggerObject``)                                  follow (``--log-level DEBUG`` shows
                                                          the re-check hops); read if there:
                                                          without it, INFO and up (not checked
                                                          at start: only DEBUG lines depend on
                                                          it, and a unit test pins it)
``BrokerUsecase._connection_kwargs["url"]``               the broker's URL, which the
                                                          operator's commands use for an
                                                          app (not checked at start: a
                                                          unit test pins it)
``BrokerUsecase.config.producer``                         whether TestRabbitBroker (or
``faststream.rabbit.testing.FakeProducer``                TestNatsBroker: ``nats_subscribers``)
                                                          is active (test mode)
context key ``"handler_"``                                the subscriber a message came to
========================================================  ===================================

The context key cannot be seen without a message: a unit test pins it, and a failure
that arrives without it is logged once (``warn_no_subscriber``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from faststream.middlewares import AckPolicy

from faststream_retry.core.policy import get_handler_policy
from faststream_retry.core.topology import Handler, Route
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import nats_subscribers, redis_subscribers

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from faststream._internal.context import ContextRepo
    from faststream.rabbit import RabbitBroker

    from faststream_retry.core.policy import HandlerPolicy
    from faststream_retry.reporting.log import Outlet
    from faststream_retry.reporting.reporter import Reporter

__all__ = [
    "FASTSTREAM_VERSION",
    "SUBSCRIBER_KEY",
    "Sample",
    "acks_first",
    "broker_and_subscriber",
    "broker_level",
    "broker_outlet",
    "check",
    "current_broker",
    "current_subscriber",
    "declared_function",
    "drops_on_error",
    "handler_names",
    "handler_policy",
    "is_rabbit",
    "middlewares_of",
    "problems",
    "queue_of",
    "route_of",
    "routes_of",
    "select_policy",
    "server_named",
    "stop_intake",
    "under_test_broker",
    "warn_no_subscriber",
]

FASTSTREAM_VERSION = version("faststream")

SUBSCRIBER_KEY = "handler_"
"""The context key under which FastStream keeps the subscriber of the current message."""


def current_subscriber(context: ContextRepo) -> Any:  # noqa: ANN401 - a Rabbit subscriber
    """Return the subscriber the current message came to (``None`` for RPC replies)."""
    return context.get_local(SUBSCRIBER_KEY)


def warn_no_subscriber(reporter: Reporter) -> None:
    """Say once per middleware that a failure arrived without its subscriber in context."""
    reporter.warn_once(
        ("no subscriber",),
        "faststream-retry: a failed message reached the middleware without its subscriber "
        "in FastStream's context (key %r), so it is left to FastStream's ack policy. Unless "
        "it came from get_one() or an iterator, FastStream %s may have renamed that key",
        SUBSCRIBER_KEY,
        FASTSTREAM_VERSION,
    )


def broker_and_subscriber(context: ContextRepo) -> tuple[Any, Any]:
    """``current_broker`` and ``current_subscriber`` in one call (every message asks both)."""
    get_local = context.get_local
    return get_local("broker"), get_local(SUBSCRIBER_KEY)


def current_broker(context: ContextRepo) -> Any:  # noqa: ANN401 - a RabbitBroker
    """Return the broker of the current message (a documented context field)."""
    return context.get_local("broker")


def queue_of(sub: Any) -> str | None:  # noqa: ANN401 - any subscriber
    """Return the full name of the queue a Rabbit subscriber consumes, router prefix included.

    For a JetStream subscriber, its key (``nats.naming``: ``<stream>.<durable>``), which
    its route, events and dead letters name it by; ``None`` for a core-NATS one. For a
    Redis stream subscriber in a consumer group, its stream; ``None`` for any other
    Redis subscriber.
    """
    queue = getattr(sub, "queue", None)
    name = getattr(queue, "name", None)
    if not isinstance(name, str) or not name:
        return nats_subscribers.key_of(sub) or redis_subscribers.key_of(sub)
    outer = getattr(sub, "_outer_config", None)
    prefix = getattr(outer, "prefix", "") or ""
    return f"{prefix}{name}"


def declared_function(item: Any) -> object:  # noqa: ANN401 - a HandlerItem
    """Return the handler function as declared (where ``@retry_policy`` put its policy)."""
    handler = getattr(item, "handler", None)
    for attr in ("_declared_call", "_original_call"):
        function = getattr(handler, attr, None)
        if function is not None:
            return function
    return None


def handler_names(sub: Any) -> tuple[str, ...]:  # noqa: ANN401 - a Rabbit subscriber
    """Return the names of a subscriber's handlers, in the order of its ``route_of`` handlers."""
    names = []
    for item in getattr(sub, "calls", ()):
        function = declared_function(item)
        name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
        names.append(name if isinstance(name, str) else repr(function))
    return tuple(names)


def handler_policy(item: Any) -> HandlerPolicy | None:  # noqa: ANN401 - a HandlerItem
    """Return the policy of a subscriber's handler, wherever ``@retry_policy`` sat.

    On the wrapper FastStream made (``@retry_policy`` above ``@broker.publisher``, or
    above ``@broker.subscriber``), else on the declared function (directly under them).
    """
    return get_handler_policy(getattr(item, "handler", None)) or get_handler_policy(
        declared_function(item)
    )


def route_of(sub: Any) -> Route | None:  # noqa: ANN401 - a Rabbit subscriber
    """Return the route of one Rabbit subscriber: its queue and its handlers' policies."""
    queue = queue_of(sub)
    if queue is None:
        return None
    declared = getattr(sub, "queue", None)
    arguments = getattr(declared, "arguments", None)
    handlers = tuple(
        Handler(handler_policy(item), getattr(item, "filter", None))
        for item in getattr(sub, "calls", ())
    )
    return Route(
        queue,
        handlers,
        dict(arguments) if isinstance(arguments, dict) else {},
        # Only what FastStream declares itself; with declare=False it connects to a queue
        # whose flags it does not know.
        transient=getattr(declared, "declare", False) is True
        and getattr(declared, "durable", True) is False
        and getattr(declared, "exclusive", False) is False,
    )


def routes_of(broker: RabbitBroker) -> list[Route]:
    """Return a route per Rabbit subscriber of ``broker`` (one queue may have several)."""
    return [route for sub in broker.subscribers if (route := route_of(sub)) is not None]


def middlewares_of(sub: Any) -> list[Any]:  # noqa: ANN401 - any subscriber
    """Return every broker middleware a subscriber's messages pass: its routers' and the broker's.

    A router's ``middlewares=``, ``include_router(..., middlewares=)`` and the
    broker's all end up in the subscriber's outer configuration, outermost first.
    """
    outer = getattr(sub, "_outer_config", None)
    return list(getattr(outer, "broker_middlewares", ()))


async def select_policy(route: Route, msg: Any) -> HandlerPolicy | None:  # noqa: ANN401
    """Return the policy of the handler that took ``msg``: the filters run again, in order."""
    if len(route.handlers) == 1:
        return route.handlers[0].policy
    for handler in route.handlers:
        accepted = handler.selector(msg) if callable(handler.selector) else False
        if asyncio.iscoroutine(accepted):
            accepted = await accepted
        if accepted:
            return handler.policy
    return None


def acks_first(sub: Any) -> bool:  # noqa: ANN401 - any subscriber
    """Return whether ``sub`` acks a message before its handler runs (``AckPolicy.ACK_FIRST``)."""
    return getattr(sub, "ack_policy", None) is AckPolicy.ACK_FIRST


def drops_on_error(sub: Any) -> bool:  # noqa: ANN401 - any subscriber
    """Whether ``sub`` lets a failed message go for good (rejects it, or acks it anyway).

    ``REJECT_ON_ERROR`` (the default) rejects without requeue and ``ACK`` acks even on
    an error; ``NACK_ON_ERROR`` requeues and ``MANUAL`` leaves it to the handler.
    """
    return getattr(sub, "ack_policy", None) in {AckPolicy.REJECT_ON_ERROR, AckPolicy.ACK}


def stop_intake(broker: Any) -> None:  # noqa: ANN401 - a RabbitBroker
    """Have every subscriber of ``broker`` take no new message, now: what its stop does first.

    FastStream's ``broker.stop()`` stops each subscriber in a task of its own, so a
    message that arrives meanwhile, a requeued one coming straight back, still starts
    its handler. One that arrives from here on is left unacked; the broker takes it
    back when the channel closes.
    """
    for sub in broker.subscribers:
        sub.running = False


def server_named(sub: Any) -> bool:  # noqa: ANN401 - any subscriber
    """Whether ``sub`` consumes a queue the broker names (``RabbitQueue("")``)."""
    queue = getattr(sub, "queue", None)
    return queue is not None and getattr(queue, "name", None) == ""


def is_rabbit(broker: object) -> bool:
    """Return whether ``broker`` is FastStream's ``RabbitBroker`` (the only one covered)."""
    from faststream.rabbit import RabbitBroker  # noqa: PLC0415 - imported when a broker comes

    return isinstance(broker, RabbitBroker)


def under_test_broker(broker: Any) -> bool:  # noqa: ANN401 - a covered broker
    """Return whether ``TestRabbitBroker``, ``TestNatsBroker`` or ``TestRedisBroker`` is active.

    Each swaps the broker's producer for a fake one.
    """
    if nats_subscribers.is_nats(broker):  # before faststream.rabbit, which needs aio-pika
        return nats_subscribers.under_test_nats(broker)
    if redis_subscribers.is_redis(broker):
        return redis_subscribers.under_test_redis(broker)
    from faststream.rabbit.testing import FakeProducer  # noqa: PLC0415 - test-only module

    return isinstance(getattr(broker.config, "producer", None), FakeProducer)


def broker_url(broker: Any) -> str | None:  # noqa: ANN401 - a RabbitBroker
    """Return the URL ``broker`` connects to, as ``RabbitBroker(url, host=..., ...)`` built it.

    ``None`` when FastStream keeps it elsewhere: the operator's command then needs
    ``--url``.
    """
    kwargs = getattr(broker, "_connection_kwargs", None)
    url = kwargs.get("url") if isinstance(kwargs, dict) else None
    return str(url) if url else None


def broker_outlet(broker: Any) -> Outlet:  # noqa: ANN401 - a RabbitBroker
    """Return a writer of lines to ``broker``'s own logger (FastStream's ``LoggerState``).

    It writes nothing and returns ``False`` until the broker has set its logger up
    (on connect) and once the broker is gone; ``RabbitBroker(logger=None)`` makes it
    write nothing and return ``True`` (silenced, as FastStream's own lines are).
    """
    ref = weakref.ref(broker)

    def write(
        level: int, message: str, exc_info: BaseException | None, extra: Mapping[str, Any]
    ) -> bool:
        state = getattr(getattr(ref(), "config", None), "logger", None)
        if state is None or not getattr(state, "logger", None):
            return False
        state.log(message, log_level=level, extra=dict(extra), exc_info=exc_info)
        return True

    return write


SILENCED = logging.CRITICAL + 1
"""The level of a silenced broker's logger: nothing is written."""


def broker_level(broker: Any) -> Callable[[], int | None]:  # noqa: ANN401 - a RabbitBroker
    """Return a reader of the level of ``broker``'s own logger.

    That is FastStream's default logger or the ``logging.Logger`` passed as ``logger=``,
    whose level ``faststream run --log-level`` and ``RabbitBroker(log_level=...)`` set.
    ``None`` until the broker has set its logger up, once the broker is gone, and for
    a logger that is not a ``logging.Logger``. A silenced broker (``logger=None``: its
    proxy is set up and holds no logger) writes nothing at any level: above
    ``CRITICAL``, so that no line is formatted (a traceback each failure) only for the
    outlet to drop it.
    """
    ref = weakref.ref(broker)

    def level() -> int | None:
        state = getattr(getattr(ref(), "config", None), "logger", None)
        proxy = getattr(state, "logger", None)
        logger = getattr(proxy, "logger", None)
        if isinstance(logger, logging.Logger):
            return logger.getEffectiveLevel()
        if logger is None and type(proxy).__name__ == "EmptyLoggerObject":
            return SILENCED
        return None

    return level


@dataclass(frozen=True, slots=True)
class Sample:
    """A broker with one router-prefixed subscriber of a known function, to probe."""

    broker: Any
    subscriber: Any
    function: object
    queue: str
    handler: object
    """What the subscriber decorator returned (FastStream's wrapper of ``function``)."""


def sample() -> Sample:
    """Build a throwaway broker (no connection) with a subscriber on a prefixed router."""
    from faststream.rabbit import RabbitBroker, RabbitRouter  # noqa: PLC0415 - at install

    broker = RabbitBroker()
    router = RabbitRouter(prefix="probe.", middlewares=[_probe_middleware])

    async def function(body: str) -> None: ...

    handler = router.subscriber("queue")(function)
    broker.include_router(router)
    return Sample(broker, next(iter(broker.subscribers)), function, "probe.queue", handler)


def _probe_middleware(msg: Any, /, *, context: Any) -> Any:  # noqa: ANN401 - never called
    """A router middleware for ``sample``: found by ``middlewares_of`` or reported missing."""
    raise NotImplementedError


def problems(probe: Sample) -> list[str]:
    """Return the private names that do not behave as the plugin expects on ``probe``."""
    found = []
    if queue_of(probe.subscriber) != probe.queue:
        found.append("SubscriberUsecase._outer_config.prefix")
    calls = getattr(probe.subscriber, "calls", None)
    items = list(calls) if calls is not None else []
    if not items:
        found.append("SubscriberUsecase.calls")
    for item in items[:1]:
        if not callable(getattr(item, "filter", None)):
            found.append("HandlerItem.filter")
        if getattr(item, "handler", None) is not probe.handler:
            found.append("HandlerItem.handler")
        elif declared_function(item) is not probe.function:
            found.append("HandlerItem.handler._declared_call / _original_call")
    if _probe_middleware not in middlewares_of(probe.subscriber):
        found.append("SubscriberUsecase._outer_config.broker_middlewares")
    if not isinstance(getattr(probe.subscriber, "ack_policy", None), AckPolicy):
        found.append("SubscriberUsecase.ack_policy")
    if not isinstance(getattr(probe.subscriber, "running", None), bool):
        found.append("SubscriberUsecase.running")
    return found + _broker_problems(probe.broker)


def _broker_problems(broker: Any) -> list[str]:  # noqa: ANN401 - a RabbitBroker
    found = []
    config = getattr(broker, "config", None)
    if not hasattr(config, "producer"):
        found.append("BrokerUsecase.config.producer")
    logger_state = getattr(config, "logger", None)
    if not callable(getattr(logger_state, "log", None)) or not hasattr(logger_state, "logger"):
        found.append("BrokerUsecase.config.logger")
    try:
        from faststream.rabbit.testing import FakeProducer  # noqa: F401, PLC0415
    except ImportError:
        found.append("faststream.rabbit.testing.FakeProducer")
    return found


@functools.cache
def _checked() -> tuple[str, ...]:
    try:
        return tuple(problems(sample()))
    except Exception as exc:  # reported as what could not be probed
        return (f"a RabbitBroker with a prefixed RabbitRouter ({exc!r})",)


def check() -> None:
    """Raise ``RetryConfigError`` if a FastStream internal the plugin needs has changed."""
    missing = _checked()
    if missing:
        raise RetryConfigError(
            f"faststream-retry cannot work with FastStream {FASTSTREAM_VERSION}: "
            f"{', '.join(missing)} changed or is gone. Install a FastStream version "
            "this faststream-retry supports (see its pyproject.toml), or a newer "
            "faststream-retry"
        )
