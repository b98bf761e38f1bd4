"""The standalone retry worker: the plugin's retries for consumers in any language.

A work queue dead-letters what its consumer rejects into ``<prefix>.intake``; the worker
sends each message back to that queue only, after a backoff held in the delay tiers, and
dead-letters it to ``<queue>.dlq`` when its attempts are spent. It shares everything
else with the FastStream path: the tiers and the re-check consumers (``Live``), the
confirming publisher, the wire format, the spans and the metrics. Nothing is kept in
memory, so any number of replicas may consume one intake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aio_pika
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import Handler, Plan, Route, queue_specs
from faststream_retry.errors import RetryConfigError, RetryWorkerError
from faststream_retry.rabbit.channels import RPC_TIMEOUT_S, ChannelPair, close_quietly
from faststream_retry.rabbit.checks import check_broker
from faststream_retry.rabbit.connection import connect_failure, safe_url
from faststream_retry.rabbit.live import Live
from faststream_retry.rabbit.registry import registered_queues, survey
from faststream_retry.reporting.log import log
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry
from faststream_retry.worker.consumer import IntakeConsumer
from faststream_retry.worker.declare import check_intake, declare_intake

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractRobustConnection
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from faststream_retry.core.events import RetryHook
    from faststream_retry.core.worker_config import WorkerConfig

__all__ = ["DRAIN_S", "RetryWorker", "first_plan", "route_of"]

DRAIN_S = 30.0
"""How long a stopping worker waits for the copies in flight to be confirmed."""


class RetryWorker:
    """Retries dead letters of the configured work queues; run it with ``run()`` or ``async with``.

    Args:
        config: the checked configuration (``load_worker_config``).
        url: the broker; else ``RABBITMQ_URL``, else the config's ``url``.
        hooks: called with every ``RetryEvent``, as the middleware's are.
        tracer_provider: spans of each step, continuing the message's ``traceparent``.
        meter_provider: the same metrics as the middleware's.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        url: str | None = None,
        hooks: Sequence[RetryHook] = (),
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Prepare; nothing touches the network before ``start``."""
        self.config = config
        self.url = url or os.environ.get("RABBITMQ_URL") or config.url
        if not self.url:
            raise RetryConfigError(
                f"no broker to connect to: give --url, set RABBITMQ_URL, or set url in "
                f"{config.source}"
            )
        parts = urlsplit(self.url)
        if parts.scheme not in {"amqp", "amqps"} or not parts.hostname:
            # aio-pika would retry a URL without a host for ever, silently.
            raise RetryConfigError(
                f"the broker's URL is amqp://user:password@host:port/vhost (or amqps://), "
                f"got {safe_url(self.url)!r}"
            )
        self.reporter = Reporter(
            Telemetry(
                tracer_provider,
                meter_provider,
                max_delay_s=config.retry.topology.max_delay_ms / 1000,
            ),
            list(hooks),
            log_retry_traceback="never",
        )
        self.connection: AbstractRobustConnection | None = None
        self.live: Live | None = None
        self._intake: IntakeConsumer | None = None
        self._channels: ChannelPair | None = None
        self._consuming = False
        self._covering = asyncio.Lock()

    @property
    def plan(self) -> Plan:
        """Return what the worker declares and consumes now (after ``start``)."""
        if self.live is None:
            raise RetryWorkerError("the worker is not started")
        return self.live.plan

    async def start(self) -> None:
        """Connect, check and declare the topology, and start consuming.

        Raises:
            RetryWorkerError: the broker cannot be reached or refused the login.
            RetryTopologyError: a queue or exchange exists with other arguments, or the
                user may not declare it (each named, with the fix).
        """
        connection = self.connection = await self._connect()
        try:
            # aio-pika reconnects by itself and says little; an operator wants both lines.
            connection.close_callbacks.add(_lost)
            connection.reconnect_callbacks.add(_back)
            topology = await self._prepare(connection)
            live = self.live = Live(topology, connection, self.config.retry, self.reporter)
            await live.open()
            await live.start_consumers()
            # Declares the registry and records the queues covered: status, doctor, and
            # this worker's next start (for queues a pattern names) read it.
            await survey(connection, topology, topology.routes)
            await self._warn_missing(connection, list(topology.routes))
            self._intake = IntakeConsumer(
                self.config,
                lambda: self.plan,
                self._cover,
                live.publisher,
                self.reporter,
                requeues=live.requeues,
            )
            self._channels = ChannelPair(
                connection,
                prefetch=self.config.retry.prefetch,
                wait_s=self.config.retry.publish_timeout_s,
                on_open=self._on_open,
            )
            self._consuming = True
            await self._channels.open()
        except BaseException:
            await self.stop(0)
            raise
        tiers = topology.tiers
        log.info(
            "faststream-retry worker: consuming %s; tick %s, %d tiers up to %s; queues: %s",
            self.config.intake,
            format_ms(tiers.tick_ms),
            len(tiers.ttls_ms),
            format_ms(tiers.ttls_ms[-1]),
            ", ".join(e.name or f"{e.pattern} (pattern)" for e in self.config.queues),
        )

    async def declare(self) -> Plan:
        """Declare what the worker needs, as its start does, then disconnect; consume nothing.

        The intake (exchange, queue, binding) and its DLQ, the delay tiers, and the
        ``.retry`` and ``.dlq`` of each queue the config names (and of those a pattern
        named before), checked as at start. From then on a queue that dead-letters into
        the intake loses nothing, whether a worker runs or not: its dead letters wait in
        the intake queue. Safe to run again (a deploy step, an init container).
        Returns the plan declared.

        Raises:
            RetryWorkerError: the broker cannot be reached or refused the login.
            RetryTopologyError: as ``start``.
        """
        connection = await self._connect()
        try:
            topology = await self._prepare(connection)
            await survey(connection, topology, topology.routes)
            await self._warn_missing(connection, list(topology.routes))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), RPC_TIMEOUT_S)
        return topology

    async def _connect(self) -> AbstractRobustConnection:
        try:
            return await aio_pika.connect_robust(self.url, timeout=RPC_TIMEOUT_S)
        except Exception as exc:  # refused, unreachable, a wrong vhost: one line says which
            raise RetryWorkerError(connect_failure(self.url or "", exc)) from exc

    async def _prepare(self, connection: AbstractRobustConnection) -> Plan:
        """Plan, check the broker and declare every object once (creating those missing)."""
        topology = await self._first_plan(connection)
        await check_broker(connection, topology)
        await check_intake(connection, self.config)
        return topology

    async def stop(self, wait_s: float = DRAIN_S) -> None:
        """Stop taking dead letters, let those in flight settle (up to ``wait_s``), disconnect."""
        self._consuming = False
        channels, self._channels = self._channels, None
        if channels is not None:
            await channels.stop_supervising()
            channels.forget_consumers()
        if self._intake is not None:
            await self._intake.stop(wait_s)
        if channels is not None:
            await channels.close()
        live, self.live = self.live, None
        if live is not None:
            await live.close()
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), RPC_TIMEOUT_S)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Start, run until ``stop`` is set or SIGTERM/SIGINT arrives, then drain and stop."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        try:
            # A signal during the start (a slow broker, a long check) stops it too.
            starting = asyncio.ensure_future(self.start())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                log.info("faststream-retry worker: stopped while starting")
                return
            stopping.cancel()
            starting.result()  # the start's error, if any
            await stop.wait()
            log.info("faststream-retry worker: stopping; letting the messages in flight settle")
        finally:
            await self.stop()
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def __aenter__(self) -> RetryWorker:  # noqa: PYI034 - Self needs typing_extensions
        """Start the worker."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the worker, draining what is in flight."""
        await self.stop()

    async def _first_plan(self, connection: AbstractRobustConnection) -> Plan:
        return await first_plan(connection, self.config)

    async def _cover(self, queue: str) -> Route:
        """Return ``queue``'s route; a new one's queues are declared and its ``.retry`` consumed."""
        live = self.live
        if live is None:
            raise RetryWorkerError("the worker is stopping")
        known = live.plan.route(queue)
        if known is not None:
            return known
        async with self._covering:
            route = await live.cover(self._route(queue), "its first dead letter arrived")
            await live.consume(route)
            return route

    def _route(self, queue: str) -> Route:
        return route_of(self.config, queue)

    async def _on_open(self, publish: AbstractChannel, consume: AbstractChannel) -> None:
        # Every (re)open: the intake may have been deleted meanwhile.
        await declare_intake(publish, self.config)
        if self._consuming and self._intake is not None and self._channels is not None:
            self._channels.track(await self._intake.start(consume))

    async def _warn_missing(self, connection: AbstractRobustConnection, queues: list[str]) -> None:
        """Warn of named work queues that do not exist: nothing can dead-letter from them yet."""
        for queue in queues:
            channel = await connection.channel()
            try:
                await channel.declare_queue(queue, passive=True, timeout=RPC_TIMEOUT_S)
            except ChannelNotFoundEntity:
                log.warning(
                    "faststream-retry worker: queue %r does not exist (yet); its dead letters "
                    "are retried once it exists and dead-letters into %r",
                    queue,
                    self.config.intake,
                )
            except Exception as exc:  # a diagnosis must not stop the worker
                log.debug("could not look at %r: %r", queue, exc)
            finally:
                await close_quietly(channel)


async def first_plan(connection: AbstractConnection, config: WorkerConfig) -> Plan:
    """Plan the named queues, and those a pattern names that the registry recorded earlier.

    A queue a pattern names is covered when its first dead letter arrives; after a
    restart its ``.retry`` may still hold waiting messages, so it is consumed from
    the start again.
    """
    options = config.retry.topology
    tiers = config.tiers
    queues = set(config.names)
    if any(e.pattern is not None for e in config.queues):
        registry = await registered_queues(connection, config.prefix)
        queues |= {q for q in registry.queues if config.rules(q) is not None}
    routes = {q: route_of(config, q) for q in sorted(queues)}
    return Plan(options, tiers, routes, queue_specs(tiers, routes.values(), options))


def route_of(config: WorkerConfig, queue: str) -> Route:
    """Return the route of an allowlisted queue, whose arguments the worker cannot see."""
    rules = config.rules(queue)
    return Route(queue, (Handler(None),), known=rules is not None and rules.direct_release)


def _lost(_connection: object, *args: object) -> None:
    exc = args[0] if args else None
    # None or a cancellation: closed on purpose, by stop().
    if isinstance(exc, BaseException) and not isinstance(exc, asyncio.CancelledError):
        log.warning("faststream-retry worker: lost the broker (%r); reconnecting", exc)


def _back(_connection: object, *_args: object) -> None:
    log.info("faststream-retry worker: reconnected to the broker")
