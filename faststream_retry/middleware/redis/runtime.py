"""The plugin on a ``RedisBroker``: the start and stop wrapping, and what it keeps per broker.

The Redis side of ``plugin``, beside ``nats.runtime``: the same ``Plugin`` makes a
``RedisRuntime`` for a ``RedisBroker`` (its cluster and sentinel kinds too), and the
per-message scope talks to it through the same few members (``plan``, ``route``,
``sink``, ``live``). At start the plugin checks the broker's subscribers (a pub/sub
channel, a list, a stream read without a group, with ``no_ack``, in batches or
claiming pending entries itself, with retries on, and two covered streams that would
share a key, are refused with the fix), builds one ``redis.engine.RedisRetryEngine`` for
the covered streams on a client of its own (the broker's settings, ``redis_subscribers``)
and checks the server with it, lets FastStream start its subscribers, then starts the
engine's mover and claimer. A failure is carried out by ``redis.sink.RedisSink``. Under
``TestRedisBroker`` nothing starts: inside ``retry.testing()`` failures go to test mode's
sink (``redis.test_mode``), once the subscribers passed the same checks
(``Planned.check_in_test``).

Redis has no tiers: a copy waits in a sorted set scored by its due time, exact to the
millisecond, so the plan's ladder is built on a 1 ms tick (``exact_plan``): the core's
decision rounds nothing and ``max_delay`` still bounds every delay. ``tick`` is not used.

Outage mode (``outage_after``) holds a covered stream's entries at its gate
(``faststream_retry.outages``), pending and kept alive against the claimer; one held for
``outage_hold``, or held when the broker stops, is parked (``redis.park``): acknowledged
and its copy scheduled a probe interval ahead, its attempt unchanged, in one script. The
probe interval is ``outage_probe``, else ``tick``, else 1 s (there are no tiers to take
it from).

A subscriber that joins the running broker (``middleware.late``) is checked as the start
checks the others before it reads (a refusal raises from its start), and covered by an
engine of its own on the plugin's client (its mover, its claimer keeping its consumer's
entries alive), started once it reads and stopped when it stops. Its failures go to
that engine's steps (``_Sinks``); the start's engine and its in-flight handlers are left
as they are.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream import AckPolicy
from faststream.message import AckStatus

from faststream_retry.core.durations import format_ms
from faststream_retry.core.policy import effective_policy
from faststream_retry.core.tiers import Tiers
from faststream_retry.core.topology import Handler, Plan, Route, merge_routes
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import _internals, checks, late, redis_subscribers
from faststream_retry.middleware.planned import Planned
from faststream_retry.middleware.redis.test_mode import RedisTestSink
from faststream_retry.outages import HandBacks, Outages
from faststream_retry.redis.keys import CLAIMER
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.decision import Decision
    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.redis.dlq_depths import RedisDeadLetterDepths
    from faststream_retry.redis.engine import RedisRetryEngine
    from faststream_retry.redis.sink import Message, RedisSink
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["RedisLive", "RedisRuntime", "exact_plan"]

_ACKS = frozenset({AckPolicy.REJECT_ON_ERROR, AckPolicy.NACK_ON_ERROR, AckPolicy.ACK})
"""The ack policies under which FastStream acknowledges a handled message (``ACK_FIRST``
is refused on a covered stream; ``MANUAL`` leaves it to the handler)."""

DEFAULT_PROBE_MS = 1000
"""Outage mode's probe interval on Redis when neither ``outage_probe`` nor ``tick`` is set."""

"""The consumer name an entry claimed from a lost consumer is pending under while settled."""

_IMPORTED = time.monotonic()
"""When this process imported the plugin: before any of its subscribers read, and after
every delivery an earlier process under the same consumer names had."""


def _refusals(sub: Any, topology: Plan, default: RetryPolicy, refusals: Any) -> list[str]:  # noqa: ANN401
    """What the start refuses of ``sub`` in ``topology`` (``refusals``: ``redis.refusals``)."""
    found: list[str] = []
    key = redis_subscribers.key_of(sub)
    if key is None:
        described = redis_subscribers.describe(sub)
        handlers = tuple(
            Handler(_internals.handler_policy(item)) for item in getattr(sub, "calls", ())
        )
        if described is None or not Route(described.name, handlers).enabled(default):
            return found
        if described.kind == "stream":
            found.append(refusals.no_group(described.name))
        else:
            found.append(refusals.not_a_stream(described.kind, described.name))
    elif key in topology.routes:
        found += _covered_refusals(sub, key)
    return found


def _policy_of(route: Route, default: RetryPolicy) -> RetryPolicy:
    """The policy a claimed entry of ``route``'s stream counts against.

    A claimed entry has no handler to ask: its stream's first handler's policy (the only
    one, unless filters share the stream).
    """
    return effective_policy(route.handlers[0].policy if route.handlers else None, default)


def _refuse(found: list[str]) -> None:
    """Raise the refusals in ``found``, together, in one error that names every fix.

    Raises:
        RetryConfigError: ``found`` is not empty.
    """
    if found:
        raise RetryConfigError(
            "faststream-retry cannot run on this RedisBroker:\n"
            + "\n".join(f"- {text}" for text in found)
        )


def _acked_by_step(msg: Any) -> None:  # noqa: ANN401 - FastStream's Redis stream message
    """``msg``'s step is its script's (or the claimer's): FastStream must send no ``XACK``.

    The script acknowledges the entry once its copy is stored (``redis.settling``); an
    ``XACK`` of FastStream's could come first, and a crash between the two lose it.
    """
    msg.committed = AckStatus.ACKED


def _entry_of(msg: Any) -> str | None:  # noqa: ANN401 - FastStream's RedisStreamMessage
    """The id of the one stream entry ``msg`` carries; ``None``: not one entry."""
    get = getattr(msg.raw_message, "get", None)
    ids = None if get is None else get("message_ids")
    if not ids or len(ids) != 1:
        return None
    (entry_id,) = ids
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def exact_plan(routes: Iterable[Route], default: RetryPolicy, config: RetryConfig) -> Plan:
    """Plan ``routes`` for a transport that holds a delay to the millisecond (pure).

    The routes whose every handler has retries off are left out, as ``core.topology.plan``
    does; the tiers are a 1 ms ladder up to ``max_delay``, so ``decide`` rounds a delay
    to the millisecond and caps it at ``max_delay``. Nothing is declared from it.
    """
    covered = {q: r for q, r in merge_routes(routes).items() if r.enabled(default)}
    tiers = Tiers.build(1, config.topology.max_delay_ms)
    return Plan(config.topology, tiers, covered, ())


def _covered_refusals(sub: Any, key: str) -> list[str]:  # noqa: ANN401 - a Redis subscriber
    """What a subscriber of a covered stream is refused for: no_ack, batches, its own claims."""
    from faststream_retry.redis import refusals  # noqa: PLC0415 - the Redis side's texts

    found = []
    if redis_subscribers.no_ack(sub):
        found.append(refusals.no_ack(key))
    if redis_subscribers.is_batch(sub):
        found.append(refusals.batch(key))
    if (claims := redis_subscribers.claims_itself(sub)) is not None:
        found.append(refusals.claiming(key, *claims))
    return found


@dataclass(eq=False, slots=True)
class RedisLive:
    """The running parts: the plan, the engine, and the close of the engine's client."""

    plan: Plan
    engine: RedisRetryEngine
    close: Callable[[], Awaitable[None]]
    dlq_depths: RedisDeadLetterDepths
    """Samples each covered stream's ``.dlq`` length when the metrics are read."""
    running: bool = True
    outages: Outages | None = None
    """Outage mode's gates (``None``: off)."""
    kept: frozenset[tuple[str, str]] = frozenset()
    """``(stream, consumer)`` whose entries the start's engine keeps alive."""
    late: dict[tuple[str, str], RedisRetryEngine] = field(default_factory=dict)
    """The engine of each ``(stream, consumer)`` that joined the running broker."""
    consuming: bool = False
    """Whether the movers and claimers run (from ``start_consumers`` to the stop)."""

    def engine_of(self, stream: str, consumer: str | None = None) -> RedisRetryEngine:
        """Return the engine that covers ``stream`` (read by ``consumer``, if given)."""
        if not self.late:  # no subscriber joined: the start's engine covers every stream
            return self.engine
        if consumer is not None and (stream, consumer) in self.late:
            return self.late[(stream, consumer)]
        if not any(s == stream for s, _ in self.kept):
            for (s, _), engine in self.late.items():
                if s == stream:
                    return engine
        return self.engine


class _Sinks:
    """The live sink of a broker with late subscribers: each failure to its stream's engine."""

    __slots__ = ("_live", "_reporter")

    def __init__(self, live: RedisLive, reporter: Reporter) -> None:
        self._live = live
        self._reporter = reporter

    def _of(self, route: Route) -> RedisSink:
        from faststream_retry.redis.sink import RedisSink  # noqa: PLC0415 - redis-py, on Redis only

        live = self._live
        return RedisSink(live.engine_of(route.queue), live.plan, self._reporter, _acked_by_step)

    async def retry(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """As ``RedisSink.retry``, through ``route``'s stream's engine."""
        return await self._of(route).retry(msg, route, decision, exc)

    async def dead_letter(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """As ``RedisSink.dead_letter``, through ``route``'s stream's engine."""
        return await self._of(route).dead_letter(msg, route, decision, exc)


class RedisRuntime(Planned):
    """Everything the plugin holds for one ``RedisBroker``."""

    messaging_system = "redis"

    releases_on_arrival = True
    """A copy that reaches its handler was moved back by the mover when due: a release."""

    acks_beside = True
    """A handled entry's ``XACK`` is batched beside the handlers (``ack_beside``)."""

    def __init__(
        self,
        config: RetryConfig,
        reporter: Reporter,
        broker: Any,  # noqa: ANN401 - a RedisBroker
        testing: Testing,
    ) -> None:
        """Prepare; nothing touches the network before ``open``."""
        super().__init__(config, reporter, broker, testing)
        self.live: RedisLive | None = None
        self._stopped_at = _IMPORTED
        self._client: Any = None
        self._kept: frozenset[tuple[str, str]] = frozenset()
        self._hand_backs = HandBacks()
        self._live_sink: tuple[RedisRetryEngine, Plan, RedisSink] | None = None
        """The sink of the live engine and plan, made at the first failure (``sink``)."""

    def replan(self) -> Plan:
        """Plan from the subscribers the broker has now, on an exact ladder (no network)."""
        self._plan = exact_plan(_internals.routes_of(self.broker), self.config.default, self.config)
        return self._plan

    def sink(self) -> RedisSink | _Sinks | RedisTestSink | None:
        """Where this broker's failures go now; ``None``: the plugin is not running.

        The live sink from the start to the stop; test mode's under ``TestRedisBroker``.
        """
        live = self.live
        if live is None and redis_subscribers.under_test_redis(self.broker):
            return RedisTestSink(self.broker, self.plan, self.reporter, self._testing)
        if live is None or not live.running:
            return None
        if live.late:
            return _Sinks(live, self.reporter)
        made = self._live_sink
        if made is not None and made[0] is live.engine and made[1] is live.plan:
            return made[2]  # the sink holds nothing of a failure: one serves them all
        from faststream_retry.redis.sink import RedisSink  # noqa: PLC0415 - redis-py, on Redis only

        sink = RedisSink(live.engine, live.plan, self.reporter, _acked_by_step)
        self._live_sink = (live.engine, live.plan, sink)
        return sink

    async def cover_failed(self, sub: Any) -> Route | None:  # noqa: ANN401 - a subscriber
        """Return the route for a failure of ``sub``, which the plan does not cover (``late``)."""
        return await late.cover_failed(self, sub)

    @property
    def running(self) -> bool:
        """Whether the plugin runs on the broker: its mover and claimer started."""
        return self.live is not None and self.live.consuming

    async def join(self, sub: Any) -> bool:  # noqa: ANN401 - a Redis subscriber
        """Check a subscriber that joins the running broker, and cover it; ``True``: covered.

        The start's checks of one subscriber (a channel, a list, a stream without a group,
        ``no_ack``, a batch, ``ACK_FIRST``, a second group on a covered stream, a stream
        whose keys would be a covered one's, the server for its stream); then an engine of
        its own for its stream and consumer, unless the start's engine keeps that consumer
        already. Retries off: left to FastStream.

        Raises:
            RetryConfigError: it is refused; it must not start.
            RetryTopologyError: the server cannot hold its retries.
        """
        live = self.live
        if live is None or self._client is None:
            return False
        from faststream_retry.redis import refusals  # noqa: PLC0415 - the Redis side's texts

        default = self.config.default
        key, group, consumer = redis_subscribers.names(sub)
        route = _internals.route_of(sub)
        covered = key is not None and route is not None and route.enabled(default)
        plan = live.plan.with_route(route) if covered and route is not None else live.plan
        _refuse(_refusals(sub, plan, default, refusals) + refusals.key_problems(plan.routes))
        if not covered or key is None or route is None or group is None or consumer is None:
            return False
        checks.refuse_ack_first_of(sub, route)
        other = live.engine_of(key).group(key) if key in live.plan.routes else group
        if other != group:
            text = (
                f"stream {key!r} is covered for group {other!r} and {group!r} joins it: a "
                "retry's copy goes back into the stream, where both would read it; give "
                "each group a stream of its own"
            )
            _refuse([text])
        if (key, consumer) in live.kept or (key, consumer) in live.late:
            return True
        from faststream_retry.redis.engine import RedisRetryEngine  # noqa: PLC0415 - redis-py

        engine = RedisRetryEngine(
            self._client,
            [(key, group)],
            born=self._stopped_at,
            consumer=CLAIMER,
            own_consumers=[(key, consumer)],
            claim_idle_ms=self.config.claim_idle_ms,
            policy=default,
            policies={key: _policy_of(route, default)},
            settle_wait_s=self._stop_wait_s,
        )
        await engine.check()
        live.late[(key, consumer)] = engine
        if key not in live.plan.routes:
            live.plan = self._plan = live.plan.with_route(route)
        log.info("faststream-retry (Redis): %s joined the running broker: covered", key)
        return True

    async def joined(self, sub: Any) -> None:  # noqa: ANN401 - a Redis subscriber
        """A covered subscriber that joined reads now: start its engine's mover and claimer."""
        live = self.live
        key, _, consumer = redis_subscribers.names(sub)
        engine = None if live is None else live.late.get((key or "", consumer or ""))
        if engine is not None:
            await engine.start()

    async def leave(self, sub: Any) -> None:  # noqa: ANN401 - a Redis subscriber
        """A subscriber that joined stops while the broker runs: stop its engine's tasks.

        Its copies wait in the schedule for its next start; its failures still in flight
        are still settled (the steps need no task).
        """
        live = self.live
        key, _, consumer = redis_subscribers.names(sub)
        engine = None if live is None else live.late.get((key or "", consumer or ""))
        if engine is None or any(
            other is not sub
            and getattr(other, "running", False)
            and redis_subscribers.names(other)[::2] == (key, consumer)  # key and consumer
            for other in self.broker.subscribers
        ):
            return
        await engine.stop()

    def holding(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's RedisStreamMessage
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> contextlib.AbstractContextManager[None]:
        """Tell the claimer a handler runs on ``msg``'s entry, so only held entries stay alive."""
        live = self.live
        stream, _, consumer = redis_subscribers.names(sub)
        entry = _entry_of(msg)
        if live is None or stream is None or entry is None:
            return contextlib.nullcontext()
        return live.engine_of(stream, consumer).holding(stream, consumer or "", entry)

    def ack_beside(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's RedisStreamMessage
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> Callable[[], Awaitable[None]] | None:
        """The ``XACK`` of ``msg``'s entry, its handler done, batched beside the handlers.

        ``None`` (FastStream acknowledges it, or nobody does) unless the plugin runs on a
        covered stream whose subscriber acknowledges a success (not ``AckPolicy.MANUAL``):
        the middleware runs it where FastStream's own acknowledgement would come next
        (``settled.on_success``). It queues the entry (``redis.acks``) and marks the
        message acknowledged, so FastStream sends no ``XACK`` of its own.
        """
        live = self.live
        if live is None or not live.running or getattr(sub, "ack_policy", None) not in _ACKS:
            return None
        stream, _, consumer = redis_subscribers.names(sub)
        entry = _entry_of(msg)
        if stream is None or stream not in live.plan.routes or entry is None:
            return None
        engine = live.engine_of(stream, consumer)
        if not engine.covers(stream):
            return None

        async def ack() -> None:
            # Settled by an app's middleware further out, or the plugin stopped meanwhile
            # (its client closing): FastStream's own acknowledgement, as without it.
            if msg.committed is None and self.live is live and live.running:
                await engine.ack_handled(stream, entry)
                msg.committed = AckStatus.ACKED

        return ack

    def check(self, middleware: Middleware) -> Plan:
        """Plan and check the broker's subscribers; raise one error naming every fix.

        Raises:
            RetryConfigError: a channel, a list, or a stream read without a group, with
                ``no_ack``, in batches or claiming pending entries itself, whose handlers
                have retries on; two covered streams that would share a key;
                ``ACK_FIRST``; two middlewares.
        """
        topology = self.replan()
        checks.refuse_ack_first(self.broker, topology)
        checks.refuse_other_instances(self.broker, middleware)
        from faststream_retry.redis import refusals  # noqa: PLC0415 - the Redis side's texts

        found = [
            text
            for sub in self.broker.subscribers
            for text in _refusals(sub, topology, self.config.default, refusals)
        ]
        found += refusals.key_problems(topology.routes)
        _refuse(found)
        return topology

    async def open(self, middleware: Middleware) -> None:
        """Check the subscribers, build the engine on a client of its own, check the server.

        Raises:
            RetryConfigError: the subscribers (``check``), or two groups on one stream.
            RetryTopologyError: the server cannot hold the retries (``redis.checks``).
        """
        topology = self.check(middleware)
        if redis_subscribers.under_test_redis(self.broker):
            return  # nothing to open: test mode's sink takes the failures (``sink``)
        made = await redis_subscribers.own_client(self.broker)
        if made is None or not type(made[0]).__module__.startswith("redis"):
            self._leave_to_faststream(
                "the broker's connection settings are not FastStream's RedisBroker's "
                "(a test double?): the plugin does not start on it, and leaves the broker's "
                "messages to FastStream"
            )
            if made is not None:
                await made[1]()
            return
        client, close = made
        try:
            engine = self._engine(client, topology)
            await engine.check()
        except BaseException:
            await close()
            raise
        from faststream_retry.redis.dlq_depths import RedisDeadLetterDepths  # noqa: PLC0415

        depths = RedisDeadLetterDepths(
            client,
            self.reporter.telemetry,
            lambda: topology if self.live is None else self.live.plan,
        )
        tick_ms = self.config.topology.tick_ms or DEFAULT_PROBE_MS
        outages = Outages.of(self.config.outage, tick_ms, self.reporter)
        self._client = client
        self.live = RedisLive(topology, engine, close, depths, outages=outages, kept=self._kept)
        self.started = True
        log.info(
            "faststream-retry (Redis): delays held to the ms up to %s, claim after %s, "
            "dead letters capped near %s a stream (the oldest trimmed past it), %d covered: %s",
            format_ms(topology.tiers.max_delay_ms),
            format_ms(self.config.claim_idle_ms),
            "no cap" if (cap := self.config.dlq_max_length) is None else f"{cap:,}",
            len(topology.routes),
            ", ".join(sorted(topology.routes)) or "none",
        )

    def _engine(self, client: Any, topology: Plan) -> RedisRetryEngine:  # noqa: ANN401 - redis-py's
        """One engine for the covered streams: their groups, this replica's consumers, policies."""
        from faststream_retry.redis.engine import RedisRetryEngine  # noqa: PLC0415 - redis-py

        streams: list[tuple[str, str]] = []
        own: list[tuple[str, str]] = []
        for sub in self.broker.subscribers:
            key = redis_subscribers.key_of(sub)
            group, consumer = redis_subscribers.group_of(sub), redis_subscribers.consumer_of(sub)
            if key is None or key not in topology.routes or group is None or consumer is None:
                continue
            if (key, group) not in streams:
                streams.append((key, group))
            if (key, consumer) not in own:
                own.append((key, consumer))
        self._kept = frozenset(own)
        default = self.config.default
        policies = {queue: _policy_of(route, default) for queue, route in topology.routes.items()}
        return RedisRetryEngine(
            client,
            streams,
            # This replica's entries are those delivered since this process imported the
            # plugin or, after a stop, since that stop: FastStream dropped the ones it held
            # then, and they are the claimer's. Not since the engine was built: without
            # install() it is built at the first message, after the first reads.
            born=self._stopped_at,
            consumer=CLAIMER,
            own_consumers=own,
            claim_idle_ms=self.config.claim_idle_ms,
            policy=default,
            policies=policies,
            dlq_maxlen=self.config.dlq_max_length or 0,
            reporter=self.reporter,  # the claimer's dead letters reach the app's hooks
            settle_wait_s=self._stop_wait_s,
        )

    async def park(self, msg: Message, route: Route) -> bool:
        """Hand an entry held in outage mode back through the schedule; ``False``: not done.

        Acknowledged and its copy scheduled a probe interval ahead, its attempt unchanged,
        in one script (``redis.park``).
        """
        live = self.live
        if live is None or not live.running or live.outages is None:
            return False
        from faststream_retry.redis.park import park  # noqa: PLC0415 - redis-py, on Redis only

        with self._hand_backs.one():
            done = await park(
                live.engine_of(route.queue),
                live.plan,
                self.reporter,
                msg,
                route,
                wait_ms=live.outages.probe_ms,
            )
        if done:
            _acked_by_step(msg)
        return done

    def _leave_to_faststream(self, why: str) -> None:
        self.bypass = why
        self.reporter.error_once(("bypass", id(self.broker)), "faststream-retry: %s", why)

    async def start_consumers(self) -> None:
        """Start the mover, the claimer and the dead-letter gauge's sampling.

        Once FastStream's subscribers made their groups.
        """
        if self.live is not None:
            await self.live.engine.start()
            self.live.dlq_depths.start()
            self.live.consuming = True

    @property
    def _stop_wait_s(self) -> float:
        """How long a stop waits for a Redis step in flight: twice ``publish_timeout`` and 1 s.

        The same for a parked hand-back and a failure's step run beside its handler.
        """
        return 2 * self.config.publish_timeout_s + 1

    async def stop_consumers(self) -> None:
        """Stop the sampling, the mover and the claiming, before FastStream drains.

        Failures of handlers still running are still settled, and what they hold is still
        kept alive: no other replica claims an entry whose handler is still running.
        """
        if self.live is not None:
            if self.live.outages is not None:
                # Held entries are parked before the client closes (FastStream's stop
                # would otherwise wait for them).
                held = self.live.outages.close()
                await self._hand_backs.settle(held, self._stop_wait_s)
            self.live.consuming = False
            await self.live.dlq_depths.stop()
            for engine in (self.live.engine, *self.live.late.values()):
                await engine.stop_claiming()

    async def stop(self) -> None:
        """After the drain: release the unstarted rest of a read, stop the keep-alive, close.

        The entries read and never handed to a handler are delivered afresh (no attempt
        spent on them, as a claim would); then the keep-alive stops, and the client closes.
        """
        live, self.live = self.live, None
        self._live_sink = None
        self._stopped_at = time.monotonic()
        if live is not None:
            live.running = False
            try:
                for engine in (live.engine, *live.late.values()):
                    await engine.release()
            except Exception as exc:  # a stop goes on: they are claimed later
                log.warning(
                    "faststream-retry (Redis): the entries read and not handled could not be "
                    "released (%s): claimed later, each as a lost attempt",
                    exc,
                )
            finally:
                for engine in (live.engine, *live.late.values()):
                    await engine.stop()
                await live.close()
