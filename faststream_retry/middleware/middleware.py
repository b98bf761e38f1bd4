"""The FastStream middleware: the configuration, and the per-message scope that owns a failure.

``RetryMiddleware`` is configuration only; FastStream calls it for every message and it
builds a ``_RetryScope``. The scope does nothing on success. When the handler raises, it
resolves the message (``delivery``), decides (``core.decision.decide``) and hands the
decision to its broker's sink (``sink``: a copy published with a broker confirm, the
original acked only then; ``test_mode`` under ``TestRabbitBroker``,
``nats.test_mode`` under ``TestNatsBroker`` and ``redis.test_mode`` under
``TestRedisBroker``, inside a ``testing()`` block: outside one
the scope leaves a test broker's messages alone; ``nats.sink`` on a ``NatsBroker``;
``redis.sink`` on a ``RedisBroker``, one script that acknowledges the entry and writes
its copy), and re-raises so FastStream never publishes the failed call's "result".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
from typing import TYPE_CHECKING, Any, overload

from faststream import BaseMiddleware, SourceType
from faststream.exceptions import IgnoredException
from faststream.specification import AsyncAPI

from faststream_retry.core import defaults
from faststream_retry.core import headers as h
from faststream_retry.core.config import RetryConfig
from faststream_retry.core.decision import Action, Decision, decide
from faststream_retry.core.events import RetryEvent, RetryHook
from faststream_retry.errors import RetryConfigError, RetryTopologyError
from faststream_retry.middleware import _internals, checks, settled
from faststream_retry.middleware.delivery import Delivery
from faststream_retry.middleware.gate import gate_of
from faststream_retry.middleware.plugin import Covered, Plugin
from faststream_retry.middleware.schema import RetrySpecification
from faststream_retry.middleware.sink import requeue_after_pause
from faststream_retry.middleware.testing import RetryRecorder, Testing
from faststream_retry.outages import Requeue
from faststream_retry.reporting.log import log
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence
    from datetime import timedelta
    from types import TracebackType

    from faststream._internal.context import ContextRepo
    from faststream.message import StreamMessage
    from faststream.nats import NatsBroker
    from faststream.rabbit import RabbitBroker
    from faststream.redis import RedisBroker
    from faststream.specification.base import SpecificationFactory
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from typing_extensions import Self

    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.core.topology import Route
    from faststream_retry.middleware.nats.runtime import NatsRuntime
    from faststream_retry.middleware.planned import Planned
    from faststream_retry.middleware.rabbit.runtime import Runtime
    from faststream_retry.middleware.redis.runtime import RedisRuntime
    from faststream_retry.middleware.sink import Sink
    from faststream_retry.outages import Gate

__all__ = ["RetryMiddleware"]


class RetryMiddleware:
    """Retries for a FastStream ``RabbitBroker``, held by RabbitMQ itself.

    On a ``NatsBroker`` it covers the JetStream subscribers, their retries held by
    JetStream (``faststream_retry.nats``; a first slice: docs/explanation/nats-design.md
    says what it does not do yet). On a ``RedisBroker`` it covers the stream subscribers
    read in a consumer group (``StreamSub(stream, group=..., consumer=...)``), their
    retries held by Redis in a sorted set per stream and dead letters in
    ``{<stream>}.dlq`` (``faststream_retry.redis``; a first slice:
    docs/explanation/redis-design.md). A pub/sub channel, a list, or a stream read
    without a group, with retries on, is refused at start with the fix. Under
    ``TestRabbitBroker``, ``TestNatsBroker`` and ``TestRedisBroker`` it runs in test mode
    inside ``testing()``. It picks its transport from the broker.

    Pass it in ``RabbitBroker(middlewares=[retry])``: the plugin starts at the first
    message the broker consumes (it plans, checks and declares its topology, then
    starts its re-check consumers) before the handler sees it. ``retry.install(broker)``
    before the broker starts does that at the broker's start instead.

    Args:
        default: the policy of handlers without ``@retry_policy`` and the base of
            those with it.
        prefix: the prefix of the shared delay tiers (``<prefix>.delay.<ms>``).
        tick: the base tier's TTL. ``None``: the GCD of the delays the policies
            name, at least 100 ms.
        max_delay: bounds every delay, ``RetryLater``'s too (a longer one is cut to
            it, with a WARNING once per handler); the tiers reach up to it. At most
            2**32 - 1 ms (about 49.7 days), RabbitMQ's longest queue TTL.
        queue_type: ``"quorum"`` (the default) or ``"classic"`` for every queue the
            plugin declares (tiers, ``<queue>.retry``, ``<queue>.dlq``). Quorum tiers
            dead-letter at least once, so a broker crash or restart loses no waiting
            message; quorum needs RabbitMQ 3.10 or later. Classic queues dead-letter
            at most once: pass ``"classic"`` for an older broker, or to keep the
            classic queues an earlier version of the plugin declared.
        delivery_limit: ``x-delivery-limit`` of the quorum ``<queue>.retry`` queues.
            The re-check consumer acks and republishes, so only redeliveries spend
            it (a crashed consumer, a copy the broker would not confirm); at the
            limit RabbitMQ moves the message to ``<queue>.dlq``.
        prefetch: unacked messages per re-check consumer channel.
        publish_failure_pause: how long a message whose copy could not be confirmed
            is held before its copy is placed again (no hot loop while the broker is
            sick; the handler is not run again), up to ``delivery_limit`` times.
        publish_timeout: how long to wait for a broker confirm; at least 1 s (a copy
            whose confirm comes later is published again: a duplicate).
        log_retry_traceback: which retry log lines carry the failure's traceback:
            ``"first"`` (a message's first failure only: it says what went wrong,
            and the next failures of an outage repeat it), ``"every"`` or ``"never"``.
            A dead letter is always logged at ERROR with its traceback; a
            ``RetryLater`` (the handler saying when, not a failure) never is.
        outage_after: consecutive transient failures on one work queue that switch it
            into outage mode: its messages are held (unacked, as many as the
            subscriber's prefetch lets in) and one per ``outage_probe`` goes on as a
            probe; the first success ends the mode. A success resets the count, a
            permanent failure leaves it. ``None`` (the default): off. Each process
            decides alone. Set a prefetch on the subscriber's channel with it.
        outage_probe: the interval between probes in outage mode (at least 100 ms).
            ``None``: the tick.
        outage_hold: how long a message may wait in outage mode before it is
            requeued (a quorum work queue counts that as a delivery). Keep it below
            RabbitMQ's ``consumer_timeout`` (30 min by default).
        claim_idle: Redis only: how long a stream entry stays pending without its replica
            keeping it alive (the replica was killed, froze, or Redis refused its step)
            before any replica claims it, counting the lost delivery as a failed attempt
            (at least 1 s). A live replica keeps the entries it holds alive every quarter
            of it, however long their handlers run.
        dlq_max_length: Redis and NATS: how many dead letters each dead-letter stream
            keeps (one per covered stream). **Past it the oldest letters are deleted**
            to make room for new ones: Redis trims near it (``XADD ... MAXLEN ~``, so the
            stream may run over by up to one node, 100 entries by default), NATS
            exactly (the stream's ``max_msgs``, discarding the oldest). ``None``: no
            cap, the letters stay until replayed or purged (watch the memory: Redis
            keeps them in RAM). Not applied on RabbitMQ, whose ``<queue>.dlq`` is
            never capped by the plugin (a ``max-length`` policy does that).
        hooks: callables that receive every ``RetryEvent``, called synchronously
            (an ``async def`` hook is refused: it would never run).
        tracer_provider: OpenTelemetry tracer provider for the plugin's spans
            (default: the global one; with no SDK configured no span is made).
        meter_provider: OpenTelemetry meter provider (default: the global one).
    """

    def __init__(
        self,
        default: RetryPolicy | None = None,
        *,
        prefix: str = defaults.PREFIX,
        tick: timedelta | float | None = None,
        max_delay: timedelta | float = defaults.MAX_DELAY,
        queue_type: str = defaults.QUEUE_TYPE,
        delivery_limit: int = defaults.DELIVERY_LIMIT,
        prefetch: int = defaults.PREFETCH,
        publish_failure_pause: timedelta | float = defaults.PUBLISH_FAILURE_PAUSE,
        publish_timeout: timedelta | float = defaults.PUBLISH_TIMEOUT,
        log_retry_traceback: str = defaults.LOG_RETRY_TRACEBACK,
        outage_after: int | None = None,
        outage_probe: timedelta | float | None = None,
        outage_hold: timedelta | float = defaults.OUTAGE_HOLD,
        claim_idle: timedelta | float = defaults.CLAIM_IDLE,
        dlq_max_length: int | None = defaults.DLQ_MAX_LENGTH,
        hooks: Sequence[RetryHook] = (),
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Validate the configuration; see the class docstring."""
        config = RetryConfig.build(
            default,
            prefix=prefix,
            tick=tick,
            max_delay=max_delay,
            queue_type=queue_type,
            delivery_limit=delivery_limit,
            prefetch=prefetch,
            publish_failure_pause=publish_failure_pause,
            publish_timeout=publish_timeout,
            log_retry_traceback=log_retry_traceback,
            outage_after=outage_after,
            outage_probe=outage_probe,
            outage_hold=outage_hold,
            claim_idle=claim_idle,
            dlq_max_length=dlq_max_length,
        )
        if not all(callable(hook) for hook in hooks):
            raise RetryConfigError("hooks takes callables that accept a RetryEvent")
        for hook in hooks:
            _refuse_async(hook)
        self._hooks: list[RetryHook] = list(hooks)
        reporter = Reporter(
            Telemetry(
                tracer_provider, meter_provider, max_delay_s=config.topology.max_delay_ms / 1000
            ),
            self._hooks,
            log_retry_traceback=config.log_retry_traceback,
        )
        self._testing = Testing(self._hooks)
        self._plugin = Plugin(config, reporter, self._testing)
        self._plugin.middleware = self

    @property
    def default(self) -> RetryPolicy:
        """Return the default policy."""
        return self._plugin.config.default

    @property
    def prefix(self) -> str:
        """Return the prefix of the delay tiers."""
        return self._plugin.config.topology.prefix

    def install(self, broker: Covered) -> Covered:
        """Start the plugin with ``broker``, rather than at the first message it consumes.

        Optional: without it the plugin starts at the broker's first message. With it,
        an app the plugin must not run in (two instances, a queue declared with other
        arguments, missing permissions) refuses to start, instead of holding its
        messages; and copies that waited in ``<queue>.retry`` while the app was down
        are released at once, not at the first message.

        Idempotent. Call it before the broker starts, before or after the
        subscribers are declared: the topology is planned and declared when the
        broker starts, from the subscribers it has then. Adds the middleware to the
        broker if it was not passed in ``middlewares=``. Returns the broker.

        Raises:
            RetryConfigError: another ``RetryMiddleware`` is installed on ``broker``,
                or the installed FastStream lacks an internal the plugin needs.
        """
        self._plugin.install(broker, self)
        return broker

    def asyncapi(self, specification: SpecificationFactory | None = None) -> SpecificationFactory:
        """Return the app's AsyncAPI factory, whose document also shows where failed messages go.

        Pass it to the app: ``FastStream(broker, specification=retry.asyncapi())``, or
        ``retry.asyncapi(AsyncAPI(title=...))`` to keep your own. The document
        ``faststream docs gen`` writes then has, for each queue the plugin covers on a
        broker this middleware is on, a ``<queue>.dlq`` channel (router prefix included)
        that the service sends to, whose message is the work queue's with the
        ``retry-*`` headers of a dead letter. Subscribers with retries off, and those
        left out of the document, get none. Works with or without ``install()``:
        nothing is registered on the broker, and the broker is never started.

        Args:
            specification: the factory to extend; ``None``: FastStream's default,
                ``AsyncAPI()``.
        """
        inner = specification if specification is not None else AsyncAPI()
        return RetrySpecification(inner, self._plugin.config, self)

    @overload
    def runtime(self, broker: RabbitBroker) -> Runtime: ...
    @overload
    def runtime(self, broker: NatsBroker) -> NatsRuntime: ...
    @overload
    def runtime(self, broker: RedisBroker) -> RedisRuntime: ...
    def runtime(
        self, broker: RabbitBroker | NatsBroker | RedisBroker
    ) -> Runtime | NatsRuntime | RedisRuntime:
        """Return this middleware's state for ``broker`` (plan, channels, consumers)."""
        return self._plugin.runtime(broker)

    def add_hook(self, hook: RetryHook) -> None:
        """Start calling ``hook`` with every ``RetryEvent``."""
        if not callable(hook):
            raise RetryConfigError("add_hook takes a callable that accepts a RetryEvent")
        _refuse_async(hook)
        self._hooks.append(hook)

    def remove_hook(self, hook: RetryHook) -> None:
        """Stop calling ``hook`` (added by ``add_hook`` or in ``hooks=``)."""
        self._hooks.remove(hook)

    @contextlib.contextmanager
    def testing(self, *, raise_on_dead_letter: bool = False) -> Iterator[RetryRecorder]:
        """Run the plugin's test mode under a test broker for the block, and record it.

        Under ``TestRabbitBroker``, ``TestNatsBroker`` or ``TestRedisBroker`` (no real
        broker, no TTL) the
        plugin stays out of the way outside such a block: a test sees what it would see
        without the plugin, the handler called once and its exception raised from
        ``publish()``. Inside
        the block it runs in test mode: decisions are made exactly as in production,
        delays are computed but not waited for (the handler is called again at once),
        and a dead letter settles the message and goes to the app's ``<queue>.dlq``
        subscriber if it has one (on NATS: to the subscribers of ``<prefix>.dlq.<key>``,
        its ``retry-*`` headers as JSON text, as the dead-letter stream holds them; on
        Redis: to the subscribers of the stream's ``{<stream>}.dlq``, its headers as text).
        On NATS and Redis the broker's subscribers are first checked as at a real start:
        a wiring the plugin would refuse (a core-NATS subscriber, a Redis channel or list,
        with retries on) raises its ``RetryConfigError`` from ``publish()``. The recorder
        it yields sees those decisions::

            async with TestRabbitBroker(broker) as br:
                with retry.testing() as recorder:
                    await br.publish({"to": "x"}, queue="email-queue")
            assert recorder.scheduled[0].delay_ms == 1000
            assert recorder.dead_letters[0].reason == "exhausted"

        Args:
            raise_on_dead_letter: re-raise the last exception of a dead-lettered
                message from ``publish()``, as ``TestRabbitBroker`` does for a
                handler without the plugin, so ``pytest.raises`` tests keep
                working. A retry that ends in success raises nothing. If the
                app's ``<queue>.dlq`` subscriber raises on the dead letter, that
                exception is raised instead (its ``__cause__`` is the handler's).
        """
        if not isinstance(raise_on_dead_letter, bool):
            raise RetryConfigError(
                f"raise_on_dead_letter must be True or False, got {raise_on_dead_letter!r}"
            )
        with self._testing.block(raise_on_dead_letter=raise_on_dead_letter) as recorder:
            yield recorder

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _RetryScope:  # noqa: ANN401
        """Build the per-message scope (FastStream calls this for every message)."""
        return _RetryScope(msg, context=context, plugin=self._plugin)


def _refuse_async(hook: object) -> None:
    """Refuse a hook that would return a coroutine, never awaited: it would never run."""
    call = getattr(hook, "__call__", None)  # noqa: B004 - an instance's async __call__ too
    if any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in (hook, call)):
        raise RetryConfigError(
            f"hook {hook!r} is async: hooks are called synchronously, so it would never run. "
            "Pass a plain function; for async work, start a task from it, e.g. "
            "asyncio.get_running_loop().create_task(work(event))"
        )


class _RetryScope(BaseMiddleware):
    """The per-message part: does nothing on success and carries a failure through."""

    # One of these is built for every message: no per-instance __dict__.
    __slots__ = ("_plugin", "_settled", "_success")

    def __init__(
        self,
        msg: Any,  # noqa: ANN401 - the raw aio-pika message
        /,
        *,
        context: ContextRepo,
        plugin: Plugin,
    ) -> None:
        super().__init__(msg, context=context)
        self._plugin = plugin
        self._settled = False
        self._success: Callable[[], Awaitable[None]] | None = None
        """The transport's acknowledgement of a success, run on the way out (no guard)."""

    async def consume_scope(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        if msg.source_type is not SourceType.CONSUME or not _claim(msg):
            # Another scope of this message (the same middleware on a router and on
            # the broker, say) owns its failure: one decision, one copy.
            return await call_next(msg)
        broker, sub = _internals.broker_and_subscriber(self.context)
        runtime = None if broker is None else self._plugin.runtime(broker)
        if (
            runtime is not None
            and not runtime.started
            and not await self._before_start(broker, runtime, sub, msg)
        ):
            return await call_next(msg)  # FastStream's, untouched
        if h.DUE in msg.headers:
            await self._arrived(msg)
        # Every message of the broker passes here: no coroutine of the plugin's own is
        # started between FastStream's and the handler's on a success.
        call = call_next
        held = _NOTHING if runtime is None else runtime.entering(msg, sub)
        if held is None and runtime is not None:  # the transport may settle it first
            held, call = await self._settle_first(runtime, msg, sub, call_next)
        with held or _NOTHING:
            if self._plugin.config.outage is not None:
                result = await self._through_gate(call, msg)
            else:
                try:
                    result = await call(msg)
                except IgnoredException:
                    raise  # FastStream's own Ack/Nack/RejectMessage: the handler decided
                except (Exception, asyncio.CancelledError) as exc:
                    # _handle's, in line: a success starts no coroutine more.
                    if not self._is_failure(exc, msg):
                        raise  # the task is being cancelled: the message goes back
                    result = await self._on_failure(call, msg, exc, None, None)
        if runtime is not None and runtime.acks_beside and msg.committed is None:
            self._ack_beside(runtime, msg, sub)
        return result

    async def _before_start(
        self,
        broker: Any,  # noqa: ANN401 - any broker
        runtime: Runtime | NatsRuntime | RedisRuntime,
        sub: Any,  # noqa: ANN401 - its subscriber
        msg: StreamMessage[Any],
    ) -> bool:
        """A message before the plugin started on its broker; ``False``: left to FastStream."""
        if runtime.bypass is not None or not self._covers(broker, runtime):
            return False
        if _internals.under_test_broker(broker):
            if not self._plugin.testing.active:
                # A test that did not ask for test mode sees what it would see
                # without the plugin: the handler's exception out of publish().
                return False
            # For the next messages (see settled): the start is faked.
            settled.guard(broker, self._plugin.middleware)
            self._plugin.start_test(broker)
        # A subscriber's message: get_one() and iterators are not the plugin's.
        elif sub is not None:
            await self._start_late(broker, msg)
        return True

    async def _arrived(self, msg: StreamMessage[Any]) -> None:
        """A retry copy arrived: report its release."""
        try:
            self._report_arrival(msg)
        except BaseException:
            # An application's own BaseException from a hook or a log handler,
            # before the handler ran: it goes on, but the message goes back to
            # its queue first (FastStream would reject it: lost without a DLX).
            with contextlib.suppress(Exception):
                await msg.nack()
            raise

    @staticmethod
    async def _settle_first(
        runtime: Planned,
        msg: StreamMessage[Any],
        sub: Any,  # noqa: ANN401 - its subscriber
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
    ) -> tuple[
        contextlib.AbstractContextManager[None], Callable[[StreamMessage[Any]], Awaitable[Any]]
    ]:
        """What wraps the handler's call, and the call: nothing to call if it was settled."""
        if await runtime.settle_first(msg, sub):
            return _NOTHING, _settled_first
        return runtime.holding(msg, sub), call_next

    def _ack_beside(self, runtime: Planned, msg: StreamMessage[Any], sub: Any) -> None:  # noqa: ANN401 - its subscriber
        """Leave a handled message's acknowledgement to its transport (``Planned.ack_beside``).

        Run by the guard where FastStream's own would come (``settled.on_success``), or
        by this scope's exit if it is the guard (the first of the broker's middlewares); a
        message settled already (a failure's step, the handler's own ack) has none.
        Otherwise (a stack built before the guard was in place) FastStream's own.
        """
        ack = runtime.ack_beside(msg, sub)
        if ack is not None and not settled.on_success(self.msg, ack) and self._outermost(sub):
            self._success = ack

    async def _handle(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
        delivery: Delivery | None = None,
        gate: Gate | None = None,
    ) -> Any:  # noqa: ANN401 - the handler's result
        """Call the handler; a failure goes on to ``_on_failure`` with what the gate resolved."""
        try:
            return await call_next(msg)
        except IgnoredException:
            raise  # FastStream's own Ack/Nack/RejectMessage: the handler decided
        except (Exception, asyncio.CancelledError) as exc:
            if not self._is_failure(exc, msg):
                raise  # the task is being cancelled: the app stops, the message goes back
            return await self._on_failure(call_next, msg, exc, delivery, gate)

    def _is_failure(self, exc: Failure, msg: StreamMessage[Any]) -> bool:
        """Whether ``exc`` is the handler's failure (``_failed``); a spurious cancel said once."""
        if not _failed(exc):
            return False
        if isinstance(exc, asyncio.CancelledError):
            self._warn_spurious(msg)
        return True

    def _covers(self, broker: Any, runtime: Runtime | NatsRuntime | RedisRuntime) -> bool:  # noqa: ANN401 - any broker
        """Whether the plugin runs on ``broker``; if not, said once, and its messages pass.

        A broker other than a ``RabbitBroker``, a ``NatsBroker`` or a ``RedisBroker``
        (Kafka, MQTT, ...): the plugin would run a topology check on a client it does not
        know, and hold its messages.
        """
        text = checks.unsupported(broker)
        if text is None:
            return True
        runtime.bypass = text
        self._plugin.reporter.error_once(("unsupported", id(broker)), "faststream-retry: %s", text)
        return False

    async def _start_late(self, broker: Any, msg: StreamMessage[Any]) -> None:  # noqa: ANN401 - a RabbitBroker
        """Start the plugin on a broker that consumes without ``install()``, before this message.

        Wired so that the plugin must not run (what would stop an installed start): the
        message is held, unacked, and so is every later one, with one ERROR that names
        the fix; nothing is lost and nothing loops. The broker unreachable: the message
        goes back to its queue after a pause, and the next one tries again.
        """
        try:
            await self._plugin.start_late(broker)
        except (RetryConfigError, RetryTopologyError) as refused:
            self._plugin.reporter.error_once(
                ("refused", id(broker)),
                "faststream-retry cannot run on this broker, so it holds its messages "
                "unacked (they go back to their queues when the app stops): %s",
                refused,
            )
            await asyncio.Event().wait()  # until the app stops and cancels the handler
        except Exception:
            log.exception(
                "faststream-retry could not start on this broker; requeueing message %s",
                msg.message_id,
            )
            await self._requeue_after_pause(msg, self._plugin.config.pause_s)
            raise

    def _warn_spurious(self, msg: StreamMessage[Any]) -> None:
        sub = _internals.current_subscriber(self.context)
        queue = (_internals.queue_of(sub) if sub is not None else None) or "?"
        self._plugin.reporter.warn_once(
            ("cancelled", queue),
            "a handler of %s raised asyncio.CancelledError (message %s) while its task was "
            "not being cancelled: a timeout or task library misused? It is taken as the "
            "handler's failure, retried and dead-lettered as its policy says (said once "
            "per queue)",
            queue,
            msg.message_id,
        )

    def _report_arrival(self, msg: StreamMessage[Any]) -> None:
        """Report a release the broker made: the copy expired out of its last tier into this queue.

        Copies the re-check consumer released are reported there; these come back
        with RabbitMQ's ``x-death`` of a tier instead, and their lateness is what the
        handler sees. A redelivery was reported on its first delivery. On Redis every
        copy that arrives is one the mover put back when due. Never raises.
        """
        try:
            raw = msg.raw_message
            broker = _internals.current_broker(self.context)
            runtime = None if broker is None else self._plugin.runtime(broker)
            live = None if runtime is None else runtime.live
            if live is None or runtime is None:
                return
            # Redis: the mover put the copy back when due, and a stream never redelivers.
            if not runtime.releases_on_arrival and (
                h.expired_from(msg.headers) not in live.plan.exchanges
                or getattr(raw, "redelivered", True)  # a NATS message has none: never a tier's
            ):
                return
            sub = _internals.current_subscriber(self.context)
            queue = _internals.queue_of(sub) if sub is not None else None
            if queue is None:
                return
            now, due = h.now_ms(), h.read_due(msg.headers)
            event = RetryEvent.released(
                queue=queue,
                message_id=msg.message_id,
                attempt=h.read_attempt(msg.headers),
                at_ms=now,
                due_ms=due,
                lateness_ms=None if due is None else now - due,
            )
            headers = msg.headers
            runtime.reporter.record(event, incoming=headers, onward=headers)
        except Exception:  # reporting never decides a message's fate
            log.exception("faststream-retry could not report the arrival of %s", msg.message_id)

    async def _through_gate(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        """Outage mode (``outage_after``): resolve the message, wait at its queue's gate, handle it.

        Only a message of a covered queue on a running broker has a gate (test mode
        has none). Its resolution goes on with it: a failure does not resolve it again.
        """
        delivery = await self._resolve_live(msg)
        gate = None if delivery is None else gate_of(delivery)
        if gate is None or delivery is None:
            return await self._handle(call_next, msg, delivery)
        try:
            probe = await gate.enter()
        except Requeue:
            # Held too long, or the broker stops: back to its queue, handler not called.
            await self._hand_back(msg, delivery)
            raise
        try:
            result = await self._handle(call_next, msg, delivery, gate)
            gate.succeeded(msg.message_id)
        finally:
            gate.leave(probe)
        return result

    async def _hand_back(self, msg: StreamMessage[Any], delivery: Delivery) -> None:
        """Hand a held message back: parked where its transport parks (NATS, Redis), else requeued.

        A park spends no attempt and no redelivery; one that fails falls back to the requeue.
        """
        try:
            parked = await delivery.runtime.park(msg, delivery.route)
        except Exception:
            log.exception("faststream-retry could not park held message %s", msg.message_id)
            parked = False
        if parked:
            self._settled = True
            return
        await self._requeue_after_pause(msg, 0)

    async def _resolve_live(self, msg: StreamMessage[Any]) -> Delivery | None:
        """Resolve ``msg`` on a running broker; ``None``: its subscriber or route is unknown.

        None for a message without its subscriber, a broker the plugin has not
        started (test mode) and a queue the plan does not cover.
        """
        broker = _internals.current_broker(self.context)
        sub = _internals.current_subscriber(self.context)
        if broker is None or sub is None:
            return None
        runtime = self._plugin.runtime(broker)
        live = runtime.live
        route = None if live is None else live.plan.route(_internals.queue_of(sub) or "")
        if route is None:
            return None
        return Delivery.of(runtime, route, await _internals.select_policy(route, msg))

    async def _on_failure(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
        exc: Failure,
        delivery: Delivery | None,
        gate: Gate | None,
    ) -> Any:  # noqa: ANN401 - the handler's result
        """Decide, and carry the decision out through the runtime's sink, until it settles.

        ``delivery`` and ``gate``: what outage mode resolved before the handler ran.
        The failure that ends it goes on up to FastStream (``after_processed`` tells it
        whether the plugin settled the message).
        """
        failure, result = await self._carry(call_next, msg, exc, delivery, gate)
        if failure is None:
            return result
        try:
            raise failure
        finally:
            # The failure's traceback holds this frame: a name for the failure left in
            # it would be a cycle, and every failure (its frames, the message, FastStream's
            # whole stack of it) would wait for the cyclic collector instead of being
            # freed on the spot. Measured: 60 objects of garbage per failure, 0 without.
            del failure, exc

    async def _carry(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
        exc: Failure,
        delivery: Delivery | None,
        gate: Gate | None,
    ) -> tuple[Failure | None, Any]:
        """Carry a failure out; return the failure to raise, or ``None`` and the handler's result.

        The failure is returned, not raised, and not left in a name of this frame: an
        in-process retry's failure has this frame in its traceback (see ``_on_failure``).
        """
        owner = await self._owner(msg, exc, delivery)
        if owner is None or not owner[0].enabled:
            return exc, None
        delivery, sink = owner
        route = delivery.route
        attempt = h.read_attempt(msg.headers)
        failure = [exc]  # popped when returned: the one reference this frame holds
        del exc
        while True:
            attempt += 1
            decision = await self._decide(msg, failure[0], attempt, delivery, gate)
            if decision.action is Action.DEAD_LETTER:
                self._settled = await sink.dead_letter(msg, route, decision, failure[0])
                return failure.pop(), None
            if not await sink.retry(msg, route, decision, failure[0]):
                self._settled = True  # its copy holds it
                return failure.pop(), None
            try:
                return None, await call_next(msg)
            except IgnoredException:
                raise
            except (Exception, asyncio.CancelledError) as again:
                if not _failed(again):
                    raise
                failure[0] = again  # the retried call failed too: decide again
            if _settled_by_handler(msg):
                self._warn_settled(route.queue, msg, failure[0])
                return failure.pop(), None

    async def _decide(
        self,
        msg: StreamMessage[Any],
        exc: Failure,
        attempt: int,
        delivery: Delivery,
        gate: Gate | None,
    ) -> Decision:
        """Decide what becomes of the failure of ``attempt``; tell the gate of outage mode.

        A decision that raises (a broken custom backoff) requeues the message after a
        pause and re-raises ``exc``: the message must not be lost.
        """
        config = self._plugin.config
        tiers = delivery.runtime.plan.tiers
        try:
            decision = decide(
                exc,
                attempt=attempt,
                handler=delivery.handler,
                default=config.default,
                tiers=tiers,
                rand=random.random,
            )
        except Exception:  # a broken custom backoff must not lose the message
            log.exception("retry decision failed for message %s", msg.message_id)
            await self._requeue_after_pause(msg, config.pause_s)
            raise exc from None
        if gate is not None:  # outage mode counts every failed call
            gate.failed(decision, msg.message_id, exc)
        _warn_if_capped(self._plugin.reporter, delivery, decision, tiers.max_delay_ms)
        return decision

    async def _owner(
        self, msg: StreamMessage[Any], exc: Failure, delivery: Delivery | None
    ) -> tuple[Delivery, Sink] | None:
        """Return the delivery that owns this failure, and its sink; ``None``: FastStream's.

        ``None`` for a message that is not a subscriber's, one its handler settled
        itself, a broker the plugin does not run on (the message is requeued) and a
        queue the plugin does not cover. A subscriber started after the broker is
        covered here, before its first copy is published. ``delivery``: resolved
        before the handler ran, and not again.
        """
        if delivery is not None:
            sink = await self._sink_of(delivery.runtime, delivery.queue, msg, exc)
            return None if sink is None else (delivery, sink)
        broker = _internals.current_broker(self.context)
        sub = _internals.current_subscriber(self.context)
        if broker is None or sub is None:
            if broker is not None:
                _internals.warn_no_subscriber(self._plugin.reporter)
            return None
        runtime, queue = self._plugin.runtime(broker), _internals.queue_of(sub)
        sink = await self._sink_of(runtime, queue or "?", msg, exc)
        if sink is None:
            return None
        route = runtime.route(queue or "")
        if route is None and runtime.live is not None:
            route = await self._cover(runtime, sub, msg)
        if route is None:
            return None
        return Delivery.of(runtime, route, await _internals.select_policy(route, msg)), sink

    async def _sink_of(
        self,
        runtime: Runtime | NatsRuntime | RedisRuntime,
        queue: str,
        msg: StreamMessage[Any],
        exc: Failure,
    ) -> Sink | None:
        """Return where this failure goes; ``None``: not the plugin's to carry.

        ``None`` if its handler settled the message itself, or if the plugin is not
        running on its broker (the message is then requeued, slowly).
        """
        if _settled_by_handler(msg):
            self._warn_settled(queue, msg, exc)
            return None
        sink = runtime.sink()
        if sink is None:
            # A failure the plugin started for (late or not) after it stopped: the
            # broker stops, with handlers still running. Without the topology a
            # retry can only be kept by handing the message back, slowly.
            log.error(
                "faststream-retry has stopped on this broker (it is stopping): "
                "requeueing message %s",
                msg.message_id,
            )
            await self._requeue_after_pause(msg, self._plugin.config.pause_s)
        return sink

    async def _cover(
        self,
        runtime: Runtime | NatsRuntime | RedisRuntime,
        sub: Any,  # noqa: ANN401 - a subscriber
        msg: StreamMessage[Any],
    ) -> Route | None:
        """Cover a subscriber the plan does not; ``None``: nothing to cover, or it failed."""
        try:
            return await runtime.cover_failed(sub)
        except Exception:  # its queues could not be declared: keep the message
            log.exception(
                "faststream-retry could not cover %r; requeueing message %s",
                _internals.queue_of(sub),
                msg.message_id,
            )
            await self._requeue_after_pause(msg, self._plugin.config.pause_s)
            return None

    def _warn_settled(self, queue: str, msg: StreamMessage[Any], exc: Failure) -> None:
        status = msg.committed.value.lower() if msg.committed is not None else "settled"
        self._plugin.reporter.warn_once(
            ("settled", queue),
            "faststream-retry: the handler of %r settled message %s itself (%s) and then "
            "raised %s: the plugin respects the handler's settlement and makes no retry "
            "copy. To have such failures retried, raise without settling (ack only on "
            "success). Logged once per queue",
            queue,
            msg.message_id,
            status,
            h.exception_name(exc),
        )

    async def _requeue_after_pause(self, msg: StreamMessage[Any], pause_s: float) -> None:
        """Hand the message back to its queue, after a pause (no hot loop)."""
        await requeue_after_pause(msg, pause_s)
        self._settled = True

    # FastStream enters and exits a scope per message: BaseMiddleware's would start a
    # coroutine more for each (on_receive, after_processed), for nothing on a success.
    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        success = self._success
        if success is not None:
            self._success = None
            if exc_val is None:
                # The first of the broker's middlewares: FastStream's acknowledgement
                # would come next, every middleware of the app having let it through.
                await success()
        if not self._settled or exc_val is None:
            return None
        return await self.after_processed(exc_type, exc_val, exc_tb)

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,  # noqa: ARG002 - FastStream's signature
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,  # noqa: ARG002
    ) -> bool | None:
        if not self._settled or exc_val is None:
            return None
        # The failure goes on through the middlewares outside this one, and stops at
        # the guard, before FastStream's own (settled): True there suppresses it, and
        # FastStream's ack middleware finds the message already settled by us.
        if settled.hand_over(self.msg, exc_val):
            return None
        return True if self._stops_here() else None

    def _stops_here(self) -> bool:
        """Whether a failure the plugin settled stops at this scope: its stack has no guard.

        That is a broker whose first middleware is the plugin's (the guard's place: see
        settled), or a message whose stack was built before the plugin put its guard in
        place (a broker's first messages, without ``install()``). It stops here if no
        middleware of the app sits outside this one, and under a test broker (test mode
        promises a ``publish()`` that does not raise). Otherwise it goes on, so the
        middlewares outside see it, and FastStream logs it once more (its ack middleware
        finds the message settled, and leaves it).
        """
        broker, sub = _internals.broker_and_subscriber(self.context)
        if broker is None or sub is None or _internals.under_test_broker(broker):
            return True
        return self._outermost(sub)

    def _outermost(self, sub: Any) -> bool:  # noqa: ANN401 - any subscriber
        """Whether no middleware of the app sits outside this scope in ``sub``'s stack."""
        outer = _internals.middlewares_of(sub)
        return not outer or outer[0] is self._plugin.middleware


_NOTHING = contextlib.nullcontext()
"""What wraps the call of a message nothing holds (reusable: it holds no state)."""

Failure = Exception | asyncio.CancelledError
"""What the scope takes as a handler's failure: an ``Exception``, or a ``CancelledError``
the handler raised itself (``_spurious``)."""


def _failed(exc: Failure) -> bool:
    """Whether ``exc`` is the handler's failure: an ``Exception``, or a spurious cancel.

    A ``CancelledError`` of a task being cancelled (the app stopping) is counted by the
    task (Python 3.11's ``Task.cancelling``): that one goes on up, and the message goes
    back to its queue with the channel. A handler can also raise one on its own, its task
    not being cancelled (a timeout or task library misused); left to FastStream, its
    message would stay unacked until the app stops. Python 3.10 cannot tell the two
    apart: there every ``CancelledError`` goes on up, as without the plugin.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return True
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is not None and cancelling() == 0


_CLAIM_ATTR = "_faststream_retry_claimed"


def _claim(msg: StreamMessage[Any]) -> bool:
    """Mark ``msg`` as owned by the calling scope; ``False`` if a scope already owns it.

    FastStream builds a scope per middleware entry in the subscriber's stack, and one
    ``RetryMiddleware`` can be there twice (on a router and on the broker). The scope
    that reaches the message first decides its failure; the others pass it through.
    """
    if getattr(msg, _CLAIM_ATTR, False):
        return False
    setattr(msg, _CLAIM_ATTR, True)
    return True


def _settled_by_handler(msg: StreamMessage[Any]) -> bool:
    """Whether the handler acked, nacked or rejected ``msg`` itself before it raised.

    FastStream records a settlement through its message API (``message.ack()``, ...)
    in ``committed``. aio-pika's own ``processed`` cannot tell: it is set from the
    start for ``no_ack`` consumers and for TestRabbitBroker's messages.
    """
    return msg.committed is not None


def _warn_if_capped(
    reporter: Reporter, delivery: Delivery, decision: Decision, max_delay_ms: int
) -> None:
    if decision.capped_from_ms is None:
        return
    # Once per handler: a handler that asks for too long a wait asks it of every message.
    reporter.warn_once(
        (delivery.queue, id(delivery.handler)),
        "a handler of %s raised RetryLater asking for %d ms, longer than max_delay "
        "(%d ms): its messages wait %d ms. Raise RetryMiddleware(max_delay=...) if such "
        "waits are meant (said once per handler)",
        delivery.queue,
        decision.capped_from_ms,
        max_delay_ms,
        decision.delay_ms,
    )


async def _settled_first(msg: StreamMessage[Any]) -> None:
    """The call of a message settled before its handler: nothing to run."""
    del msg
