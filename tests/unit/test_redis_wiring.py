"""RetryMiddleware's Redis side without a server: what it reads of FastStream's subscribers,
what it refuses at start, how a failure is carried out (a stand-in engine), and the plan."""

from __future__ import annotations

import contextlib
import json
import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream import AckPolicy
from faststream.rabbit import RabbitBroker
from faststream.redis import (
    ListSub,
    PubSub,
    RedisBroker,
    RedisClusterBroker,
    RedisRouter,
    StreamSub,
)
from redis.exceptions import ResponseError

from faststream_retry import (
    EventKind,
    Exponential,
    RetryConfigError,
    RetryEvent,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)
from faststream_retry.core import fit
from faststream_retry.core import headers as h
from faststream_retry.core.config import RetryConfig
from faststream_retry.core.decision import Action, decide
from faststream_retry.core.topology import Handler, Route
from faststream_retry.middleware import _internals, redis_subscribers
from faststream_retry.middleware.redis.runtime import RedisRuntime, exact_plan
from faststream_retry.redis import envelope, refusals
from faststream_retry.redis import steps as redis_steps
from faststream_retry.redis.settling import Settlements
from faststream_retry.redis.sink import RedisSink
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry

if TYPE_CHECKING:
    from collections.abc import Iterator


def fresh() -> Any:
    async def handle(body: Any) -> None: ...

    return handle


def subscribers() -> tuple[RedisBroker, dict[str, Any]]:
    """A broker with one subscriber of each kind, some on a prefixed router."""
    broker = RedisBroker()
    router = RedisRouter(prefix="pre.")
    subs = {
        "covered": router.subscriber(stream=StreamSub("s", group="g", consumer="c"))(fresh()),
        "nogroup": broker.subscriber(stream="bare")(fresh()),
        "channel": router.subscriber(channel=PubSub("ch"))(fresh()),
        "list": broker.subscriber(list=ListSub("li"))(fresh()),
    }
    broker.include_router(router)
    by_name = {
        key: next(s for s in broker.subscribers if s.calls[0].handler is handler)
        for key, handler in subs.items()
    }
    return broker, by_name


def test_only_a_stream_read_in_a_group_has_a_key_its_prefixed_stream() -> None:
    """The key a route, an event and a dead letter name a Redis subscriber by."""
    _, subs = subscribers()
    assert redis_subscribers.key_of(subs["covered"]) == "pre.s"
    assert _internals.queue_of(subs["covered"]) == "pre.s"
    for name in ("nogroup", "channel", "list"):
        assert redis_subscribers.key_of(subs[name]) is None
        assert _internals.queue_of(subs[name]) is None
    assert redis_subscribers.group_of(subs["covered"]) == "g"
    assert redis_subscribers.consumer_of(subs["covered"]) == "c"


def test_a_subscriber_s_stream_is_read_once_until_a_router_prefixes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FastStream deep-copies its ``StreamSub`` at each read (50 µs, twice a message in
    ``holding``): read once, and again only when a router's prefix changes what it is."""
    inner = RedisRouter(prefix="p.")

    @inner.subscriber(stream=StreamSub("s", group="g", consumer="c"))
    async def handle(body: str) -> None: ...

    sub = inner.subscribers[0]
    kind: Any = type(sub)
    reads: list[str] = []
    prop = kind.stream_sub

    def counted(self: Any) -> Any:
        reads.append("read")
        return prop.fget(self)

    monkeypatch.setattr(kind, "stream_sub", property(counted))
    for _ in range(3):
        assert redis_subscribers.key_of(sub) == "p.s"
        assert redis_subscribers.consumer_of(sub) == "c"
    assert len(reads) == 1
    outer = RedisRouter(prefix="o.")
    outer.include_router(inner)
    RedisBroker().include_router(outer)
    assert redis_subscribers.key_of(sub) == "o.p.s"
    assert len(reads) == 2
    assert redis_subscribers.names(sub) == ("o.p.s", "g", "c"), "read with the key, once"
    assert len(reads) == 2


def test_a_stream_read_without_a_group_or_a_consumer_name_has_no_key() -> None:
    """``names`` gives what ``key_of``, ``group_of`` and ``consumer_of`` give, in one read."""
    broker = RedisBroker()

    @broker.subscriber(stream=StreamSub("a", group="g", consumer="c"))
    async def covered(body: str) -> None: ...

    @broker.subscriber(stream=StreamSub("b"))
    async def bare(body: str) -> None: ...

    @broker.subscriber(channel="ch")
    async def channel(body: str) -> None: ...

    names = [redis_subscribers.names(s) for s in broker.subscribers]
    assert sorted(names, key=lambda n: n.key or "") == [
        (None, None, None),
        (None, None, None),
        ("a", "g", "c"),
    ]
    for sub, (key, group, consumer) in zip(broker.subscribers, names, strict=True):
        assert redis_subscribers.key_of(sub) == key
        assert redis_subscribers.group_of(sub) == group
        assert redis_subscribers.consumer_of(sub) == consumer


def test_each_subscriber_is_described_by_its_kind_and_prefixed_name() -> None:
    """What a refusal names."""
    _, subs = subscribers()
    described = {k: tuple(redis_subscribers.describe(s) or ()) for k, s in subs.items()}
    assert described == {
        "covered": ("stream", "pre.s"),
        "nogroup": ("stream", "bare"),
        "channel": ("channel", "pre.ch"),
        "list": ("list", "li"),
    }
    assert redis_subscribers.describe(object()) is None


def test_a_redis_broker_is_told_from_the_others() -> None:
    """Plain and cluster brokers are Redis ones; a RabbitBroker is not; no test broker yet."""
    assert redis_subscribers.is_redis(RedisBroker())
    assert redis_subscribers.is_redis(RedisClusterBroker())
    assert not redis_subscribers.is_redis(RabbitBroker())
    assert not redis_subscribers.under_test_redis(RedisBroker())


def runtime_of(broker: RedisBroker, retry: RetryMiddleware) -> RedisRuntime:
    runtime = retry.runtime(broker)
    assert isinstance(runtime, RedisRuntime)
    return runtime


def test_every_subscriber_that_would_lose_a_failure_is_refused_in_one_error() -> None:
    """A channel, a list, a stream without a group, no_ack and batch: one line each, with the
    fix; a subscriber whose retries are off is not named."""
    broker, _ = subscribers()
    broker.subscriber(stream=StreamSub("noack", group="g", consumer="c", no_ack=True))(fresh())
    broker.subscriber(stream=StreamSub("batch", group="g", consumer="c", batch=True))(fresh())
    broker.subscriber(channel="off")(retry_policy(enabled=False)(fresh()))
    retry = RetryMiddleware()
    broker.insert_middleware(retry)
    with pytest.raises(RetryConfigError) as refused:
        runtime_of(broker, retry).check(retry)
    lines = str(refused.value).splitlines()
    assert lines[0] == "faststream-retry cannot run on this RedisBroker:"
    assert len(lines) == 6, lines
    text = str(refused.value)
    for expected in (
        "the subscriber of channel 'pre.ch' reads a Redis channel",
        "the subscriber of list 'li' reads a Redis list",
        "the subscriber of stream 'bare' reads it without a consumer group",
        "the subscriber of stream 'noack' reads with no_ack=True",
        "the subscriber of stream 'batch' takes batches",
    ):
        assert expected in text
    assert "'off'" not in text
    assert text.count("@retry_policy(enabled=False)") == 5


def test_a_broker_of_covered_streams_only_passes_and_plans_them() -> None:
    """No refusal: the plan covers each stream read in a group, by its prefixed name."""
    broker = RedisBroker()
    router = RedisRouter(prefix="pre.")
    router.subscriber(stream=StreamSub("a", group="g", consumer="c"))(fresh())
    broker.include_router(router)
    broker.subscriber(stream=StreamSub("b", group="g", consumer="c"))(
        retry_policy(enabled=False)(fresh())
    )
    retry = RetryMiddleware()
    broker.insert_middleware(retry)
    plan = runtime_of(broker, retry).check(retry)
    assert sorted(plan.routes) == ["pre.a"], "retries off: not covered"


def test_outage_mode_is_accepted_on_redis() -> None:
    """Outage mode holds entries at the gate and parks them in the schedule: no refusal."""
    broker = RedisBroker()
    broker.subscriber(stream=StreamSub("a", group="g", consumer="c"))(fresh())
    retry = RetryMiddleware(outage_after=5)
    broker.insert_middleware(retry)
    plan = runtime_of(broker, retry).check(retry)
    assert sorted(plan.routes) == ["a"]


def test_ack_first_is_refused() -> None:
    """AckPolicy.ACK_FIRST acknowledges before the handler: the step would find nothing."""
    broker = RedisBroker()
    broker.subscriber(
        stream=StreamSub("a", group="g", consumer="c"), ack_policy=AckPolicy.ACK_FIRST
    )(fresh())
    retry = RetryMiddleware()
    broker.insert_middleware(retry)
    with pytest.raises(RetryConfigError, match="ACK_FIRST"):
        runtime_of(broker, retry).check(retry)


async def test_two_groups_on_one_covered_stream_are_refused_before_anything_is_sent() -> None:
    """Each group would read every copy: refused at open, with the fix, the client closed."""
    broker = RedisBroker("redis://127.0.0.1:1")  # never reached: refused first
    broker.subscriber(stream=StreamSub("a", group="g1", consumer="c"))(fresh())
    broker.subscriber(stream=StreamSub("a", group="g2", consumer="c"))(fresh())
    retry = RetryMiddleware()
    broker.insert_middleware(retry)
    runtime = runtime_of(broker, retry)
    with pytest.raises(RetryConfigError, match="give each group a stream of its own"):
        await runtime.open(retry)
    assert runtime.live is None


async def test_the_engine_gets_a_client_of_its_own_with_the_brokers_settings() -> None:
    """Same address and options as the broker's, bytes responses, another pool; no network."""
    broker = RedisBroker("redis://127.0.0.1:6399/3", socket_timeout=7.0)
    made = await redis_subscribers.own_client(broker)
    assert made is not None
    client, close = made
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 6399, 3)
        assert kwargs["socket_timeout"] == 7.0
        assert kwargs["decode_responses"] is False
        assert broker.config.broker_config.connection._client is None, "the broker's untouched"
    finally:
        await close()
    assert await redis_subscribers.own_client(object()) is None


def configured(default: RetryPolicy | None = None, max_delay: Any = 3600) -> RetryConfig:
    """The middleware's options as RetryMiddleware builds them, ``max_delay`` as given."""
    return RetryMiddleware(default, max_delay=max_delay)._plugin.config


def test_a_delay_is_held_to_the_millisecond_and_capped_at_max_delay() -> None:
    """No tiers on Redis: jitter survives (no tick rounding), max_delay still bounds."""
    config = configured(max_delay=timedelta(seconds=10))
    policy = RetryPolicy(max_attempts=9, backoff=Exponential(1.0, jitter=0.5, maximum=60))
    route = Route("s", (Handler(None),))
    plan = exact_plan([route], policy, config)
    assert plan.queues == ()
    assert plan.tiers.max_delay_ms == 10_000
    delays = {
        decide(
            RuntimeError(),
            attempt=1,
            handler=None,
            default=policy,
            tiers=plan.tiers,
            rand=random.Random(seed).random,
        ).delay_ms
        for seed in range(50)
    }
    assert len(delays) > 40, "jittered delays are not rounded onto a grid"
    assert all(500 <= d <= 1500 for d in delays)
    late = decide(
        RuntimeError(), attempt=8, handler=None, default=policy, tiers=plan.tiers, rand=lambda: 0.5
    )
    assert late.delay_ms == 10_000


# The sink, against a stand-in for the engine.


class Engine:
    """What RedisSink calls of RedisRetryEngine, recorded; ``refuse`` raises from the scripts."""

    def __init__(self, *, pending: bool = True, refuse: Exception | None = None) -> None:
        self.pending = pending
        self.refuse = refuse
        self.scheduled: list[tuple[int, dict[str, Any]]] = []
        self.letters: list[dict[str, Any]] = []
        self.abandoned: list[str] = []
        self.settlements = Settlements()
        self.holds: dict[str, int] = {}
        """Per entry id: the claimer's holds on it taken and not released (0: none)."""

    def group(self, stream: str) -> str:
        return "g"

    def settling(self, entry: Any) -> contextlib.AbstractContextManager[None]:
        holds = self.holds

        @contextlib.contextmanager
        def hold() -> Iterator[None]:
            holds[entry.id] = holds.get(entry.id, 0) + 1
            try:
                yield
            finally:
                holds[entry.id] -= 1

        return hold()

    async def retry_later(
        self, entry: Any, *, delay_ms: int, headers: dict[str, Any]
    ) -> int | None:
        if self.refuse is not None:
            raise self.refuse
        redis_steps.encode_copy(entry, headers)  # raises EnvelopeTooLarge as the engine does
        self.scheduled.append((delay_ms, headers))
        return 1 if self.pending else None

    async def dead_letter(self, entry: Any, *, headers: dict[str, Any]) -> bool:
        if self.refuse is not None:
            raise self.refuse
        self.letters.append(headers)
        return self.pending

    def abandon(self, entry: Any) -> None:
        self.abandoned.append(entry.id)


class Message:
    def __init__(self, headers: dict[str, str] | None = None) -> None:
        # An older producer's JSON envelope: it holds headers the binary format cannot.
        body = json.dumps({"data": '{"id": 1}', "headers": headers or {"correlation_id": "c"}})
        self.raw_message = {
            "channel": "s",
            "message_ids": [b"1-0"],
            "data": {b"__data__": body.encode()},
        }
        self.message_id = "first-id"
        self.headers = headers or {}


def sink_for(engine: Engine, events: list[RetryEvent]) -> tuple[RedisSink, Route, Any]:
    policy = RetryPolicy(max_attempts=3)
    route = Route("s", (Handler(None),))
    config = configured(policy)
    plan = exact_plan([route], policy, config)
    sink = RedisSink(engine, plan, Reporter(Telemetry(), [events.append]))  # type: ignore[arg-type]
    return sink, route, plan


def decided(plan: Any, attempt: int) -> Any:
    return decide(
        ConnectionError("down"),
        attempt=attempt,
        handler=None,
        default=RetryPolicy(max_attempts=3),
        tiers=plan.tiers,
        rand=lambda: 0.5,
    )


async def test_a_retry_is_one_scheduled_copy_carrying_the_first_deliverys_id() -> None:
    """The copy's headers have the attempt, the due time and the message id of attempt 1."""
    engine, events = Engine(), list[RetryEvent]()
    sink, route, plan = sink_for(engine, events)
    decision = decided(plan, 1)
    assert decision.action is Action.RETRY_LATER
    assert await sink.retry(Message(), route, decision, ConnectionError("down")) is False
    await engine.settlements.drain()
    ((delay, headers),) = engine.scheduled
    assert delay == decision.delay_ms
    assert h.read_attempt(headers) == 1
    assert headers["message_id"] == "first-id"
    assert [e.kind for e in events] == [EventKind.SCHEDULED]
    assert engine.holds == {"1-0": 0}, "the keep-alive's hold on the entry is released"


async def test_a_step_that_found_nothing_pending_reports_nothing() -> None:
    """A claimer took the entry: the sink writes nothing, tells nothing, and the scope settles."""
    engine, events = Engine(pending=False), list[RetryEvent]()
    sink, route, plan = sink_for(engine, events)
    assert await sink.retry(Message(), route, decided(plan, 1), ConnectionError()) is False
    assert await sink.dead_letter(Message(), route, decided(plan, 3), ConnectionError()) is True
    await engine.settlements.drain()
    assert events == []


async def test_a_step_redis_refuses_leaves_the_entry_pending_to_the_claimer() -> None:
    """The step runs beside the handler: refused, its entry is abandoned and nothing reported.

    The handler's turn does not see the refusal; FastStream is told the message is settled
    (no XACK of its own), so the entry stays pending for the claimer.
    """
    refusal = ResponseError("READONLY You can't write against a read only replica.")
    engine, events = Engine(refuse=refusal), list[RetryEvent]()
    sink, route, plan = sink_for(engine, events)
    settled: list[Any] = []
    sink = RedisSink(engine, plan, Reporter(Telemetry(), [events.append]), settled.append)  # type: ignore[arg-type]
    first, second = Message(), Message()
    assert await sink.retry(first, route, decided(plan, 1), ConnectionError()) is False
    assert await sink.dead_letter(second, route, decided(plan, 3), ConnectionError()) is True
    await engine.settlements.drain()
    assert settled == [first, second]
    assert engine.abandoned == ["1-0", "1-0"]
    assert events == []
    assert engine.holds == {"1-0": 0}, "a refused step releases its hold too"


async def test_a_copy_the_format_cannot_hold_is_a_lean_dead_letter() -> None:
    """Its own 70,000-byte header: dead-lettered as invalid (HeadersTooLarge), not retried."""
    engine, events = Engine(), list[RetryEvent]()
    sink, route, plan = sink_for(engine, events)
    message = Message({"correlation_id": "c", "big": "x" * 70_000})
    assert await sink.retry(message, route, decided(plan, 1), ConnectionError("down")) is False
    await engine.settlements.drain()
    assert engine.scheduled == []
    ((headers,),) = [engine.letters]
    assert headers[h.REASON] == "invalid"
    assert headers[h.EXCEPTION] == "faststream_retry.HeadersTooLarge"
    assert [e.kind for e in events] == [EventKind.DEAD_LETTERED]
    fitted = redis_steps.fitted(headers)
    assert "big" not in fitted
    assert fitted[h.ERROR].startswith("Left out to fit in FastStream's binary format (65,535")


def test_a_fitted_dead_letter_keeps_what_fits_and_the_retry_state() -> None:
    """Lean first; then the own headers too large for the format go, largest first."""
    small = {h.REASON: "exhausted", h.ATTEMPT: "3", h.HISTORY: [{"attempt": 1}], "own": "o"}
    assert redis_steps.fitted(small) == fit.lean(small)
    large = {**small, "a": "a" * 70_000, "b": "b" * 66_000, "c": "c" * 100}
    kept = redis_steps.fitted(large)
    assert set(kept) >= {h.REASON, h.ATTEMPT, "own", "c"}
    assert "a" not in kept
    assert "b" not in kept
    envelope.build(b"", envelope.to_wire(kept))  # fits


def test_a_copy_too_large_for_the_format_is_dead_lettered_as_invalid() -> None:
    """What a claimed entry's dead letter says when its retry copy would not fit."""
    headers = redis_steps.too_large_headers(
        {"own": "x"}, stream="s", attempt=2, now_ms=5, cause="faststream_retry.ConsumerLost"
    )
    assert headers[h.REASON] == "invalid"
    assert headers[h.EXCEPTION] == "faststream_retry.HeadersTooLarge"
    assert headers[h.ORIGIN_QUEUE] == "s"
    assert h.read_attempt(headers) == 2
    assert headers[h.ERROR].endswith("; it had failed with faststream_retry.ConsumerLost")
    assert "65,535 bytes per header" in headers[h.ERROR]


@pytest.mark.parametrize(
    "text",
    [
        refusals.not_a_stream("channel", "x"),
        refusals.not_a_stream("list", "x"),
        refusals.no_group("x"),
        refusals.no_ack("x"),
        refusals.batch("x"),
    ],
)
def test_each_refusal_names_the_subscriber_and_both_fixes(text: str) -> None:
    """The stream fix, and retries off."""
    assert "'x'" in text
    assert "StreamSub(" in text or "no_ack off" in text or "batch=False" in text
    assert text.endswith("or switch its retries off with @retry_policy(enabled=False)")
