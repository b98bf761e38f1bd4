"""A started runtime's connected parts: channels, publisher, re-check consumers, outage gates.

The middleware's runtime and the standalone worker each hold one ``Live`` per
connection. It declares the topology on every (re)open, declares it again when an
operator deleted one of the plugin's own objects, covers a queue that joins late, and
samples its ``.dlq`` depths for the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from aiormq.exceptions import ChannelAccessRefused

from faststream_retry.core.advice import parse_refusal, refused
from faststream_retry.outages import Outages
from faststream_retry.rabbit.channels import ChannelPair
from faststream_retry.rabbit.checks import declare_late_route
from faststream_retry.rabbit.declare import declare_topology, redeclare
from faststream_retry.rabbit.dlq_depths import DeadLetterDepths
from faststream_retry.rabbit.publisher import Publisher
from faststream_retry.rabbit.recheck import RecheckConsumer
from faststream_retry.rabbit.registry import record
from faststream_retry.rabbit.requeues import Requeues
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractRobustConnection

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Live"]


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
        self.requeues = Requeues()
        """The requeues of unconfirmed copies, counted for every consumer of this runtime."""
        self.recheck = RecheckConsumer(
            topology, self.publisher, reporter, pause_s=config.pause_s, requeues=self.requeues
        )
        self.outages = Outages.of(config.outage, topology.tiers.tick_ms, reporter)
        """Outage mode's gates (``None``: off); probes come once a tick unless told."""
        self.connection = connection
        self.dlq_depths = DeadLetterDepths(connection, reporter.telemetry, lambda: self.plan)
        """Samples each route's ``.dlq`` depth when the metrics are read."""
        self._wait_s = config.publish_timeout_s
        self._consuming = False
        self._stopping = asyncio.Event()
        self._adopting = asyncio.Lock()
        self._declared = False

    async def open(self, *, declared: bool = False) -> None:
        """Open the channels and declare the topology on them.

        ``declared``: the startup checks (``check_broker``) have just declared this plan,
        every object of it: the first open declares nothing again. Every reopen does.
        """
        self._declared = declared
        await self.channels.open()
        self.dlq_depths.start()

    async def _on_open(self, publish: AbstractChannel, consume: AbstractChannel) -> None:
        # Runs on every (re)open: the topology may have been deleted meanwhile.
        if self._declared:
            self._declared = False
        else:
            await declare_topology(publish, self.plan)
        if self._consuming:
            await self._consume(consume)

    async def _repair(self, exchange: str, routing_key: str) -> bool:
        # A publish found a destination missing (an operator deleted it while the
        # app runs). Only the plugin's own objects are declared again: a missing
        # work queue is its application's business, and its releases are requeued.
        if not self.plan.owns(exchange, routing_key):
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
        self._stopping.clear()
        channel = self.channels.consume_channel
        # A channel being reopened right now may be past its on_open: start on it
        # here too (once per channel); a closed one is replaced, and its
        # replacement's on_open starts them.
        if channel is not None and not channel.is_closed:
            await self._consume(channel)

    async def stop_consumers(self) -> None:
        """Stop the re-check consumers and let their in-flight hops finish.

        Messages held in outage mode are requeued first: the broker's graceful stop
        would otherwise wait for them. The ``.dlq`` sampler stops too: no read of the
        plugin's may be in flight when FastStream closes the connection next.
        """
        await self.dlq_depths.stop()
        if self.outages is not None:
            self.outages.close()
        self._consuming = False
        self._stopping.set()
        self.channels.forget_consumers()
        await self.recheck.stop(self._wait_s)

    async def hold(self, seconds: float) -> bool:
        """Wait ``seconds`` while holding a message; ``False`` if the plugin stops meanwhile.

        A message held so its copy can be placed again must go back at a stop: the
        broker's graceful stop would otherwise wait for it.
        """
        if not self._consuming:
            return False
        # asyncio's own: TimeoutError is an alias of it only from Python 3.11 on.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._consuming

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
        await self.stop_consumers()  # the .dlq sampler with them
        await self.channels.close()
