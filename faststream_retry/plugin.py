"""Installing the plugin on a broker: the start/stop wrapping and what it keeps per broker.

FastStream 0.7 has no broker start hook, so ``install`` wraps ``broker.start`` and
``broker.stop``. On start the plugin plans the topology from the subscribers the broker
has then, checks it against the live broker, opens its channels and declares it, starts
FastStream's subscribers and then the re-check consumers (they release into the
subscribers' queues, so those must exist first). On stop it undoes that in reverse.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from faststream_retry import _faststream
from faststream_retry.amqp.channels import ChannelPair
from faststream_retry.amqp.declare import check_broker, declare_topology, work_queue_findings
from faststream_retry.amqp.publisher import Publisher
from faststream_retry.amqp.recheck import RecheckConsumer
from faststream_retry.errors import RetryConfigError
from faststream_retry.topology import Plan, plan

if TYPE_CHECKING:
    from types import TracebackType

    from aio_pika.abc import AbstractChannel, AbstractRobustConnection
    from faststream.rabbit import RabbitBroker

    from faststream_retry.config import RetryConfig
    from faststream_retry.reporting import Reporter

__all__ = ["Live", "Plugin", "Runtime"]

log = logging.getLogger("faststream_retry")

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
        self.publisher = Publisher(self.channels.underlay_for_publish, config.publish_timeout_s)
        self.recheck = RecheckConsumer(topology, self.publisher, reporter, pause_s=config.pause_s)
        self._wait_s = config.publish_timeout_s
        self._consuming = False

    async def open(self) -> None:
        """Open the channels and declare the topology on them."""
        await self.channels.open()

    async def _on_open(self, publish: AbstractChannel, consume: AbstractChannel) -> None:
        # Runs on every (re)open: the topology may have been deleted meanwhile.
        await declare_topology(publish, self.plan)
        if self._consuming:
            await self._consume(consume)

    async def _consume(self, channel: AbstractChannel) -> None:
        for tag in await self.recheck.start(channel):
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
        """Stop the re-check consumers and let their in-flight hops finish."""
        self._consuming = False
        self.channels.forget_consumers()
        await self.recheck.stop(self._wait_s)

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
        version = await check_broker(connection, topology)
        for level, text in work_queue_findings(
            topology.routes.values(), self.config.default, version
        ):
            log.log(level, "faststream-retry: %s", text)
        live = Live(topology, connection, self.config, self.reporter)
        await live.open()
        self.live = live
        tiers = topology.tiers
        log.info(
            "faststream-retry: tick %d ms, %d tiers up to %d ms, %d queues covered: %s",
            tiers.tick_ms,
            len(tiers.ttls_ms),
            tiers.ttls_ms[-1],
            len(topology.routes),
            ", ".join(sorted(topology.routes)) or "none",
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
            broker.add_middleware(middleware)
        original_start = broker.start
        original_stop = broker.stop
        runtime = self.runtime(broker)

        async def start() -> None:
            # Planned from the subscribers the broker has now, at start.
            topology = runtime.replan()
            _refuse_ack_first(broker, topology)
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
        setattr(broker, _INSTALLED_ATTR, middleware)
        return broker


def _refuse_ack_first(broker: RabbitBroker, topology: Plan) -> None:
    for sub in broker.subscribers:
        route = topology.route(_faststream.queue_of(sub) or "")
        if route is not None and _faststream.acks_first(sub):
            raise RetryConfigError(
                f"subscriber of {route.queue!r} uses AckPolicy.ACK_FIRST: the message is "
                "acked before the handler runs, so a failure cannot be retried safely. "
                "Use the default ack policy, or switch retries off for it with "
                "@retry_policy(enabled=False)"
            )
