"""What a runtime of either transport holds before it runs: its broker, plan and state.

``rabbit.runtime.Runtime`` (RabbitMQ), ``nats.runtime.NatsRuntime`` (NATS JetStream) and
``redis.runtime.RedisRuntime`` (Redis Streams) build on it; the per-message scope reads
each through these members.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core.topology import plan
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import _internals

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.errors import RetryTopologyError
    from faststream_retry.middleware.checks import Middleware
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

    messaging_system = "rabbitmq"
    """The broker's ``messaging.system`` (OpenTelemetry's word), on every span of this runtime."""

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
        self.reporter = reporter.on(self.messaging_system)
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
        self._checked_in_test = False

    def check(self, middleware: Middleware) -> Plan:
        """Plan and check the broker's subscribers as a real start does (NATS, Redis).

        Raises:
            RetryConfigError: the app is wired so that the plugin would refuse to start.
        """
        del middleware
        return self.replan()

    def check_in_test(self, middleware: Middleware) -> None:
        """Test mode's start: the checks a real start makes, once; a refusal raises every time.

        A test of an app the plugin would refuse to start with (a core-NATS subscriber,
        a Redis channel or list, with retries on) fails with the same error, rather than
        retrying in memory what production would not.

        Raises:
            RetryConfigError: as ``check``.
        """
        if self.refused is not None:
            raise self.refused
        if self._checked_in_test:
            return
        try:
            self.check(middleware)
        except RetryConfigError as refused:
            self.refused = refused
            raise
        self._checked_in_test = True

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

    def holding(
        self,
        msg: Any,  # noqa: ANN401, ARG002 - FastStream's message
        sub: Any,  # noqa: ANN401, ARG002 - its subscriber
    ) -> contextlib.AbstractContextManager[None]:
        """Wrap a handler's call on ``msg``; nothing here.

        A transport that must know what its handlers hold (Redis' claimer) is told.
        """
        return contextlib.nullcontext()

    def entering(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's message
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> contextlib.AbstractContextManager[None] | None:
        """What wraps a handler's call on ``msg`` (``holding``); ``None``: await ``settle_first``.

        A transport that settles some messages before their handlers (NATS) answers
        ``None`` for those, and tests the rest without a coroutine.
        """
        return self.holding(msg, sub)

    acks_beside = False
    """Whether a handled message's acknowledgement may be the transport's (``ack_beside``)."""

    def ack_beside(
        self,
        msg: Any,  # noqa: ANN401, ARG002 - FastStream's message
        sub: Any,  # noqa: ANN401, ARG002 - its subscriber
    ) -> Callable[[], Awaitable[None]] | None:
        """The acknowledgement of ``msg``, its handler done, if the transport sends it.

        ``None``: FastStream's own. Redis batches them beside the handlers (``redis.acks``).
        """
        return None

    async def settle_first(
        self,
        msg: Any,  # noqa: ANN401, ARG002 - FastStream's message
        sub: Any,  # noqa: ANN401, ARG002 - its subscriber
    ) -> bool:
        """Settle ``msg`` before its handler runs, if the transport must; ``False``: it runs.

        NATS: the last delivery a consumer's ``max_deliver`` allows is dead-lettered first.
        """
        return False

    async def park(
        self,
        msg: Any,  # noqa: ANN401, ARG002 - FastStream's message
        route: Route,  # noqa: ARG002 - its route
    ) -> bool:
        """Hand a message held in outage mode back; ``False``: the caller requeues it.

        NATS and Redis park it (a requeue would spend a delivery or an attempt); on
        RabbitMQ a requeue is free, so nothing is done here.
        """
        return False

    def route(self, queue: str) -> Route | None:
        """Return the route of ``queue`` if the plugin covers it: the live plan's once started."""
        live = self.live
        return (live.plan if live is not None else self.plan).route(queue)
