"""The plugin on a ``RabbitBroker``: its runtime, its start and stop, late subscribers.

FastStream 0.7 has no broker start hook, so ``install`` wraps ``broker.start`` and
``broker.stop``. On start the plugin plans the topology from the subscribers the broker
has then, checks it against the live broker (declaring it: ``rabbit.checks``), opens its
channels, and starts FastStream's subscribers and the re-check consumers side by side.
On stop it undoes that in reverse, the intake first.

A subscriber can also join a running broker: ``broker.subscriber(...)`` then ``await
sub.start()``, or a router included after start. ``watch`` follows both: such a
subscriber's queues are declared before it consumes, its re-check consumer starts once
it consumes and stops with it. One that reaches the broker some other way is covered at
its first failure (``cover_failed``), before its copy is published.

Each runtime also says where its broker's failures go (``Runtime.sink``): the live sink
while the plugin runs, test mode's under ``TestRabbitBroker``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aio_pika.abc import AbstractConnection

from faststream_retry.core.advice import series_advice, work_queue_findings
from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import Plan, Route, merge_routes, retry_queue_name
from faststream_retry.middleware import _internals, checks, settled
from faststream_retry.middleware.planned import Planned
from faststream_retry.middleware.rabbit.sink import LiveSink
from faststream_retry.middleware.test_mode import TestSink
from faststream_retry.rabbit.checks import check_broker
from faststream_retry.rabbit.live import Live
from faststream_retry.rabbit.registry import retry_queues_in_use, survey
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping
    from types import TracebackType

    from aio_pika.abc import AbstractRobustConnection
    from faststream.rabbit import RabbitBroker

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.sink import Sink
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Runtime", "cover_failed", "follow", "install", "start_plugin", "watch"]


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


def install(broker: RabbitBroker, runtime: Runtime, middleware: Middleware) -> None:
    """Wrap a ``RabbitBroker``'s start and stop, and follow subscribers that join it late.

    Start: plan, check and declare (``start``), then FastStream's subscribers and the
    re-check consumers side by side. Stop: intake first, then the re-check consumers,
    then FastStream's drain, whose failures still need the publisher; the channels last.
    """
    original_start = broker.start
    original_stop = broker.stop

    async def start() -> None:
        settled.guard(broker, middleware)  # still the first, whatever was inserted since install()
        if runtime.live is not None:
            # Started again while running (to start a router included late):
            # FastStream starts the subscribers, and the new ones are followed.
            await original_start()
            return
        await start_plugin(broker, runtime, middleware)
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

    broker.start = start  # type: ignore[method-assign]
    broker.stop = stop  # type: ignore[method-assign]
    watch(broker, runtime, middleware)


async def _side_by_side(*steps: Awaitable[None]) -> None:
    """Run ``steps`` at once; once each is done, raise the first one's exception, if any."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


async def start_plugin(broker: RabbitBroker, runtime: Runtime, middleware: Middleware) -> None:
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
