"""The NATS pages' examples (examples/docs/nats_*.py) on a real nats-server: what each page
claims, counted by id (sent = processed + dead-lettered).

The examples use the plugin's default prefix, ``retry``, as a reader's app would, so they
share the delay stream ``retry-delay`` (as two apps of one prefix do); each test uses
streams no other test uses, and clears them, and its keys' copies, before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import logging
import time
from collections import defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js.api import RetentionPolicy
from nats.js.errors import NotFoundError

from faststream_retry import Fixed, PermanentError, RetryMiddleware, RetryPolicy, retry_policy
from tests.nats.helpers import running, stream_count, stream_messages
from tests.rabbit import eventually
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

DELAY = "retry-delay"


async def fresh(js: JetStreamContext, work: str, keys: list[str]) -> None:
    """Empty the work stream ``work`` (purged, not deleted: a stream made again restarts
    its sequences, and the plugin's copy ids, ``<stream>:<sequence>:<kind>``, would repeat
    ids the delay stream saw within its duplicate window), delete its dead-letter
    stream, and drop every copy of ``keys`` an earlier run left in the delay stream."""
    with contextlib.suppress(NotFoundError):
        await js.purge_stream(work)
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(f"retry-dlq-{work}")
    for key in keys:
        for subject in (f"retry.delay.*.{key}", f"retry.ready.{key}"):
            with contextlib.suppress(NotFoundError):
                await js.purge_stream(DELAY, subject=subject)


async def waiting(js: JetStreamContext, key: str) -> int:
    """How many copies of ``key``'s subscriber wait in the delay stream (tiers, ready)."""
    try:
        info = await js.stream_info(DELAY, subjects_filter="retry.>")
    except NotFoundError:
        return 0
    return sum(n for subject, n in (info.state.subjects or {}).items() if subject.endswith(key))


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def test_the_getting_started_app_retries_then_dead_letters_and_the_reader_moves_nothing(
    nats_url: str,
    js: JetStreamContext,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """getting-started-nats.md: a failure comes back after 1 s, then 2 s; the third failed
    attempt, and a PermanentError at once, land in retry-dlq-orders on
    retry.dlq.orders.billing, body untouched. how-to/nats.md: listing them moves nothing."""
    await fresh(js, "orders", ["orders.billing"])
    monkeypatch.setenv("NATS_URL", nats_url)
    example = importlib.reload(importlib.import_module("examples.docs.nats_orders"))
    calls: dict[str, list[float]] = defaultdict(list)
    saved: list[str] = []

    async def save(order: dict[str, str]) -> None:
        calls[order["id"]].append(time.monotonic())
        kind = order["id"].split("-")[0]
        if kind == "down" or (kind == "flaky" and len(calls[order["id"]]) == 1):
            raise ConnectionError("the database is restarting")
        saved.append(order["id"])

    monkeypatch.setattr(example, "save", save)
    good = [f"{kind}-{i}" for kind in ("ok", "flaky") for i in range(10)]
    bad = [f"{kind}-{i}" for kind in ("down", "anonymous") for i in range(3)]
    caplog.set_level(logging.INFO)
    async with running(example.broker) as broker:
        for ident in good + bad:
            order = {"id": ident, "customer": "" if ident.startswith("anonymous") else "c"}
            await broker.publish(order, "orders.created", stream="orders")

        async def settled() -> bool:
            return len(saved) >= len(good) and await stream_count(js, "retry-dlq-orders") >= 6

        await until(settled, 30, "20 saved and 6 dead letters")
        await asyncio.sleep(1.0)  # and nothing more comes
        left = await waiting(js, "orders.billing")
    letters = await stream_messages(js, "retry-dlq-orders")
    dead = [json.loads(body)["id"] for _, body, _ in letters]
    # Counted by id: each sent order saved or dead-lettered, once.
    assert sorted(saved + dead) == sorted(good + bad)
    assert len(set(saved)) == len(saved)
    assert sorted(dead) == sorted(bad)
    assert left == 0
    for ident in good:
        assert len(calls[ident]) == (2 if ident.startswith("flaky") else 1)
        if ident.startswith("flaky"):
            assert gaps(calls[ident])[0] >= 1.0  # back in 1 s, never early
    for ident in bad:
        if ident.startswith("down"):
            assert len(calls[ident]) == 3
            first, second = gaps(calls[ident])
            assert first >= 1.0
            assert second >= 2.0
        else:
            assert ident not in calls  # PermanentError before save: one call, no retry
    for subject, body, headers in letters:
        ident = json.loads(body)["id"]
        assert subject == "retry.dlq.orders.billing"
        assert headers["retry-origin-queue"] == "orders.billing"
        assert headers["retry-subject"] == "orders.created"
        if ident.startswith("down"):
            assert (headers["retry-reason"], headers["retry-attempt"]) == ("exhausted", 3)
            assert headers["retry-exception"] == "ConnectionError"
        else:
            assert (headers["retry-reason"], headers["retry-attempt"]) == ("permanent", 1)
            assert headers["retry-error"] == f"order {ident} names no customer"
    started = [m for r in caplog.records if "(NATS)" in (m := r.getMessage())]
    assert started == [
        (
            "faststream-retry (NATS): tick 1 s, 17 tiers up to 18 h 12 min 16 s in stream "
            "retry-delay, 1 covered: orders.billing"
        )
    ]

    # how-to/nats.md: reading them takes nothing off the stream and makes no consumer.
    from examples.docs.nats_read_dead_letters import list_dead_letters  # noqa: PLC0415

    before = (await js.stream_info("retry-dlq-orders")).state
    capsys.readouterr()
    listed = await list_dead_letters(nats_url, "orders", "billing")
    again = await list_dead_letters(nats_url, "orders", "billing")
    after = (await js.stream_info("retry-dlq-orders")).state
    assert (after.messages, after.first_seq, after.last_seq) == (
        before.messages,
        before.first_seq,
        before.last_seq,
    )
    assert after.consumer_count == before.consumer_count == 0
    assert listed == again
    assert [json.loads(letter["body"])["id"] for letter in listed] == dead
    assert [(letter["retry-reason"], letter["retry-attempt"]) for letter in listed] == [
        ("exhausted" if i.startswith("down") else "permanent", 3 if i.startswith("down") else 1)
        for i in dead
    ]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 * len(dead)
    assert await list_dead_letters(nats_url, "no-such-stream", "billing") == []


async def test_the_billing_example_router_policies_and_dead_letter_consumer(
    nats_url: str, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """how-to/nats.md: a router's prefix is in the subject, not in the key; the mailer's
    @retry_policy (5 attempts, InvalidAddress permanent) and the ledger's default (3);
    the dead-letter consumer alerts once per dead letter, which stays in its stream,
    direct gets still on."""
    await fresh(js, "invoices", ["invoices.mailer", "invoices.ledger"])
    monkeypatch.setenv("NATS_URL", nats_url)
    example = importlib.reload(importlib.import_module("examples.docs.nats_billing"))
    calls: dict[str, int] = defaultdict(int)
    done: list[str] = []
    alerts: list[tuple[str, str, str]] = []

    async def work(invoice: dict[str, str]) -> None:
        ident = invoice["id"]
        calls[ident] += 1
        kind = ident.split("-")[1]
        if kind == "down" or (kind == "flaky" and calls[ident] < 3):
            raise ConnectionError("down")
        done.append(ident)

    async def alert_on_call(body: bytes, reason: str, error: str) -> None:
        alerts.append((json.loads(body)["id"], reason, error))

    monkeypatch.setattr(example, "send_mail", work)
    monkeypatch.setattr(example, "book", work)
    monkeypatch.setattr(example, "alert_on_call", alert_on_call)
    mails = [f"mail-{kind}-{i}" for kind in ("ok", "flaky", "down", "bad") for i in range(3)]
    payments = [f"paid-{kind}-{i}" for kind in ("ok", "down") for i in range(3)]
    async with running(example.broker) as broker:
        for ident in mails:
            email = "nowhere" if "-bad-" in ident else "a@example.com"
            invoice = {"id": ident, "email": email}
            await broker.publish(invoice, "billing.invoices.issued", stream="invoices")
        for ident in payments:
            await broker.publish({"id": ident}, "billing.invoices.paid", stream="invoices")
        await eventually(lambda: len(alerts) >= 9, timeout=30, what="9 alerts")
        await eventually(lambda: len(done) >= 9, timeout=10, what="9 handled")
        await asyncio.sleep(1.0)  # and nothing more comes
        consumer = await js.consumer_info("retry-dlq-invoices", "on-call")
        left = await waiting(js, "invoices.mailer") + await waiting(js, "invoices.ledger")
    letters = await stream_messages(js, "retry-dlq-invoices")
    dead = {json.loads(body)["id"]: (subject, headers) for subject, body, headers in letters}
    sent = mails + payments
    # Counted by id: handled or dead-lettered, once; one alert per dead letter.
    assert sorted(done + list(dead)) == sorted(sent)
    assert len(set(done)) == len(done)
    assert sorted(a[0] for a in alerts) == sorted(dead)
    assert left == 0
    expected = {
        "mail-down": ("invoices.mailer", "billing.invoices.issued", "exhausted", 5),
        "mail-bad": ("invoices.mailer", "billing.invoices.issued", "permanent", 1),
        "paid-down": ("invoices.ledger", "billing.invoices.paid", "exhausted", 3),
    }
    for ident, (subject, headers) in dead.items():
        key, original, reason, attempts = expected[ident.rsplit("-", 1)[0]]
        assert subject == f"retry.dlq.{key}"
        assert headers["retry-origin-queue"] == key
        assert headers["retry-subject"] == original
        assert (headers["retry-reason"], headers["retry-attempt"]) == (reason, attempts)
        assert calls[ident] == (0 if reason == "permanent" else attempts)
    for ident in mails:
        if "-flaky-" in ident:
            assert calls[ident] == 3
    reasons = {ident: reason for ident, reason, _ in alerts}
    assert reasons == {ident: headers["retry-reason"] for ident, (_, headers) in dead.items()}
    assert {error for ident, _, error in alerts if "-bad-" in ident} == {"nowhere"}
    # Acked, and still there: limits retention; the stream is the plugin's as it made it.
    assert consumer.num_ack_pending == 0
    assert consumer.num_pending == 0
    info = await js.stream_info("retry-dlq-invoices")
    assert info.state.messages == len(dead) == 9
    assert info.config.allow_direct is True
    assert info.config.subjects == ["retry.dlq.invoices.>"]
    # The router's stream as the example declared it: the prefix is in its subjects.
    assert (await js.stream_info("invoices")).config.subjects == ["billing.invoices.>"]


async def test_a_dead_letter_stream_declared_by_faststream_loses_its_direct_gets(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Why how-to/nats.md says declare=False: a subscriber of the dead-letter stream whose
    JStream FastStream declares (the default) updates the stream the plugin made, with
    direct gets on, to FastStream's config, with them off."""
    stream, subject = names.stream(), names.subject()
    dlq = f"{names.prefix}-dlq-{stream}"
    retry = RetryMiddleware(prefix=names.prefix)
    broker = retry.install(NatsBroker(nats_url, logger=None))

    @broker.subscriber(
        subject, stream=JStream(stream, subjects=[subject]), durable="d", pull_sub=PullSub()
    )
    async def handle(body: str) -> None: ...

    @broker.subscriber(
        f"{names.prefix}.dlq.{stream}.>", stream=JStream(dlq), durable="a", pull_sub=PullSub()
    )
    @retry_policy(enabled=False)
    async def alert(msg: NatsMessage) -> None: ...

    async with running(broker):
        info = await js.stream_info(dlq)
    assert info.config.allow_direct is not True


async def test_two_consumers_failing_one_message_each_get_their_retry(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Two durable consumers of one interest stream both fail the same message once: each
    is called again for its own retry (sent 1 = processed once by each): a copy's
    ``Nats-Msg-Id`` names the consumer that made it."""
    stream, subject = names.stream(), names.subject()
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
        prefix=names.prefix,
        tick=timedelta(milliseconds=100),
        max_delay=120,
    )
    broker = retry.install(NatsBroker(nats_url, logger=None))
    jstream = JStream(stream, subjects=[subject], retention=RetentionPolicy.INTEREST)
    calls: list[str] = []

    for durable in ("billing", "shipping"):

        @broker.subscriber(subject, stream=jstream, durable=durable, pull_sub=PullSub())
        async def handle(body: str, name: str = durable) -> None:
            calls.append(name)
            if calls.count(name) == 1:
                raise ConnectionError("once")

    async with running(broker):
        await broker.publish("x", subject, stream=stream)
        deadline = time.monotonic() + 10  # both retries, or the assert below says which
        while len(calls) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
    assert sorted(calls) == ["billing", "billing", "shipping", "shipping"]
    assert await stream_count(js, f"{names.prefix}-dlq-{stream}") == 0


async def test_a_work_stream_made_again_keeps_its_dead_letters(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A stream deleted and made again by the next start of its app: the first message of
    each run fails for good; both dead letters are kept (sent 2 = dead-lettered 2): a
    copy's ``Nats-Msg-Id`` names its message's stored time, not only its sequence."""
    stream, subject = names.stream(), names.subject()
    calls: list[str] = []

    def app() -> NatsBroker:
        broker = RetryMiddleware(prefix=names.prefix).install(NatsBroker(nats_url, logger=None))

        @broker.subscriber(
            subject, stream=JStream(stream, subjects=[subject]), durable="d", pull_sub=PullSub()
        )
        async def handle(body: str) -> None:
            calls.append(body)
            raise PermanentError(body)

        return broker

    sent: list[str] = []
    for body in ("first", "second"):
        sent.append(body)
        async with running(app()) as broker:
            await broker.publish(body, subject, stream=stream)
            await eventually(lambda: len(calls) == len(sent), timeout=10, what="the call")
            await asyncio.sleep(0.5)  # its dead letter confirmed, or dropped
        await js.delete_stream(stream)
    assert calls == ["first", "second"]
    dead = [body for _, body, _ in await stream_messages(js, f"{names.prefix}-dlq-{stream}")]
    assert dead == [b"first", b"second"]
