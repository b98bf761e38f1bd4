"""Installing the plugin on a broker: the start/stop wrapping and what it keeps per broker.

FastStream 0.7 has no broker start hook, so ``install`` wraps ``broker.start`` and
``broker.stop``. On start the plugin plans the topology from the subscribers the broker
has then, checks it against the live broker, opens its channels and declares it, starts
FastStream's subscribers and then the re-check consumers (they release into the
subscribers' queues, so those must exist first). On stop it undoes that in reverse.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from aiormq.exceptions import ChannelAccessRefused

from faststream_retry import _faststream, wiring
from faststream_retry._log import log
from faststream_retry.amqp.channels import ChannelPair
from faststream_retry.amqp.declare import (
    check_broker,
    declare_late_route,
    declare_topology,
    owns,
    parse_refusal,
    redeclare,
    refused,
    work_queue_findings,
)
from faststream_retry.amqp.publisher import Publisher
from faststream_retry.amqp.recheck import RecheckConsumer
from faststream_retry.amqp.registry import record, retry_queues_in_use, survey
from faststream_retry.errors import RetryConfigError
from faststream_retry.gate import Outages
from faststream_retry.topology import Plan, Route, merge_routes, plan, retry_queue_name

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

    from aio_pika.abc import AbstractChannel, AbstractRobustConnection
    from faststream.rabbit import RabbitBroker

    from faststream_retry.config import RetryConfig
    from faststream_retry.reporting import Reporter

__all__ = ["Live", "Plugin", "Runtime"]

_INSTALLED_ATTR = "__faststream_retry_installed__"


class Live:
    """The plugin's connected parts for one broker: channels, publisher, re-check consumers."""

    def __init__(
        self,
        topology: Plan,
        connection: AbstractRobustConnection,
        config: RetryConfig,
        reporter: Reporter,
    ) -> None:
        """Wire the parts together; ``open`` connects them."""
        self.plan = topology
        self.channels = ChannelPair(
            connection,
            prefetch=config.prefetch,
            wait_s=config.publish_timeout_s,
            on_open=self._on_open,
        )
        self.publisher = Publisher(
            self.channels.underlay_for_publish, config.publish_timeout_s, repair=self._repair
        )
        self.recheck = RecheckConsumer(topology, self.publisher, reporter, pause_s=config.pause_s)
        self.outages = Outages.of(config.outage, topology.tiers.tick_ms, reporter)
        """Outage mode's gates (``None``: off); probes come once a tick unless told."""
        self.connection = connection
        self._wait_s = config.publish_timeout_s
        self._consuming = False
        self._adopting = asyncio.Lock()

    async def open(self) -> None:
        """Open the channels and declare the topology on them."""
        await self.channels.open()

    async def _on_open(self, publish: AbstractChannel, consume: AbstractChannel) -> None:
        # Runs on every (re)open: the topology may have been deleted meanwhile.
        await declare_topology(publish, self.plan)
        if self._consuming:
            await self._consume(consume)

    async def _repair(self, exchange: str, routing_key: str) -> bool:
        # A publish found a destination missing (an operator deleted it while the
        # app runs). Only the plugin's own objects are declared again: a missing
        # work queue is its application's business, and its releases are requeued.
        if not owns(self.plan, exchange, routing_key):
            return False
        log.warning(
            "faststream-retry: %r/%r was missing (deleted while the app runs?); "
            "declaring the topology again",
            exchange,
            routing_key,
        )
        await redeclare(self.connection, self.plan)
        return True

    async def _consume(self, channel: AbstractChannel) -> None:
        try:
            tags = await self.recheck.start(channel)
        except ChannelAccessRefused as exc:
            # The user may declare .retry (checked at start) but not read it.
            reply = str(exc.args[0]) if exc.args else repr(exc)
            refusal = parse_refusal(reply, "queue", "a .retry queue", "read permission", "consume")
            raise refused([refusal]) from exc
        for tag in tags:
            self.channels.track(tag)

    async def start_consumers(self) -> None:
        """Start the re-check consumers (and again after each reopen)."""
        self._consuming = True
        channel = self.channels.consume_channel
        # A channel being reopened right now may be past its on_open: start on it
        # here too (once per channel); a closed one is replaced, and its
        # replacement's on_open starts them.
        if channel is not None and not channel.is_closed:
            await self._consume(channel)

    async def stop_consumers(self) -> None:
        """Stop the re-check consumers and let their in-flight hops finish.

        Messages held in outage mode are requeued first: the broker's graceful stop
        would otherwise wait for them.
        """
        if self.outages is not None:
            self.outages.close()
        self._consuming = False
        self.channels.forget_consumers()
        await self.recheck.stop(self._wait_s)

    async def cover(
        self, route: Route, why: str = "its subscriber joined the running broker"
    ) -> Route:
        """Cover ``route`` from now on: declare its queues and record it; no consumer yet.

        For a subscriber that joins the running broker. Its queues exist when this
        returns, so its first copy has somewhere to go; ``consume`` starts its
        re-check consumer once the subscriber consumes.

        Raises:
            RetryTopologyError: one of its queues exists with other arguments.
        """
        async with self._adopting:  # two first failures at once declare once
            known = self.plan.route(route.queue)
            if known is not None:
                return known
            topology = self.plan.with_route(route)
            await declare_late_route(self.connection, topology, route)
            self.plan = self.recheck.plan = topology
        await record(self.connection, topology, route.queue)
        log.info("faststream-retry: now covering %r (%s)", route.queue, why)
        return route

    async def consume(self, route: Route) -> None:
        """Start ``route``'s re-check consumer, if the plugin's consumers run."""
        if self._consuming:
            tag = await self.recheck.add(route)
            if tag is not None:
                self.channels.track(tag)

    async def forget(self, queue: str) -> None:
        """Stop covering ``queue`` (its subscriber stopped): its re-check consumer stops."""
        async with self._adopting:
            self.plan = self.recheck.plan = self.plan.without(queue)
        await self.recheck.remove(queue)

    async def close(self) -> None:
        """Stop reopening the channels, stop the consumers, then close the channels."""
        await self.channels.stop_supervising()
        await self.stop_consumers()
        await self.channels.close()


class Runtime:
    """Everything the plugin holds for one broker: the plan, and its live parts once started."""

    def __init__(self, config: RetryConfig, reporter: Reporter, broker: RabbitBroker) -> None:
        """Prepare; nothing touches the network before ``start``."""
        self.config = config
        self.reporter = reporter
        self.broker = broker
        self._plan: Plan | None = None
        self.live: Live | None = None
        """The connected parts, from ``start`` to ``stop``."""

    @property
    def plan(self) -> Plan:
        """Return the plan; planned from the broker's subscribers when first needed.

        ``start`` plans again, from the subscribers the broker has then. In-memory
        tests never start the plugin and use the plan made on their first failure.
        """
        if self._plan is None:
            self._plan = self.replan()
        return self._plan

    def replan(self) -> Plan:
        """Plan from the subscribers the broker has now (no network)."""
        self._plan = plan(
            _faststream.routes_of(self.broker), self.config.default, self.config.topology
        )
        return self._plan

    async def cover(self, sub: Any, *, consume: bool) -> Route | None:  # noqa: ANN401
        """Cover a subscriber that joins the running broker; ``None``: nothing to cover.

        A subscriber with retries off is covered only if its ``.retry`` exists (what
        waits there still goes home). ``consume`` starts its re-check consumer now;
        otherwise ``Live.consume`` does, once the subscriber consumes.
        """
        route = _faststream.route_of(sub)
        live = self.live
        if live is None or route is None or _faststream.acks_first(sub):
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
        queue = _faststream.queue_of(sub)
        live = self.live
        if live is None or queue is None or queue not in live.plan.routes:
            return
        # Another running subscriber of the same queue still needs its re-check.
        if not any(
            other is not sub
            and getattr(other, "running", False)
            and _faststream.queue_of(other) == queue
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
        routes = merge_routes(_faststream.routes_of(self.broker))
        topology = await self._keep_releasing(connection, topology, routes)
        version = await check_broker(connection, topology)
        for level, text in work_queue_findings(
            topology.routes.values(), self.config.default, version
        ):
            log.log(level, "faststream-retry: %s", text)
        live = Live(topology, connection, self.config, self.reporter)
        await live.open()
        self.live = live
        await self._report_stranded(connection, topology, routes)
        tiers = topology.tiers
        log.info(
            "faststream-retry: tick %d ms, %d tiers up to %d ms, %d queues covered: %s",
            tiers.tick_ms,
            len(tiers.ttls_ms),
            tiers.ttls_ms[-1],
            len(topology.routes),
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

    def __init__(self, config: RetryConfig, reporter: Reporter) -> None:
        """Keep the configuration; runtimes are made per broker as they are needed."""
        self.config = config
        self.reporter = reporter
        self._runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()
        self.raise_on_dead_letter = False
        """Test mode: let a dead letter's exception reach ``publish()`` (``testing()``)."""

    def runtime(self, broker: RabbitBroker) -> Runtime:
        """Return the runtime of ``broker``."""
        runtime = self._runtimes.get(broker)
        if runtime is None:
            runtime = self._runtimes[broker] = Runtime(self.config, self.reporter, broker)
        return runtime

    def install(self, broker: RabbitBroker, middleware: Any) -> RabbitBroker:  # noqa: ANN401
        """Add ``middleware`` to ``broker`` if needed and wrap its start and stop."""
        installed = getattr(broker, _INSTALLED_ATTR, None)
        if installed is middleware:
            return broker
        if installed is not None:
            raise RetryConfigError("another RetryMiddleware is already installed on this broker")
        _faststream.check()
        if middleware not in broker.middlewares:
            # Outermost: a failure raised anywhere in the broker's middlewares is
            # covered too. Pass it in middlewares= to choose its place yourself.
            broker.insert_middleware(middleware)
        # The plugin's lines go through this broker's logger unless logging is
        # configured for them (see _log).
        log.send_to(_faststream.broker_outlet(broker), _faststream.broker_level(broker))
        original_start = broker.start
        original_stop = broker.stop
        runtime = self.runtime(broker)

        async def start() -> None:
            if runtime.live is not None:
                # Started again while running (to start a router included late):
                # FastStream starts the subscribers, and the new ones are followed.
                await original_start()
                return
            # Planned from the subscribers the broker has now, at start.
            topology = runtime.replan()
            wiring.refuse_ack_first(broker, topology)
            wiring.refuse_other_instances(broker, middleware)
            wiring.refuse_plugin_queues(broker, topology)
            wiring.refuse_other_queue_type(broker, topology)
            wiring.warn_uncovered(broker, topology)
            await runtime.start(await broker.connect(), topology)
            await original_start()
            await runtime.start_consumers()

        async def stop(
            exc_type: type[BaseException] | None = None,
            exc_val: BaseException | None = None,
            exc_tb: TracebackType | None = None,
        ) -> None:
            # Re-check consumers first (they feed the subscribers' queues), then
            # FastStream drains its handlers, whose failures still need the
            # publisher; the plugin's channels close last.
            await runtime.stop_consumers()
            try:
                await original_stop(exc_type, exc_val, exc_tb)
            finally:
                await runtime.stop()

        broker.start = start  # type: ignore[method-assign]
        broker.stop = stop  # type: ignore[method-assign]
        wiring.watch(broker, runtime, middleware)
        setattr(broker, _INSTALLED_ATTR, middleware)
        return broker
