"""The FastStream middleware: classify a handler's failure, then retry or dead-letter it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import traceback
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from faststream import BaseMiddleware, SourceType
from faststream.exceptions import IgnoredException
from faststream.middlewares import AckPolicy

from faststream_retry import headers as h
from faststream_retry.decision import Action, Decision, decide
from faststream_retry.errors import RetryConfigError
from faststream_retry.events import EventKind, RetryEvent, RetryHook, emit
from faststream_retry.policy import RetryPolicy, to_ms
from faststream_retry.runtime import (
    Route,
    Runtime,
    RuntimeConfig,
    now_ms,
    subscriber_queue,
)
from faststream_retry.telemetry import ATTR, Telemetry
from faststream_retry.tiers import Tiers, compute_tick_ms, tier_name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence
    from types import TracebackType

    from faststream._internal.context import ContextRepo
    from faststream.message import StreamMessage
    from faststream.rabbit import RabbitBroker
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["RetryMiddleware", "RetryRecorder"]

log = logging.getLogger("faststream_retry")

_INSTALLED_ATTR = "__faststream_retry_installed__"


class RetryRecorder:
    """Collects every event while ``RetryMiddleware.testing()`` is active."""

    def __init__(self) -> None:
        """Start empty."""
        self.events: list[RetryEvent] = []

    def __call__(self, event: RetryEvent) -> None:
        """Record one event (the recorder is a hook)."""
        self.events.append(event)

    @property
    def scheduled(self) -> list[RetryEvent]:
        """Return the retries scheduled, in-process ones included."""
        return [e for e in self.events if e.kind is EventKind.SCHEDULED]

    @property
    def dead_letters(self) -> list[RetryEvent]:
        """Return the dead letters."""
        return [e for e in self.events if e.kind is EventKind.DEAD_LETTERED]


class RetryMiddleware:
    """Retries for a FastStream ``RabbitBroker``, held by RabbitMQ itself.

    Pass it in ``RabbitBroker(middlewares=[retry])`` (or let ``install`` add it) and
    call ``retry.install(broker)`` before the broker starts.

    Args:
        default: the policy of handlers without ``@retry_policy`` and the base of
            those with it.
        prefix: the prefix of the shared delay tiers (``<prefix>.delay.<ms>``).
        tick: the base tier's TTL. ``None``: the GCD of the delays the policies
            name, at least 100 ms.
        max_delay: bounds every delay, ``RetryLater``'s too; the tiers reach up to it.
        queue_type: ``"classic"`` or ``"quorum"`` for every queue the plugin declares
            (tiers, ``<queue>.retry``, ``<queue>.dlq``). Quorum tiers dead-letter
            at-least-once; quorum needs RabbitMQ 3.10 or later.
        delivery_limit: ``x-delivery-limit`` of the quorum ``<queue>.retry`` queues.
            The re-check consumer acks and republishes, so only redeliveries spend
            it (a crashed consumer, a copy the broker would not confirm); at the
            limit RabbitMQ moves the message to ``<queue>.dlq``.
        prefetch: unacked messages per re-check consumer channel.
        publish_failure_pause: how long a message whose copy could not be confirmed
            is held before it is requeued (no hot loop while the broker is sick).
        publish_timeout: how long to wait for a broker confirm.
        hooks: callables that receive every ``RetryEvent``.
        tracer_provider: OpenTelemetry tracer provider for the plugin's spans
            (default: the global one; with no SDK configured no span is made).
        meter_provider: OpenTelemetry meter provider (default: the global one).
    """

    def __init__(
        self,
        default: RetryPolicy | None = None,
        *,
        prefix: str = "retry",
        tick: timedelta | float | None = None,
        max_delay: timedelta | float = timedelta(days=1),
        queue_type: str = "classic",
        delivery_limit: int = 20,
        prefetch: int = 200,
        publish_failure_pause: timedelta | float = timedelta(seconds=1),
        publish_timeout: timedelta | float = timedelta(seconds=30),
        hooks: Sequence[RetryHook] = (),
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Validate the configuration; see the class docstring."""
        if default is None:
            default = RetryPolicy()
        if not isinstance(default, RetryPolicy):
            raise RetryConfigError(f"default takes a RetryPolicy(...), got {default!r}")
        if not isinstance(prefix, str) or not prefix or len(prefix) > 100:
            raise RetryConfigError(f"prefix must be a short non-empty str, got {prefix!r}")
        if queue_type not in {"classic", "quorum"}:
            raise RetryConfigError(f"queue_type is 'classic' or 'quorum', got {queue_type!r}")
        if (
            isinstance(delivery_limit, bool)
            or not isinstance(delivery_limit, int)
            or delivery_limit < 1
        ):
            raise RetryConfigError(f"delivery_limit must be an int >= 1, got {delivery_limit!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise RetryConfigError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if not all(callable(hook) for hook in hooks):
            raise RetryConfigError("hooks takes callables that accept a RetryEvent")
        tick_ms = None if tick is None else to_ms(tick, "tick")
        max_delay_ms = to_ms(max_delay, "max_delay")
        if tick_ms is not None:
            Tiers.build(compute_tick_ms((), tick_ms), max_delay_ms)
        self._hooks: list[RetryHook] = list(hooks)
        self._config = RuntimeConfig(
            default=default,
            prefix=prefix,
            tick_ms=tick_ms,
            max_delay_ms=max_delay_ms,
            queue_type=queue_type,
            delivery_limit=delivery_limit,
            prefetch=prefetch,
            pause_s=to_ms(publish_failure_pause, "publish_failure_pause") / 1000,
            publish_timeout_s=max(to_ms(publish_timeout, "publish_timeout") / 1000, 0.001),
            hooks=self._hooks,
            telemetry=Telemetry(tracer_provider, meter_provider),
        )
        self._runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()
        self._rand = random.random

    @property
    def default(self) -> RetryPolicy:
        """Return the default policy."""
        return self._config.default

    def runtime(self, broker: RabbitBroker) -> Runtime:
        """Return this middleware's state for ``broker`` (tiers, routes, channels)."""
        runtime = self._runtimes.get(broker)
        if runtime is None:
            runtime = self._runtimes[broker] = Runtime(self._config, broker)
        return runtime

    def install(self, broker: RabbitBroker) -> RabbitBroker:
        """Make ``broker`` declare the topology and run the re-check consumers.

        Idempotent. Call it before the broker starts, before or after the
        subscribers are declared: the topology is planned and declared when the
        broker starts, from the subscribers it has then. Adds the middleware to the
        broker if it was not passed in ``middlewares=``. Returns the broker.
        """
        if getattr(broker, _INSTALLED_ATTR, None) is self:
            return broker
        if getattr(broker, _INSTALLED_ATTR, None) is not None:
            raise RetryConfigError("another RetryMiddleware is already installed on this broker")
        if self not in broker.config.broker_middlewares:
            broker.add_middleware(self)
        original_start = broker.start
        original_stop = broker.stop
        runtime = self.runtime(broker)

        async def start() -> None:
            # FastStream 0.7 has no start hook: connect, declare what the plugin
            # needs, start the subscribers, then the re-check consumers (they
            # release into the subscribers' queues, so those must exist first).
            self._check_ack_policies(broker)
            connection = await broker.connect()
            await runtime.declare(connection)
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
        setattr(broker, _INSTALLED_ATTR, self)
        return broker

    def _check_ack_policies(self, broker: RabbitBroker) -> None:
        for sub in broker.subscribers:
            if getattr(sub, "ack_policy", None) is AckPolicy.ACK_FIRST:
                route = self.runtime(broker).route(_queue_of(sub))
                if route is not None:
                    raise RetryConfigError(
                        f"subscriber of {route.queue!r} uses AckPolicy.ACK_FIRST: the "
                        "message is acked before the handler runs, so a failure cannot "
                        "be retried safely. Use the default ack policy, or switch "
                        "retries off for it with @retry_policy(enabled=False)"
                    )

    @contextlib.contextmanager
    def testing(self) -> Iterator[RetryRecorder]:
        """Record every retry decision, for tests with ``TestRabbitBroker``.

        Under ``TestRabbitBroker`` (no real broker, no TTL) the plugin runs in test
        mode by itself: decisions are made exactly as in production, delays are
        computed but not waited for (the handler is called again at once), and a
        dead letter settles the message. This context manager lets a test see
        those decisions::

            async with TestRabbitBroker(broker) as br:
                with retry.testing() as recorder:
                    await br.publish({"to": "x"}, queue="email-queue")
            assert recorder.scheduled[0].delay_ms == 1000
            assert recorder.dead_letters[0].reason == "exhausted"
        """
        recorder = RetryRecorder()
        self._hooks.append(recorder)
        try:
            yield recorder
        finally:
            self._hooks.remove(recorder)

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _RetryScope:  # noqa: ANN401
        """Build the per-message scope (FastStream calls this for every message)."""
        return _RetryScope(msg, context=context, middleware=self)

    async def _on_failure(  # noqa: C901 - one linear decision procedure
        self,
        scope: _RetryScope,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
        exc: Exception,
    ) -> Any:  # noqa: ANN401 - the handler's result
        broker = scope.context.get_local("broker")
        sub = scope.context.get_local("handler_")
        if broker is None or sub is None:
            raise exc
        runtime = self.runtime(broker)
        testing = not runtime.connected and _under_test_broker(broker)
        if not runtime.connected and not testing:
            # Consuming without our start hook: install() was not called, or the
            # broker was started by other means. Without the topology a retry can
            # only be kept by handing the message back, slowly.
            log.error(
                "faststream-retry is not running on this broker: call "
                "retry.install(broker) before the broker starts. Requeueing message %s",
                msg.message_id,
            )
            await scope.requeue_after_pause(msg, self._config.pause_s)
            raise exc
        route = runtime.route(_queue_of(sub))
        if route is None:
            raise exc
        handler_policy = await route.policy_for(msg)
        default = self._config.default
        if not (handler_policy.resolve(default) if handler_policy else default).enabled:
            raise exc
        tiers = runtime.tiers
        assert tiers is not None  # noqa: S101 - route() planned them
        attempt = h.read_attempt(msg.headers)
        while True:
            attempt += 1
            try:
                decision = decide(
                    exc,
                    attempt=attempt,
                    handler=handler_policy,
                    default=self._config.default,
                    tiers=tiers,
                    rand=self._rand,
                )
            except Exception:  # a broken custom backoff must not lose the message
                log.exception("retry decision failed for message %s", msg.message_id)
                await scope.requeue_after_pause(msg, self._config.pause_s)
                raise exc from None
            retry_now = decision.action is Action.RETRY_NOW or (
                testing and decision.action is Action.RETRY_LATER
            )
            if not retry_now:
                break
            self._report(
                route,
                msg,
                decision,
                exc,
                now_ms(),
                immediate=decision.action is Action.RETRY_NOW,
            )
            if testing:
                # Mirror what the copy would carry, so the handler sees its attempt.
                msg.headers[h.ATTEMPT] = decision.attempt
            try:
                return await call_next(msg)
            except IgnoredException:
                raise
            except Exception as again:  # the retried call failed too: decide again
                exc = again
        if testing:
            self._report(route, msg, decision, exc, now_ms())
            await scope.settle(msg, ok=True, pause_s=0)
            raise exc
        ok = await self._publish(runtime, route, msg, decision, exc)
        await scope.settle(msg, ok=ok, pause_s=self._config.pause_s)
        raise exc

    async def _publish(
        self,
        runtime: Runtime,
        route: Route,
        msg: StreamMessage[Any],
        decision: Decision,
        exc: Exception,
    ) -> bool:
        publisher, tiers = runtime.publisher, runtime.tiers
        if publisher is None or tiers is None:
            return False
        raw = msg.raw_message
        now = now_ms()
        failure = h.FailureRecord(
            attempt=decision.attempt,
            at_ms=now,
            exception=_qualname(exc),
            error=str(exc),
            delay_ms=decision.delay_ms,
        )
        attributes = _decision_attributes(route, msg, decision)
        if decision.action is Action.RETRY_LATER:
            headers = h.retry_headers(raw.headers, failure, now + decision.delay_ms)
            tier = tiers.pick(decision.delay_ms)
            exchange, key = tier_name(self._config.prefix, tier), route.retry_queue
            name = f"{route.queue} retry scheduled"
            attributes |= {ATTR.DUE_MS: now + decision.delay_ms, ATTR.TIER_MS: tier}
        else:
            headers = h.dead_letter_headers(
                raw.headers,
                failure,
                reason=decision.reason or "permanent",
                origin_queue=route.queue,
                traceback="".join(traceback.format_exception(exc)),
            )
            exchange, key = "", route.dlq
            name = f"{route.queue} dead-letter"
            attributes |= {ATTR.REASON: decision.reason or "permanent", ATTR.DLQ: route.dlq}
        attributes |= {ATTR.DESTINATION: exchange or key, ATTR.ROUTING_KEY: key}
        telemetry = self._config.telemetry
        with telemetry.step(name, raw.headers, headers, attributes, prefer_current=True) as span:
            if span is not None:
                span.record_exception(exc)
            ok = await publisher.republish(raw, exchange=exchange, routing_key=key, headers=headers)
            if span is not None and not ok:
                telemetry.fail(span, "the copy was not confirmed; the original is requeued")
            elif span is not None and decision.action is Action.DEAD_LETTER:
                telemetry.fail(span, f"dead-lettered: {decision.reason}")
        if ok:
            self._report(route, msg, decision, exc, now)
        return ok

    def _report(
        self,
        route: Route,
        msg: StreamMessage[Any],
        decision: Decision,
        exc: Exception,
        now: int,
        *,
        immediate: bool = False,
    ) -> None:
        dead = decision.action is Action.DEAD_LETTER
        event = RetryEvent(
            kind=EventKind.DEAD_LETTERED if dead else EventKind.SCHEDULED,
            queue=route.queue,
            message_id=msg.message_id,
            attempt=decision.attempt,
            max_attempts=decision.max_attempts,
            at_ms=now,
            delay_ms=None if dead else decision.delay_ms,
            due_ms=None if dead or immediate else now + decision.delay_ms,
            reason=decision.reason,
            exception=_qualname(exc),
            error=h.truncate(str(exc), h.HISTORY_ERROR_LIMIT),
            rule=decision.classification.rule,
            immediate=immediate,
        )
        telemetry = self._config.telemetry
        if immediate:  # no copy is published, so the span is only a record
            with telemetry.step(
                f"{route.queue} retry scheduled",
                msg.headers,
                {},
                _decision_attributes(route, msg, decision) | {ATTR.IMMEDIATE: True},
                prefer_current=True,
            ) as span:
                if span is not None:
                    span.record_exception(exc)
        labels = {ATTR.QUEUE: route.queue}
        telemetry.failures.add(
            1, labels | {ATTR.CLASSIFICATION: decision.classification.verdict.value}
        )
        if dead:
            telemetry.dead_lettered.add(1, labels | {ATTR.REASON: event.reason or ""})
        else:
            telemetry.scheduled.add(1, labels | {ATTR.RULE: decision.classification.rule})
            telemetry.planned_delay.record(decision.delay_ms, labels)
        if dead:
            log.warning(
                "dead-lettered message %s from %s to %s: reason=%s attempt=%d/%d error=%s: %s",
                event.message_id,
                route.queue,
                route.dlq,
                event.reason,
                event.attempt,
                event.max_attempts,
                event.exception,
                event.error,
                extra=_log_fields(event),
            )
        else:
            log.info(
                "retry scheduled for message %s from %s: attempt=%d/%d delay=%dms "
                "rule=%s error=%s: %s",
                event.message_id,
                route.queue,
                event.attempt,
                event.max_attempts,
                event.delay_ms or 0,
                event.rule,
                event.exception,
                event.error,
                extra=_log_fields(event),
            )
        emit(self._hooks, event)


class _RetryScope(BaseMiddleware):
    """The per-message part: catches the handler's failure and hands it over."""

    # One of these is built for every message: no per-instance __dict__.
    __slots__ = ("_middleware", "_settled")

    def __init__(
        self,
        msg: Any,  # noqa: ANN401 - the raw aio-pika message
        /,
        *,
        context: ContextRepo,
        middleware: RetryMiddleware,
    ) -> None:
        super().__init__(msg, context=context)
        self._middleware = middleware
        self._settled = False

    async def consume_scope(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        if msg.source_type is not SourceType.CONSUME:
            return await call_next(msg)
        try:
            return await call_next(msg)
        except IgnoredException:
            raise  # FastStream's own Ack/Nack/RejectMessage: the handler decided
        except Exception as exc:
            return await self._middleware._on_failure(self, call_next, msg, exc)  # noqa: SLF001

    async def settle(self, msg: StreamMessage[Any], *, ok: bool, pause_s: float) -> None:
        """Ack after a confirmed copy; otherwise requeue after a pause.

        The exception is re-raised afterwards (FastStream must not publish the
        handler's "result"), and ``after_processed`` then suppresses it.
        """
        if ok:
            await msg.ack()
        else:
            await self.requeue_after_pause(msg, pause_s)
        self._settled = True

    async def requeue_after_pause(self, msg: StreamMessage[Any], pause_s: float) -> None:
        """Hand the message back to its queue, after a pause (no hot loop)."""
        if pause_s:
            await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
        await msg.nack()  # RabbitMessage.nack requeues by default
        self._settled = True

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,  # noqa: ARG002 - FastStream's signature
        exc_val: BaseException | None = None,  # noqa: ARG002
        exc_tb: TracebackType | None = None,  # noqa: ARG002
    ) -> bool | None:
        # True suppresses the re-raised failure for the outer middlewares, so
        # FastStream's ack middleware finds the message already settled by us.
        return self._settled or None


def _log_fields(event: RetryEvent) -> dict[str, Any]:
    """Fields for structured log handlers (JSON formatters read ``record.retry``)."""
    return {
        "retry": {
            "event": event.kind.value,
            "queue": event.queue,
            "message_id": event.message_id,
            "attempt": event.attempt,
            "max_attempts": event.max_attempts,
            "delay_ms": event.delay_ms,
            "reason": event.reason,
            "exception": event.exception,
            "rule": event.rule,
        }
    }


def _decision_attributes(
    route: Route, msg: StreamMessage[Any], decision: Decision
) -> dict[str, Any]:
    return {
        ATTR.QUEUE: route.queue,
        ATTR.MESSAGE_ID: msg.message_id or "",
        ATTR.ATTEMPT: decision.attempt,
        ATTR.MAX_ATTEMPTS: decision.max_attempts,
        ATTR.CLASSIFICATION: decision.classification.verdict.value,
        ATTR.RULE: decision.classification.rule,
        ATTR.DELAY_MS: decision.delay_ms,
    }


def _queue_of(sub: Any) -> str:  # noqa: ANN401 - any subscriber
    return subscriber_queue(sub) or ""


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _under_test_broker(broker: Any) -> bool:  # noqa: ANN401 - RabbitBroker
    # TestRabbitBroker swaps the producer for its FakeProducer while it is active.
    try:
        from faststream.rabbit.testing import FakeProducer  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return False
    return isinstance(getattr(broker.config, "producer", None), FakeProducer)
