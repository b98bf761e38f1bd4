"""Installing the plugin on a broker: one runtime per broker, picked by the broker's kind.

A ``RabbitBroker`` gets ``rabbit.runtime.Runtime``, a ``NatsBroker`` a
``nats.runtime.NatsRuntime`` and a ``RedisBroker`` a ``redis.runtime.RedisRuntime``;
the rest of the plugin reads any of them through the same members. Installing puts the
middleware outermost on the broker and wraps its start and stop: RabbitMQ's wrapping
follows subscribers that join late (``rabbit.runtime.install``), NATS's and Redis's is
``_install_own``. A broker that consumes without ``install()`` starts the plugin at its
first message (``Plugin.start_late``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from faststream_retry.errors import RetryConfigError, RetryTopologyError
from faststream_retry.middleware import (
    _internals,
    checks,
    late,
    nats_subscribers,
    redis_subscribers,
    settled,
)
from faststream_retry.middleware.nats.runtime import NatsRuntime
from faststream_retry.middleware.rabbit import runtime as rabbit_runtime
from faststream_retry.middleware.rabbit.runtime import Runtime
from faststream_retry.middleware.redis.runtime import RedisRuntime
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from types import TracebackType

    from faststream.nats import NatsBroker
    from faststream.rabbit import RabbitBroker
    from faststream.redis import RedisBroker

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Covered", "Plugin"]

Covered = TypeVar("Covered", "RabbitBroker", "NatsBroker", "RedisBroker")
"""A broker the plugin runs on."""

_INSTALLED_ATTR = "__faststream_retry_installed__"


class Plugin:
    """A middleware's configuration, its reporter and its runtime per broker."""

    def __init__(self, config: RetryConfig, reporter: Reporter, testing: Testing) -> None:
        """Keep the configuration; runtimes are made per broker as they are needed.

        ``testing``: the middleware's open ``testing()`` blocks, which test mode obeys.
        """
        self.config = config
        self.reporter = reporter
        self.testing = testing
        """The middleware's open ``testing()`` blocks: test mode runs while one is open."""
        self._runtimes: weakref.WeakKeyDictionary[Any, Runtime | NatsRuntime | RedisRuntime] = (
            weakref.WeakKeyDictionary()
        )
        self._last: tuple[Any, Runtime | NatsRuntime | RedisRuntime] | None = None
        """The broker asked for last and its runtime: nearly every call asks for the same.

        Never stale: a broker's runtime is made once and kept for the broker's life (its
        stop and a restart keep it). Holding the broker here keeps it no longer than
        ``_runtimes`` already does: its runtime, held there, holds the broker.
        """
        self.middleware: Middleware | None = None
        """The ``RetryMiddleware`` this is the plugin of (set by it): a late start installs it."""

    def runtime(self, broker: Any) -> Runtime | NatsRuntime | RedisRuntime:  # noqa: ANN401 - a broker
        """Return the runtime of ``broker``: a ``NatsRuntime`` for a ``NatsBroker``, and so on."""
        last = self._last
        if last is not None and last[0] is broker:
            return last[1]
        runtime = self._runtimes.get(broker)
        if runtime is None:
            kind: type[Runtime | NatsRuntime | RedisRuntime] = Runtime
            if nats_subscribers.is_nats(broker):
                kind = NatsRuntime
            elif redis_subscribers.is_redis(broker):
                kind = RedisRuntime
            runtime = self._runtimes[broker] = kind(
                self.config, self.reporter, broker, self.testing
            )
        self._last = (broker, runtime)
        return runtime

    def start_test(self, broker: Any) -> None:  # noqa: ANN401 - a broker under a test broker
        """Test mode's start, at each message in a ``testing()`` block.

        Nothing is started. A ``NatsBroker``'s and a ``RedisBroker``'s subscribers are
        checked as at a real start (``Planned.check_in_test``); ``TestRabbitBroker``'s test
        mode checks nothing.

        Raises:
            RetryConfigError: the app is wired so that the plugin would refuse to start.
        """
        runtime = self.runtime(broker)
        if isinstance(runtime, (NatsRuntime, RedisRuntime)) and self.middleware is not None:
            runtime.check_in_test(self.middleware)

    def install(self, broker: Any, middleware: Middleware) -> None:  # noqa: ANN401 - a broker
        """Add ``middleware`` to ``broker`` if needed and wrap its start and stop."""
        checks.refuse_other_broker(broker)
        if not _attach(broker, middleware):
            return
        runtime = self.runtime(broker)
        if isinstance(runtime, (NatsRuntime, RedisRuntime)):
            _install_own(broker, runtime, middleware)
            setattr(broker, _INSTALLED_ATTR, middleware)
            return
        rabbit_runtime.install(broker, runtime, middleware)
        setattr(broker, _INSTALLED_ATTR, middleware)

    async def start_late(self, broker: Any) -> None:  # noqa: ANN401 - a broker
        """Start on a broker that is consuming without ``install()``: at its first message.

        What ``install()`` does at the broker's start, done now: plan from the
        subscribers the broker has, check them, declare the topology, start the
        re-check consumers, and wrap the broker's stop (and a later start). Once.

        Raises:
            RetryConfigError, RetryTopologyError: the app or the broker is wired so
                that the plugin must not run (as at an installed start); every later
                call raises it again.
            Exception: the broker could not be reached; the next message tries again.
        """
        runtime = self.runtime(broker)
        async with runtime.starting:
            if runtime.refused is not None:
                raise runtime.refused
            if runtime.started:
                return
            middleware = self.middleware
            if middleware is None:  # pragma: no cover - RetryMiddleware sets it
                raise RetryConfigError("this plugin belongs to no RetryMiddleware")
            try:
                self.install(broker, middleware)
                if isinstance(runtime, (NatsRuntime, RedisRuntime)):
                    await runtime.open(middleware)
                else:
                    await rabbit_runtime.start_plugin(broker, runtime, middleware)
            except (RetryConfigError, RetryTopologyError) as exc:
                runtime.refused = exc
                raise
            await runtime.start_consumers()


def _attach(broker: Any, middleware: Middleware) -> bool:  # noqa: ANN401 - a broker
    """Put ``middleware`` on ``broker``; ``False``: it is installed there already.

    Raises:
        RetryConfigError: another ``RetryMiddleware`` is installed there, or FastStream
            lacks an internal the plugin reads.
    """
    installed = getattr(broker, _INSTALLED_ATTR, None)
    if installed is middleware:
        return False
    if installed is not None:
        raise RetryConfigError("another RetryMiddleware is already installed on this broker")
    _internals.check()
    if middleware not in broker.middlewares:
        # Outermost: a failure raised anywhere in the broker's middlewares is
        # covered too. Pass it in middlewares= to choose its place yourself.
        broker.insert_middleware(middleware)
    settled.guard(broker, middleware)
    # The plugin's lines go through this broker's logger unless logging is
    # configured for them (see _log).
    log.send_to(_internals.broker_outlet(broker), _internals.broker_level(broker))
    return True


def _install_own(
    broker: Any,  # noqa: ANN401 - a NatsBroker or a RedisBroker
    runtime: NatsRuntime | RedisRuntime,
    middleware: Middleware,
) -> None:
    """Wrap a ``NatsBroker``'s or a ``RedisBroker``'s start and stop.

    Start: check the subscribers and open the plugin's side (NATS: its streams; Redis:
    the engine, the server checked), let FastStream start its subscribers, then start
    the plugin's consumers (NATS: the re-checks and the hand-overs, which hand copies to
    running subscribers; Redis: the mover and the claimer). Stop: intake first, then
    the plugin's consumers, then FastStream's drain, whose failures are still carried
    out; the plugin stops last. Subscribers that join the running broker are followed
    (``late.watch``).
    """
    original_start = broker.start
    original_stop = broker.stop

    async def start() -> None:
        settled.guard(broker, middleware)
        if runtime.live is not None or runtime.bypass is not None:
            await original_start()
            return
        await runtime.open(middleware)
        await original_start()
        await runtime.start_consumers()

    async def stop(
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> None:
        _internals.stop_intake(broker)
        await runtime.stop_consumers()
        try:
            await original_stop(exc_type, exc_val, exc_tb)
        finally:
            await runtime.stop()

    broker.start = start
    broker.stop = stop
    late.watch(broker, runtime, middleware)
