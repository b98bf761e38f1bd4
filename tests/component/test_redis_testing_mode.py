"""The middleware's decisions under TestRedisBroker: test mode on Redis, as on RabbitMQ and NATS.

Pure middleware decisions, no server: the broker's URL points at a port nothing listens
on, so anything that tried the network would fail the test.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from faststream import BaseMiddleware
from faststream.message import AckStatus
from faststream.redis import (
    ListSub,
    RedisBroker,
    RedisRouter,
    RedisStreamMessage,
    StreamSub,
    TestRedisBroker,
)

from faststream_retry import (
    EventKind,
    Exponential,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)

NOWHERE = "redis://127.0.0.1:1"
"""No server: test mode must not touch the network."""


def orders(stream: str = "orders", group: str = "workers") -> StreamSub:
    return StreamSub(stream, group=group, consumer="c1")


def make(**options: Any) -> tuple[RetryMiddleware, RedisBroker]:
    retry = RetryMiddleware(
        default=RetryPolicy(max_attempts=4, backoff=Exponential(initial=1, factor=2)), **options
    )
    return retry, RedisBroker(NOWHERE, middlewares=[retry])


async def test_transient_failures_are_retried_at_once_and_recorded() -> None:
    """Delays computed as in production (to the millisecond), not waited for; the handler sees
    its attempt as the header a copy the mover puts back carries on Redis (decimal text)."""
    retry, broker = make()
    seen: list[Any] = []

    @broker.subscriber(stream=orders())
    async def handle(body: str, msg: RedisStreamMessage) -> None:
        seen.append(msg.headers.get("retry-attempt"))
        if len(seen) < 3:
            raise ConnectionError("db down")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("hi", stream="orders")
    assert seen == [None, "1", "2"]
    assert [(e.kind, e.attempt, e.delay_ms, e.queue) for e in recorder.events] == [
        (EventKind.SCHEDULED, 1, 1000, "orders"),
        (EventKind.SCHEDULED, 2, 2000, "orders"),
    ]


async def test_an_exhausted_message_reaches_the_dead_letter_stream_as_redis_holds_it() -> None:
    """max_attempts calls, then the dead letter on ``{orders}.dlq``: the body untouched, the
    app's headers kept, the ``retry-*`` record as text (the history as JSON), the message id
    every attempt had."""
    retry, broker = make()
    calls = 0
    dead: list[tuple[bytes, dict[str, Any], str, str | None]] = []
    ids: set[str] = set()

    @broker.subscriber(stream=orders())
    async def handle(body: bytes, msg: RedisStreamMessage) -> None:
        nonlocal calls
        calls += 1
        ids.add(msg.message_id)
        raise TimeoutError("warehouse down")

    @broker.subscriber(stream="{orders}.dlq")
    @retry_policy(enabled=False)
    async def letters(body: bytes, msg: RedisStreamMessage) -> None:
        dead.append((body, dict(msg.headers), msg.raw_message["channel"], msg.correlation_id))

    body = b"\x00\xffnot utf-8"
    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish(body, stream="orders", headers={"app": "kept"}, correlation_id="c-7")
    assert calls == 4
    (event,) = recorder.dead_letters
    assert (event.reason, event.attempt, event.queue) == ("exhausted", 4, "orders")
    assert event.dlq == "{orders}.dlq"
    ((letter, headers, stream, correlation_id),) = dead
    assert (letter, stream, correlation_id) == (body, "{orders}.dlq", "c-7")
    assert headers["app"] == "kept"
    assert all(isinstance(value, str) for value in headers.values())
    assert headers["retry-reason"] == "exhausted"
    assert headers["retry-attempt"] == "4"
    assert headers["retry-exception"] == "TimeoutError"
    assert headers["retry-error"] == "warehouse down"
    assert headers["retry-origin-queue"] == "orders"
    assert "TimeoutError: warehouse down" in headers["retry-traceback"]
    assert json.loads(headers["retry-history"])[-1]["exception"] == "TimeoutError"
    assert [headers["message_id"]] == list(ids) == [event.message_id]
    assert "retry-due" not in headers


async def test_a_permanent_failure_is_acknowledged_and_swallowed() -> None:
    """PermanentError: one call, a dead letter, no exception for the test; the entry is
    acknowledged, as the live dead-letter script's XACK does."""
    retry = RetryMiddleware()
    committed: list[AckStatus | None] = []

    class Outer(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            try:
                return await call_next(msg)
            finally:
                committed.append(msg.committed)

    broker = RedisBroker(NOWHERE, middlewares=[Outer, retry])
    calls = 0

    @broker.subscriber(stream=orders("hooks", "hooks"))
    async def hook(body: str) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("no url")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", stream="hooks")
    assert calls == 1
    (dead,) = recorder.dead_letters
    assert (dead.reason, dead.rule) == ("permanent", "explicit")
    assert committed == [AckStatus.ACKED]


async def test_retry_later_and_a_handlers_policy_are_the_productions() -> None:
    """RetryLater's delay is recorded; ``@retry_policy(max_attempts=2)`` dead-letters at 2."""
    retry, broker = make()
    later_calls = 0

    @broker.subscriber(stream=orders("later"))
    async def later(body: str) -> None:
        nonlocal later_calls
        later_calls += 1
        if later_calls == 1:
            raise RetryLater(delay=30)

    @broker.subscriber(stream=orders("short"))
    @retry_policy(max_attempts=2)
    async def short(body: str) -> None:
        raise ConnectionError("down")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", stream="later")
            await br.publish("x", stream="short")
    assert [(e.queue, e.delay_ms) for e in recorder.scheduled] == [
        ("later", 30_000),
        ("short", 1000),
    ]
    assert [(e.queue, e.attempt) for e in recorder.dead_letters] == [("short", 2)]


async def test_outside_a_testing_block_the_plugin_stays_out_of_the_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No ``retry.testing()``: the handler runs once and its exception comes out of publish(),
    as without the plugin, with nothing logged by the plugin."""
    _, broker = make()
    calls: list[str] = []

    @broker.subscriber(stream=orders())
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    with caplog.at_level(logging.DEBUG, logger="faststream_retry"):
        async with TestRedisBroker(broker) as br:
            with pytest.raises(ConnectionError, match="bad"):
                await br.publish("bad", stream="orders")
    assert calls == ["bad"]
    assert [r.getMessage() for r in caplog.records if r.name == "faststream_retry"] == []


async def test_a_handler_with_retries_off_passes_its_exception_through() -> None:
    """``@retry_policy(enabled=False)``: FastStream sees the exception; nothing recorded."""
    retry, broker = make()

    @broker.subscriber(stream=orders("raw"))
    @retry_policy(enabled=False)
    async def raw(body: str) -> None:
        raise ValueError("mine to handle")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder, pytest.raises(ValueError, match="mine to handle"):
            await br.publish("x", stream="raw")
    assert recorder.events == []


@pytest.mark.parametrize(
    ("declare", "publish", "refusal"),
    [
        ({"channel": "pings"}, {"channel": "pings"}, r"channel 'pings'.*StreamSub\('pings'"),
        ({"list": ListSub("jobs")}, {"list": "jobs"}, r"list 'jobs'.*StreamSub\('jobs'"),
        ({"stream": "events"}, {"stream": "events"}, r"stream 'events' .*without a consumer"),
    ],
)
async def test_a_subscriber_a_start_refuses_fails_the_test_as_it_fails_the_start(
    declare: dict[str, Any], publish: dict[str, Any], refusal: str
) -> None:
    """A pub/sub channel, a list, a stream read without a group, with retries on: nothing
    holds a delivered message, so a real start refuses them; test mode raises the same
    RetryConfigError, naming the fix, every time, rather than retrying in memory."""
    retry, broker = make()
    calls = 0

    @broker.subscriber(**declare)
    async def ping(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("down")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            for _ in range(2):  # said again, not only once
                with pytest.raises(RetryConfigError, match=refusal) as refused:
                    await br.publish("x", **publish)
                assert "cannot run on this RedisBroker" in str(refused.value)
    assert calls == 0
    assert recorder.events == []


async def test_a_no_ack_or_batch_stream_fails_the_test_as_it_fails_the_start() -> None:
    """``no_ack=True`` and ``batch=True`` on a grouped stream: both named in one error."""
    retry, broker = make()

    @broker.subscriber(stream=StreamSub("fast", group="g", consumer="c", no_ack=True))
    async def fast(body: str) -> None: ...

    @broker.subscriber(stream=StreamSub("bulk", group="g", consumer="c", batch=True))
    async def bulk(body: list[str]) -> None: ...

    async with TestRedisBroker(broker) as br:
        with retry.testing(), pytest.raises(RetryConfigError) as refused:
            await br.publish("x", stream="fast")
    assert "'fast' reads with no_ack=True" in str(refused.value)
    assert "'bulk' takes batches" in str(refused.value)


async def test_a_channel_subscriber_with_retries_off_is_left_to_faststream() -> None:
    """The fix the refusal names: ``@retry_policy(enabled=False)`` on it, and test mode runs."""
    retry, broker = make()

    @broker.subscriber(channel="pings")
    @retry_policy(enabled=False)
    async def ping(body: str) -> None:
        raise ConnectionError("mine")

    @broker.subscriber(stream=orders())
    async def handle(body: str) -> None:
        raise PermanentError("bad")

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            with pytest.raises(ConnectionError, match="mine"):
                await br.publish("x", channel="pings")
            await br.publish("x", stream="orders")
    assert [e.queue for e in recorder.dead_letters] == ["orders"]


async def test_outage_mode_holds_nothing_in_test_mode() -> None:
    """``outage_after`` starts on Redis; under ``TestRedisBroker`` no message is held and no
    outage reported (as under ``TestRabbitBroker``): failures are retried as test mode does."""
    retry, broker = make(outage_after=2)
    calls: list[str] = []

    @broker.subscriber(stream=orders())
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError("down")

    async with TestRedisBroker(broker) as br:
        with retry.testing(raise_on_dead_letter=False) as recorder:
            await br.publish("x", stream="orders")
            await br.publish("y", stream="orders")
    assert calls == ["x"] * 4 + ["y"] * 4
    assert len(recorder.dead_letters) == 2
    assert not [e for e in recorder.events if "outage" in str(e.kind)]


async def test_a_stream_on_a_prefixed_router_and_a_hash_tag_are_covered() -> None:
    """A router prefix is part of the stream's name, and a name with its own hash tag keeps
    it: their dead letters go to ``{eu.orders}.dlq`` and ``{tenant}.orders.dlq``."""
    retry, broker = make()
    router = RedisRouter(prefix="eu.")
    streams: list[str] = []

    @router.subscriber(stream=orders())
    async def eu(body: str) -> None:
        raise PermanentError("no")

    @broker.subscriber(stream=orders("{tenant}.orders"))
    async def tenant(body: str) -> None:
        raise PermanentError("no")

    for dlq in ("{eu.orders}.dlq", "{tenant}.orders.dlq"):

        @broker.subscriber(stream=dlq)
        @retry_policy(enabled=False)
        async def letters(body: str, msg: RedisStreamMessage) -> None:
            streams.append(msg.raw_message["channel"])

    broker.include_router(router)
    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", stream="eu.orders")
            await br.publish("x", stream="{tenant}.orders")
    assert [e.queue for e in recorder.dead_letters] == ["eu.orders", "{tenant}.orders"]
    assert streams == ["{eu.orders}.dlq", "{tenant}.orders.dlq"]


async def test_an_installed_broker_runs_test_mode_without_a_network() -> None:
    """``install()``: TestRedisBroker fakes the start, so the plugin opens nothing; inside
    ``retry.testing()`` failures are recorded as with ``middlewares=[retry]``."""
    retry = RetryMiddleware(default=RetryPolicy(max_attempts=2))
    broker = RedisBroker(NOWHERE)
    retry.install(broker)

    @broker.subscriber(stream=orders())
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("bad", stream="orders")
    assert [e.kind for e in recorder.events] == [EventKind.SCHEDULED, EventKind.DEAD_LETTERED]


async def test_raise_on_dead_letter_re_raises_the_last_exception() -> None:
    """``testing(raise_on_dead_letter=True)``: pytest.raises tests keep working; retries count."""
    retry, broker = make()
    calls = 0

    @broker.subscriber(stream=orders("pay"))
    async def pay(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"bank down ({calls})")

    async with TestRedisBroker(broker) as br:
        with (
            retry.testing(raise_on_dead_letter=True) as recorder,
            pytest.raises(ConnectionError, match=r"bank down \(4\)"),
        ):
            await br.publish("x", stream="pay")
    assert calls == 4
    assert [e.kind for e in recorder.events] == [EventKind.SCHEDULED] * 3 + [
        EventKind.DEAD_LETTERED
    ]


async def test_a_failing_dead_letter_subscriber_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the dead-letter subscriber: raised under raise_on_dead_letter (the handler's
    exception its cause), otherwise one ERROR line naming the dead-letter stream."""
    retry, broker = make()

    @broker.subscriber(stream=orders("inv"))
    @retry_policy(max_attempts=1)
    async def invoices(body: str) -> None:
        raise ValueError("bad invoice")

    @broker.subscriber(stream="{inv}.dlq")
    @retry_policy(enabled=False)
    async def invoices_dlq(body: str) -> None:
        raise RuntimeError("dlq consumer bug")

    caplog.set_level(logging.ERROR, logger="faststream_retry")
    async with TestRedisBroker(broker) as br:
        with (
            retry.testing(raise_on_dead_letter=True),
            pytest.raises(RuntimeError, match="dlq consumer bug") as raised,
        ):
            await br.publish("x", stream="inv", headers={"message_id": "i-1"})
        assert isinstance(raised.value.__cause__, ValueError)
        with retry.testing() as recorder:
            await br.publish("x", stream="inv", headers={"message_id": "i-2"})
    assert len(recorder.dead_letters) == 1
    lines = [r.getMessage() for r in caplog.records if "subscriber failed" in r.msg]
    assert lines == ["the {inv}.dlq subscriber failed on the dead letter of message i-2"]
