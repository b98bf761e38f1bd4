"""Odd failures on a real RabbitMQ: exceptions that cannot describe themselves, broken
reporting, invalid or too long RetryLater delays, surrogates. None of them loses a message.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream.rabbit import RabbitMessage
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faststream_retry import EventKind, Fixed, RetryEvent, RetryLater, retry_policy
from tests.rabbit import (
    App,
    depth_reaches,
    drain,
    eventually,
    headers_of,
    queue_depth,
    unique,
)

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


class ApiError(Exception):
    """The issue's exception: raised without args, its __str__ raises IndexError."""

    def __str__(self) -> str:
        return f"API error {self.args[0]}"


FALLBACK = "<unprintable tests.integration.test_odd_failures.ApiError: str() raised IndexError>"


async def test_an_unprintable_exception_is_retried_then_dead_lettered_with_a_fallback(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """ApiError() with tracing on and a hook that raises: retried, then in the DLQ, none lost."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    app: App = make_app(tracer_provider=provider)

    def broken_hook(_: RetryEvent) -> None:
        raise RuntimeError("hook bug")

    app.retry.add_hook(broken_hook)
    queue = unique("api")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.1))
    async def handle(body: dict[str, Any], message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        raise ApiError

    await app.start()
    sent = [f"api-{n}" for n in range(5)]
    for message_id in sent:
        await app.broker.publish({"n": message_id}, queue=queue, message_id=message_id)
    dead = await drain(amqp, f"{queue}.dlq", expect=len(sent))
    assert sorted(m.message_id or "" for m in dead) == sent
    assert calls == dict.fromkeys(sent, 3)
    for message in dead:
        headers = headers_of(message)
        assert headers["retry-reason"] == "exhausted"
        assert headers["retry-error"] == FALLBACK
        assert headers["retry-exception"] == "tests.integration.test_odd_failures.ApiError"
        assert [e["error"] for e in headers["retry-history"]] == [FALLBACK] * 3
        assert "ApiError: <exception str() failed>" in str(headers["retry-traceback"])
    scheduled = Counter(e.message_id for e in app.events if e.kind is EventKind.SCHEDULED)
    assert scheduled == dict.fromkeys(sent, 2)  # through the retry path, twice each
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0
    dead_spans = [s for s in spans.get_finished_spans() if s.name.endswith("dead-letter")]
    assert len(dead_spans) == len(sent)
    assert all([e.name for e in s.events] == ["exception"] for s in dead_spans)


@pytest.mark.parametrize("delay", [-3, float("nan"), float("inf"), "soon"])
async def test_retry_later_with_an_invalid_delay_is_a_permanent_failure(
    make_app: Any, amqp: AbstractRobustConnection, delay: object
) -> None:
    """RetryLater(delay=-3) is a bug in the handler: DLQ at attempt 1, the value named."""
    app: App = make_app()
    queue = unique("later")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=5, backoff=Fixed(0.1), transient=(ValueError,))
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        raise RetryLater(delay=delay)  # type: ignore[arg-type]

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="bad-delay")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    assert calls == {"bad-delay": 1}
    headers = headers_of(dead)
    assert (headers["retry-reason"], headers["retry-attempt"]) == ("permanent", 1)
    assert headers["retry-exception"] == "faststream_retry.errors.RetryConfigError"
    assert str(headers["retry-error"]).startswith("RetryLater(delay=...) ")
    assert str(headers["retry-error"]).endswith(f"got {delay!r}")
    assert await app.waiting(amqp, queue) == 0


async def test_a_retry_later_whose_delay_was_spoiled_says_why_on_its_dead_letter(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A delay changed after construction: DLQ at attempt 1, the value named before the text."""
    app: App = make_app()
    queue = unique("spoiled")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        later = RetryLater(1)
        later.delay = -1  # type: ignore[assignment]
        raise later

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="spoiled")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    assert calls == 1
    headers = headers_of(dead)
    assert (headers["retry-reason"], headers["retry-attempt"]) == ("permanent", 1)
    assert headers["retry-exception"] == "faststream_retry.errors.RetryLater"
    assert headers["retry-error"] == (
        "RetryLater(delay=...) must be a finite duration >= 0, got -1 (retry later, in 0:00:01)"
    )


async def test_retry_later_above_max_delay_is_capped_with_one_warning_per_handler(
    make_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """RetryLater(1 h) with max_delay 1 s: every message waits 1 s; one WARNING for the handler."""
    app: App = make_app(max_delay=1)
    queue = unique("capped")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=5)
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        if calls[message.message_id] <= 2:
            raise RetryLater(delay=3600)

    caplog.set_level(logging.WARNING, logger="faststream_retry")
    await app.start()
    sent = ["c-1", "c-2", "c-3"]
    for message_id in sent:
        await app.broker.publish("x", queue=queue, message_id=message_id)
    await eventually(lambda: calls == dict.fromkeys(sent, 3), timeout=20, what="3 calls each")
    planned = [e.delay_ms for e in app.events if e.kind is EventKind.SCHEDULED]
    assert planned == [1000] * 6
    warnings = [r.getMessage() for r in caplog.records if r.name == "faststream_retry"]
    assert warnings == [
        (
            f"a handler of {queue} raised RetryLater asking for 3600000 ms, longer than "
            "max_delay (1000 ms): its messages wait 1000 ms. Raise "
            "RetryMiddleware(max_delay=...) if such waits are meant (said once per handler)"
        )
    ]


async def test_a_lone_surrogate_in_an_error_is_escaped_on_the_dead_letter(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """retry-error, retry-history and retry-traceback all arrive, with \\udc80 escaped."""
    app: App = make_app()
    queue = unique("surrogate")
    calls = 0

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=2, backoff=Fixed(0.1))
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad \udc80 byte")

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="s-1")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    assert calls == 2
    headers = headers_of(dead)
    assert headers["retry-error"] == "bad \\udc80 byte"
    assert [e["error"] for e in headers["retry-history"]] == ["bad \\udc80 byte"] * 2
    assert str(headers["retry-traceback"]).endswith("ValueError: bad \\udc80 byte\n")


async def test_a_huge_error_is_dead_lettered_with_bounded_headers_and_log_lines(
    make_app: Any, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A 2 MB message: every plugin line and header is cut, the frames stay, none lost."""
    app: App = make_app(log_retry_traceback="every")

    def broken_hook(_: RetryEvent) -> None:
        raise RuntimeError("hook bug")  # its traceback is chained to the 2 MB error

    app.retry.add_hook(broken_hook)
    queue = unique("huge")

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=2, backoff=Fixed(0.1))
    async def handle(body: str) -> None:
        raise ValueError("E" * 2_000_000)

    caplog.set_level(logging.DEBUG, logger="faststream_retry")
    await app.start()
    await app.broker.publish("x", queue=queue, message_id="huge-1")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    headers = headers_of(dead)
    assert headers["retry-error"] == "E" * 1021 + "..."
    trace = str(headers["retry-traceback"])
    assert len(trace.encode()) <= 4096
    assert "in handle\n" in trace
    assert trace.endswith("ValueError: " + "E" * (1024 - 3 - 12) + "...\n")
    await eventually(
        lambda: any(
            "hook" in r.getMessage() and "dead_lettered" in r.getMessage() for r in caplog.records
        )
    )
    lines = [r for r in caplog.records if r.name == "faststream_retry"]
    kinds = {r.getMessage().split(" message ")[0] for r in lines}
    assert {"retry scheduled for", "dead-lettered"} <= kinds
    formatter = logging.Formatter()
    for record in lines:
        assert len(formatter.format(record).encode()) <= 4096 + 1 + 8192
    assert sum(r.exc_text is not None for r in lines) >= 4  # retry, dead letter, hooks


class HookStopError(BaseException):
    """An application's own BaseException, raised by a hook."""


async def test_a_hook_raising_a_base_exception_on_a_hop_leaves_no_duplicate(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The re-check hop is confirmed, then a hook raises: the .retry delivery is acked all the same.

    Left unacked, the broker would deliver it again when the channel closes: a second
    copy of a message already sent on. (300 ms on a 100 ms tick is two tiers, 200 + 100,
    so the copy passes the re-check step once.)
    """
    app: App = make_app()
    stopped: list[str | None] = []

    def hook(event: RetryEvent) -> None:
        if event.kind is EventKind.HOP and not stopped:
            stopped.append(event.message_id)
            raise HookStopError("hook stop")

    app.retry.add_hook(hook)
    queue = unique("hookstop")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.3))
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        if calls[message.message_id] == 1:
            raise ConnectionError("once")

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="b-1")
    await eventually(lambda: calls["b-1"] == 2, what="the released call")
    assert stopped == ["b-1"]
    await app.stop()  # an unacked .retry delivery goes back to the queue here
    assert await queue_depth(amqp, f"{queue}.retry") == 0
    assert await app.waiting(amqp, queue) == 0
    assert calls == {"b-1": 2}


async def test_a_hook_raising_a_base_exception_on_arrival_hands_the_message_back(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A copy back from its last tier, and a hook raises on its release: requeued, not lost.

    The release is reported before the handler runs. An application's own
    BaseException there goes on, but the message is handed back to its queue first
    (FastStream would reject it: with no DLX, gone); its redelivery is not reported
    again, so it is handled exactly once more.
    """
    app: App = make_app()
    stopped: list[str | None] = []

    def hook(event: RetryEvent) -> None:
        if event.kind is EventKind.RELEASED and not stopped:
            stopped.append(event.message_id)
            raise HookStopError("hook stop")

    app.retry.add_hook(hook)
    queue = unique("hookarrive")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.1))
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        if calls[message.message_id] == 1:
            raise ConnectionError("once")

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="b-1")
    await eventually(lambda: calls["b-1"] == 2, what="the call after the release")
    assert stopped == ["b-1"]
    await app.stop()
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0
    assert calls == {"b-1": 2}


NEW_ASYNCIO = sys.version_info >= (3, 11)


async def test_a_cancelled_error_the_handler_raises_itself_is_its_failure(
    make_app: Any, amqp: AbstractRobustConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A CancelledError while its task is not being cancelled: a misused timeout, say.

    Left to FastStream, the message stayed unacked until the app stopped, taking a slot
    of the prefetch. Now it is the handler's failure: retried and dead-lettered as its
    policy says, with one WARNING per queue naming it. (Python 3.10 cannot tell it from
    a real cancellation: there it stays FastStream's, and comes back after a restart.)
    """
    app: App = make_app()
    queue = unique("cancelled")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=2, backoff=Fixed(0.1))
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        raise asyncio.CancelledError("a timeout library misused")

    caplog.set_level(logging.WARNING, logger="faststream_retry")
    await app.start()
    for message_id in ("c1", "c2"):
        await app.broker.publish("x", queue=queue, message_id=message_id)
    if not NEW_ASYNCIO:
        await eventually(lambda: calls == {"c1": 1, "c2": 1}, what="both handled once")
        await app.stop()
        await depth_reaches(amqp, queue, 2, what="both back in the queue")
        return
    dead = await drain(amqp, f"{queue}.dlq", expect=2)
    assert sorted(m.message_id or "" for m in dead) == ["c1", "c2"]
    assert calls == {"c1": 2, "c2": 2}
    headers = headers_of(dead[0])
    assert (headers["retry-reason"], headers["retry-attempt"]) == ("exhausted", 2)
    assert headers["retry-exception"] == "asyncio.exceptions.CancelledError"
    assert headers["retry-error"] == "a timeout library misused"
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "faststream_retry" and "raised asyncio.CancelledError" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"a handler of {queue} raised asyncio.CancelledError")
    assert await queue_depth(amqp, queue) == 0


async def test_a_handler_whose_task_is_cancelled_hands_its_message_back(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A real cancellation (the task asked to stop) is not a failure: no copy, no DLQ.

    The message stays unacked, as without the plugin, and is in its queue again once
    the app has stopped.
    """
    app: App = make_app()
    queue = unique("really-cancelled")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=2, backoff=Fixed(0.1))
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    await app.start()
    await app.broker.publish("x", queue=queue, message_id="c1")
    await eventually(lambda: calls == {"c1": 1}, what="the call")
    await app.stop()
    await depth_reaches(amqp, queue, 1, what="the message back in its queue")
    assert await queue_depth(amqp, f"{queue}.dlq") == 0
    assert await app.waiting(amqp, queue) == 0
