"""An operator deletes a ``.dlq``, a ``.retry`` or a tier while the app runs: declared again.

The copy that finds its destination missing is returned ``312 NO_ROUTE`` (a queue) or
closes the publish channel with ``404 NOT_FOUND`` (an exchange); the plugin declares the
topology again and publishes the copy once more, so the handler is not called again for
it. Messages are counted by id: every one is processed or dead-lettered exactly once.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream.rabbit import RabbitMessage

from faststream_retry import Fixed, PermanentError, RetryPolicy
from faststream_retry.core import headers as h
from faststream_retry.core.events import EventKind
from faststream_retry.core.topology import tier_name
from tests.rabbit import App, drain, eventually, queue_depth, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

N = 5


async def _delete(amqp: AbstractRobustConnection, *, queue: str = "", exchange: str = "") -> None:
    channel = await amqp.channel()
    if queue:
        await channel.queue_delete(queue)
    if exchange:
        await channel.exchange_delete(exchange)
    await channel.close()


async def _exists(amqp: AbstractRobustConnection, queue: str) -> bool:
    try:
        await queue_depth(amqp, queue)
    except Exception:  # a 404 closes the channel: it is missing
        return False
    return True


async def test_a_deleted_dlq_is_declared_again_at_the_first_dead_letter(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A poison message lands in the recreated ``.dlq`` at once: its handler runs once."""
    app: App = make_app()
    queue = unique("dlq-gone")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls[body] += 1
        raise PermanentError(body)

    await app.start()
    await _delete(amqp, queue=f"{queue}.dlq")
    ids = [unique("poison") for _ in range(N)]
    for mid in ids:
        await app.broker.publish(mid, queue=queue, message_id=mid)
    await eventually(
        lambda: sum(e.kind is EventKind.DEAD_LETTERED for e in app.events) == N,
        timeout=20,
        what="every message dead-lettered",
    )
    dead = await drain(amqp, f"{queue}.dlq", expect=N)
    assert sorted(m.message_id or "" for m in dead) == sorted(ids)
    assert all(m.headers.get(h.REASON) == "permanent" for m in dead)
    live = app.retry.runtime(app.broker).live
    assert live is not None
    # The first dead letter declared the topology again; the rest found it there
    # (or rode on that one repair): never one redeclaration per message.
    assert 1 <= live.publisher.repairs <= 2
    await app.stop()
    assert calls == dict.fromkeys(ids, 1)


def _first_delivery_fails(app: App, queue: str) -> tuple[Counter[str], set[str]]:
    """A handler that fails every delivery without a ``retry-attempt``: the originals.

    A copy the plugin released carries the header and succeeds; so does nothing else.
    An original handed back after a failed publish fails again, and the count shows it.
    """
    calls: Counter[str] = Counter()
    processed: set[str] = set()

    @app.broker.subscriber(queue)
    async def handle(body: str, message: RabbitMessage) -> None:
        calls[body] += 1
        if h.ATTEMPT not in message.headers:
            raise ConnectionError("down")
        processed.add(body)

    return calls, processed


async def _send_and_settle(
    app: App,
    amqp: AbstractRobustConnection,
    queue: str,
    calls: Counter[str],
    processed: set[str],
    *,
    one_by_one: bool = False,
) -> None:
    ids = [unique("m") for _ in range(N)]
    for mid in ids:
        await app.broker.publish(mid, queue=queue, message_id=mid)
        if one_by_one:
            await eventually(
                lambda mid=mid: mid in processed,  # type: ignore[misc]
                timeout=30,
                what=f"{mid} processed",
            )
    await eventually(lambda: processed == set(ids), timeout=30, what="every message processed")
    await app.stop()
    # One failed call and one successful call per message: no copy was lost on the
    # way and no original was handed back to run again.
    assert calls == dict.fromkeys(ids, 2)
    assert await app.waiting(amqp, queue) == 0
    assert await queue_depth(amqp, f"{queue}.dlq") == 0


async def test_a_deleted_retry_queue_is_declared_again_before_the_copy_needs_it(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The copy waits its tier, reaches the recreated ``.retry`` and is released once.

    The delay outlasts noticing the deletion: aiormq 6 (Python 3.10's stack) does not
    report a cancelled consumer, and the plugin looks for one once a second.
    """
    app: App = make_app(default=RetryPolicy(backoff=Fixed(2.5)))
    queue = unique("retry-gone")
    calls, processed = _first_delivery_fails(app, queue)
    await app.start()
    await _delete(amqp, queue=f"{queue}.retry")
    await _send_and_settle(app, amqp, queue, calls, processed)


async def test_a_deleted_tier_queue_is_declared_again(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Its exchange is left with no binding: the copy is returned, then sent again."""
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("tierq-gone")
    calls, processed = _first_delivery_fails(app, queue)
    await app.start()
    tier = tier_name(app.prefix, 100)
    await _delete(amqp, queue=tier)
    await _send_and_settle(app, amqp, queue, calls, processed)
    assert await _exists(amqp, tier)


async def test_a_deleted_tier_exchange_is_declared_again(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A publish to it closes the publish channel (404); the copy still goes at once.

    One message at a time: with several publishes in flight on the channel the broker
    closes, aiormq can write one after its ``Channel.CloseOk``, and RabbitMQ then
    closes the whole connection (504 CHANNEL_ERROR). Nothing is lost then either (the
    unacked originals are redelivered), but a handler runs again: not what this pins.
    """
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("tierx-gone")
    calls, processed = _first_delivery_fails(app, queue)
    await app.start()
    await _delete(amqp, exchange=tier_name(app.prefix, 100))
    await _send_and_settle(app, amqp, queue, calls, processed, one_by_one=True)
