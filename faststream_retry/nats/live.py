"""The NATS transport's running parts for one broker: streams, publisher, re-checks, hand-overs.

``open`` makes the delay stream and the dead-letter stream of every covered stream;
``start_consumers`` starts a re-check consumer per tier, a hand-over per covered
subscriber and the dead-letter gauge's sampling; ``stop_consumers`` stops them (the
hand-overs first: they feed handlers);
``close`` forgets the connection, which the broker owns. A subscriber that joins the
running broker is covered by ``cover`` (its dead-letter stream) and ``hand_over`` (its
hand-over), and ``let_go`` stops its hand-over when it stops.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from faststream_retry.nats import naming
from faststream_retry.nats.dead_letters import declare_dead_letter_stream
from faststream_retry.nats.dlq_depths import NatsDeadLetterDepths
from faststream_retry.nats.publisher import Publisher
from faststream_retry.nats.ready import Ready
from faststream_retry.nats.recheck import Recheck, RetiredTiers
from faststream_retry.nats.streams import covered_replicas, declare_delay_stream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.outages import Outages
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["HandOver", "NatsLive"]


class HandOver:
    """A covered subscriber as the hand-over sees it: its key, its pipeline, its ack_wait."""

    __slots__ = ("ack_wait_s", "consume", "key")

    def __init__(
        self, key: str, consume: Callable[[Msg], Awaitable[Any]], ack_wait_s: float
    ) -> None:
        """Hand ``key``'s ready copies to ``consume``."""
        self.key = key
        self.consume = consume
        self.ack_wait_s = ack_wait_s


class NatsLive:
    """What the plugin runs on one connected ``NatsBroker``."""

    outages: Outages | None = None
    """Outage mode's gates, set by the runtime once open (``None``: off)."""

    def __init__(
        self, plan: Plan, js: JetStreamContext, config: RetryConfig, reporter: Reporter
    ) -> None:
        """Prepare; ``open`` touches the server."""
        self.plan = plan
        self.prefix = plan.options.prefix
        self.delivery_limit = plan.options.delivery_limit
        self.publisher = Publisher(js, config.publish_timeout_s)
        self.running = False
        self._js = js
        self._config = config
        self._reporter = reporter
        self._rechecks: list[Recheck] = []
        self._readies: dict[str, Ready] = {}
        self._retired: RetiredTiers | None = None
        self._streams: dict[str, int] = {}
        self._hand_overs: dict[str, HandOver] = {}
        self.consuming = False
        """Whether the re-checks and hand-overs run (from ``start_consumers`` to the stop)."""
        self.dlq_depths = NatsDeadLetterDepths(
            js, self.prefix, reporter.telemetry, lambda: self.plan
        )
        """Samples each covered subscriber's dead letters when the metrics are read."""

    async def open(self, streams: Mapping[str, int]) -> None:
        """Make the delay stream and the dead-letter stream of each of ``streams``.

        ``streams``: each covered stream and the replicas its ``JStream`` declares. A
        dead-letter stream gets its covered stream's replicas (the server's if it exists),
        the delay stream the most of any.
        """
        self._streams = {**self._streams, **streams}
        replicas = await covered_replicas(self._js, self._streams)
        await declare_delay_stream(self._js, self.prefix, max(replicas.values(), default=1))
        await asyncio.gather(
            *(
                declare_dead_letter_stream(
                    self._js, self.prefix, s, replicas[s], self._config.dlq_max_length
                )
                for s in sorted(replicas)
            )
        )
        self.running = True

    async def start_consumers(self, hand_overs: list[HandOver]) -> None:
        """Start a re-check consumer per tier and a hand-over per covered subscriber."""
        self._hand_overs = {o.key: o for o in hand_overs}
        await self._start_pulling()
        pause = self._config.pause_s
        self._retired = RetiredTiers(
            lambda t: Recheck(
                self._js, self.publisher, self._reporter, lambda: self.plan, t, pause_s=pause
            ),
            self._js,
            self.prefix,
            dead_letters=[naming.dlq_stream(self.prefix, s) for s in self._streams],
            repair=self._repair,
        )
        await self._retired.start(self.plan.tiers.ttls_ms)
        self.dlq_depths.start()
        self.consuming = True

    async def _start_pulling(self) -> None:
        pause = self._config.pause_s
        self._rechecks = [
            Recheck(self._js, self.publisher, self._reporter, lambda: self.plan, t, pause_s=pause)
            for t in self.plan.tiers.ttls_ms
        ]
        self._readies = {o.key: self._ready(o) for o in self._hand_overs.values()}
        await asyncio.gather(*(r.start() for r in self._rechecks))
        await asyncio.gather(*(r.start() for r in self._readies.values()))

    def _ready(self, o: HandOver) -> Ready:
        return Ready(
            self._js,
            self.prefix,
            o.key,
            o.consume,
            ack_wait_s=o.ack_wait_s,
            pause_s=self._config.pause_s,
        )

    async def _repair(self, delay_gone: bool) -> None:
        """Make the plugin's streams again; on a new delay stream, its consumers too."""
        await self.open(self._streams)
        if delay_gone:
            await asyncio.gather(*(r.stop() for r in self._readies.values()))
            await asyncio.gather(*(r.stop() for r in self._rechecks))
            await self._start_pulling()

    async def stop_consumers(self) -> None:
        """Stop the hand-overs (they feed handlers), then the re-checks and the sampling."""
        self.consuming = False
        await asyncio.gather(*(r.stop() for r in self._readies.values()))
        await asyncio.gather(*(r.stop() for r in self._rechecks))
        if self._retired is not None:
            await self._retired.stop()
        self._readies, self._rechecks, self._retired = {}, [], None
        await self.dlq_depths.stop()

    async def cover(self, route: Route, stream: str, declared_replicas: int) -> None:
        """Cover a subscriber that joins: make its stream's dead-letter stream, plan its route.

        The delay stream and the tiers stay as they are: their consumers are running.
        """
        replicas = await covered_replicas(self._js, {stream: declared_replicas})
        await declare_dead_letter_stream(
            self._js, self.prefix, stream, replicas[stream], self._config.dlq_max_length
        )
        self._streams.setdefault(stream, declared_replicas)
        self.plan = self.plan.with_route(route)

    async def hand_over(self, o: HandOver) -> None:
        """Start handing ``o.key``'s ready copies to ``o.consume``, unless that runs already."""
        if o.key in self._readies:
            return
        self._hand_overs[o.key] = o
        ready = self._ready(o)
        self._readies[o.key] = ready
        await ready.start()

    async def let_go(self, key: str) -> None:
        """Stop handing ``key``'s copies over (its subscriber stopped): they wait in the stream."""
        self._hand_overs.pop(key, None)
        ready = self._readies.pop(key, None)
        if ready is not None:
            await ready.stop()

    def close(self) -> None:
        """Stop publishing: a handler still running keeps its message (not confirmed)."""
        self.running = False

    def delay_stream(self) -> str:
        """The name of the delay stream."""
        return naming.delay_stream(self.prefix)
