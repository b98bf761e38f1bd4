"""The middleware's decisions under TestRabbitBroker: the test mode our users rely on."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from faststream import AckPolicy
from faststream.exceptions import RejectMessage
from faststream.rabbit import RabbitBroker, RabbitRouter, TestRabbitBroker
from faststream.rabbit.annotations import RabbitMessage

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


def make() -> tuple[RetryMiddleware, RabbitBroker]:
    retry = RetryMiddleware(
        default=RetryPolicy(max_attempts=4, backoff=Exponential(initial=1, factor=2))
    )
    broker = RabbitBroker(logger=None)
    retry.install(broker)
    return retry, broker


async def test_transient_failures_are_retried_at_once_and_recorded() -> None:
    """Delays are computed as in production but not waited for; the handler sees its attempt."""
    retry, broker = make()
    attempts_seen: list[Any] = []

    @broker.subscriber("email-queue")
    async def send(body: str, msg: RabbitMessage) -> None:
        attempts_seen.append(msg.headers.get("retry-attempt"))
        if len(attempts_seen) < 3:
            raise ConnectionError("smtp down")

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("hi", queue="email-queue")
    assert attempts_seen == [None, 1, 2]
    assert [(e.attempt, e.delay_ms) for e in recorder.scheduled] == [(1, 1000), (2, 2000)]
    assert recorder.dead_letters == []


async def test_handler_reads_the_attempt_header() -> None:
    """The attempt a retried call sees is the one a real copy would carry."""
    retry, broker = make()
    seen: list[Any] = []

    @broker.subscriber("q2")
    async def handle2(body: str, msg: RabbitMessage) -> None:
        seen.append(msg.headers.get("retry-attempt"))
        raise TimeoutError

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="q2")
    assert seen == [None, 1, 2, 3]
    assert recorder.dead_letters[0].reason == "exhausted"
    assert recorder.dead_letters[0].attempt == 4


async def test_permanent_failure_is_dead_lettered_and_swallowed() -> None:
    """A permanent failure: one call, a recorded dead letter, no exception for the test."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("webhook-queue")
    async def hook(body: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("no url")

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish({"x": 1}, queue="webhook-queue")
    assert calls == 1
    (dead,) = recorder.dead_letters
    assert (dead.reason, dead.exception, dead.rule) == (
        "permanent",
        "faststream_retry.errors.PermanentError",
        "explicit",
    )


async def test_validation_error_is_permanent_by_default() -> None:
    """A body that fails validation is dead-lettered at once, not retried."""
    retry, broker = make()

    @broker.subscriber("typed")
    async def typed(body: dict[str, int]) -> None: ...

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish({"a": "not an int"}, queue="typed")
    assert [e.kind for e in recorder.events] == [EventKind.DEAD_LETTERED]
    assert recorder.dead_letters[0].rule == "builtin"


async def test_retry_later_delay_is_recorded() -> None:
    """RetryLater's explicit delay is what the recorder shows, rounded to the tick."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("rate-limited")
    async def call_api(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RetryLater(delay=30)

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="rate-limited")
    assert [e.delay_ms for e in recorder.scheduled] == [30_000]


async def test_disabled_handler_passes_exceptions_through() -> None:
    """@retry_policy(enabled=False): FastStream sees the exception untouched."""
    retry, broker = make()

    @broker.subscriber("raw")
    @retry_policy(enabled=False)
    async def raw(body: str) -> None:
        raise ValueError("mine to handle")

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder, pytest.raises(ValueError, match="mine to handle"):
            await broker.publish("x", queue="raw")
    assert recorder.events == []


async def test_faststream_control_exceptions_pass_through() -> None:
    """RejectMessage raised by a handler is the handler's decision, not a failure."""
    retry, broker = make()

    @broker.subscriber("ctl")
    async def ctl(body: str) -> None:
        raise RejectMessage

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="ctl")
    assert recorder.events == []


async def test_failed_handler_result_is_not_published() -> None:
    """A dead-lettered call must not publish a None result to the handler's publisher."""
    retry, broker = make()
    out = broker.publisher("out")

    @broker.subscriber("in")
    @out
    async def handler(body: str) -> str:
        raise PermanentError("bad")

    async with TestRabbitBroker(broker):
        with retry.testing():
            await broker.publish("x", queue="in")
        out.mock.assert_not_called()


async def test_success_path_is_untouched() -> None:
    """A handler that succeeds publishes its result as usual and records nothing."""
    retry, broker = make()
    out = broker.publisher("out")

    @broker.subscriber("in")
    @out
    async def handler(body: str) -> str:
        return body.upper()

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="in")
        out.mock.assert_called_once_with("X")
    assert recorder.events == []


def test_install_is_idempotent_and_adds_the_middleware() -> None:
    """install() twice is a no-op; without middlewares= it adds the middleware itself."""
    retry = RetryMiddleware()
    broker = RabbitBroker()
    retry.install(broker)
    retry.install(broker)
    assert list(broker.config.broker_middlewares).count(retry) == 1
    with pytest.raises(RetryConfigError, match="already installed"):
        RetryMiddleware().install(broker)


async def test_install_before_subscribers_covers_them() -> None:
    """Subscribers declared after install() are planned at start."""
    retry = RetryMiddleware()
    broker = RabbitBroker()
    retry.install(broker)

    @broker.subscriber("late")
    @retry_policy(backoff=Exponential(initial=0.5))
    async def late(body: str) -> None: ...

    runtime = retry.runtime(broker)
    tiers = runtime.plan.tiers
    assert "late" in runtime.plan.routes
    assert tiers.tick_ms == 500


async def test_ack_first_subscriber_is_refused_at_start() -> None:
    """ACK_FIRST acks before the handler: retries cannot be safe, so start says so."""
    retry = RetryMiddleware()
    broker = RabbitBroker("amqp://guest:guest@127.0.0.1:1/")
    retry.install(broker)

    @broker.subscriber("fire-and-forget", ack_policy=AckPolicy.ACK_FIRST)
    async def fire(body: str) -> None: ...

    with pytest.raises(RetryConfigError, match="ACK_FIRST"):
        await broker.start()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"prefix": ""}, "prefix"),
        ({"queue_type": "stream"}, "queue_type"),
        ({"prefetch": 0}, "prefetch"),
        ({"tick": 0.01}, "tick"),
        ({"tick": 10, "max_delay": 1}, "max_delay"),
        ({"default": 3}, "default"),
        ({"hooks": [1]}, "hooks"),
    ],
)
def test_invalid_middleware_options_name_themselves(kwargs: dict[str, Any], name: str) -> None:
    """Each invalid option fails at construction with its name in the message."""
    with pytest.raises(RetryConfigError, match=name):
        RetryMiddleware(**kwargs)


async def test_default_policy_can_switch_retries_off() -> None:
    """enabled=False on the default: undecorated handlers pass through, decorated ones opt in."""
    retry = RetryMiddleware(default=RetryPolicy(enabled=False))
    broker = RabbitBroker(logger=None)
    retry.install(broker)

    @broker.subscriber("off")
    async def off(body: str) -> None:
        raise TimeoutError("nobody retries me")

    @broker.subscriber("on")
    @retry_policy(enabled=True, max_attempts=2)
    async def on(body: str) -> None:
        raise TimeoutError("retried")

    assert set(retry.runtime(broker).plan.routes) == {"on"}
    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            with pytest.raises(TimeoutError, match="nobody"):
                await broker.publish("x", queue="off")
            await broker.publish("x", queue="on")
    assert [e.kind for e in recorder.events] == [EventKind.SCHEDULED, EventKind.DEAD_LETTERED]


async def test_hooks_can_be_added_and_removed_after_construction() -> None:
    """add_hook/remove_hook: a hook sees the events in between, and only those."""
    retry, broker = make()
    seen: list[Any] = []

    @broker.subscriber("hooked")
    async def handle(body: str) -> None:
        raise PermanentError(body)

    async with TestRabbitBroker(broker):
        with retry.testing():
            retry.add_hook(seen.append)
            await broker.publish("one", queue="hooked")
            retry.remove_hook(seen.append)
            await broker.publish("two", queue="hooked")
    assert [(e.kind, e.error) for e in seen] == [(EventKind.DEAD_LETTERED, "one")]
    with pytest.raises(RetryConfigError, match="callable"):
        retry.add_hook("not a hook")  # type: ignore[arg-type]


async def test_a_dead_letter_reaches_the_apps_dlq_subscriber() -> None:
    """Test mode hands a dead letter to ``<queue>.dlq``'s subscriber, headers as on the wire."""
    retry, broker = make()
    dead: list[tuple[Any, dict[str, Any], str | None, str | None]] = []

    @broker.subscriber("orders")
    async def orders(body: dict[str, Any]) -> None:
        raise TimeoutError("warehouse down")

    @broker.subscriber("orders.dlq")
    @retry_policy(enabled=False)
    async def orders_dlq(body: dict[str, Any], msg: RabbitMessage) -> None:
        dead.append((body, dict(msg.headers), msg.message_id, msg.correlation_id))

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish({"id": 7}, queue="orders", message_id="m-7", correlation_id="c-7")
    assert len(recorder.dead_letters) == 1
    ((body, headers, message_id, correlation_id),) = dead
    assert (body, message_id, correlation_id) == ({"id": 7}, "m-7", "c-7")
    assert headers["retry-reason"] == "exhausted"
    assert headers["retry-attempt"] == 4
    assert headers["retry-exception"] == "TimeoutError"
    assert headers["retry-error"] == "warehouse down"
    assert headers["retry-origin-queue"] == "orders"
    assert "TimeoutError: warehouse down" in headers["retry-traceback"]
    assert "retry-due" not in headers


async def test_a_dead_letter_reaches_a_prefixed_dlq_subscriber() -> None:
    """On a router with a prefix, the ``.dlq`` subscriber of the prefixed queue gets it."""
    retry, broker = make()
    router = RabbitRouter(prefix="svc.")
    dead: list[str] = []

    @router.subscriber("hooks")
    async def hooks(body: str) -> None:
        raise PermanentError("no url")

    @router.subscriber("hooks.dlq")
    async def hooks_dlq(body: str, msg: RabbitMessage) -> None:
        dead.append(msg.headers["retry-origin-queue"])

    broker.include_router(router)
    async with TestRabbitBroker(broker):
        with retry.testing():
            await broker.publish("x", queue="svc.hooks")
    assert dead == ["svc.hooks"]


async def test_raise_on_dead_letter_re_raises_the_last_exception() -> None:
    """``testing(raise_on_dead_letter=True)``: pytest.raises tests keep working; retries count."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("payments")
    async def pay(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"bank down ({calls})")

    async with TestRabbitBroker(broker):
        with (
            retry.testing(raise_on_dead_letter=True) as recorder,
            pytest.raises(ConnectionError, match=r"bank down \(4\)"),
        ):
            await broker.publish("x", queue="payments")
    assert calls == 4
    assert [e.kind for e in recorder.events] == [EventKind.SCHEDULED] * 3 + [
        EventKind.DEAD_LETTERED
    ]


async def test_raise_on_dead_letter_raises_nothing_for_a_recovered_message() -> None:
    """A retry that ends in success raises nothing; the flag ends with its block."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("flaky")
    async def flaky(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("once")

    @broker.subscriber("broken")
    async def broken(body: str) -> None:
        raise PermanentError("always")

    async with TestRabbitBroker(broker):
        with retry.testing(raise_on_dead_letter=True):
            await broker.publish("x", queue="flaky")
            with pytest.raises(PermanentError, match="always"):
                await broker.publish("x", queue="broken")
        with retry.testing() as recorder:
            await broker.publish("x", queue="broken")  # swallowed again
    assert calls == 2
    assert len(recorder.dead_letters) == 1


async def test_raise_on_dead_letter_is_the_innermost_blocks() -> None:
    """Nested ``testing()`` blocks: the inner one's flag holds inside it, the outer's after it."""
    retry, broker = make()

    @broker.subscriber("broken")
    async def broken(body: str) -> None:
        raise PermanentError("always")

    async with TestRabbitBroker(broker):
        with retry.testing() as outer:
            with retry.testing(raise_on_dead_letter=True) as inner:
                with pytest.raises(PermanentError, match="always"):
                    await broker.publish("x", queue="broken")
                with retry.testing():
                    await broker.publish("x", queue="broken")  # swallowed in there
            await broker.publish("x", queue="broken")  # swallowed again
    assert len(outer.dead_letters) == 3
    assert len(inner.dead_letters) == 2


def test_raise_on_dead_letter_takes_a_bool() -> None:
    """A wrong value is named, at once."""
    retry, _ = make()
    recording = retry.testing(raise_on_dead_letter="yes")  # type: ignore[arg-type]
    with pytest.raises(RetryConfigError, match="raise_on_dead_letter must be True or False"):
        recording.__enter__()


class UnprintableError(Exception):
    """Raised without args, its __str__ raises IndexError (the issue's ApiError)."""

    def __str__(self) -> str:
        return f"API error {self.args[0]}"


async def test_an_unprintable_exception_is_retried_and_dead_lettered_in_test_mode() -> None:
    """Test mode takes the same total path: every attempt made, the fallback text recorded."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("api-queue")
    async def call_api(body: str) -> None:
        nonlocal calls
        calls += 1
        raise UnprintableError

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="api-queue")
    assert calls == 4
    fallback = (
        "<unprintable tests.component.test_testing_mode.UnprintableError: str() raised IndexError>"
    )
    assert [e.error for e in recorder.scheduled] == [fallback] * 3
    (dead,) = recorder.dead_letters
    assert (dead.reason, dead.attempt) == ("exhausted", 4)


async def test_an_invalid_retry_later_is_dead_lettered_at_once_in_test_mode() -> None:
    """RetryLater(delay=-3): RetryConfigError in the handler, permanent at attempt 1."""
    retry, broker = make()
    calls = 0

    @broker.subscriber("later-queue")
    async def later(body: str) -> None:
        nonlocal calls
        calls += 1
        raise RetryLater(delay=-3)

    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="later-queue")
    assert calls == 1
    (dead,) = recorder.dead_letters
    assert (dead.reason, dead.attempt, dead.rule) == ("permanent", 1, "explicit")
    assert dead.exception == "faststream_retry.errors.RetryConfigError"
    assert dead.error == "RetryLater(delay=...) must be a finite duration >= 0, got -3"


def failing_dlq_app() -> tuple[RetryMiddleware, RabbitBroker, list[str]]:
    """A handler that always fails and a ``.dlq`` subscriber with a bug."""
    retry, broker = make()
    dlq_calls: list[str] = []

    @broker.subscriber("invoices")
    @retry_policy(max_attempts=1)
    async def invoices(body: str) -> None:
        raise ValueError("bad invoice")

    @broker.subscriber("invoices.dlq")
    @retry_policy(enabled=False)
    async def invoices_dlq(body: str, msg: RabbitMessage) -> None:
        dlq_calls.append(msg.headers["retry-reason"])
        raise RuntimeError("dlq consumer bug")

    return retry, broker, dlq_calls


async def test_a_failing_dlq_subscriber_raises_under_raise_on_dead_letter() -> None:
    """Its exception comes out of publish(), the handler's as its cause: never swallowed."""
    retry, broker, dlq_calls = failing_dlq_app()
    async with TestRabbitBroker(broker):
        with (
            retry.testing(raise_on_dead_letter=True) as recorder,
            pytest.raises(RuntimeError, match="dlq consumer bug") as raised,
        ):
            await broker.publish("x", queue="invoices", message_id="i-1")
    assert isinstance(raised.value.__cause__, ValueError)
    assert str(raised.value.__cause__) == "bad invoice"
    assert dlq_calls == ["exhausted"]
    assert len(recorder.dead_letters) == 1


async def test_a_failing_dlq_subscriber_is_logged_without_raise_on_dead_letter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without the flag publish() raises nothing, and an ERROR line names the .dlq failure."""
    retry, broker, dlq_calls = failing_dlq_app()
    caplog.set_level(logging.ERROR, logger="faststream_retry")
    async with TestRabbitBroker(broker):
        with retry.testing() as recorder:
            await broker.publish("x", queue="invoices", message_id="i-2")
    assert dlq_calls == ["exhausted"]
    assert len(recorder.dead_letters) == 1
    (line,) = [
        r for r in caplog.records if r.name == "faststream_retry" and "subscriber failed" in r.msg
    ]
    assert line.levelname == "ERROR"
    assert (
        line.getMessage() == "the invoices.dlq subscriber failed on the dead letter of message i-2"
    )
    assert line.exc_text is not None
    assert line.exc_text.endswith("RuntimeError: dlq consumer bug")
