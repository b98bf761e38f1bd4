"""Each FastStream internal the plugin reads, on the FastStream installed: one test per probe.

When FastStream renames one of them, the test of that probe fails here, and ``install()``
refuses to run with an error naming it (``test_a_renamed_internal_stops_install``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from faststream import BaseMiddleware, SourceType
from faststream.middlewares import AckPolicy
from faststream.rabbit import RabbitBroker, RabbitQueue, RabbitRouter, TestRabbitBroker

from faststream_retry import RetryConfigError, RetryMiddleware, retry_policy
from faststream_retry.middleware import _internals as fs


def prefixed_subscriber() -> tuple[RabbitBroker, Any, Any]:
    broker = RabbitBroker()
    router = RabbitRouter(prefix="svc.")

    @retry_policy(max_attempts=7)
    async def orders(body: str) -> None: ...

    router.subscriber("orders")(orders)
    broker.include_router(router)
    (sub,) = broker.subscribers
    return broker, sub, orders


def test_the_router_prefix_is_part_of_the_queue_name() -> None:
    """``SubscriberUsecase._outer_config.prefix``: prefixed queues keep their retries."""
    _, sub, _ = prefixed_subscriber()
    assert fs.queue_of(sub) == "svc.orders"


def test_a_subscriber_lists_its_routers_and_its_brokers_middlewares() -> None:
    """``_outer_config.broker_middlewares``: where a ``RetryMiddleware`` may sit, all found."""

    class OnBroker(BaseMiddleware): ...

    class OnRouter(BaseMiddleware): ...

    class OnInclude(BaseMiddleware): ...

    class OnInner(BaseMiddleware): ...

    on_broker, on_router, on_include, on_inner = OnBroker, OnRouter, OnInclude, OnInner

    broker = RabbitBroker(middlewares=[on_broker])
    router = RabbitRouter(prefix="svc.", middlewares=[on_router])
    inner = RabbitRouter(prefix="in.", middlewares=[on_inner])
    inner.subscriber("orders")(print)
    router.include_router(inner)
    broker.include_router(router, middlewares=[on_include])
    (sub,) = broker.subscribers
    assert set(fs.middlewares_of(sub)) == {on_broker, on_router, on_include, on_inner}
    assert fs.queue_of(sub) == "svc.in.orders"
    assert fs.middlewares_of(object()) == []


def test_the_handler_function_is_the_declared_one() -> None:
    """``calls``, ``HandlerItem.handler`` and ``_declared_call``/``_original_call``."""
    _, sub, orders = prefixed_subscriber()
    (item,) = sub.calls
    assert fs.declared_function(item) is orders


def test_routes_carry_each_handlers_policy() -> None:
    """The handler's ``@retry_policy`` reaches the plan (else it would silently be the default)."""
    broker, _, _ = prefixed_subscriber()
    (route,) = fs.routes_of(broker)
    assert route.queue == "svc.orders"
    (handler,) = route.handlers
    assert handler.policy is not None
    assert handler.policy.options == {"max_attempts": 7}


@pytest.mark.parametrize(
    ("queue", "transient"),
    [
        (RabbitQueue("q"), False),  # FastStream 0.7 declares durable unless told
        (RabbitQueue("q", durable=False), True),
        (RabbitQueue("q", durable=False, exclusive=True), False),
        (RabbitQueue("q", durable=False, declare=False), False),  # its flags are unknown
    ],
)
def test_a_route_says_whether_its_queue_is_declared_transient(
    queue: RabbitQueue, *, transient: bool
) -> None:
    """RabbitQueue's durable, exclusive and declare: what RabbitMQ 4.x deprecates."""
    broker = RabbitBroker()

    @broker.subscriber(queue)
    async def handle(body: str) -> None: ...

    (route,) = fs.routes_of(broker)
    assert route.transient is transient


@pytest.mark.parametrize("on_router", [False, True])
def test_the_policy_is_found_above_or_below_the_publisher(on_router: bool) -> None:
    """``@retry_policy`` over ``@broker.publisher`` (FastStream's slotted wrapper) or under it."""
    broker = RabbitBroker()
    registrar: Any = RabbitRouter(prefix="svc.") if on_router else broker

    @registrar.subscriber("below")
    @registrar.publisher("out")
    @retry_policy(max_attempts=2)
    async def below(body: str) -> str:
        return body

    @registrar.subscriber("above")
    @retry_policy(max_attempts=3)
    @registrar.publisher("out")
    async def above(body: str) -> str:
        return body

    @retry_policy(max_attempts=4)
    @registrar.subscriber("outside")
    async def outside(body: str) -> str:
        return body

    if on_router:
        broker.include_router(registrar)
    prefix = "svc." if on_router else ""
    found = {
        route.queue: [h.policy.options if h.policy else None for h in route.handlers]
        for route in fs.routes_of(broker)
    }
    assert found == {
        f"{prefix}below": [{"max_attempts": 2}],
        f"{prefix}above": [{"max_attempts": 3}],
        f"{prefix}outside": [{"max_attempts": 4}],
    }


def test_the_wrappers_policy_wins_over_the_functions() -> None:
    """Two ``@retry_policy`` on one handler: the one applied last (outermost) rules."""
    broker = RabbitBroker()

    @broker.subscriber("twice")
    @retry_policy(max_attempts=5)
    @broker.publisher("out")
    @retry_policy(max_attempts=2)
    async def twice(body: str) -> str:
        return body

    (sub,) = broker.subscribers
    (item,) = sub.calls
    policy = fs.handler_policy(item)
    assert policy is not None
    assert policy.options == {"max_attempts": 5}


async def test_filters_pick_the_handler_and_its_policy() -> None:
    """``HandlerItem.filter``: a queue with several handlers gets each message's own policy."""
    broker = RabbitBroker()
    sub = broker.subscriber("q")

    @sub(filter=lambda m: m.content_type == "application/json")
    @retry_policy(max_attempts=2)
    async def json_handler(body: dict[str, Any]) -> None: ...

    @sub
    @retry_policy(max_attempts=9)
    async def other(body: str) -> None: ...

    (route,) = fs.routes_of(broker)
    json_msg = SimpleNamespace(content_type="application/json", processed=False)
    text_msg = SimpleNamespace(content_type="text/plain", processed=False)
    json_policy = await fs.select_policy(route, json_msg)
    text_policy = await fs.select_policy(route, text_msg)
    assert json_policy is not None
    assert json_policy.options == {"max_attempts": 2}
    assert text_policy is not None
    assert text_policy.options == {"max_attempts": 9}


def test_ack_policy_is_read() -> None:
    """``SubscriberUsecase.ack_policy``: ACK_FIRST subscribers are refused at start."""
    broker = RabbitBroker()
    first = broker.subscriber("a", ack_policy=AckPolicy.ACK_FIRST)
    plain = broker.subscriber("b")
    assert fs.acks_first(first)
    assert not fs.acks_first(plain)


async def test_the_test_broker_is_recognised() -> None:
    """``config.producer`` is FastStream's ``FakeProducer`` only inside TestRabbitBroker."""
    broker, _, _ = prefixed_subscriber()
    assert not fs.under_test_broker(broker)
    async with TestRabbitBroker(broker):
        assert fs.under_test_broker(broker)
    assert not fs.under_test_broker(broker)


async def test_the_subscriber_is_in_context_under_its_key() -> None:
    """Context key ``"handler_"``: without it no failure could be matched to its queue."""
    seen: list[Any] = []

    class Spy(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            seen.append(fs.current_subscriber(self.context))
            seen.append(fs.current_broker(self.context))
            return await call_next(msg)

    broker = RabbitBroker(middlewares=[Spy])

    @broker.subscriber("q")
    async def handle(body: str) -> None: ...

    async with TestRabbitBroker(broker):
        await broker.publish("x", queue="q")
    (sub,) = broker.subscribers
    assert seen == [sub, broker]


class NoSubscriberContext:
    """A context where FastStream kept the broker but not the subscriber (a renamed key)."""

    def __init__(self, broker: RabbitBroker) -> None:
        self.broker = broker

    def get_local(self, key: str, default: Any = None) -> Any:
        return self.broker if key == "broker" else default


async def test_a_failure_without_its_subscriber_is_left_to_faststream_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No subscriber in context: the failure goes on untouched, with one WARNING per middleware."""

    async def fails(msg: Any) -> None:
        raise ValueError("boom")

    def message() -> Any:
        return SimpleNamespace(
            source_type=SourceType.CONSUME, headers={}, message_id="m", committed=None
        )

    broker = RabbitBroker()
    context: Any = NoSubscriberContext(broker)
    caplog.set_level(logging.WARNING, logger="faststream_retry")
    first, second = RetryMiddleware(), RetryMiddleware()
    for middleware in (first, first, second):
        with pytest.raises(ValueError, match="boom"):
            await middleware(None, context=context).consume_scope(fails, message())
    said = (
        "faststream-retry: a failed message reached the middleware without its subscriber "
        "in FastStream's context (key 'handler_'), so it is left to FastStream's ack policy. "
        f"Unless it came from get_one() or an iterator, FastStream {fs.FASTSTREAM_VERSION} "
        "may have renamed that key"
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "faststream_retry"]
    assert lines == [said, said], "once per middleware"


def test_every_probe_passes_on_the_installed_faststream() -> None:
    """What install() checks: nothing is missing on the version CI installs."""
    assert fs.problems(fs.sample()) == []
    fs.check()


@pytest.mark.parametrize(
    ("broken", "name"),
    [
        ("prefix", "SubscriberUsecase._outer_config.prefix"),
        ("middlewares", "SubscriberUsecase._outer_config.broker_middlewares"),
        ("calls", "SubscriberUsecase.calls"),
        ("handler", "HandlerItem.handler"),
        ("function", "HandlerItem.handler._declared_call / _original_call"),
        ("ack_policy", "SubscriberUsecase.ack_policy"),
        ("running", "SubscriberUsecase.running"),
        ("producer", "BrokerUsecase.config.producer"),
        ("logger", "BrokerUsecase.config.logger"),
        ("logger_object", "BrokerUsecase.config.logger"),
    ],
)
def test_a_renamed_internal_is_named(broken: str, name: str) -> None:
    """A sample missing one internal is reported by that internal's name."""
    item = SimpleNamespace(filter=lambda _: True, handler=SimpleNamespace(_declared_call=print))
    sub = SimpleNamespace(
        queue=SimpleNamespace(name="queue"),
        _outer_config=SimpleNamespace(prefix="probe.", broker_middlewares=[fs._probe_middleware]),
        calls=[item],
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        running=False,
    )
    logger_state = SimpleNamespace(log=print, logger=None)
    broker = SimpleNamespace(config=SimpleNamespace(producer=object(), logger=logger_state))
    handler = item.handler  # what the subscriber decorator returned
    if broken == "prefix":
        del sub._outer_config.prefix
    elif broken == "middlewares":
        del sub._outer_config.broker_middlewares
    elif broken == "calls":
        del sub.calls
    elif broken == "handler":  # another object than the decorator returned
        item.handler = SimpleNamespace(_declared_call=print)
    elif broken == "function":
        del item.handler._declared_call
    elif broken == "ack_policy":
        del sub.ack_policy
    elif broken == "running":
        del sub.running
    elif broken == "producer":
        del broker.config.producer
    elif broken == "logger":
        del logger_state.log
    else:
        del logger_state.logger
    assert fs.problems(fs.Sample(broker, sub, print, "probe.queue", handler)) == [name]


def test_a_renamed_internal_stops_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """install() raises RetryConfigError naming the FastStream version and the name."""
    monkeypatch.setattr(fs, "_checked", lambda: ("SubscriberUsecase.calls",))
    with pytest.raises(RetryConfigError) as caught:
        RetryMiddleware().install(RabbitBroker())
    text = str(caught.value)
    assert f"FastStream {fs.FASTSTREAM_VERSION}" in text
    assert "SubscriberUsecase.calls" in text
