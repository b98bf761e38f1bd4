"""What a runtime of either transport holds before it runs: its broker, plan and state.

``runtime.Runtime`` (RabbitMQ), ``nats_runtime.NatsRuntime`` (NATS JetStream) and
``redis_runtime.RedisRuntime`` (Redis Streams) build on it; the per-message scope reads
each through these members.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core.topology import plan
from faststream_retry.middleware import _internals

if TYPE_CHECKING:
    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.errors import RetryConfigError, RetryTopologyError
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Planned"]


class _Running(Protocol):
    @property
    def plan(self) -> Plan: ...


class Planned:
    """A broker's plan, and whether and how the plugin runs on it."""

    live: _Running | None
    """The connected parts, from the start to the stop."""

    releases_on_arrival = False
    """Whether a copy that reaches its handler was released by the plugin's own mover (Redis),
    rather than by the broker (a RabbitMQ tier, reported only when ``x-death`` names one)."""

    def __init__(
        self,
        config: RetryConfig,
        reporter: Reporter,
        broker: Any,  # noqa: ANN401 - a RabbitBroker, NatsBroker or RedisBroker
        testing: Testing,
    ) -> None:
        """Prepare; nothing touches the network before the start."""
        self.config = config
        self.reporter = reporter
        self.broker = broker
        self._testing = testing
        self._plan: Plan | None = None
        self.started = False
        """Whether the plugin ever started on this broker (a stopped one does not start late)."""
        self.refused: RetryConfigError | RetryTopologyError | None = None
        """Why a late start refused to run (``Plugin.start_late``): it is not tried again."""
        self.bypass: str | None = None
        """Why the plugin leaves this broker's messages to FastStream, untouched (a broker it
        does not cover, a connection that is not its client's); ``None``: it does not."""
        self.starting = asyncio.Lock()
        """Held by a late start: the messages that arrive meanwhile wait for it."""

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
            _internals.routes_of(self.broker), self.config.default, self.config.topology
        )
        return self._plan

    def route(self, queue: str) -> Route | None:
        """Return the route of ``queue`` if the plugin covers it: the live plan's once started."""
        live = self.live
        return (live.plan if live is not None else self.plan).route(queue)
