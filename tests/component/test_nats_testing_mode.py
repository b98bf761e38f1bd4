"""The middleware's decisions under TestNatsBroker: test mode on NATS, as on RabbitMQ.

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
from faststream.nats import JStream, NatsBroker, NatsMessage, NatsRouter, PullSub, TestNatsBroker

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

NOWHERE = "nats://127.0.0.1:1"
"""No server: test mode must not touch the network."""

ORDERS = JStream("ORDERS", subjects=["orders.>"])
PULL = PullSub()


def make(**options: Any) -> tuple[RetryMiddleware, NatsBroker]:
    retry = RetryMiddleware(
        default=RetryPolicy(max_attempts=4, backoff=Exponential(initial=1, factor=2)), **options
    )
    return retry, NatsBroker(NOWHERE, middlewares=[retry], logger=None)


async def test_transient_failures_are_retried_at_once_and_recorded() -> None:
    """Delays computed as in production, not waited for; the handler sees its attempt as the
    header a real retry carries on NATS (JSON text)."""
    retry, broker = make()
    seen: list[Any] = []

    @broker.subscriber("orders.new", stream=ORDERS, durable="workers", pull_sub=PULL)
    async def handle(body: str, msg: NatsMessage) -> None:
        seen.append(msg.headers.get("retry-attempt"))
        if len(seen) < 3:
            raise ConnectionError("db down")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("hi", "orders.new", stream="ORDERS")
    assert seen == [None, "1", "2"]
    assert [(e.kind, e.attempt, e.delay_ms, e.queue) for e in recorder.events] == [
        (EventKind.SCHEDULED, 1, 1000, "ORDERS.workers"),
        (EventKind.SCHEDULED, 2, 2000, "ORDERS.workers"),
    ]


async def test_an_exhausted_message_reaches_the_dead_letter_subject_as_the_stream_holds_it() -> (
    None
):
    """max_attempts calls, then the dead letter on ``<prefix>.dlq.<stream>.<durable>``: the body
    untouched, the app's headers kept, the ``retry-*`` record as JSON text, no Nats-Msg-Id."""
    retry, broker = make()
    calls = 0
    dead: list[tuple[bytes, dict[str, Any], str, str | None]] = []

    @broker.subscriber("orders.new", stream=ORDERS, durable="workers", pull_sub=PULL)
    async def handle(body: bytes) -> None:
        nonlocal calls
        calls += 1
        raise TimeoutError("warehouse down")

    @broker.subscriber("retry.dlq.>")
    @retry_policy(enabled=False)
    async def letters(body: bytes, msg: NatsMessage) -> None:
        dead.append((body, dict(msg.headers), msg.raw_message.subject, msg.correlation_id))

    body = b"\x00\xffnot utf-8"
    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish(
                body, "orders.new", stream="ORDERS", headers={"app": "kept"}, correlation_id="c-7"
            )
    assert calls == 4
    (event,) = recorder.dead_letters
    assert (event.reason, event.attempt, event.queue) == ("exhausted", 4, "ORDERS.workers")
    assert event.dlq == "retry.dlq.ORDERS.workers"
    ((letter, headers, subject, correlation_id),) = dead
    assert (letter, subject, correlation_id) == (body, "retry.dlq.ORDERS.workers", "c-7")
    assert headers["app"] == "kept"
    record = {k: json.loads(v) for k, v in headers.items() if k.startswith("retry-")}
    assert record["retry-reason"] == "exhausted"
    assert record["retry-attempt"] == 4
    assert record["retry-exception"] == "TimeoutError"
    assert record["retry-error"] == "warehouse down"
    assert record["retry-origin-queue"] == "ORDERS.workers"
    assert record["retry-subject"] == "orders.new"
    assert "TimeoutError: warehouse down" in record["retry-traceback"]
    assert "retry-due" not in record
    assert not any(k.lower().startswith("nats-") for k in headers)


async def test_a_permanent_failure_is_terminated_and_swallowed() -> None:
    """PermanentError: one call, a dead letter, no exception for the test; the message is
    terminated (JetStream would never deliver it again), not acked."""
    retry = RetryMiddleware()
    committed: list[AckStatus | None] = []

    class Outer(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            try:
                return await call_next(msg)
            finally:
                committed.append(msg.committed)

    broker = NatsBroker(NOWHERE, middlewares=[Outer, retry], logger=None)
    calls = 0

    @broker.subscriber("orders.bad", stream=ORDERS, durable="hooks", pull_sub=PULL)
    async def hook(body: str) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("no url")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", "orders.bad", stream="ORDERS")
    assert calls == 1
    (dead,) = recorder.dead_letters
    assert (dead.reason, dead.rule) == ("permanent", "explicit")
    assert committed == [AckStatus.REJECTED]


async def test_retry_later_and_a_handlers_policy_are_the_productions() -> None:
    """RetryLater's delay is recorded; ``@retry_policy(max_attempts=2)`` dead-letters at 2."""
    retry, broker = make()
    later_calls = 0

    @broker.subscriber("orders.later", stream=ORDERS, durable="later", pull_sub=PULL)
    async def later(body: str) -> None:
        nonlocal later_calls
        later_calls += 1
        if later_calls == 1:
            raise RetryLater(delay=30)

    @broker.subscriber("orders.short", stream=ORDERS, durable="short", pull_sub=PULL)
    @retry_policy(max_attempts=2)
    async def short(body: str) -> None:
        raise ConnectionError("down")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", "orders.later", stream="ORDERS")
            await br.publish("x", "orders.short", stream="ORDERS")
    assert [(e.queue, e.delay_ms) for e in recorder.scheduled] == [
        ("ORDERS.later", 30_000),
        ("ORDERS.short", 1000),
    ]
    assert [(e.queue, e.attempt) for e in recorder.dead_letters] == [("ORDERS.short", 2)]


async def test_outside_a_testing_block_the_plugin_stays_out_of_the_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No ``retry.testing()``: the handler runs once and its exception comes out of publish(),
    as without the plugin, with nothing logged by the plugin."""
    _, broker = make()
    calls: list[str] = []

    @broker.subscriber("orders.new", stream=ORDERS, durable="workers", pull_sub=PULL)
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    with caplog.at_level(logging.DEBUG, logger="faststream_retry"):
        async with TestNatsBroker(broker) as br:
            with pytest.raises(ConnectionError, match="bad"):
                await br.publish("bad", "orders.new", stream="ORDERS")
    assert calls == ["bad"]
    assert [r.getMessage() for r in caplog.records if r.name == "faststream_retry"] == []


async def test_a_handler_with_retries_off_passes_its_exception_through() -> None:
    """``@retry_policy(enabled=False)``: FastStream sees the exception; nothing recorded."""
    retry, broker = make()

    @broker.subscriber("orders.raw", stream=ORDERS, durable="raw", pull_sub=PULL)
    @retry_policy(enabled=False)
    async def raw(body: str) -> None:
        raise ValueError("mine to handle")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder, pytest.raises(ValueError, match="mine to handle"):
            await br.publish("x", "orders.raw", stream="ORDERS")
    assert recorder.events == []


async def test_a_core_nats_subscriber_with_retries_on_fails_the_test_as_it_fails_the_start() -> (
    None
):
    """A subscriber without a stream: nothing persisted, so a real start refuses it; test mode
    raises the same RetryConfigError, naming the fix, rather than retrying in memory."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("pings")
    async def ping(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("down")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            for _ in range(2):  # said again, not only once
                with pytest.raises(RetryConfigError, match=r"core-NATS subscriber.*JStream"):
                    await br.publish("x", "pings")
    assert calls == 0
    assert recorder.events == []


async def test_a_core_nats_subscriber_with_retries_off_is_left_to_faststream() -> None:
    """The fix the refusal names: ``@retry_policy(enabled=False)`` on it, and test mode runs."""
    retry, broker = make()

    @broker.subscriber("pings")
    @retry_policy(enabled=False)
    async def ping(body: str) -> None:
        raise ConnectionError("mine")

    @broker.subscriber("orders.new", stream=ORDERS, durable="workers", pull_sub=PULL)
    async def handle(body: str) -> None:
        raise PermanentError("bad")

    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            with pytest.raises(ConnectionError, match="mine"):
                await br.publish("x", "pings")
            await br.publish("x", "orders.new", stream="ORDERS")
    assert [e.queue for e in recorder.dead_letters] == ["ORDERS.workers"]


async def test_outage_mode_holds_nothing_in_test_mode() -> None:
    """``outage_after`` starts on NATS; under ``TestNatsBroker`` no message is held and no
    outage reported (as under ``TestRabbitBroker``): failures are retried as test mode does."""
    retry, broker = make(outage_after=2)
    calls: list[str] = []

    @broker.subscriber("orders.new", stream=ORDERS, durable="workers", pull_sub=PULL)
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError("down")

    async with TestNatsBroker(broker) as br:
        with retry.testing(raise_on_dead_letter=False) as recorder:
            await br.publish("x", "orders.new", stream="ORDERS")
            await br.publish("y", "orders.new", stream="ORDERS")
    assert calls == ["x"] * 4 + ["y"] * 4
    assert len(recorder.dead_letters) == 2
    assert not [e for e in recorder.events if "outage" in str(e.kind)]


async def test_an_ephemeral_subscriber_on_a_prefixed_router_is_covered() -> None:
    """No durable name, a router prefix: covered by its key (stream and hashed subject), and its
    dead letter goes to that key's subject."""
    retry, broker = make()
    router = NatsRouter(prefix="orders.")
    subjects: list[str] = []

    @router.subscriber("eu", stream=ORDERS)
    async def eu(body: str) -> None:
        raise PermanentError("no")

    @broker.subscriber("retry.dlq.>")
    @retry_policy(enabled=False)
    async def letters(body: str, msg: NatsMessage) -> None:
        subjects.append(msg.raw_message.subject)

    broker.include_router(router)
    async with TestNatsBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish("x", "orders.eu", stream="ORDERS")
    (dead,) = recorder.dead_letters
    assert dead.queue.startswith("ORDERS._")
    assert subjects == [f"retry.dlq.{dead.queue}"]


async def test_raise_on_dead_letter_re_raises_the_last_exception() -> None:
    """``testing(raise_on_dead_letter=True)``: pytest.raises tests keep working; retries count."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("orders.pay", stream=ORDERS, durable="pay", pull_sub=PULL)
    async def pay(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"bank down ({calls})")

    async with TestNatsBroker(broker) as br:
        with (
            retry.testing(raise_on_dead_letter=True) as recorder,
            pytest.raises(ConnectionError, match=r"bank down \(4\)"),
        ):
            await br.publish("x", "orders.pay", stream="ORDERS")
    assert calls == 4
    assert [e.kind for e in recorder.events] == [EventKind.SCHEDULED] * 3 + [
        EventKind.DEAD_LETTERED
    ]


async def test_a_failing_dead_letter_subscriber_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the dead-letter subscriber: raised under raise_on_dead_letter (the handler's
    exception its cause), otherwise one ERROR line naming the dead-letter subject."""
    retry, broker = make()

    @broker.subscriber("orders.inv", stream=ORDERS, durable="inv", pull_sub=PULL)
    @retry_policy(max_attempts=1)
    async def invoices(body: str) -> None:
        raise ValueError("bad invoice")

    @broker.subscriber("retry.dlq.ORDERS.inv")
    @retry_policy(enabled=False)
    async def invoices_dlq(body: str) -> None:
        raise RuntimeError("dlq consumer bug")

    caplog.set_level(logging.ERROR, logger="faststream_retry")
    async with TestNatsBroker(broker) as br:
        with (
            retry.testing(raise_on_dead_letter=True),
            pytest.raises(RuntimeError, match="dlq consumer bug") as raised,
        ):
            await br.publish("x", "orders.inv", stream="ORDERS", correlation_id="i-1")
        assert isinstance(raised.value.__cause__, ValueError)
        with retry.testing() as recorder:
            await br.publish("x", "orders.inv", stream="ORDERS", correlation_id="i-2")
    assert len(recorder.dead_letters) == 1
    lines = [r.getMessage() for r in caplog.records if "subscriber failed" in r.msg]
    assert lines == ["the retry.dlq.ORDERS.inv subscriber failed on the dead letter of message i-2"]
