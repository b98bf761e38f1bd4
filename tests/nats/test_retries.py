"""The NATS transport on a real nats-server: the RabbitMQ suite's scenarios that mean something
on JetStream, counted by id (sent = processed + dead-lettered)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js.api import ConsumerConfig, DiscardPolicy, RetentionPolicy

from faststream_retry import (
    Fixed,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryPolicy,
    retry_policy,
)
from faststream_retry.core import headers as h
from faststream_retry.middleware.middleware import RetryMiddleware
from tests.nats.helpers import (
    drained,
    make_delay_stream,
    raw_hpub,
    running,
    stream_count,
    stream_messages,
)
from tests.rabbit import eventually
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

BULK = 30.0
"""The PubAck timeout of a test's own bulk publishes: 1,000 at once on a loaded machine take
longer than FastStream's 0.5 s default (seen: the stall test's publish timed out)."""

FAST = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200)))


def middleware(names: Names, default: RetryPolicy = FAST) -> RetryMiddleware:
    """The plugin as a test wires it: its own prefix, a 100 ms tick, tiers up to 2 min."""
    return RetryMiddleware(
        default, prefix=names.prefix, tick=timedelta(milliseconds=100), max_delay=120
    )


async def counted(js: JetStreamContext, stream: str, at_least: int) -> bool:
    return await stream_count(js, stream) >= at_least


def attempt_of(msg: NatsMessage) -> int:
    return int(msg.headers.get("retry-attempt", "0"))


async def refusal_of(broker: NatsBroker) -> str:
    """What the broker's start raises once the plugin is installed (it must refuse)."""
    retry = broker.middlewares[0]
    assert isinstance(retry, RetryMiddleware)
    retry.install(broker)
    with pytest.raises(RetryConfigError) as refused:
        await broker.start()
    await broker.stop()
    return str(refused.value)


async def test_a_transient_failure_is_retried_until_it_succeeds(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Fails twice, then succeeds: three calls, the copies waited on the server, nothing dead.
    Each call sees the message as it came: its subject, and one id (published by a plain
    NATS client, with no id of FastStream's)."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[tuple[str, int, str]] = []
    ids: set[str] = set()

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append((body, attempt_of(msg), msg.raw_message.subject))
        ids.add(msg.message_id)
        if len(calls) < 3:
            raise ConnectionError("flaky")

    async with running(broker):
        started = time.monotonic()
        await js.publish(subject, b"hello", stream=stream)
        await eventually(lambda: len(calls) == 3, what="three calls")
        took = time.monotonic() - started
        await asyncio.sleep(0.5)  # nothing more comes
    assert calls == [("hello", 0, subject), ("hello", 1, subject), ("hello", 2, subject)]
    assert len(ids) == 1
    assert took >= 0.4  # two 200 ms waits, never early
    assert await stream_count(js, f"{names.prefix}-dlq-{stream}") == 0
    await drained(js, names.prefix)


async def test_an_exhausted_message_is_dead_lettered_with_its_record(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Always failing: max_attempts calls, then the dead-letter stream, body untouched."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: bytes, msg: NatsMessage) -> None:
        calls.append(attempt_of(msg))
        raise ConnectionError("down")

    dlq = f"{names.prefix}-dlq-{stream}"
    body = b"\x00\xffnot utf-8\r\n"
    async with running(broker):
        await broker.publish(body, subject, stream=stream, headers={"app": "kept"})
        await eventually(lambda: len(calls) == 3, what="three calls")
        letters: list[Any] = []

        async def one_letter() -> bool:
            letters[:] = await stream_messages(js, dlq)
            return len(letters) == 1

        await until(one_letter, 10, "the dead letter")
    assert calls == [0, 1, 2]
    letter_subject, letter_body, headers = letters[0]
    assert letter_subject == f"{names.prefix}.dlq.{stream}.d"
    assert letter_body == body
    assert headers["retry-reason"] == "exhausted"
    assert headers["retry-attempt"] == 3
    assert headers["retry-exception"] == "ConnectionError"
    assert headers["retry-origin-queue"] == f"{stream}.d"
    assert headers["retry-subject"] == subject
    assert [e["attempt"] for e in headers["retry-history"]] == [1, 2, 3]
    assert "ConnectionError: down" in headers["retry-traceback"]
    assert headers["app"] == "kept"
    await drained(js, names.prefix)


async def test_a_permanent_failure_is_dead_lettered_at_once(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """PermanentError: one call, then the dead-letter stream (reason permanent)."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append(attempt_of(msg))
        raise PermanentError("bad input")

    dlq = f"{names.prefix}-dlq-{stream}"
    async with running(broker):
        await broker.publish("x", subject, stream=stream)
        await until(lambda: counted(js, dlq, 1), 10, "the dead letter")
        await asyncio.sleep(0.5)  # and no retry
    assert calls == [0]
    [(_, _, headers)] = await stream_messages(js, dlq)
    assert headers["retry-reason"] == "permanent"
    assert headers["retry-attempt"] == 1


async def test_retry_later_waits_as_long_as_the_handler_asks(nats_url: str, names: Names) -> None:
    """RetryLater(0.7 s): the retry comes no earlier than that (through tiers of 400, 200 and
    100 ms, each re-check checking the due time), and not seconds late."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    seen: list[float] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise RetryLater(delay=timedelta(milliseconds=700))

    async with running(broker):
        await broker.publish("x", subject, stream=stream)
        await eventually(lambda: len(seen) == 2, what="the retry")
    waited = seen[1] - seen[0]
    assert 0.7 <= waited < 0.7 + 3.0


async def test_a_handler_policy_overrides_the_default(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """@retry_policy(max_attempts=2) on one handler; the other keeps the default's 3."""
    stream = names.stream()
    one, two = names.subject("one"), names.subject("two")
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: dict[str, int] = {"one": 0, "two": 0}
    jstream = JStream(stream, subjects=[one, two])

    @broker.subscriber(one, stream=jstream, durable="one")
    @retry_policy(max_attempts=2)
    async def first(body: str) -> None:
        calls["one"] += 1
        raise ConnectionError("down")

    @broker.subscriber(two, stream=jstream, durable="two")
    async def second(body: str) -> None:
        calls["two"] += 1
        raise ConnectionError("down")

    dlq = f"{names.prefix}-dlq-{stream}"
    async with running(broker):
        await broker.publish("x", one, stream=stream)
        await broker.publish("x", two, stream=stream)
        await until(lambda: counted(js, dlq, 2), 15, "both dead letters")
    assert calls == {"one": 2, "two": 3}
    origins = {
        h["retry-origin-queue"]: h["retry-attempt"] for _, _, h in await stream_messages(js, dlq)
    }
    assert origins == {f"{stream}.one": 2, f"{stream}.two": 3}


async def test_only_the_failing_consumer_sees_its_retry(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Two durable consumers of one subject (interest retention): one fails once; the other
    is called once, not again for the first one's retry."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    billing: list[int] = []
    shipping: list[int] = []
    jstream = JStream(stream, subjects=[subject], retention=RetentionPolicy.INTEREST)

    @broker.subscriber(subject, stream=jstream, durable="billing")
    async def bill(body: str, msg: NatsMessage) -> None:
        billing.append(attempt_of(msg))
        if len(billing) == 1:
            raise ConnectionError("once")

    @broker.subscriber(subject, stream=jstream, durable="shipping")
    async def ship(body: str, msg: NatsMessage) -> None:
        shipping.append(attempt_of(msg))

    async with running(broker):
        await broker.publish("x", subject, stream=stream)
        await eventually(lambda: len(billing) == 2, what="billing's retry")
        await asyncio.sleep(0.5)
    assert billing == [0, 1]
    assert shipping == [0]


async def test_every_message_is_processed_or_dead_lettered_once(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """300 messages: a third always fail, a third fail once, a third succeed. By id:
    sent = processed + dead-lettered, none twice."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    processed: list[str] = []
    failed_once: set[str] = set()

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(batch_size=20),
    )
    async def handle(body: str) -> None:
        kind, _ = body.split(":")
        if kind == "bad":
            raise ConnectionError(body)
        if kind == "flaky" and body not in failed_once:
            failed_once.add(body)
            raise ConnectionError(body)
        processed.append(body)

    sent = [f"{kind}:{i}" for i in range(100) for kind in ("ok", "flaky", "bad")]
    dlq = f"{names.prefix}-dlq-{stream}"
    async with running(broker):
        await asyncio.gather(
            *(broker.publish(b, subject, stream=stream, timeout=BULK) for b in sent)
        )

        async def all_settled() -> bool:
            return len(processed) >= 200 and await stream_count(js, dlq) >= 100

        await until(all_settled, 60, "200 processed and 100 dead letters")
        await asyncio.sleep(1.0)  # nothing more comes
    dead = [body.decode() for _, body, _ in await stream_messages(js, dlq)]
    assert sorted(processed + dead) == sorted(sent)
    assert len(set(processed)) == len(processed)
    assert len(set(dead)) == len(dead)
    assert all(d.startswith("bad:") for d in dead)
    await drained(js, names.prefix)


async def test_a_core_nats_subscriber_is_refused_at_start(nats_url: str, names: Names) -> None:
    """A subscriber with no stream: the start fails with one error that names the fix."""
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    subject = names.subject()

    @broker.subscriber(subject)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    text = await refusal_of(broker)
    assert "core-NATS subscriber" in text
    assert subject in text
    assert "stream=JStream(" in text
    assert "@retry_policy(enabled=False)" in text


async def test_a_core_nats_subscriber_with_retries_off_starts(nats_url: str, names: Names) -> None:
    """Retries off for it: nothing to keep, nothing refused; its failures stay FastStream's."""
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    subject = names.subject()
    calls: list[str] = []

    @broker.subscriber(subject)
    @retry_policy(enabled=False)
    async def handle(body: str) -> None:
        calls.append(body)

    broker.middlewares[0].install(broker)  # type: ignore[attr-defined]
    async with running(broker):
        await broker.publish("x", subject)
        await eventually(lambda: calls == ["x"], what="the call")


async def test_a_batch_pull_subscriber_is_refused_at_start(nats_url: str, names: Names) -> None:
    """``PullSub(batch=True)``: one call for a whole batch, so a failure cannot be kept
    message by message. The start fails with one error naming the fix; nothing is pulled."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(batch_size=3, batch=True, timeout=0.5),
    )
    async def handle(body: list[str]) -> None:
        raise ConnectionError("batch")

    text = await refusal_of(broker)
    assert "PullSub(batch=True)" in text
    assert subject in text
    assert "PullSub(batch_size=N)" in text
    assert "@retry_policy(enabled=False)" in text


async def test_keys_that_read_alike_keep_their_own_retries(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Stream ``s_x`` durable ``d`` and stream ``s`` durable ``x_d`` (keys ``s_x.d`` and
    ``s.x_d``, the same once made consumer-name safe): each fails once and gets its own
    retry, in its own handler (their hand-over consumers shared one name)."""
    tag = names.tag
    s1, s2 = f"s{tag}_x", f"s{tag}"
    names.streams += [s1, s2]
    sub1, sub2 = f"{tag}.one", f"{tag}.two"
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    one: list[str] = []
    two: list[str] = []

    @broker.subscriber(sub1, stream=JStream(s1, subjects=[sub1]), durable="d")
    async def first(body: str) -> None:
        one.append(body)
        if len(one) == 1:
            raise ConnectionError("once")

    @broker.subscriber(sub2, stream=JStream(s2, subjects=[sub2]), durable="x_d")
    async def second(body: str) -> None:
        two.append(body)
        if len(two) == 1:
            raise ConnectionError("once")

    async with running(broker):
        await js.publish(sub1, b"a", stream=s1)
        await js.publish(sub2, b"b", stream=s2)
        await eventually(lambda: len(one) >= 2 and len(two) >= 2, what="both retries")
        await asyncio.sleep(0.5)
    assert (one, two) == (["a", "a"], ["b", "b"])
    await drained(js, names.prefix)


async def test_two_services_without_durable_names_keep_their_own_retries(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Two apps (one prefix) each with a subscriber without a durable name on the same
    subject: A fails each of 20 messages once, B never fails. A sees each retry; B each
    message once (their keys were the stream and subject only: B took A's retries)."""
    stream, subject = names.stream(), names.subject()
    a_calls: list[str] = []
    b_calls: list[str] = []
    a = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    b = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)

    @a.subscriber(subject, stream=JStream(stream, subjects=[subject]))
    async def service_a(body: str) -> None:
        a_calls.append(body)
        if a_calls.count(body) == 1:
            raise ConnectionError("once")

    @b.subscriber(subject, stream=JStream(stream, subjects=[subject]))
    async def service_b(body: str) -> None:
        b_calls.append(body)

    async with running(a), running(b):
        sent = [f"m{i}" for i in range(20)]
        for body in sent:
            await js.publish(subject, body.encode(), stream=stream)
        await eventually(
            lambda: len(a_calls) >= 40 and len(b_calls) >= 20, what="A's retries and B's calls"
        )
        await asyncio.sleep(1.0)  # nothing more comes
    assert sorted(a_calls) == sorted(sent * 2)
    assert sorted(b_calls) == sorted(sent)
    await drained(js, names.prefix)


@pytest.mark.timeout(240)
async def test_failures_waiting_out_a_long_delay_never_stall_the_consumer(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The held-out stall test: max_ack_pending=100, 1,000 messages failing with a 60 s
    delay, then 1,000 good ones: every good one is handled within seconds, not after the
    delay (plain nak(delay) leaves the consumer at 100 pending, taking nothing new)."""
    stream, subject = names.stream(), names.subject()
    policy = RetryPolicy(max_attempts=2, backoff=Fixed(timedelta(seconds=60)))
    broker = NatsBroker(nats_url, middlewares=[middleware(names, policy)], logger=None)
    good: dict[str, float] = {}
    bad: list[str] = []

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(batch_size=20),
        config=ConsumerConfig(max_ack_pending=100),
    )
    async def handle(body: str) -> None:
        if body.startswith("bad"):
            bad.append(body)
            raise ConnectionError(body)
        good[body] = time.monotonic()

    async with running(broker):
        await asyncio.gather(
            *(broker.publish(f"bad:{i}", subject, stream=stream, timeout=BULK) for i in range(1000))
        )
        sent_at = time.monotonic()
        await asyncio.gather(
            *(
                broker.publish(f"good:{i}", subject, stream=stream, timeout=BULK)
                for i in range(1000)
            )
        )
        await eventually(lambda: len(good) == 1000, timeout=30, what="every good message")
        slowest = max(good.values()) - sent_at
        waiting = await stream_count(js, f"{names.prefix}-delay")
    assert slowest < 30  # seconds, against the 60 s a stalled consumer would take
    assert len(bad) == 1000  # each failed once, and waits for its retry on the server
    assert waiting == 1000


async def test_an_ephemeral_push_subscriber_is_covered(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """No durable name: keyed by its subject, its retry comes back to it all the same."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]))
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append(attempt_of(msg))
        if len(calls) == 1:
            raise ConnectionError("once")

    async with running(broker):
        await broker.publish("x", subject, stream=stream)
        await eventually(lambda: len(calls) == 2, what="the retry")
    assert calls == [0, 1]
    await drained(js, names.prefix)


async def test_a_waiting_copy_outlives_the_app(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The app stops while a copy waits out its delay on the server (the re-check holding
    it gives it back); a new process of the same app (same durable consumers) gets the
    retry once it is due."""
    stream, subject = names.stream(), names.subject()
    calls: list[tuple[int, int]] = []
    policy = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=2)))

    def app(run: int) -> NatsBroker:
        # install(): the plugin starts with the broker, not at its first message (the
        # second process gets none but the retry).
        broker = middleware(names, policy).install(NatsBroker(nats_url, logger=None))

        @broker.subscriber(
            subject,
            stream=JStream(stream, subjects=[subject]),
            durable="d",
            pull_sub=PullSub(batch_size=5),
        )
        async def handle(body: str, msg: NatsMessage) -> None:
            calls.append((run, attempt_of(msg)))
            if run == 1:
                raise ConnectionError("down")

        return broker

    async with running(app(1)) as first:
        await first.publish("x", subject, stream=stream)
        await eventually(lambda: calls == [(1, 0)], what="the first call")
        await until(lambda: counted(js, f"{names.prefix}-delay", 1), 5, "the copy")
    assert calls == [(1, 0)]
    async with running(app(2)):
        # Within seconds of its due time, not after the re-check's ack_wait (30 s).
        await eventually(lambda: len(calls) == 2, timeout=15, what="the retry in the new app")
        await asyncio.sleep(0.5)
    assert calls == [(1, 0), (2, 1)]
    await drained(js, names.prefix)


async def test_hostile_headers_neither_crash_nor_misroute_a_retry(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A message whose publisher set garbled ``retry-*`` headers, a forged subject and a
    server instruction (``Nats-Rollup``, which the delay stream would refuse) is retried
    like any other, on its own subject: its copy carries none of them, nothing is left."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []
    subjects: list[str] = []

    jstream = JStream(stream, subjects=[subject], allow_rollup_hdrs=True)

    @broker.subscriber(subject, stream=jstream, durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append(h.read_attempt(msg.headers))
        subjects.append(msg.raw_message.subject)
        if len(calls) == 1:
            raise ConnectionError("once")

    hostile = {
        "Nats-Expected-Stream": stream,
        "Nats-Rollup": "sub",
        "retry-attempt": "not json",
        "retry-due": "99999999999999999999",
        "retry-history": '[{"attempt": "x"',
        "retry-subject": '"elsewhere.subject"',
    }
    async with running(broker):
        await js.publish(subject, b"x", stream=stream, headers=hostile)
        await eventually(lambda: len(calls) == 2, what="the retry")
        await asyncio.sleep(0.3)
    assert calls == [0, 1]
    assert subjects == [subject, subject]
    await drained(js, names.prefix)


async def test_a_header_name_nats_py_refuses_is_renamed_in_the_copy_and_the_dead_letter(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A message from another client with a header ``x/y`` (legal on the wire, refused by
    nats-py) that always fails, 2 attempts: its retry and its dead letter are written with
    the header as ``x%2Fy``, and the retry's ``retry-error`` says so (neither was: the handler ran at
    every redelivery, for ever)."""
    stream, subject = names.stream(), names.subject()
    dlq = f"{names.prefix}-dlq-{stream}"
    policy = RetryPolicy(max_attempts=2, backoff=Fixed(timedelta(milliseconds=200)))
    broker = NatsBroker(nats_url, middlewares=[middleware(names, policy)], logger=None)
    calls: list[dict[str, str]] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append(dict(msg.headers))
        raise ConnectionError("always")

    async with running(broker):
        await raw_hpub(nats_url, subject, b"x/y: 1\r\n", b"hostile")
        await until(lambda: counted(js, dlq, 1), 15, "the dead letter")
        await asyncio.sleep(0.5)  # nothing more comes
    assert len(calls) == 2
    assert calls[0]["x/y"] == "1"
    retried = calls[1]
    assert retried["x%2Fy"] == "1"
    assert "x/y" not in retried
    assert "renamed: 'x/y' as 'x%2Fy'" in retried["retry-error"]
    [(_, body, headers)] = await stream_messages(js, dlq)
    assert body == b"hostile"
    assert headers["x%2Fy"] == "1"
    assert "x/y" not in headers
    await drained(js, names.prefix)


async def test_a_copy_over_max_payload_is_dead_lettered_without_cutting_the_connection(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A message 64 bytes under the server's max_payload fails: its copy (with the retry-*
    headers) would not fit, so it is dead-lettered at once, body untouched, without the
    headers that do not fit; the app's connection is never cut (nats-py checks the body
    only, and the server closed the connection at every attempt)."""
    stream, subject = names.stream(), names.subject()
    dlq = f"{names.prefix}-dlq-{stream}"
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(batch_size=1),
    )
    async def handle(body: bytes) -> None:
        calls.append(len(body))
        raise ConnectionError("always")

    async with running(broker):
        limit = js._nc.max_payload
        big = b"x" * (limit - 64)
        await js.publish(subject, big, stream=stream, timeout=BULK)
        await until(lambda: counted(js, dlq, 1), 15, "the dead letter")
        await asyncio.sleep(0.5)  # nothing more comes
        connection = broker._connection
        assert connection is not None
        reconnects = connection.stats["reconnects"]
    assert reconnects == 0
    assert calls == [limit - 64]
    [(_, body, _)] = await stream_messages(js, dlq)
    assert body == big
    await drained(js, names.prefix)


async def test_a_copy_the_server_keeps_refusing_is_dead_lettered_as_stuck(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A full delay stream (made so by an operator: one message at most, new ones refused):
    the second failure's copy is placed again while its message is held, then the
    message is dead-lettered as stuck; its handler ran once. Counted: 2 sent = 1 waiting
    + 1 dead-lettered."""
    stream, subject = names.stream(), names.subject()
    await make_delay_stream(js, names.prefix, max_msgs=1, discard=DiscardPolicy.NEW)
    policy = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=60)))
    retry = RetryMiddleware(
        policy,
        prefix=names.prefix,
        tick=timedelta(milliseconds=100),
        max_delay=120,
        delivery_limit=2,
        publish_failure_pause=timedelta(milliseconds=100),
    )
    broker = NatsBroker(nats_url, middlewares=[retry], logger=None)
    calls: list[str] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    dlq = f"{names.prefix}-dlq-{stream}"
    async with running(broker):
        await broker.publish("first", subject, stream=stream)
        await until(lambda: counted(js, f"{names.prefix}-delay", 1), 10, "the first copy")
        await broker.publish("second", subject, stream=stream)
        await until(lambda: counted(js, dlq, 1), 10, "the stuck dead letter")
        await asyncio.sleep(0.3)
    assert calls == ["first", "second"]
    [(_, body, headers)] = await stream_messages(js, dlq)
    assert body == b"second"
    assert headers["retry-reason"] == "stuck"
    assert "placed again" in headers["retry-error"]
    assert await stream_count(js, f"{names.prefix}-delay") == 1


async def test_a_handler_longer_than_ack_wait_runs_once_then_retries_once(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A push consumer with ``ack_wait`` 1 s, a handler that takes 3 s and fails once: the
    message is kept alive while it runs (``in_progress``), so the handler runs once, then
    once for its retry (JetStream delivered it again mid-run: three runs or more)."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[int] = []

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        config=ConsumerConfig(ack_wait=1),
    )
    async def handle(body: str, msg: NatsMessage) -> None:
        calls.append(attempt_of(msg))
        await asyncio.sleep(3)
        if len(calls) == 1:
            raise ConnectionError("once")

    async with running(broker):
        await js.publish(subject, b"x", stream=stream)
        await eventually(lambda: len(calls) >= 2, timeout=20, what="the retry")
        await asyncio.sleep(4)  # a redelivery would come within ack_wait
    assert calls == [0, 1]
    await drained(js, names.prefix)


async def test_the_plugins_streams_deleted_while_the_app_runs_are_made_again(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """An operator deletes the delay stream and the dead-letter stream of a running app:
    they are made again (with the re-checks and the hand-over), and a message that fails
    once comes back while one that fails for good is dead-lettered (nothing was made
    again until the next start: no retry came back in 30 s)."""
    stream, subject = names.stream(), names.subject()
    dlq, delay = f"{names.prefix}-dlq-{stream}", f"{names.prefix}-delay"
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[str] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        calls.append(body)
        if body == "bad":
            raise PermanentError(body)
        if calls.count(body) == 1:
            raise ConnectionError("once")

    broker.middlewares[0].install(broker)  # type: ignore[attr-defined]
    async with running(broker):
        await js.delete_stream(delay)
        await js.delete_stream(dlq)
        await js.publish(subject, b"flaky", stream=stream)
        await js.publish(subject, b"bad", stream=stream)
        await eventually(lambda: calls.count("flaky") == 2, timeout=30, what="the retry")
        await until(lambda: counted(js, dlq, 1), 30, "the dead letter")
        await asyncio.sleep(0.5)
    assert sorted(calls) == ["bad", "flaky", "flaky"]
    [(_, body, headers)] = await stream_messages(js, dlq)
    assert body == b"bad"
    assert headers["retry-reason"] == "permanent"
    await drained(js, names.prefix)


async def test_the_last_delivery_max_deliver_allows_is_dead_lettered_as_stuck(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A consumer with ``max_deliver`` 3 whose message was delivered twice and never acked
    (a process that died in its handler, twice): at its third delivery it is dead-lettered
    as ``stuck``, its handler not run (JetStream delivers it no more: it stopped, silently)."""
    stream, subject = names.stream(), names.subject()
    dlq = f"{names.prefix}-dlq-{stream}"
    config = ConsumerConfig(durable_name="d", max_deliver=3, ack_wait=1.0)
    await js.add_stream(name=stream, subjects=[subject])
    await js.publish(subject, b"crash", stream=stream)
    crashed = await js.pull_subscribe(subject, durable="d", stream=stream, config=config)
    for _ in range(2):  # two deliveries that die with their process: never acked
        [msg] = await crashed.fetch(1, timeout=5)
        await asyncio.sleep(1.2)
    await crashed.unsubscribe()
    assert msg.metadata.num_delivered == 2
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)
    calls: list[str] = []

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(batch_size=1),
        config=config,
    )
    async def handle(body: str) -> None:
        calls.append(body)

    broker.middlewares[0].install(broker)  # type: ignore[attr-defined]
    async with running(broker):
        await until(lambda: counted(js, dlq, 1), 15, "the dead letter")
        await asyncio.sleep(1.5)  # nothing more comes
        info = await js.consumer_info(stream, "d")
    assert calls == []
    assert info.num_ack_pending == 0
    [(_, body, headers)] = await stream_messages(js, dlq)
    assert body == b"crash"
    assert headers["retry-reason"] == "stuck"
    assert "max_deliver" in headers["retry-error"]


async def test_a_copy_in_a_tier_the_next_version_does_not_have_comes_back(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """v1 (tick 1 s, max_delay 10 s) leaves a RetryLater(4 s) copy in tier 4000 and stops;
    v2 of the app (max_delay 3 s: tiers 1000 and 2000) starts: the copy comes back to its
    handler, once (no re-check read tier 4000 any more: it waited for ever)."""
    stream, subject = names.stream(), names.subject()
    calls: list[str] = []

    def app(max_delay: float) -> NatsBroker:
        policy = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=1)))
        retry = RetryMiddleware(
            policy, prefix=names.prefix, tick=timedelta(seconds=1), max_delay=max_delay
        )
        broker = NatsBroker(nats_url, middlewares=[retry], logger=None)

        @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
        async def handle(body: str) -> None:
            calls.append(body)
            if len(calls) == 1:
                raise RetryLater(4)

        retry.install(broker)  # v2 gets no new message: the plugin starts with the broker
        return broker

    async with running(app(10)):
        await js.publish(subject, b"x", stream=stream)
        await until(lambda: counted(js, f"{names.prefix}-delay", 1), 10, "the copy in its tier")
    info = await js.stream_info(f"{names.prefix}-delay", subjects_filter=f"{names.prefix}.>")
    assert list(info.state.subjects or {}) == [f"{names.prefix}.delay.4000.{stream}.d"]
    async with running(app(3)):
        await eventually(lambda: len(calls) == 2, timeout=20, what="the retry in v2")
        await asyncio.sleep(0.5)
    assert calls == ["x", "x"]
    await drained(js, names.prefix)


async def test_two_processes_of_one_app_share_the_retries(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Two instances of one app (same durable consumers, same prefix, both re-checking and
    handing over): 200 messages, half failing once, each processed exactly once, whichever
    instance took it or its retry."""
    stream, subject = names.stream(), names.subject()
    processed: list[tuple[int, str]] = []
    failed: set[str] = set()

    def app(n: int) -> NatsBroker:
        broker = middleware(names).install(NatsBroker(nats_url, logger=None))

        @broker.subscriber(
            subject,
            stream=JStream(stream, subjects=[subject]),
            durable="d",
            pull_sub=PullSub(batch_size=10),
        )
        async def handle(body: str) -> None:
            if body.startswith("flaky") and body not in failed:
                failed.add(body)
                raise ConnectionError(body)
            processed.append((n, body))

        return broker

    sent = [f"{kind}:{i}" for i in range(100) for kind in ("ok", "flaky")]
    async with running(app(1)) as first, running(app(2)):
        await asyncio.gather(
            *(first.publish(b, subject, stream=stream, timeout=BULK) for b in sent)
        )
        await eventually(lambda: len(processed) >= 200, timeout=60, what="200 processed")
        await asyncio.sleep(1.0)  # nothing more comes
    assert sorted(body for _, body in processed) == sorted(sent)
    await drained(js, names.prefix)
