"""Per-broker machinery: topology, the confirming publisher and the re-check consumers.

This is the adapter to aio-pika. It publishes on channels of its own, on the broker's
robust connection, so FastStream's broker-level middlewares never see the plugin's
republishes and nothing rewrites ``app_id`` or invents ids; the re-check consumer is
written on aio-pika directly because every hop of every waiting message passes it.

The plugin reopens its own channels rather than leaving that to aio-pika's robust
channels: after a broker restart, aio-pika 10.2 now and then left a robust channel
closed for good while the connection was back, and every retry publish then failed
until the process restarted (seen in the R1 fault test, about 1 restart in 20).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aio_pika import Channel
from aio_pika.abc import AbstractIncomingMessage, ExchangeType
from pamqp import commands
from pamqp.encode import field_table as encode_table

from faststream_retry import headers as h
from faststream_retry.checks import check_broker, work_queue_findings
from faststream_retry.events import EventKind, RetryEvent, RetryHook, emit
from faststream_retry.policy import HandlerPolicy, RetryPolicy, get_handler_policy
from faststream_retry.telemetry import ATTR
from faststream_retry.tiers import (
    Tiers,
    compute_tick_ms,
    dlq_name,
    retry_queue_name,
    tier_name,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from aio_pika.abc import (
        AbstractChannel,
        AbstractQueue,
        AbstractRobustConnection,
        ConsumerTag,
    )
    from aiormq.abc import AbstractChannel as UnderlayChannel
    from faststream.rabbit import RabbitBroker

    from faststream_retry.telemetry import Telemetry

__all__ = ["QueueSpec", "Route", "Runtime", "RuntimeConfig", "now_ms"]

log = logging.getLogger("faststream_retry")


def now_ms() -> int:
    """Return the wall clock in epoch milliseconds (the unit of ``retry-due``)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """What the middleware was configured with, as the runtime needs it."""

    default: RetryPolicy
    prefix: str
    tick_ms: int | None
    max_delay_ms: int
    queue_type: str
    delivery_limit: int
    prefetch: int
    pause_s: float
    publish_timeout_s: float
    hooks: Sequence[RetryHook]
    telemetry: Telemetry


@dataclass(slots=True)
class Route:
    """An origin queue the plugin covers, and the policies of its handlers."""

    queue: str
    policies: list[tuple[Any, HandlerPolicy | None]]
    arguments: dict[str, Any] = field(default_factory=dict)
    """The origin queue's declared arguments, as its subscriber knows them."""
    retry_queue: str = field(init=False)
    dlq: str = field(init=False)

    def __post_init__(self) -> None:
        """Derive the queue names from the origin queue's name."""
        self.retry_queue = retry_queue_name(self.queue)
        self.dlq = dlq_name(self.queue)

    def enabled(self, default: RetryPolicy) -> bool:
        """Return whether any handler of the queue has retries on."""
        return any(
            (p.resolve(default) if p is not None else default).enabled for _, p in self.policies
        )

    async def policy_for(self, msg: Any) -> HandlerPolicy | None:  # noqa: ANN401 - StreamMessage
        """Return the policy of the handler that took ``msg`` (filters re-run, in order)."""
        if len(self.policies) == 1:
            return self.policies[0][1]
        for item, policy in self.policies:
            accepted = item.filter(msg)
            if asyncio.iscoroutine(accepted):
                accepted = await accepted
            if accepted:
                return policy
        return None


def _handler_policy(item: Any) -> HandlerPolicy | None:  # noqa: ANN401 - HandlerItem
    # FastStream 0.7 keeps the plain decorated function at the private
    # `_declared_call`; `_original_call` is the FastDepends-wrapped one.
    handler = getattr(item, "handler", None)
    for attr in ("_declared_call", "_original_call"):
        policy = get_handler_policy(getattr(handler, attr, None))
        if policy is not None:
            return policy
    return None


def subscriber_queue(sub: Any) -> str | None:  # noqa: ANN401 - any subscriber
    """Return the full name of the queue a Rabbit subscriber consumes, router prefix included."""
    queue = getattr(sub, "queue", None)
    name = getattr(queue, "name", None)
    if not isinstance(name, str) or not name:
        return None
    outer = getattr(sub, "_outer_config", None)
    prefix = getattr(outer, "prefix", "") or ""
    return f"{prefix}{name}"


def collect_routes(broker: RabbitBroker) -> dict[str, Route]:
    """Return the routes of every subscriber queue on ``broker``, by queue name."""
    routes: dict[str, Route] = {}
    for sub in broker.subscribers:
        queue = subscriber_queue(sub)
        if queue is None:
            continue
        arguments = getattr(getattr(sub, "queue", None), "arguments", None)
        route = routes.setdefault(
            queue, Route(queue, [], dict(arguments) if isinstance(arguments, dict) else {})
        )
        route.policies.extend((item, _handler_policy(item)) for item in sub.calls)
    return routes


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue the plugin declares: its name and arguments (always durable)."""

    name: str
    arguments: dict[str, Any]


class Publisher:
    """Publishes with ``mandatory`` and a broker confirm; a return or a nack is a failure."""

    def __init__(self, channel: Callable[[], Awaitable[UnderlayChannel]], timeout_s: float) -> None:
        """Publish on the channel ``channel()`` returns (opened with publisher confirms)."""
        self._channel = channel
        self._timeout_s = timeout_s
        # aiormq matches a basic.return to its publish by message_id; two publishes
        # of one id in flight at once (a fanout message failing in two queues)
        # could swap their outcomes, so they go one after the other.
        # A future is made only when a second publish of an id arrives (rare).
        self._inflight: dict[str, asyncio.Future[None] | None] = {}

    async def republish(
        self,
        message: AbstractIncomingMessage,
        *,
        exchange: str,
        routing_key: str,
        headers: dict[str, Any],
    ) -> bool:
        """Publish a copy of ``message`` with ``headers``; ``True`` only once confirmed.

        Never raises: whatever goes wrong means "not confirmed", and the caller keeps
        the original.
        """
        try:
            return await self.publish(
                exchange=exchange,
                routing_key=routing_key,
                body=message.body,
                properties=copy_properties(message, headers),
            )
        except Exception:  # never let a publish problem lose the original
            log.exception("could not publish a copy of message %s", message.message_id)
            return False

    async def publish(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties,
    ) -> bool:
        """Publish and return ``True`` only on a ``Basic.Ack`` for a routed message."""
        message_id = properties.message_id or ""
        while message_id in self._inflight:
            waiter = self._inflight[message_id]
            if waiter is None:
                waiter = self._inflight[message_id] = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)
        self._inflight[message_id] = None
        try:
            return await self._publish(exchange, routing_key, body, properties)
        finally:
            waiter = self._inflight.pop(message_id)
            if waiter is not None:
                waiter.set_result(None)

    async def _publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties,
    ) -> bool:
        try:
            channel = await self._channel()
            result = await channel.basic_publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
                timeout=self._timeout_s,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            # Marshalling failed before anything was sent: a header value the
            # encoder refuses. Send the headers that encode; log the rest.
            kept = _encodable(properties.headers or {})
            if kept == properties.headers:
                log.exception("publish to %r/%r failed", exchange, routing_key)
                return False
            log.warning(
                "dropping unencodable headers %s from message %s (%s)",
                sorted(set(properties.headers or {}) - set(kept)),
                properties.message_id,
                exc,
            )
            properties.headers = kept
            return await self._publish(exchange, routing_key, body, properties)
        except Exception as exc:  # any broker or connection failure means "not confirmed"
            log.warning("publish to %r/%r not confirmed: %r", exchange, routing_key, exc)
            return False
        if isinstance(result, commands.Basic.Ack):
            return True
        log.error(
            "publish to %r/%r was returned by the broker (unroutable): %r",
            exchange,
            routing_key,
            result,
        )
        return False


def _encodable(headers: Mapping[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, value in headers.items():
        try:
            encode_table({key: value})
        except Exception:  # noqa: S112 - any encoder failure means: leave it out
            continue
        kept[key] = value
    return kept


def copy_properties(
    src: AbstractIncomingMessage, headers: dict[str, Any]
) -> commands.Basic.Properties:
    """Return the properties of a republished copy of ``src``.

    Everything the application set travels unchanged, except ``expiration`` (the
    copy would expire inside a tier) and ``user_id`` (RabbitMQ refuses a publish
    whose user_id is not the connection's user). Copies are persistent. A message
    without an id gets one, kept from then on.
    """
    return commands.Basic.Properties(
        content_type=src.content_type,
        content_encoding=src.content_encoding,
        headers=headers,
        delivery_mode=2,
        priority=src.priority,
        correlation_id=src.correlation_id,
        reply_to=src.reply_to,
        message_id=src.message_id or uuid.uuid4().hex,
        timestamp=src.timestamp,
        message_type=src.type,
        app_id=src.app_id,
    )


class Runtime:
    """Everything the plugin holds for one broker."""

    def __init__(self, config: RuntimeConfig, broker: RabbitBroker) -> None:
        """Prepare; nothing touches the network before ``declare``."""
        self.config = config
        self.broker = broker
        self.routes: dict[str, Route] = {}
        self.tiers: Tiers | None = None
        self.publisher: Publisher | None = None
        self._connection: AbstractRobustConnection | None = None
        self._consume_channel: AbstractChannel | None = None
        self._publish_channel: AbstractChannel | None = None
        self._consumers: list[tuple[AbstractQueue, ConsumerTag]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._consuming = False
        # Set while both channels are open and the topology is declared on them.
        self._up = asyncio.Event()
        # Set when one of them closes; the supervisor then opens both again.
        self._down = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._specs: dict[str, QueueSpec] = {}

    @property
    def connected(self) -> bool:
        """Return whether the topology is declared and the publisher is up."""
        return self.publisher is not None

    def plan(self) -> Tiers:
        """Collect the routes and compute the tiers (no network)."""
        default = self.config.default
        self.routes = {q: r for q, r in collect_routes(self.broker).items() if r.enabled(default)}
        delays: list[int] = list(self.config.default.backoff.named_delays_ms())
        for route in self.routes.values():
            for _, policy in route.policies:
                if policy is not None:
                    delays.extend(policy.resolve(self.config.default).backoff.named_delays_ms())
        tick = compute_tick_ms(delays, self.config.tick_ms)
        self.tiers = Tiers.build(tick, self.config.max_delay_ms)
        return self.tiers

    def route(self, queue: str) -> Route | None:
        """Return the route of ``queue``, planning lazily (the in-memory test path)."""
        if self.tiers is None:
            self.plan()
        return self.routes.get(queue)

    def queue_specs(self) -> list[QueueSpec]:
        """Return every queue the plugin declares, with its arguments (after ``plan``)."""
        assert self.tiers is not None  # noqa: S101 - plan() ran
        quorum = self.config.queue_type == "quorum"
        base: dict[str, Any] = {"x-queue-type": self.config.queue_type}
        # Quorum queues dead-letter at most once by default: a message expiring out
        # of a tier while a node fails could vanish. At-least-once needs
        # reject-publish overflow (RabbitMQ >= 3.10).
        safe_dl: dict[str, Any] = (
            {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
            if quorum
            else {}
        )
        # One queue-wide TTL per tier queue: RabbitMQ expires messages only at the
        # head of a queue, so mixed per-message TTLs in one queue would hold a short
        # wait behind a long one. No routing-key override on the DLX: an expired
        # message goes back by its own key, `<queue>.retry`.
        specs = [
            QueueSpec(
                tier_name(self.config.prefix, ttl),
                {**base, "x-message-ttl": ttl, "x-dead-letter-exchange": "", **safe_dl},
            )
            for ttl in self.tiers.ttls_ms
        ]
        for route in self.routes.values():
            retry_args = dict(base)
            if quorum:
                # The re-check consumer acks and republishes, so only redeliveries
                # (a crashed consumer, a copy that could not be confirmed) count.
                # At the limit the message goes to the DLQ, never nowhere.
                retry_args |= {
                    "x-delivery-limit": self.config.delivery_limit,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": route.dlq,
                    **safe_dl,
                }
            specs.append(QueueSpec(route.retry_queue, retry_args))
            specs.append(QueueSpec(route.dlq, dict(base)))
        return specs

    async def declare(self, connection: AbstractRobustConnection) -> None:
        """Check the broker, open the plugin's channels and declare the topology.

        From here on a supervisor task watches the two channels: when one closes
        (a reconnect, a channel error) or the broker cancels a re-check consumer, it
        waits for the connection, opens both again, declares the topology again and
        restarts the re-check consumers.
        """
        tiers = self.plan()
        self._specs = {spec.name: spec for spec in self.queue_specs()}
        version = await check_broker(
            connection,
            queue_type=self.config.queue_type,
            prefix=self.config.prefix,
            exchanges=[tier_name(self.config.prefix, ttl) for ttl in tiers.ttls_ms],
            queues=self._specs.values(),
        )
        for level, text in work_queue_findings(self.routes.values(), self.config.default, version):
            log.log(level, "faststream-retry: %s", text)
        self._connection = connection
        await self._open()
        self.publisher = Publisher(self._publish_underlay, self.config.publish_timeout_s)
        self._supervisor = asyncio.create_task(self._supervise(), name="faststream-retry channels")
        log.info(
            "faststream-retry: tick %d ms, %d tiers up to %d ms, %d queues covered: %s",
            tiers.tick_ms,
            len(tiers.ttls_ms),
            tiers.ttls_ms[-1],
            len(self.routes),
            ", ".join(sorted(self.routes)) or "none",
        )

    async def _open(self) -> None:
        """Open both channels, declare the topology, and consume if consumers run."""
        connection = self._connection
        assert connection is not None  # noqa: S101 - declare() set it
        assert self.tiers is not None  # noqa: S101 - plan() ran
        timeout = _RPC_TIMEOUT_S
        # Plain channels on the robust connection: aio-pika does not restore them,
        # the supervisor does (see the module docstring).
        publish = Channel(connection, publisher_confirms=True)
        consume = Channel(connection, publisher_confirms=False)
        try:
            await publish.initialize(timeout=timeout)
            await consume.initialize(timeout=timeout)
            await consume.set_qos(prefetch_count=self.config.prefetch, timeout=timeout)
            for ttl in self.tiers.ttls_ms:
                name = tier_name(self.config.prefix, ttl)
                exchange = await publish.declare_exchange(
                    name, ExchangeType.FANOUT, durable=True, timeout=timeout
                )
                queue = await publish.declare_queue(
                    name, durable=True, arguments=self._specs[name].arguments, timeout=timeout
                )
                await queue.bind(exchange, routing_key="", timeout=timeout)
            for route in self.routes.values():
                for name in (route.retry_queue, route.dlq):
                    await publish.declare_queue(
                        name, durable=True, arguments=self._specs[name].arguments, timeout=timeout
                    )
            self._consumers.clear()
            self._publish_channel, self._consume_channel = publish, consume
            if self._consuming:
                await self._consume()
        except BaseException:
            await _close_quietly(publish, consume)
            raise
        self._down.clear()
        for channel in (publish, consume):
            channel.close_callbacks.add(self._on_channel_close)
        # The broker cancels a consumer whose queue was deleted; reopening declares
        # the queue again and consumes it.
        underlay = await consume.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(self._on_consumer_cancel)
        if publish.is_closed or consume.is_closed:  # closed before the callbacks were in
            self._down.set()
            return
        self._up.set()

    def _on_channel_close(self, channel: Any, _exc: BaseException | None) -> None:  # noqa: ANN401
        if channel is self._publish_channel or channel is self._consume_channel:
            self._up.clear()
            self._down.set()

    def _on_consumer_cancel(self, frame: Any) -> None:  # noqa: ANN401 - a pamqp frame
        log.warning(
            "faststream-retry: the broker cancelled re-check consumer %s; reopening",
            getattr(frame, "consumer_tag", "?"),
        )
        self._up.clear()
        self._down.set()

    async def _supervise(self) -> None:
        """Open the channels again whenever one of them closes, until stopped."""
        connection = self._connection
        assert connection is not None  # noqa: S101 - declare() set it
        while True:
            await self._down.wait()
            self._up.clear()
            await _close_quietly(self._publish_channel, self._consume_channel)
            attempt = 0
            while not connection.is_closed:
                attempt += 1
                try:
                    # aio-pika reconnects the connection itself; wait for it.
                    await asyncio.wait_for(connection.ready(), _RPC_TIMEOUT_S)
                    await self._open()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # broker still down, or a declare failed
                    log.log(
                        logging.WARNING if attempt % 10 == 1 else logging.DEBUG,
                        "faststream-retry: channels not reopened yet (attempt %d): %r",
                        attempt,
                        exc,
                    )
                    await asyncio.sleep(_REOPEN_PAUSE_S)
                    continue
                log.info("faststream-retry: channels reopened, topology declared again")
                break
            if connection.is_closed:
                return

    async def _publish_underlay(self) -> UnderlayChannel:
        """The publish channel, waiting up to the publish timeout while it reopens."""
        if not self._up.is_set():  # wait_for costs a task: only when it must wait
            await asyncio.wait_for(self._up.wait(), self.config.publish_timeout_s)
        channel = self._publish_channel
        assert channel is not None  # noqa: S101 - set before _up
        return await channel.get_underlay_channel()

    async def start_consumers(self) -> None:
        """Start one re-check consumer per covered queue (again after each reopen)."""
        self._consuming = True
        await self._consume()

    async def _consume(self) -> None:
        channel = self._consume_channel
        assert channel is not None  # noqa: S101 - _open() ran
        for route in self.routes.values():
            queue = await channel.declare_queue(
                route.retry_queue,
                durable=True,
                arguments=self._specs[route.retry_queue].arguments,
                timeout=_RPC_TIMEOUT_S,
            )
            tag = await queue.consume(self._recheck_callback(route), timeout=_RPC_TIMEOUT_S)
            self._consumers.append((queue, tag))

    async def stop_consumers(self) -> None:
        """Stop the re-check consumers and let their in-flight hops finish."""
        self._consuming = False
        for queue, tag in self._consumers:
            with contextlib.suppress(Exception):
                await queue.cancel(tag, timeout=_RPC_TIMEOUT_S)
        self._consumers.clear()
        if self._pending:
            await asyncio.wait(self._pending, timeout=self.config.publish_timeout_s)

    async def stop(self) -> None:
        """Stop the supervisor and the consumers, then close the channels."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        await self.stop_consumers()
        self._up.clear()
        await _close_quietly(self._consume_channel, self._publish_channel)
        self._consume_channel = self._publish_channel = None
        self.publisher = None

    def _recheck_callback(self, route: Route) -> Any:  # noqa: ANN401 - aio-pika callback
        async def on_message(message: AbstractIncomingMessage) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._pending.add(task)
            try:
                await self.recheck(route, message)
            finally:
                if task is not None:
                    self._pending.discard(task)

        return on_message

    async def _traced_republish(
        self,
        route: Route,
        message: AbstractIncomingMessage,
        *,
        kind: EventKind,
        now: int,
        due: int | None,
        ttl: int,
        exchange: str,
        key: str,
        headers: dict[str, Any],
    ) -> bool:
        """Republish one re-checked message inside its span (when tracing is on)."""
        telemetry = self.config.telemetry
        publisher = self.publisher
        if publisher is None:  # stopped under our feet
            return False
        if not telemetry.tracing:
            return await publisher.republish(
                message, exchange=exchange, routing_key=key, headers=headers
            )
        attributes: dict[str, Any] = {
            ATTR.QUEUE: route.queue,
            ATTR.MESSAGE_ID: message.message_id or "",
            ATTR.ATTEMPT: h.read_attempt(message.headers),
            ATTR.NOW_MS: now,
            ATTR.DESTINATION: exchange or key,
            ATTR.ROUTING_KEY: key,
        }
        if due is not None:
            attributes[ATTR.DUE_MS] = due
            attributes[ATTR.REMAINING_MS] = due - now
        if kind is EventKind.HOP:
            attributes[ATTR.TIER_MS] = ttl
        elif kind is EventKind.RELEASED:
            attributes[ATTR.LATENESS_MS] = now - due if due is not None else 0
        else:
            attributes |= {ATTR.REASON: "invalid", ATTR.DLQ: route.dlq}
        with telemetry.step(
            f"{route.queue} {_SPAN_SUFFIX[kind]}",
            message.headers,
            headers,
            attributes,
            prefer_current=False,
        ) as span:
            ok = await publisher.republish(
                message, exchange=exchange, routing_key=key, headers=headers
            )
            if span is not None and not ok:
                telemetry.fail(span, "the copy was not confirmed; the message is requeued")
            elif span is not None and kind is EventKind.DEAD_LETTERED:
                telemetry.fail(span, "dead-lettered: invalid retry-due")
        return ok

    async def recheck(self, route: Route, message: AbstractIncomingMessage) -> None:
        """The busy-wait step: release a due message, or send it round a tier again.

        The destination comes from the queue the message was consumed from, never
        from a header, so a forged header cannot move a message to another queue.
        """
        tiers = self.tiers
        publisher = self.publisher
        if tiers is None or publisher is None:  # stopped under our feet: redeliver
            await _settle(message, ok=False, pause_s=0)
            return
        ok = False
        kind = EventKind.HOP
        now = ttl = 0
        due: int | None = None
        try:
            now = now_ms()
            incoming = message.headers
            due = h.read_due(incoming)
            if due is None or due <= now:
                kind, exchange, key = EventKind.RELEASED, "", route.queue
                headers = h.carry_over(incoming)
            elif due - now > tiers.max_delay_ms + tiers.tick_ms:
                kind, exchange, key = EventKind.DEAD_LETTERED, "", route.dlq
                failure = h.FailureRecord(
                    attempt=h.read_attempt(incoming),
                    at_ms=now,
                    exception="faststream_retry.InvalidDueTime",
                    error=f"retry-due {due} is more than max_delay "
                    f"({tiers.max_delay_ms} ms) ahead of now ({now})",
                )
                headers = h.dead_letter_headers(
                    incoming, failure, reason="invalid", origin_queue=route.queue
                )
            else:
                ttl = tiers.pick(due - now)
                exchange, key = tier_name(self.config.prefix, ttl), route.retry_queue
                headers = h.carry_over(incoming)
            ok = await self._traced_republish(
                route,
                message,
                kind=kind,
                now=now,
                due=due,
                ttl=ttl,
                exchange=exchange,
                key=key,
                headers=headers,
            )
        except Exception:  # a hostile message must never kill the consumer
            log.exception("re-check of a message from %s failed", route.retry_queue)
        if ok:
            # Hops are the noisy path: never above DEBUG.
            log.debug(
                "re-check %s message %s from %s (due %s)",
                kind.value,
                message.message_id,
                route.retry_queue,
                due,
            )
        telemetry = self.config.telemetry
        if ok and kind is EventKind.RELEASED:
            telemetry.released.add(1, {ATTR.QUEUE: route.queue})
            if due is not None:
                telemetry.lateness.record(now - due, {ATTR.QUEUE: route.queue})
        if ok and kind is EventKind.DEAD_LETTERED:
            telemetry.dead_lettered.add(1, {ATTR.QUEUE: route.queue, ATTR.REASON: "invalid"})
            log.warning(
                "dead-lettered message %s from %s: reason=invalid (due time beyond max_delay)",
                message.message_id,
                route.retry_queue,
            )
        if ok and self.config.hooks:  # events cost nothing when nobody listens
            emit(
                self.config.hooks,
                RetryEvent(
                    kind=kind,
                    queue=route.queue,
                    message_id=message.message_id,
                    attempt=h.read_attempt(message.headers),
                    at_ms=now,
                    delay_ms=ttl or None,
                    due_ms=due,
                    lateness_ms=(now - due) if kind is EventKind.RELEASED and due else None,
                    reason="invalid" if kind is EventKind.DEAD_LETTERED else None,
                ),
            )
        await _settle(message, ok=ok, pause_s=self.config.pause_s)


# Bounds every declare, consume and cancel: a broker that does not answer must not
# hang a start, a reopen or a shutdown.
_RPC_TIMEOUT_S = 30.0
# Between attempts to reopen the channels while the broker is away.
_REOPEN_PAUSE_S = 1.0


async def _close_quietly(*channels: AbstractChannel | None) -> None:
    """Close what is open, within a bound, ignoring what is already gone."""
    for channel in channels:
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), _RPC_TIMEOUT_S)


_SPAN_SUFFIX = {
    EventKind.HOP: "retry hop",
    EventKind.RELEASED: "retry release",
    EventKind.DEAD_LETTERED: "dead-letter",
}


async def _settle(message: AbstractIncomingMessage, *, ok: bool, pause_s: float) -> None:
    """Ack after a confirmed publish; otherwise requeue, after a pause (no hot loop)."""
    try:
        if ok:
            await message.ack()
            return
        if pause_s:
            await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
        await message.nack(requeue=True)
    except Exception as exc:  # channel gone: the broker redelivers the unacked copy
        log.warning("could not settle message %s: %r", message.message_id, exc)
