"""Messages whose headers come near RabbitMQ's frame limit, on a real broker.

A frame carries a message's properties and headers whole, and a publish whose header
frame is larger than the connection's ``frame_max`` makes RabbitMQ close the whole
connection (``501 FRAME_ERROR``): every delivery in flight on it goes back to its queue.
Any client can publish a message whose headers alone come close to that limit; a copy of
it with the plugin's headers added must never be that publish. These tests pin that such
a message ends where the docs say, within seconds, that the ordinary failing messages
beside it are handled exactly as their policy says, and that nothing is redelivered.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from faststream.rabbit import RabbitMessage
from pamqp import commands
from pamqp.header import ContentHeader

from faststream_retry import Fixed, HeadersTooLarge, retry_policy
from faststream_retry.fit import payload_limit
from tests.rabbit import App, drain, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

ORDINARY = 50
BODY = b'{"big": true}'


async def frame_payload_limit(connection: AbstractRobustConnection) -> int:
    """Return what a header frame may carry on the test broker (frame_max less 8 bytes)."""
    channel = await connection.channel()
    try:
        underlay = await channel.get_underlay_channel()
        limit = payload_limit(underlay.connection.connection_tune.frame_max)
    finally:
        await channel.close()
    assert limit is not None
    return limit


def big_message(limit: int, room: int, message_id: str) -> aio_pika.Message:
    """A message whose header frame leaves ``room`` bytes below ``limit``.

    Its one big header, ``big``, is what takes the frame; ``keep`` is a small header of
    its own that must survive whatever happens to ``big``.
    """

    def properties(big: str) -> commands.Basic.Properties:
        return commands.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_id=message_id,
            headers={"keep": "me", "big": big},
        )

    base = len(ContentHeader(0, len(BODY), properties("")).marshal())
    big = "b" * (limit - room - base)
    assert len(ContentHeader(0, len(BODY), properties(big)).marshal()) == limit - room
    return aio_pika.Message(
        BODY,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
        headers={"keep": "me", "big": big},
    )


async def run_with_big_message(
    make_app: Any, amqp: AbstractRobustConnection, room: int
) -> tuple[App, str, Counter[str], list[bool], list[aio_pika.abc.AbstractIncomingMessage]]:
    """One big message, then ``ORDINARY`` small ones, every call failing; 3 attempts each.

    Returns the app, the queue, the calls per message id, the redelivered flag of every
    call, and every dead letter.
    """
    app: App = make_app()
    queue = unique("frame")
    calls: Counter[str] = Counter()
    redelivered: list[bool] = []

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.1), transient=(ConnectionError,))
    async def handle(body: Any, message: RabbitMessage) -> None:
        calls[message.message_id] += 1
        redelivered.append(bool(message.raw_message.redelivered))
        raise ConnectionError("the database is down")

    await app.start()
    limit = await frame_payload_limit(amqp)
    channel = await amqp.channel(publisher_confirms=True)
    await channel.default_exchange.publish(big_message(limit, room, "big"), routing_key=queue)
    for n in range(ORDINARY):
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"n": %d}' % n, message_id=f"small-{n}"), routing_key=queue
        )
    await channel.close()
    dead = await drain(amqp, f"{queue}.dlq", expect=ORDINARY + 1, timeout=30)
    return app, queue, calls, redelivered, dead


async def test_a_message_near_the_frame_limit_is_retried_with_lean_copies(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The issue's message: 1,300 bytes of room, less than a dead letter's full headers.

    It gets its three attempts like the others, and its dead letter leaves out the
    traceback and the history (the reason, attempts and exception stay; its own headers
    and body are untouched). The 50 ordinary messages beside it are each handled three
    times and dead-lettered once, and no call ever sees a redelivery: the connection was
    never closed under them.
    """
    app, queue, calls, redelivered, dead = await run_with_big_message(make_app, amqp, room=1300)
    expected = {"big", *(f"small-{n}" for n in range(ORDINARY))}
    assert Counter(m.message_id for m in dead) == dict.fromkeys(expected, 1)
    assert calls == dict.fromkeys(expected, 3)
    assert not any(redelivered)
    (big,) = [m for m in dead if m.message_id == "big"]
    headers = headers_of(big)
    assert (headers["retry-reason"], headers["retry-attempt"]) == ("exhausted", 3)
    assert headers["retry-exception"] == "ConnectionError"
    assert "retry-traceback" not in headers
    assert "retry-history" not in headers
    assert headers["keep"] == "me"
    assert big.body == BODY
    small = headers_of(next(m for m in dead if m.message_id == "small-0"))
    assert "ConnectionError: the database is down" in str(small["retry-traceback"])
    assert len(small["retry-history"]) == 3
    assert app.retry.runtime(app.broker).live.channels.generation == 1  # type: ignore[union-attr]
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0


async def test_a_message_whose_headers_leave_no_room_is_dead_lettered_as_invalid(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """40 bytes of room: not even a lean retry copy fits.

    At its first failure it goes to the DLQ as ``invalid``, ``HeadersTooLarge``, with its
    big header left out and named in ``retry-error``, its small header and its body as
    they were. The ordinary messages are handled exactly as without it.
    """
    app, queue, calls, redelivered, dead = await run_with_big_message(make_app, amqp, room=40)
    smalls = {f"small-{n}" for n in range(ORDINARY)}
    assert Counter(m.message_id for m in dead) == dict.fromkeys({"big", *smalls}, 1)
    assert calls == {"big": 1, **dict.fromkeys(smalls, 3)}
    assert not any(redelivered)
    (big,) = [m for m in dead if m.message_id == "big"]
    headers = headers_of(big)
    assert (headers["retry-reason"], headers["retry-attempt"]) == ("invalid", 1)
    assert headers["retry-exception"] == f"faststream_retry.{HeadersTooLarge.__name__}"
    error = str(headers["retry-error"])
    limit = await frame_payload_limit(amqp)
    assert error.startswith(f"Left out to fit in a frame ({limit:,} bytes): 'big' (")
    assert "it had failed with ConnectionError: the database is down" in error
    assert "big" not in headers
    assert headers["keep"] == "me"
    assert headers["retry-origin-queue"] == queue
    assert big.body == BODY
    assert app.retry.runtime(app.broker).live.channels.generation == 1  # type: ignore[union-attr]
    assert await queue_depth(amqp, queue) == 0
    assert await app.waiting(amqp, queue) == 0
