"""The last tier delivers straight to the work queue, on a real RabbitMQ.

A wait that is one tier on the tick grid enters that tier addressed to the work queue:
the broker dead-letters it home when the TTL expires, with no re-check hop. A longer wait
passes ``<queue>.retry`` until its last tier. Never early either way, on classic and
quorum tiers, into classic and quorum work queues.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from faststream.rabbit import QueueType, RabbitMessage, RabbitQueue

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core.events import EventKind
from faststream_retry.core.topology import tier_name
from tests.rabbit import (
    App,
    drain,
    eventually,
    on_time,
    queue_depth,
    run_ctl,
    script_broker_ctl,
    unique,
)

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

N = 20


class Calls:
    """Each message's handler calls: when, and the queue its delivery last expired out of."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.expired_from: dict[str, list[Any]] = {}

    def record(self, msg: RabbitMessage) -> int:
        mid = msg.message_id or ""
        self.times.setdefault(mid, []).append(time.time())
        deaths = msg.headers.get("x-death") or [{}]
        self.expired_from.setdefault(mid, []).append(
            (deaths[0].get("queue"), deaths[0].get("reason"))
        )
        return len(self.times[mid])

    def gaps_ms(self) -> list[float]:
        return [(t[1] - t[0]) * 1000 for t in self.times.values()]


@pytest.mark.parametrize("tiers", ["quorum", "classic"])
@pytest.mark.parametrize("work_queue", ["classic", "quorum"])
async def test_a_wait_of_one_tier_comes_home_from_it_never_early(
    make_app: Any, amqp: AbstractRobustConnection, tiers: str, work_queue: str
) -> None:
    """Fixed(0.5 s) on a 0.5 s tick: each copy expires out of the tier into its queue.

    No re-check hop, no message through ``.retry``; the release is reported as the copy
    arrives, with its lateness. Quorum tiers dead-letter at least once, into a classic
    work queue too.
    """
    app: App = make_app(tick=0.5, queue_type=tiers, default=RetryPolicy(backoff=Fixed(0.5)))
    queue = unique("home")
    calls = Calls()

    home = (
        RabbitQueue(queue, queue_type=QueueType.QUORUM, durable=True)
        if work_queue == "quorum"
        else RabbitQueue(queue, durable=True)
    )

    @app.broker.subscriber(home)
    async def handle(body: str, msg: RabbitMessage) -> None:
        if calls.record(msg) == 1:
            raise ConnectionError("down")

    await app.start()
    for i in range(N):
        await app.broker.publish("x", queue=queue, message_id=f"m{i}")
    await eventually(
        lambda: sum(len(t) for t in calls.times.values()) == 2 * N, what="2 calls each"
    )
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == N, what="N releases"
    )
    tier = tier_name(app.prefix, 500)
    assert all(seen[1] == (tier, "expired") for seen in calls.expired_from.values())
    assert all(gap >= 500 for gap in calls.gaps_ms()), calls.gaps_ms()
    released = [e for e in app.events if e.kind is EventKind.RELEASED]
    assert all(e.lateness_ms is not None and on_time(e.lateness_ms, 500) for e in released)
    assert not [e for e in app.events if e.kind is EventKind.HOP]
    await app.stop()
    assert await app.waiting(amqp, queue) == 0
    assert await queue_depth(amqp, queue) == 0
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []


@pytest.mark.parametrize("tiers", ["quorum", "classic"])
async def test_a_longer_wait_passes_the_re_check_until_its_last_tier(
    make_app: Any, tiers: str
) -> None:
    """300 ms on a 100 ms tick: 200 ms, one re-check hop, then home from the 100 ms tier."""
    app: App = make_app(queue_type=tiers, default=RetryPolicy(backoff=Fixed(0.3)))
    queue = unique("longer")
    calls = Calls()

    @app.broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        if calls.record(msg) == 1:
            raise ConnectionError("down")

    await app.start()
    for i in range(N):
        await app.broker.publish("x", queue=queue, message_id=f"m{i}")
    await eventually(
        lambda: sum(len(t) for t in calls.times.values()) == 2 * N, what="2 calls each"
    )
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == N, what="N releases"
    )
    assert all(gap >= 300 for gap in calls.gaps_ms()), calls.gaps_ms()
    hops = [e for e in app.events if e.kind is EventKind.HOP]
    # One hop each, into the last tier; under load a copy may reach .retry already due
    # and be released from there instead (a release, no hop).
    assert len(hops) <= N
    assert all(e.delay_ms == 100 for e in hops)
    last = tier_name(app.prefix, 100)
    came_home = [seen[1] for seen in calls.expired_from.values()]
    assert sum(seen == (last, "expired") for seen in came_home) == len(hops)


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
async def test_a_refused_copy_never_acks_the_original(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The tier nacks the copy (at its length limit): the original is held, not acked.

    Confirms pipeline, but a delivery is acked only on its own copy's ``Basic.Ack``:
    every refused copy leaves its original unacked, held while its copy is placed again
    after each pause (never redelivered, its handler not run again), and nothing is
    reported scheduled. Once the tier takes copies again, each message is retried and
    processed exactly once more.
    """
    script_ctl = script_broker_ctl(rabbit_url)
    if script_ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to set a policy")
    ctl = functools.partial(run_ctl, script_ctl)

    # Classic tiers: a quorum queue takes a publish while it is under its limit, so
    # max-length 0 would not refuse every copy.
    app: App = make_app(queue_type="classic", default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("refused-copy")
    calls = Calls()
    redelivered: set[str] = set()
    refusing = True

    @app.broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        if msg.raw_message.redelivered:
            redelivered.add(msg.message_id or "")
        calls.record(msg)
        if refusing or msg.headers.get("retry-attempt") is None:
            raise ConnectionError("down")

    await app.start()
    tier = tier_name(app.prefix, 100)
    policy = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    ctl("set_policy", tier, f"^{tier}$", policy, "--apply-to", "queues")
    try:
        for i in range(5):
            await app.broker.publish("x", queue=queue, message_id=f"m{i}")
        await eventually(lambda: len(calls.times) == 5, what="every message handled")
        # Three pauses (publish_failure_pause 0.2 s): requeued, each would have run again.
        await asyncio.sleep(0.6)
        assert redelivered == set()
        assert {mid: len(times) for mid, times in calls.times.items()} == {
            f"m{i}": 1 for i in range(5)
        }
        assert not [e for e in app.events if e.kind is EventKind.SCHEDULED]
        assert await app.waiting(amqp, queue) == 0
    finally:
        ctl("clear_policy", tier)
    refusing = False
    await eventually(
        lambda: all(seen[-1] == (tier, "expired") for seen in calls.expired_from.values()),
        what="each message retried once the tier takes copies",
    )
    await app.stop()
    assert sorted(calls.times) == [f"m{i}" for i in range(5)]
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
async def test_a_retry_copy_never_confirmed_ends_a_classic_queues_loop_as_stuck(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A classic work queue counts no redeliveries, so the broker never ends the loop of a
    message whose retry copy its tier refuses every time: the plugin holds the message,
    places its copy again and, after ``delivery_limit`` tries, dead-letters it (``stuck``).
    Each message is called once and reaches the DLQ once; nothing is left."""
    script_ctl = script_broker_ctl(rabbit_url)
    if script_ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to set a policy")
    app: App = make_app(
        queue_type="classic",
        delivery_limit=2,
        publish_failure_pause=0.1,
        default=RetryPolicy(backoff=Fixed(0.1)),
    )
    queue = unique("refused-loop")
    calls = Calls()

    @app.broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        calls.record(msg)
        raise ConnectionError(body)

    await app.start()
    tier = tier_name(app.prefix, 100)
    policy = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    run_ctl(script_ctl, "set_policy", tier, f"^{tier}$", policy, "--apply-to", "queues")
    ids = [f"m{i}" for i in range(5)]
    try:
        for message_id in ids:
            await app.broker.publish("x", queue=queue, message_id=message_id)
        dead = await drain(amqp, f"{queue}.dlq", expect=len(ids), timeout=30)
    finally:
        run_ctl(script_ctl, "clear_policy", tier, check=False)
    await app.stop()
    assert sorted(m.message_id or "" for m in dead) == ids
    for message in dead:
        got = dict(message.headers or {})
        assert (got["retry-reason"], got["retry-exception"]) == (
            "stuck",
            "faststream_retry.CopyNotConfirmed",
        )
        assert str(got["retry-error"]).endswith(
            "was not confirmed (refused) and it was placed again 2 times while the message "
            "was held, its handler not run again (each counts as a requeue: 2 of the "
            "delivery limit of 2)"
        )
    assert {mid: len(times) for mid, times in calls.times.items()} == dict.fromkeys(ids, 1)
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0


@pytest.mark.parametrize("delay", [0.1, 0.3], ids=["one-tier", "through-retry"])
async def test_a_cc_header_never_brings_a_retry_copy_to_another_queue(
    make_app: Any, amqp: AbstractRobustConnection, delay: float
) -> None:
    """Published with CC naming a second queue: that queue gets the original only.

    RabbitMQ routes a message by its CC header at every publish and every
    dead-lettering; a copy that kept it reached the second queue again on each.
    """
    app: App = make_app(default=RetryPolicy(backoff=Fixed(delay)))
    queue, victim = unique("cc"), unique("cc-victim")
    calls = Calls()
    seen_by_victim: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        if calls.record(msg) == 1:
            raise ConnectionError("down")

    @app.broker.subscriber(victim)
    async def bystander(body: str, msg: RabbitMessage) -> None:
        seen_by_victim.append(msg.message_id or "")

    await app.start()
    channel = await amqp.channel()
    await channel.default_exchange.publish(
        aio_pika.Message(b'"x"', message_id="c-1", headers={"CC": [victim]}, delivery_mode=2),
        routing_key=queue,
    )
    await eventually(lambda: len(calls.times.get("c-1", [])) == 2, what="the retried call")
    await eventually(
        lambda: any(e.kind is EventKind.RELEASED for e in app.events), what="the release"
    )
    await app.stop()
    await channel.close()
    assert seen_by_victim == ["c-1"]
    assert await queue_depth(amqp, victim) == 0


async def test_a_queue_that_refuses_when_full_gets_its_copies_from_the_re_check(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """x-overflow reject-publish: the last tier sends copies to .retry, and the re-check releases.

    Dead-lettered straight into such a queue while it is full, a copy would sit in the
    shared quorum tier's dead-letter backlog, and hold up every other queue's copies in
    that tier, for minutes. A release by the re-check consumer is confirmed by the queue,
    and waits in a tier again if refused.
    """
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("bounded")
    calls = Calls()
    bounded = RabbitQueue(
        queue, durable=True, arguments={"x-max-length": 1000, "x-overflow": "reject-publish"}
    )

    @app.broker.subscriber(bounded)
    async def handle(body: str, msg: RabbitMessage) -> None:
        if calls.record(msg) == 1:
            raise ConnectionError("down")

    await app.start()
    for i in range(5):
        await app.broker.publish("x", queue=queue, message_id=f"m{i}")
    await eventually(lambda: sum(len(t) for t in calls.times.values()) == 10, what="2 calls each")
    await eventually(
        lambda: sum(e.kind is EventKind.RELEASED for e in app.events) == 5, what="5 releases"
    )
    await app.stop()
    # Released by the re-check consumer: republished, so no x-death of a tier.
    assert all(seen[1] == (None, None) for seen in calls.expired_from.values())
    assert all(gap >= 100 for gap in calls.gaps_ms())
    assert await app.waiting(amqp, queue) == 0
