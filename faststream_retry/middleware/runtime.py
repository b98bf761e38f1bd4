"""Installing the plugin on a broker: the start/stop wrapping and what it keeps per broker.

FastStream 0.7 has no broker start hook, so ``install`` wraps ``broker.start`` and
``broker.stop``. On start the plugin plans the topology from the subscribers the broker
has then, checks it against the live broker (declaring it: ``amqp.checks``), opens its
channels, and starts FastStream's subscribers and the re-check consumers side by side.
On stop it undoes that in reverse, the intake first.

A subscriber can also join a running broker: ``broker.subscriber(...)`` then ``await
sub.start()``, or a router included after start. ``watch`` follows both: such a
subscriber's queues are declared before it consumes, its re-check consumer starts once
it consumes and stops with it. One that reaches the broker some other way is covered at
its first failure (``cover_failed``), before its copy is published.

Each runtime also says where its broker's failures go (``Runtime.sink``): the live sink
while the plugin runs, test mode's under ``TestRabbitBroker``.

A ``NatsBroker`` gets a ``nats_runtime.NatsRuntime`` instead, and a ``RedisBroker`` a
``redis_runtime.RedisRuntime``, each with a start and stop of its own (``_install_own``);
the rest of the plugin reads any of them through the same members.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from aio_pika.abc import AbstractConnection

from faststream_retry.amqp.checks import check_broker
from faststream_retry.amqp.registry import retry_queues_in_use, survey
from faststream_retry.core.advice import series_advice, work_queue_findings
from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import Plan, Route, merge_routes, retry_queue_name
from faststream_retry.engine.live import Live
from faststream_retry.errors import RetryConfigError, RetryTopologyError
from faststream_retry.middleware import (
    _internals,
    checks,
    nats_subscribers,
    redis_subscribers,
    settled,
)
from faststream_retry.middleware.nats_runtime import NatsRuntime
from faststream_retry.middleware.planned import Planned
from faststream_retry.middleware.redis_runtime import RedisRuntime
from faststream_retry.middleware.sink import LiveSink
from faststream_retry.middleware.test_mode import TestSink
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping
    from types import TracebackType

    from aio_pika.abc import AbstractRobustConnection
    from faststream.nats import NatsBroker
    from faststream.rabbit import RabbitBroker
    from faststream.redis import RedisBroker

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.sink import Sink
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Covered", "Plugin", "Runtime", "cover_failed", "follow", "watch"]

Covered = TypeVar("Covered", "RabbitBroker", "NatsBroker", "RedisBroker")
"""A broker the plugin runs on."""

_INSTALLED_ATTR = "__faststream_retry_installed__"


class Runtime(Planned):
    """Everything the plugin holds for one broker: the plan, and its live parts once started."""

    def __init__(
        self, config: RetryConfig, reporter: Reporter, broker: RabbitBroker, testing: Testing
    ) -> None:
        """Prepare; nothing touches the network before ``start``."""
        super().__init__(config, reporter, broker, testing)
        self.live: Live | None = None
        """The connected parts, from ``start`` to ``stop``."""

    def sink(self) -> Sink | None:
        """Choose where this broker's failures go now; ``None``: nowhere, the plugin is not running.

        The live sink from ``start`` to ``stop``; test mode's under ``TestRabbitBroker``
        (no broker to hold a copy).
        """
        live = self.live
        if live is not None:
            return LiveSink(live, self.reporter, self.config.pause_s)
        if _internals.under_test_broker(self.broker):
            return TestSink(self.broker, self.plan, self.reporter, self._testing)
        return None

    async def cover_failed(self, sub: Any) -> Route | None:  # noqa: ANN401 - a Rabbit subscriber
        """Return the route for a failure of ``sub``, which the start plan does not cover."""
        return await cover_failed(self, sub)

    async def cover(self, sub: Any, *, consume: bool) -> Route | None:  # noqa: ANN401
        """Cover a subscriber that joins the running broker; ``None``: nothing to cover.

        A subscriber with retries off is covered only if its ``.retry`` exists (what
        waits there still goes home). ``consume`` starts its re-check consumer now;
        otherwise ``Live.consume`` does, once the subscriber consumes.
        """
        route = _internals.route_of(sub)
        live = self.live
        if live is None or route is None or _internals.acks_first(sub):
            return None  # ACK_FIRST: acked before its handler ran, nothing to keep
        if (
            not route.enabled(self.config.default)
            and route.queue not in live.plan.routes
            and not await retry_queues_in_use(live.connection, [route.queue])
        ):
            return None
        route = await live.cover(route)
        self._plan = live.plan
        if consume:
            await live.consume(route)
        return route

    async def forget(self, sub: Any) -> None:  # noqa: ANN401 - a Rabbit subscriber
        """Stop covering a subscriber that stopped while the broker runs."""
        queue = _internals.queue_of(sub)
        live = self.live
        if live is None or queue is None or queue not in live.plan.routes:
            return
        # Another running subscriber of the same queue still needs its re-check.
        if not any(
            other is not sub
            and getattr(other, "running", False)
            and _internals.queue_of(other) == queue
            for other in self.broker.subscribers
        ):
            await live.forget(queue)
            self._plan = live.plan

    @property
    def connected(self) -> bool:
        """Return whether the topology is declared and the publisher is up."""
        return self.live is not None

    async def start(self, connection: AbstractRobustConnection, topology: Plan) -> None:
        """Check the broker against ``topology``, then open the channels and declare it.

        From here on the channels are supervised: when one closes (a reconnect, a
        channel error) or the broker cancels a re-check consumer, they are opened
        again, the topology is declared again and the consumers restart.
        """
        # The broker's subscribers, retries on or off: read once for both looks below.
        routes = merge_routes(_internals.routes_of(self.broker))
        topology = await self._keep_releasing(connection, topology, routes)
        version = await check_broker(connection, topology)
        for level, text in work_queue_findings(
            topology.routes.values(), self.config.default, version
        ):
            log.log(level, "faststream-retry: %s", text)
        for _, advice in series_advice(topology.routes.values(), version):
            log.warning("faststream-retry: %s: %s. Fix: %s", advice.what, advice.why, advice.fix)
        live = Live(topology, connection, self.config, self.reporter)
        await live.open(declared=True)  # check_broker declared every object of it
        self.live = live
        self.started = True
        await self._report_stranded(connection, topology, routes)
        tiers = topology.tiers
        covered = len(topology.routes)
        log.info(
            "faststream-retry: tick %s, %d tiers up to %s, %d %s covered: %s",
            format_ms(tiers.tick_ms),
            len(tiers.ttls_ms),
            format_ms(tiers.ttls_ms[-1]),
            covered,
            "queue" if covered == 1 else "queues",
            ", ".join(sorted(topology.routes)) or "none",
        )

    async def _keep_releasing(
        self, connection: AbstractRobustConnection, topology: Plan, routes: Mapping[str, Route]
    ) -> Plan:
        """Add the queues with retries off whose ``.retry`` exists: their messages still go home.

        Messages that waited when the app last ran with retries on would otherwise
        stay in ``<queue>.retry`` for ever. Failures of these queues are still left to
        FastStream: the handlers' policies say no.
        """
        off = sorted(set(routes) - set(topology.routes))
        try:
            in_use = await retry_queues_in_use(connection, off)
        except Exception as exc:  # a diagnosis must not stop the service
            log.warning("faststream-retry: could not look for existing .retry queues: %r", exc)
            in_use = []
        for queue in in_use:
            topology = topology.with_route(routes[queue])
            log.info(
                "faststream-retry: retries are off for %r, but %r exists: its waiting "
                "messages are still released to %r",
                queue,
                retry_queue_name(queue),
                queue,
            )
        self._plan = topology
        return topology

    async def _report_stranded(
        self, connection: AbstractRobustConnection, topology: Plan, routes: Mapping[str, Route]
    ) -> None:
        """Warn of ``.retry`` queues with messages that no subscriber of this app releases."""
        try:
            stranded = await survey(connection, topology, routes)
        except Exception as exc:  # a diagnosis must not stop the service
            log.warning("faststream-retry: could not look for stranded .retry queues: %r", exc)
            return
        if stranded:
            log.warning(
                "faststream-retry: %d message(s) wait in .retry queues that no subscriber of "
                "this app releases and nothing consumes: %s. Their subscriber was renamed or "
                "removed, or runs in an app that is down. Start a subscriber of that queue "
                "with this middleware (retries on or off: either releases them), or move "
                "the messages by hand",
                sum(s.messages for s in stranded),
                ", ".join(f"{s.queue} ({s.messages})" for s in stranded),
            )

    async def start_consumers(self) -> None:
        """Start the re-check consumers (after FastStream's subscribers)."""
        if self.live is not None:
            await self.live.start_consumers()

    async def stop_consumers(self) -> None:
        """Stop the re-check consumers; the publisher stays up for handlers still running."""
        if self.live is not None:
            await self.live.stop_consumers()

    async def stop(self) -> None:
        """Stop the consumers and close the channels."""
        if self.live is not None:
            # Handlers still running meanwhile find the channels closing: their
            # copies are not confirmed and their messages are requeued.
            await self.live.close()
        self.live = None


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
        self.middleware: Middleware | None = None
        """The ``RetryMiddleware`` this is the plugin of (set by it): a late start installs it."""

    def runtime(self, broker: Any) -> Runtime | NatsRuntime | RedisRuntime:  # noqa: ANN401 - a broker
        """Return the runtime of ``broker``: a ``NatsRuntime`` for a ``NatsBroker``, and so on."""
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
        return runtime

    def start_test(self, broker: Any) -> None:  # noqa: ANN401 - a broker under a test broker
        """Test mode's start, at each message in a ``testing()`` block.

        Nothing is started. A ``NatsBroker``'s subscribers are checked as at a real start
        (``NatsRuntime.check_in_test``); ``TestRabbitBroker``'s test mode checks nothing.

        Raises:
            RetryConfigError: the app is wired so that the plugin would refuse to start.
        """
        runtime = self.runtime(broker)
        if isinstance(runtime, NatsRuntime) and self.middleware is not None:
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
        original_start = broker.start
        original_stop = broker.stop

        async def start() -> None:
            settled.guard(broker)  # still the first, whatever was inserted since install()
            if runtime.live is not None:
                # Started again while running (to start a router included late):
                # FastStream starts the subscribers, and the new ones are followed.
                await original_start()
                return
            await _start(broker, runtime, middleware)
            # Side by side: a copy the re-check consumers release before its queue's
            # subscriber consumes waits in that queue; one released before FastStream
            # declared that queue (a queue that is not durable, after a broker restart)
            # is refused, and requeued after the pause.
            await _side_by_side(original_start(), runtime.start_consumers())

        async def stop(
            exc_type: type[BaseException] | None = None,
            exc_val: BaseException | None = None,
            exc_tb: TracebackType | None = None,
        ) -> None:
            # Intake first, at once: no handler starts once stop() is called. Then the
            # re-check consumers (they feed the subscribers' queues), then FastStream
            # drains its handlers, whose failures still need the publisher; the
            # plugin's channels close last.
            _internals.stop_intake(broker)
            await runtime.stop_consumers()
            try:
                await original_stop(exc_type, exc_val, exc_tb)
            finally:
                await runtime.stop()

        broker.start = start
        broker.stop = stop
        watch(broker, runtime, middleware)
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
                    await _start(broker, runtime, middleware)
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
    settled.guard(broker)
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
    out; the plugin stops last.
    """
    original_start = broker.start
    original_stop = broker.stop

    async def start() -> None:
        settled.guard(broker)
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


async def _side_by_side(*steps: Awaitable[None]) -> None:
    """Run ``steps`` at once; once each is done, raise the first one's exception, if any."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


async def _start(broker: RabbitBroker, runtime: Runtime, middleware: Middleware) -> None:
    """Plan from the subscribers the broker has now, check the plan, and declare it."""
    topology = runtime.replan()
    checks.refuse_ack_first(broker, topology)
    checks.refuse_other_instances(broker, middleware)
    checks.refuse_plugin_queues(broker, topology)
    checks.refuse_other_queue_type(broker, topology)
    checks.warn_uncovered(broker, topology)
    connection = await broker.connect()
    if not isinstance(connection, AbstractConnection):
        # A test double (FastStream's own tests mock the connection): nothing to declare
        # on, nothing to run. Said once; the broker works as without the plugin.
        runtime.bypass = (
            f"the broker's connection is a {type(connection).__name__}, not an aio-pika "
            "connection (a test double?): the plugin does not start on it, and leaves the "
            "broker's messages to FastStream"
        )
        log.warning("faststream-retry: %s", runtime.bypass)
        return
    await runtime.start(connection, topology)


_FOLLOWED_ATTR = "__faststream_retry_followed__"


def watch(broker: RabbitBroker, runtime: Runtime, middleware: Middleware) -> None:
    """Follow every subscriber that joins ``broker`` while it runs."""
    original_subscriber = broker.subscriber
    original_include = broker.include_router

    def subscriber(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - FastStream's
        sub = original_subscriber(*args, **kwargs)
        if runtime.live is not None:
            follow(runtime, sub)
        return sub

    def include_router(router: Any, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        original_include(router, *args, **kwargs)
        if runtime.live is not None:
            # A second instance on the new router would decide its failures too.
            checks.refuse_other_instances(broker, middleware)
            for sub in router.subscribers:
                follow(runtime, sub)

    broker.subscriber = subscriber  # type: ignore[method-assign]
    broker.include_router = include_router  # type: ignore[method-assign]


def follow(runtime: Runtime, sub: Any) -> None:  # noqa: ANN401 - a Rabbit subscriber
    """Cover ``sub`` each time it starts, and stop covering it when it stops (once per sub)."""
    if getattr(sub, _FOLLOWED_ATTR, False):
        return
    original_start, original_stop = sub.start, sub.stop

    async def start() -> None:
        route = _internals.route_of(sub)
        if route is not None and route.enabled(runtime.config.default):
            checks.refuse_ack_first_of(sub, route)  # before it consumes anything
        if runtime.live is not None:
            checks.refuse_on_plugin_queues([sub], runtime.live.plan)
        # Declared before it consumes (a mismatch raises here, and it does not
        # start); its re-check consumer starts once the work queue is consumed.
        covered = await runtime.cover(sub, consume=False)
        await original_start()
        if covered is not None and runtime.live is not None:
            await runtime.live.consume(covered)

    async def stop() -> None:
        await runtime.forget(sub)
        await original_stop()

    sub.start, sub.stop = start, stop
    setattr(sub, _FOLLOWED_ATTR, True)


async def cover_failed(runtime: Runtime, sub: Any) -> Route | None:  # noqa: ANN401
    """Return the route for a failure of a subscriber the start plan does not cover.

    A running subscriber is covered from now on, and followed so its re-check
    consumer stops with it. A stopped one (its failure was in flight when it
    stopped) is not covered again: its copy goes to the queues declared when it
    joined, and no consumer is started for it.
    """
    if not getattr(sub, "running", True):
        route = _internals.route_of(sub)
        return route if route is not None and not _internals.acks_first(sub) else None
    follow(runtime, sub)
    return await runtime.cover(sub, consume=True)
