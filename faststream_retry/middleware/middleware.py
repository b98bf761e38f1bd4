"""The FastStream middleware: the configuration, and the per-message scope that owns a failure.

``RetryMiddleware`` is configuration only; FastStream calls it for every message and it
builds a ``_RetryScope``. The scope does nothing on success. When the handler raises, it
classifies the failure (``core.decision.decide``), publishes the copy ``core.steps``
builds (into the delay tiers or the dead-letter queue) with a broker confirm, acks the
original only then, and re-raises so FastStream never publishes the failed call's
"result".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
from typing import TYPE_CHECKING, Any

from faststream import BaseMiddleware, SourceType
from faststream.exceptions import IgnoredException

from faststream_retry.core import defaults, steps
from faststream_retry.core import headers as h
from faststream_retry.core.config import RetryConfig
from faststream_retry.core.decision import Action, Decision, decide
from faststream_retry.core.events import RetryEvent, RetryHook
from faststream_retry.core.policy import RetryPolicy, effective_policy
from faststream_retry.engine.outages import Requeue
from faststream_retry.engine.step import publish_step
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import _internals
from faststream_retry.middleware.gate import gate_of
from faststream_retry.middleware.runtime import Plugin, Runtime, cover_failed
from faststream_retry.middleware.testing import RetryRecorder, recording
from faststream_retry.reporting.log import log
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence
    from datetime import timedelta
    from types import TracebackType

    from faststream._internal.context import ContextRepo
    from faststream.message import StreamMessage
    from faststream.rabbit import RabbitBroker
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from faststream_retry.core.policy import HandlerPolicy
    from faststream_retry.core.steps import Step
    from faststream_retry.core.topology import Route
    from faststream_retry.engine.live import Live
    from faststream_retry.engine.outages import Gate

__all__ = ["RetryMiddleware"]

_Covered = tuple[Runtime, "Route"]


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
        max_delay: bounds every delay, ``RetryLater``'s too (a longer one is cut to
            it, with a WARNING once per handler); the tiers reach up to it.
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
            is held before it is requeued (no hot loop while the broker is sick).
        publish_timeout: how long to wait for a broker confirm.
        log_retry_traceback: which retry log lines carry the failure's traceback:
            ``"first"`` (a message's first failure only: it says what went wrong,
            and the next failures of an outage repeat it), ``"every"`` or ``"never"``.
            A dead letter is always logged at ERROR with its traceback.
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
        )
        if not all(callable(hook) for hook in hooks):
            raise RetryConfigError("hooks takes callables that accept a RetryEvent")
        for hook in hooks:
            _refuse_async(hook)
        self._hooks: list[RetryHook] = list(hooks)
        reporter = Reporter(
            Telemetry(tracer_provider, meter_provider),
            self._hooks,
            log_retry_traceback=config.log_retry_traceback,
        )
        self._plugin = Plugin(config, reporter)

    @property
    def default(self) -> RetryPolicy:
        """Return the default policy."""
        return self._plugin.config.default

    @property
    def prefix(self) -> str:
        """Return the prefix of the delay tiers."""
        return self._plugin.config.topology.prefix

    def install(self, broker: RabbitBroker) -> RabbitBroker:
        """Make ``broker`` declare the topology and run the re-check consumers.

        Idempotent. Call it before the broker starts, before or after the
        subscribers are declared: the topology is planned and declared when the
        broker starts, from the subscribers it has then. Adds the middleware to the
        broker if it was not passed in ``middlewares=``. Returns the broker.

        Raises:
            RetryConfigError: another ``RetryMiddleware`` is installed on ``broker``,
                or the installed FastStream lacks an internal the plugin needs.
        """
        return self._plugin.install(broker, self)

    def runtime(self, broker: RabbitBroker) -> Runtime:
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
        """Record every retry decision, for tests with ``TestRabbitBroker``.

        Under ``TestRabbitBroker`` (no real broker, no TTL) the plugin runs in test
        mode by itself: decisions are made exactly as in production, delays are
        computed but not waited for (the handler is called again at once), and a
        dead letter settles the message and goes to the app's ``<queue>.dlq``
        subscriber if it has one. This context manager lets a test see those
        decisions::

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
        plugin = self._plugin
        before, plugin.raise_on_dead_letter = plugin.raise_on_dead_letter, raise_on_dead_letter
        try:
            with recording(self._hooks) as recorder:
                yield recorder
        finally:
            plugin.raise_on_dead_letter = before

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
    __slots__ = ("_gate", "_plugin", "_settled")

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
        self._gate: Gate | None = None

    async def consume_scope(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        if msg.source_type is not SourceType.CONSUME or not _claim(msg):
            # Another scope of this message (the same middleware on a router and on
            # the broker, say) owns its failure: one decision, one copy.
            return await call_next(msg)
        if h.DUE in msg.headers:
            try:
                self._report_arrival(msg)
            except BaseException:
                # An application's own BaseException from a hook or a log handler,
                # before the handler ran: it goes on, but the message goes back to
                # its queue first (FastStream would reject it: lost without a DLX).
                with contextlib.suppress(Exception):
                    await msg.nack()
                raise
        if self._plugin.config.outage is not None:
            return await self._through_gate(call_next, msg)
        return await self._handle(call_next, msg)

    async def _handle(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        try:
            return await call_next(msg)
        except IgnoredException:
            raise  # FastStream's own Ack/Nack/RejectMessage: the handler decided
        except (Exception, asyncio.CancelledError) as exc:
            if not _failed(exc):
                raise  # the task is being cancelled: the app stops, the message goes back
            if isinstance(exc, asyncio.CancelledError):
                self._warn_spurious(msg)
            return await self._on_failure(call_next, msg, exc)

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
        handler sees. A redelivery was reported on its first delivery. Never raises.
        """
        try:
            raw = msg.raw_message
            broker = _internals.current_broker(self.context)
            live = None if broker is None else self._plugin.runtime(broker).live
            if live is None or raw.redelivered:
                return
            if h.expired_from(msg.headers) not in live.plan.exchanges:
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
            self._plugin.reporter.record(event, incoming=headers, onward=headers)
        except Exception:  # reporting never decides a message's fate
            log.exception("faststream-retry could not report the arrival of %s", msg.message_id)

    async def _through_gate(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> Any:  # noqa: ANN401 - the handler's result
        """Outage mode (``outage_after``): wait at the queue's gate, then handle the message."""
        gate = self._gate = await gate_of(self._plugin, self.context, msg)
        if gate is None:
            return await self._handle(call_next, msg)
        try:
            probe = await gate.enter()
        except Requeue:
            # Held too long, or the broker stops: back to its queue, handler not called.
            await self._requeue_after_pause(msg, 0)
            raise
        try:
            result = await self._handle(call_next, msg)
            gate.succeeded(msg.message_id)
        finally:
            gate.leave(probe)
        return result

    async def _on_failure(  # noqa: C901 - one linear procedure, in the order it happens
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
        exc: Failure,
    ) -> Any:  # noqa: ANN401 - the handler's result
        covered = await self._route_of(msg, exc)
        if covered is None:
            raise exc
        runtime, route = covered
        config, reporter = self._plugin.config, self._plugin.reporter
        live = runtime.live
        testing = live is None
        topology = live.plan if live is not None else runtime.plan
        handler = await _internals.select_policy(route, msg)
        if not effective_policy(handler, config.default).enabled:
            raise exc
        attempt = h.read_attempt(msg.headers)
        while True:
            attempt += 1
            try:
                decision = decide(
                    exc,
                    attempt=attempt,
                    handler=handler,
                    default=config.default,
                    tiers=topology.tiers,
                    rand=random.random,
                )
            except Exception:  # a broken custom backoff must not lose the message
                log.exception("retry decision failed for message %s", msg.message_id)
                await self._requeue_after_pause(msg, config.pause_s)
                raise exc from None
            if self._gate is not None:  # outage mode counts every failed call
                self._gate.failed(decision, msg.message_id, exc)
            _warn_if_capped(reporter, route, handler, decision, topology.tiers.max_delay_ms)
            immediate = decision.action is Action.RETRY_NOW
            if not immediate and not (testing and decision.action is Action.RETRY_LATER):
                break
            event = steps.in_process(
                route.queue, msg.message_id, decision, exc, h.now_ms(), immediate=immediate
            )
            reporter.record(event, incoming=msg.headers, exception=exc)
            if testing:
                # Mirror what the copy would carry, so the handler sees its attempt.
                msg.headers[h.ATTEMPT] = decision.attempt
            try:
                return await call_next(msg)
            except IgnoredException:
                raise
            except (Exception, asyncio.CancelledError) as again:
                if not _failed(again):
                    raise
                exc = again  # the retried call failed too: decide again
            if _settled_by_handler(msg):
                _warn_settled_once(route.queue, msg, exc)
                raise exc
        if live is None:  # test mode: no broker to hold the copy
            letter = steps.failed(
                topology,
                route,
                decision,
                exc,
                message_id=msg.message_id,
                incoming=msg.headers,
                now_ms=h.now_ms(),
            )
            await self._dead_letter_in_test_mode(runtime.broker, route, msg, letter, exc)
            raise exc
        ok = await self._publish(live, route, msg, decision, exc)
        await self._settle(msg, ok=ok, pause_s=config.pause_s)
        raise exc

    async def _route_of(self, msg: StreamMessage[Any], exc: Failure) -> _Covered | None:
        """Return the runtime and route that own this failure; ``None``: leave it to FastStream.

        ``None`` for a message that is not a subscriber's, one its handler settled
        itself, and a queue the plugin does not cover. A subscriber started after
        the broker is covered here, before its first copy is published.
        """
        broker = _internals.current_broker(self.context)
        sub = _internals.current_subscriber(self.context)
        if broker is None or sub is None:
            if broker is not None:
                _internals.warn_no_subscriber()
            return None
        if _settled_by_handler(msg):
            _warn_settled_once(_internals.queue_of(sub) or "?", msg, exc)
            return None
        runtime = self._plugin.runtime(broker)
        live = runtime.live
        if live is None and not _internals.under_test_broker(broker):
            # Consuming without our start hook: install() was not called, or the
            # broker was started by other means. Without the topology a retry can
            # only be kept by handing the message back, slowly.
            log.error(
                "faststream-retry is not running on this broker: call "
                "retry.install(broker) before the broker starts. Requeueing message %s",
                msg.message_id,
            )
            await self._requeue_after_pause(msg, self._plugin.config.pause_s)
            return None
        topology = live.plan if live is not None else runtime.plan
        route = topology.route(_internals.queue_of(sub) or "")
        if route is None and live is not None:
            try:
                route = await cover_failed(runtime, sub)
            except Exception:  # its queues could not be declared: keep the message
                log.exception(
                    "faststream-retry could not cover %r; requeueing message %s",
                    _internals.queue_of(sub),
                    msg.message_id,
                )
                await self._requeue_after_pause(msg, self._plugin.config.pause_s)
                return None
        return None if route is None else (runtime, route)

    async def _publish(
        self,
        live: Live,
        route: Route,
        msg: StreamMessage[Any],
        decision: Decision,
        exc: Failure,
    ) -> bool:
        """Publish the copy the decision calls for, and report it once confirmed."""
        raw = msg.raw_message
        step = steps.failed(
            live.plan,
            route,
            decision,
            exc,
            message_id=msg.message_id,
            incoming=raw.headers,
            now_ms=h.now_ms(),
        )
        return await publish_step(
            self._plugin.reporter,
            live.publisher,
            raw,
            step,
            dlq=route.dlq,
            origin_queue=route.queue,
            exception=exc,
        )

    async def _dead_letter_in_test_mode(
        self,
        broker: RabbitBroker,
        route: Route,
        msg: StreamMessage[Any],
        letter: Step,
        exc: Failure,
    ) -> None:
        """Record and settle a dead letter; hand it to the app's ``<queue>.dlq`` subscriber.

        Only a dead letter gets here: test mode retries every delay at once. The
        ``.dlq`` subscriber, if the app has one, gets the headers and properties the
        real copy would carry, so a test can assert on what an operator would find;
        without one there is nowhere to put it (``TestRabbitBroker`` refuses a
        publish nobody consumes). If that subscriber raises, the dead letter stays
        settled and its exception is logged at ERROR, or, under
        ``testing(raise_on_dead_letter=True)``, raised from ``publish()`` with the
        handler's exception as its cause.
        """
        self._plugin.reporter.record(letter.event, incoming=msg.headers, exception=exc)
        await self._settle(msg, ok=True, pause_s=0)
        if any(_internals.queue_of(sub) == route.dlq for sub in broker.subscribers):
            try:
                await broker.publish(
                    msg.body,
                    queue=route.dlq,
                    headers=letter.copy.headers,
                    message_id=msg.message_id,
                    correlation_id=msg.correlation_id,
                    content_type=msg.content_type or None,
                )
            except Exception as failure:  # the app's .dlq handler raised on the dead letter
                if self._plugin.raise_on_dead_letter:
                    # A bug in the .dlq consumer must fail the test, not pass a
                    # pytest.raises() written for the handler's exception.
                    self._settled = False
                    raise failure from exc
                log.error(
                    "the %s subscriber failed on the dead letter of message %s",
                    route.dlq,
                    msg.message_id,
                    exc_info=failure,
                )
        if self._plugin.raise_on_dead_letter:
            # Not suppressed: TestRabbitBroker raises it from publish(), as it does
            # for a handler without the plugin.
            self._settled = False

    async def _settle(self, msg: StreamMessage[Any], *, ok: bool, pause_s: float) -> None:
        """Ack after a confirmed copy; otherwise requeue after a pause.

        The exception is re-raised afterwards (FastStream must not publish the
        handler's "result"), and ``after_processed`` then suppresses it.
        """
        if ok:
            await msg.ack()
        else:
            await self._requeue_after_pause(msg, pause_s)
        self._settled = True

    async def _requeue_after_pause(self, msg: StreamMessage[Any], pause_s: float) -> None:
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


_warned_settled: set[str] = set()


def _warn_settled_once(queue: str, msg: StreamMessage[Any], exc: Failure) -> None:
    if queue in _warned_settled:
        return
    _warned_settled.add(queue)
    status = msg.committed.value.lower() if msg.committed is not None else "settled"
    log.warning(
        "faststream-retry: the handler of %r settled message %s itself (%s) and then raised "
        "%s: the plugin respects the handler's settlement and makes no retry copy. To have "
        "such failures retried, raise without settling (ack only on success). Logged once "
        "per queue",
        queue,
        msg.message_id,
        status,
        h.exception_name(exc),
    )


def _warn_if_capped(
    reporter: Reporter,
    route: Route,
    handler: HandlerPolicy | None,
    decision: Decision,
    max_delay_ms: int,
) -> None:
    if decision.capped_from_ms is None:
        return
    # Once per handler: a handler that asks for too long a wait asks it of every message.
    reporter.warn_once(
        (route.queue, id(handler)),
        "a handler of %s raised RetryLater asking for %d ms, longer than max_delay "
        "(%d ms): its messages wait %d ms. Raise RetryMiddleware(max_delay=...) if such "
        "waits are meant (said once per handler)",
        route.queue,
        decision.capped_from_ms,
        max_delay_ms,
        decision.delay_ms,
    )
