"""Outage mode on a real nats-server: a subscriber whose dependency is down takes one message
per probe, spends no attempt while it waits, and loses or doubles nothing.

The dependency is a flag the handler reads. While it is down every call fails with a
transient ``ConnectionError``; the policy (4 attempts, 0.2 s apart) would dead-letter every
message within a second without outage mode. Counted by id: sent = processed + dead-lettered,
with nothing dead-lettered and each processed once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage
from nats.js.api import ConsumerConfig

from faststream_retry import EventKind, RetryMiddleware
from faststream_retry.core import headers as h
from tests.nats.helpers import drained, running, stream_count
from tests.outage_support import POLICY, Dependency, N
from tests.rabbit import eventually

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]


def app(
    nats_url: str, names: Names, dependency: Dependency[str], ack_wait: float = 30, **options: Any
) -> NatsBroker:
    stream, subject = names.stream(), names.subject()
    retry = RetryMiddleware(
        POLICY,
        prefix=names.prefix,
        tick=timedelta(milliseconds=100),
        max_delay=120,
        outage_after=3,
        hooks=[dependency.events.append],
        **{"outage_probe": 0.3, **options},
    )
    broker = NatsBroker(nats_url, middlewares=[retry], logger=None)

    # Ten calls at once: several messages wait at the gate side by side.
    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        config=ConsumerConfig(ack_wait=ack_wait),
        max_workers=10,
    )
    async def handle(body: str, msg: NatsMessage) -> None:
        dependency.delivered.append(msg.raw_message.metadata.num_delivered)
        dependency.call(body, h.read_attempt(msg.headers))

    return broker


async def publish(js: JetStreamContext, names: Names) -> list[str]:
    sent = [f"m{i}" for i in range(N)]
    for body in sent:
        await js.publish(names.subject(), body.encode(), stream=names.stream())
    return sent


async def dead_letters(js: JetStreamContext, names: Names) -> int:
    return await stream_count(js, f"{names.prefix}-dlq-{names.stream()}")


async def test_outage_mode_holds_the_subscriber_until_the_dependency_is_back(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """After 3 transient failures one message per 0.3 s probe reaches the handler; a message
    held past outage_hold is parked in a delay tier (a hop, its attempt unchanged), never
    nak'd; once the dependency is back every message is processed once, none dead-lettered."""
    dependency: Dependency[str] = Dependency()
    broker = app(nats_url, names, dependency, outage_hold=1.0)
    async with running(broker):
        sent = await publish(js, names)
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_STARTED) != [], what="outage mode"
        )
        switched = time.monotonic()
        # The dependency stays down 3 s (the outage, not a wait for a condition): ten
        # messages at a time wait at the gate, each parked after 1 s.
        await asyncio.sleep(3)
        parked = len(dependency.kinds(EventKind.HOP))
        calls = dependency.probes_since(switched)
        window = time.monotonic() - switched
        dependency.down = False
        await eventually(
            lambda: sum(dependency.processed.values()) >= N, timeout=60, what="every message"
        )
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_ENDED) != [], what="the mode's end"
        )
        await asyncio.sleep(0.5)  # nothing more comes
        await drained(js, names.prefix)
    # One probe at a time, one per interval (a call already running when the mode began
    # may land just after the switch).
    assert len(calls) <= window / 0.3 + 2, (len(calls), window)
    assert dependency.processed == Counter(sent), "every message processed, each once"
    assert await dead_letters(js, names) == 0
    # The wait spent no attempt: only the calls made before the switch and the probes did.
    assert max(dependency.attempts.values()) < POLICY.max_attempts
    hops = dependency.kinds(EventKind.HOP)
    assert all(e.attempt < POLICY.max_attempts for e in hops)
    # Parked, never nak'd: JetStream delivered each message (original or copy) once.
    assert set(dependency.delivered) == {1}, Counter(dependency.delivered)
    assert dependency.attempts == {b: dependency.failed[b] for b in sent}, "no attempt lost"
    assert parked >= 10, parked


async def test_a_stop_parks_the_held_messages_and_a_restart_processes_them_once(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The broker stops in outage mode: every message waiting at the gate is parked at once
    (a hop each, the stop not held up by them), and the next start processes each message
    once. The consumer's ack_wait is 4 s, so the messages the client had buffered but not
    handled come back quickly after the stop (they are FastStream's, outage mode or not)."""
    dependency: Dependency[str] = Dependency()
    broker = app(nats_url, names, dependency, ack_wait=4)  # outage_hold 5 min, capped at 2 s
    async with running(broker):
        sent = await publish(js, names)
        await eventually(
            lambda: dependency.kinds(EventKind.OUTAGE_STARTED) != [], what="outage mode"
        )
        switched = time.monotonic()
        # Two probes: the other workers have taken their messages and wait at the gate.
        await eventually(
            lambda: len(dependency.probes_since(switched)) >= 2,
            timeout=20,
            what="two probes",
        )
        hops_before = len(dependency.kinds(EventKind.HOP))
        started = time.monotonic()
    stopped_in = time.monotonic() - started
    parked_by_stop = len(dependency.kinds(EventKind.HOP)) - hops_before
    assert stopped_in < 5, stopped_in
    assert parked_by_stop >= 5, parked_by_stop
    assert dependency.kinds(EventKind.OUTAGE_ENDED) != [], "the stop ends the mode"
    assert await stream_count(js, f"{names.prefix}-delay") >= parked_by_stop

    dependency.down = False
    again = app(nats_url, names, dependency, ack_wait=4)
    async with running(again):
        await eventually(
            lambda: sum(dependency.processed.values()) >= N, timeout=60, what="every message"
        )
        await asyncio.sleep(0.5)
        await drained(js, names.prefix)
    assert dependency.processed == Counter(sent)
    assert await dead_letters(js, names) == 0


async def test_probes_rarer_than_the_hold_ack_wait_allows_are_warned_of(
    nats_url: str, names: Names, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer's ack_wait of 1 s holds a message at most 0.5 s: with a probe every 0.6 s
    each held message would be parked before a probe comes, and the start says so."""
    dependency: Dependency[str] = Dependency()
    broker = app(nats_url, names, dependency, ack_wait=1, outage_probe=0.6)
    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        async with running(broker):
            # The plugin starts at the first message (no install()).
            await js.publish(names.subject(), b"first", stream=names.stream())
            await eventually(lambda: dependency.calls_while_down != [], what="the first call")
    assert "less than outage_probe" in caplog.text
