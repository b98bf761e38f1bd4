"""Startup checks and quorum queues on a real RabbitMQ."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelPreconditionFailed, ConnectionInternalError
from faststream.rabbit import QueueType, RabbitQueue

from faststream_retry import (
    Fixed,
    PermanentError,
    RetryPolicy,
    RetryTopologyError,
    retry_policy,
)
from faststream_retry.core import headers
from faststream_retry.core.events import EventKind
from faststream_retry.core.topology import tier_name
from tests.rabbit import App, drain, eventually, headers_of, queue_depth, series_of, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


async def test_existing_queues_with_other_arguments_are_named_not_a_raw_406(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Every mismatch at once, each with its queue, argument and how to migrate."""
    app: App = make_app(queue_type="quorum")
    queue = unique("mismatch")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    channel = await amqp.channel()
    tier = tier_name(app.prefix, 100)
    await channel.declare_queue(tier, durable=True)  # classic, no TTL
    await channel.declare_queue(f"{queue}.dlq", durable=True)
    with pytest.raises(RetryTopologyError) as caught:
        await app.start()
    text = str(caught.value)
    assert f"queue {tier!r}: argument 'x-message-ttl' is unset on the broker" in text
    assert "the plugin declares '100'" in text
    # 3.x reports a classic queue's type as unset; 4.x as 'classic'.
    found = "'classic'" if series_of(amqp) >= (4, 0) else "unset"
    assert f"queue '{queue}.dlq': argument 'x-queue-type' is {found} on the broker" in text
    assert "the plugin declares 'quorum'" in text
    assert "choose a new prefix=" in text  # the tier's advice
    assert "faststream-retry migrate <queue> --queue-type quorum" in text  # the DLQ's advice
    assert "PRECONDITION_FAILED" in text
    await app.broker.stop()
    for name in (tier, f"{queue}.dlq"):
        await channel.queue_delete(name)
    await channel.close()


async def test_classic_queues_of_the_old_default_are_named_with_both_fixes(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Quorum is the default: a classic ``.retry`` left by an older version is named at
    start with the mismatch and both ways out, and ``queue_type="classic"`` still runs."""
    queue = unique("old-classic")
    channel = await amqp.channel()
    # What the plugin declared while classic was its default.
    for name in (f"{queue}.retry", f"{queue}.dlq"):
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "classic"})
    await channel.close()
    prefix = unique("t")
    calls: list[str] = []

    def subscribe(app: App) -> None:
        @app.broker.subscriber(queue)
        async def handle(body: str) -> None:
            calls.append(body)
            if len(calls) == 1:
                raise ConnectionError("down")

    app: App = make_app(prefix=prefix)
    subscribe(app)
    with pytest.raises(RetryTopologyError) as caught:
        await app.start()
    await app.broker.stop()
    text = str(caught.value)
    # RabbitMQ names the first argument that differs, for .retry not the type itself.
    assert f"- queue '{queue}.retry': argument 'x-dead-letter-exchange' is unset" in text
    assert (
        f"- queue '{queue}.dlq': argument 'x-queue-type' is 'classic' on the broker, "
        "the plugin declares 'quorum'" in text
    )
    # One advice for both, not a paragraph each.
    assert text.count('All of them are what queue_type="classic" declares') == 1
    assert text.count('pass RetryMiddleware(queue_type="classic")') == 1
    assert f"- '{queue}.retry', '{queue}.dlq': it may hold messages" in text
    # The first fix: keep classic queues.
    classic: App = make_app(prefix=unique("t"), queue_type="classic")
    subscribe(classic)
    await classic.start()
    await classic.broker.publish("m", queue=queue)
    await eventually(lambda: calls == ["m", "m"], what="the retried call on classic queues")


async def test_quorum_everywhere_retries_and_dead_letters(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Every queue the plugin declares is a quorum queue, and the loop works on them."""
    app: App = make_app(
        queue_type="quorum", delivery_limit=1, default=RetryPolicy(backoff=Fixed(0.3))
    )
    queue = unique("quorum")
    calls: dict[str, int] = {}

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls[body] = calls.get(body, 0) + 1
        if body == "bad":
            raise PermanentError("no")
        if calls[body] < 4:
            raise TimeoutError("later")

    await app.start()
    await app.broker.publish("good", queue=queue)
    await app.broker.publish("bad", queue=queue)
    await eventually(
        lambda: any(e.kind is EventKind.RELEASED and e.attempt == 3 for e in app.events),
        what="the third release",
    )
    await eventually(lambda: calls.get("good") == 4, what="success on the 4th call")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    assert dead.body == b"bad"
    assert dead.headers[headers.REASON] == "permanent"
    await app.stop()
    # A quorum queue refuses a classic redeclaration: proof of its type.
    runtime = app.retry.runtime(app.broker)
    for spec in runtime.plan.queues:
        assert spec.arguments["x-queue-type"] == "quorum"
        channel = await amqp.channel()
        with pytest.raises(ChannelPreconditionFailed):
            await channel.declare_queue(
                spec.name, durable=True, arguments={"x-queue-type": "classic"}
            )


async def test_a_stuck_message_in_a_quorum_retry_queue_ends_in_the_dlq_at_the_limit(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The re-check consumer requeues only when it cannot publish; at the limit it
    dead-letters the message itself, reason ``stuck``: RabbitMQ 4.3 no longer counts a
    requeue against the delivery limit, so the broker would never end the loop."""
    app: App = make_app(queue_type="quorum", delivery_limit=2)
    queue = unique("limit")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    await app.start()
    channel = await amqp.channel()
    runtime = app.retry.runtime(app.broker)
    # Every hop is now unroutable: each tier queue is replaced by an unbound classic
    # one, which the plugin cannot declare its own over (406), so no repair helps.
    for tier in runtime.plan.exchanges:
        await channel.queue_delete(tier)
        await channel.declare_queue(tier, durable=True, arguments={"x-queue-type": "classic"})
    due = int(time.time() * 1000) + 30_000
    await channel.default_exchange.publish(
        aio_pika.Message(b"stuck", headers={headers.DUE: due, headers.ATTEMPT: 1}, message_id="s1"),
        routing_key=f"{queue}.retry",
    )
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1, timeout=20)
    await app.stop()
    assert dead.body == b"stuck"
    assert dead.message_id == "s1"
    got = headers_of(dead)
    assert (got[headers.REASON], got[headers.EXCEPTION]) == (
        "stuck",
        "faststream_retry.CopyNotConfirmed",
    )
    assert got[headers.ERROR].endswith(
        "was not confirmed (failed) and it came back 2 times (the delivery limit is 2)"
    )
    assert "x-death" not in got  # the plugin's dead letter, not the broker's
    assert await queue_depth(amqp, f"{queue}.retry") == 0
    await channel.close()


async def test_a_dead_letter_subscriber_declared_classic_is_named_before_start(
    make_app: Any,
) -> None:
    """FastStream would declare ``.dlq`` classic after the plugin declared it quorum (406)."""
    app: App = make_app()
    queue = unique("dlq-consumer")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise PermanentError(body)

    @app.broker.subscriber(RabbitQueue(f"{queue}.dlq", durable=True))
    @retry_policy(enabled=False)
    async def dead(body: str) -> None: ...

    with pytest.raises(RetryTopologyError) as caught:
        await app.start()
    assert str(caught.value).splitlines()[1] == (
        f"- the subscriber of '{queue}.dlq' declares it as a durable classic queue; the plugin "
        f"declares it as a durable quorum queue: declare it RabbitQueue('{queue}.dlq', "
        "durable=True, queue_type=QueueType.QUORUM), or RabbitQueue("
        f"'{queue}.dlq', declare=False) to consume it as the plugin declares it, or pass "
        'RetryMiddleware(queue_type="classic")'
    )


async def test_a_dead_letter_subscriber_declared_as_the_plugin_does_gets_each_dead_letter(
    make_app: Any,
) -> None:
    """The docs' way to consume a DLQ with FastStream, on quorum queues."""
    app: App = make_app()
    queue = unique("dlq-consumer")
    dead: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise PermanentError(body)

    @app.broker.subscriber(RabbitQueue(f"{queue}.dlq", durable=True, queue_type=QueueType.QUORUM))
    @retry_policy(enabled=False)
    async def on_dead(body: str) -> None:
        dead.append(body)

    await app.start()
    ids = [unique("poison") for _ in range(3)]
    for mid in ids:
        await app.broker.publish(mid, queue=queue, message_id=mid)
    await eventually(lambda: sorted(dead) == sorted(ids), what="every dead letter consumed")


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_release_that_can_never_be_confirmed_ends_in_the_dlq_within_a_bound(
    make_app: Any, amqp: AbstractRobustConnection, queue_type: str
) -> None:
    """A work queue that refuses every publish (full, ``reject-publish``): its releases
    wait in tiers, then requeue, and once ``max_delay`` past due the re-check consumer
    dead-letters them itself (``stuck``). On every RabbitMQ series and queue type: a
    classic ``.retry`` has no delivery limit, and 4.3's quorum one no longer counts a
    requeue. Each message exactly once in the DLQ, none left anywhere."""
    app: App = make_app(queue_type=queue_type, max_delay=2, tick=0.25)
    queue = unique("refusing")
    full = RabbitQueue(
        queue, durable=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )

    @app.broker.subscriber(full)
    async def handle(body: str) -> None:  # never called: the queue holds nothing
        raise AssertionError(body)

    await app.start()
    channel = await amqp.channel()
    started = time.monotonic()
    now = int(time.time() * 1000)
    ids = [f"r{i}" for i in range(5)]
    for message_id in ids:
        await channel.default_exchange.publish(
            aio_pika.Message(
                b"x", headers={headers.DUE: now, headers.ATTEMPT: 1}, message_id=message_id
            ),
            routing_key=f"{queue}.retry",
        )
    dead = await drain(amqp, f"{queue}.dlq", expect=len(ids), timeout=30)
    took = time.monotonic() - started
    assert sorted(m.message_id or "" for m in dead) == ids
    for message in dead:
        got = headers_of(message)
        assert (got[headers.REASON], got[headers.EXCEPTION]) == (
            "stuck",
            "faststream_retry.CopyNotConfirmed",
        )
        assert "past its due time (max_delay is 2000 ms)" in got[headers.ERROR]
    # max_delay past due, plus a pause or a tier: far below the drain's bound.
    assert took < 15, took
    assert await app.waiting(amqp, queue) == 0
    assert await queue_depth(amqp, f"{queue}.dlq") == 0  # drained: no second copy came
    await channel.close()


async def test_a_transient_work_queue_is_warned_about_at_start(
    make_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Declared neither durable nor exclusive: RabbitMQ 4.x deprecates it, and a broker
    restart deletes it with every message in it. The start says so, once, with the fix,
    before FastStream declares it: where the feature is denied (the suite's 4.3 denies
    it), RabbitMQ then closes the connection and the start fails."""
    app: App = make_app()
    queue = unique("transient")

    @app.broker.subscriber(RabbitQueue(queue, durable=False))
    async def handle(body: str) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        try:
            await app.start()
        except ConnectionInternalError as exc:
            assert "transient_nonexcl_queues" in str(exc)  # noqa: PT017 - which refusal
    (warning,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "faststream_retry" and "transient" in r.getMessage()
    ]
    assert warning.startswith(
        f"faststream-retry: queue {queue!r} is declared transient (durable=False) and not "
        "exclusive: a broker restart deletes it"
    )
    assert f"Fix: declare it RabbitQueue({queue!r}, durable=True)" in warning
