"""Subscribers that join a running NatsBroker, on a real nats-server: checked as the start
checks the others, and covered (their dead-letter stream made, their copies handed over),
counted by id: sent = processed + dead-lettered."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage, NatsRouter

from faststream_retry import Fixed, RetryConfigError, RetryMiddleware, RetryPolicy
from faststream_retry.core import headers as h
from tests.nats.helpers import drained, running, stream_count, stream_messages
from tests.rabbit import eventually
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

N = 20
FAST = RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200)))


def middleware(names: Names) -> RetryMiddleware:
    return RetryMiddleware(FAST, prefix=names.prefix, tick=timedelta(milliseconds=100))


class Seen:
    """Each call's attempt by body, and the bodies handled."""

    def __init__(self) -> None:
        self.calls: dict[str, list[int]] = {}
        self.done: Counter[str] = Counter()

    def handle(self, body: str, msg: NatsMessage) -> None:
        attempt = h.read_attempt(msg.headers)
        self.calls.setdefault(body, []).append(attempt)
        if body.startswith("poison") or attempt == 0:
            raise ConnectionError("flaky")
        self.done[body] += 1


async def check_counts(js: JetStreamContext, names: Names, seen: Seen, sent: list[str]) -> None:
    """Every good message handled once after one retry; the poison one dead-lettered."""
    dlq = f"{names.prefix}-dlq-{names.stream()}"
    await eventually(lambda: sum(seen.done.values()) >= N, what="every good message")
    await until(lambda: _counted(js, dlq, 1), 20, "the poison message's dead letter")
    await asyncio.sleep(0.5)  # nothing more comes
    letters = await stream_messages(js, dlq)
    assert [body for _, body, _ in letters] == [b"poison"]
    assert letters[0][2]["retry-attempt"] == FAST.max_attempts
    assert seen.done == Counter(b for b in sent if b != "poison"), "each good one once"
    assert all(seen.calls[b] == [0, 1] for b in seen.done), "one retry each, by a copy"
    assert seen.calls["poison"] == [0, 1, 2]
    await drained(js, names.prefix)


async def _counted(js: JetStreamContext, stream: str, n: int) -> bool:
    return await stream_count(js, stream) >= n


async def first_app(
    nats_url: str, names: Names, *, install: bool
) -> tuple[NatsBroker, Callable[[JetStreamContext], Awaitable[None]]]:
    """A broker with one subscriber, and what makes the plugin run on it once it started.

    Installed, the plugin starts with the broker; in ``middlewares=`` only, at the first
    message the broker consumes: the first subscriber is sent one, and it is waited for.
    """
    retry = middleware(names)
    broker = NatsBroker(nats_url, middlewares=[retry], logger=None)
    if install:
        retry.install(broker)
    other = names.subject("other")
    handled: list[str] = []

    @broker.subscriber(other, stream=JStream(names.stream("O"), subjects=[other]), durable="o")
    async def first(body: str) -> None:
        handled.append(body)

    async def plugin_running(js: JetStreamContext) -> None:
        if not install:
            await js.publish(other, b"hello", stream=names.stream("O"))
            await eventually(lambda: handled == ["hello"], what="the first message")

    return broker, plugin_running


async def publish(js: JetStreamContext, names: Names) -> list[str]:
    sent = [f"m{i}" for i in range(N)] + ["poison"]
    for body in sent:
        await js.publish(names.subject(), body.encode(), stream=names.stream())
    return sent


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_a_subscriber_started_on_the_running_broker_is_covered(
    nats_url: str, names: Names, js: JetStreamContext, install: bool
) -> None:
    """``broker.subscriber(...)`` then ``await sub.start()`` after the broker started: its
    failures wait as copies on the server and come back to it, its poison message goes to
    its stream's dead-letter stream (made when it joined)."""
    broker, first = await first_app(nats_url, names, install=install)
    seen = Seen()
    async with running(broker):
        await first(js)
        subject = names.subject()
        # FastStream makes a subscriber's stream at the broker's start: a late one's is
        # made by the app, as it would be.
        await js.add_stream(name=names.stream(), subjects=[subject])
        sub = broker.subscriber(
            subject, stream=JStream(names.stream(), subjects=[subject]), durable="late"
        )
        sub(seen.handle)
        await sub.start()
        sent = await publish(js, names)
        await check_counts(js, names, seen, sent)


@pytest.mark.parametrize("install", [True, False], ids=["installed", "in-middlewares"])
async def test_a_router_included_late_is_covered(
    nats_url: str, names: Names, js: JetStreamContext, install: bool
) -> None:
    """A router included after the start, then ``broker.start()`` again to start it."""
    broker, first = await first_app(nats_url, names, install=install)
    seen = Seen()
    async with running(broker):
        await first(js)
        router = NatsRouter()
        subject = names.subject()
        router.subscriber(
            subject, stream=JStream(names.stream(), subjects=[subject]), durable="late"
        )(seen.handle)
        broker.include_router(router)
        await broker.start()
        sent = await publish(js, names)
        await check_counts(js, names, seen, sent)


async def test_a_core_nats_subscriber_joining_with_retries_on_is_refused(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """A core-NATS subscriber that joins is refused as the start refuses one: its start
    raises with the fix, and it consumes nothing."""
    broker, first = await first_app(nats_url, names, install=True)
    async with running(broker):
        await first(js)
        sub = broker.subscriber(names.subject("core"))

        @sub
        async def late(body: str) -> None: ...

        with pytest.raises(RetryConfigError, match="is a core-NATS subscriber"):
            await sub.start()
        assert not getattr(sub, "running", False)
