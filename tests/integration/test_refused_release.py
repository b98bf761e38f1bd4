"""A work queue that refuses its messages for a while: waiting retries keep waiting, none is
dead-lettered for it (the quorum ``.retry`` queue's delivery limit is not spent)."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.core.events import EventKind
from tests.rabbit import App, drain, eventually, queue_depth, run_ctl, script_broker_ctl, unique

if TYPE_CHECKING:
    from collections.abc import Callable

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


def policies(rabbit_url: str) -> Callable[..., object]:
    """Return a runner of the script's rabbitmqctl (to set policies), or skip the test."""
    script_ctl = script_broker_ctl(rabbit_url)
    if script_ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to set a policy")

    return functools.partial(run_ctl, script_ctl)


async def test_a_refused_release_waits_another_tick_instead_of_spending_the_limit(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Releases nacked by the work queue (full, or its leader moving) for longer than
    delivery_limit re-checks: the message keeps coming back, then is delivered once."""
    ctl = policies(rabbit_url)
    app: App = make_app(
        queue_type="quorum", delivery_limit=2, default=RetryPolicy(backoff=Fixed(0.3))
    )
    queue = unique("refusing")
    calls: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)

    def refused_releases() -> int:
        # A release the queue refused goes round the base tier once more, already due.
        return sum(
            e.kind is EventKind.HOP and e.due_ms is not None and e.due_ms <= e.at_ms
            for e in app.events
        )

    await app.start()
    # From now on the work queue nacks every publish, as a full or leaderless one does.
    policy = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    ctl("set_policy", queue, f"^{queue}$", policy, "--apply-to", "queues")
    # A copy back in .retry from a tier that was not its last, already due: the
    # re-check consumer releases it (a wait of one tier never passes .retry).
    channel = await amqp.channel()
    due: dict[str, Any] = {h.ATTEMPT: 1, h.DUE: h.now_ms() - 1}
    await channel.default_exchange.publish(
        aio_pika.Message(b'"m"', headers=due, message_id="m-1", delivery_mode=2),
        routing_key=f"{queue}.retry",
    )
    await channel.close()
    try:
        await eventually(lambda: refused_releases() >= 5, what="5 refused releases")
    finally:
        ctl("clear_policy", queue)
    await eventually(lambda: len(calls) == 1, what="the release once the queue takes it")
    assert calls == ["m"]
    assert await drain(amqp, f"{queue}.dlq", expect=0) == []
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
async def test_a_copy_the_tiers_refuse_is_placed_again_without_running_the_handler_again(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Tiers that refuse every copy (full by a policy): the message is held and its copy
    placed again after each pause, and then dead-lettered as stuck. The handler runs once
    per message: a handler with side effects is not run again because a copy could not be
    placed (it ran 13 times a message before, each refusal a requeue). Classic tiers: a
    quorum queue enforces max-length 0 only roughly, and took some copies here."""
    ctl = policies(rabbit_url)
    app: App = make_app(
        queue_type="classic",
        delivery_limit=4,
        publish_failure_pause=0.05,
        default=RetryPolicy(max_attempts=3, backoff=Fixed(0.3)),
    )
    queue = unique("held")
    calls: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)
        raise ConnectionError(body)

    tiers = f"^{app.prefix}\\.delay\\."
    policy = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    ctl("set_policy", app.prefix, tiers, policy, "--apply-to", "queues")
    try:
        await app.start()
        sent = [f"m{i}" for i in range(5)]
        channel = await amqp.channel(publisher_confirms=True)
        for body in sent:
            await channel.default_exchange.publish(
                aio_pika.Message(json.dumps(body).encode(), message_id=body), routing_key=queue
            )
        await channel.close()
        dead = await drain(amqp, f"{queue}.dlq", expect=len(sent), timeout=60)
    finally:
        ctl("clear_policy", app.prefix)
    assert sorted(m.message_id or "" for m in dead) == sent
    assert {dict(m.headers or {})[h.REASON] for m in dead} == {"stuck"}
    assert sorted(calls) == sent  # once each
