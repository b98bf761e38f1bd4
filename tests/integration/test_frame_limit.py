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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pamqp import commands
from pamqp.header import ContentHeader

from faststream_retry import Fixed, HeadersTooLarge, retry_policy
from faststream_retry.core.fit import payload_limit
from tests.cli import run_cli
from tests.integration.test_cli_dlq import ids_in, seed
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
    from collections.abc import AsyncIterator
    from pathlib import Path

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


async def test_a_release_that_tracing_would_push_past_the_frame_goes_to_the_dlq(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Published straight into ``.retry`` with 20 bytes of room and no trace context.

    The release would carry the re-check's ``traceparent`` (55 bytes): it cannot fit,
    so instead of the work queue the message goes to the DLQ as invalid, its big header
    left out, and the handler is never called with it. The re-check's channel stays up.
    """
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    app: App = make_app(tracer_provider=provider)
    queue = unique("frame-release")
    calls: Counter[str] = Counter()

    @app.broker.subscriber(queue)
    async def handle(body: Any, message: RabbitMessage) -> None:
        calls[message.message_id] += 1

    await app.start()
    limit = await frame_payload_limit(amqp)
    big = big_message(limit, 20, "big")
    assert big.headers is not None
    big.headers["retry-due"] = 0  # due long ago: released at once
    big.headers["big"] = str(big.headers["big"])[: -len("retry-due") - 10]
    channel = await amqp.channel(publisher_confirms=True)
    await channel.default_exchange.publish(big, routing_key=f"{queue}.retry")
    await channel.default_exchange.publish(
        aio_pika.Message(b"{}", message_id="small", headers={"retry-due": 0}),
        routing_key=f"{queue}.retry",
    )
    await channel.close()
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    await eventually(lambda: calls == {"small": 1}, what="the small one released")
    headers = headers_of(dead)
    assert (dead.message_id, headers["retry-reason"]) == ("big", "invalid")
    assert headers["retry-exception"] == "faststream_retry.HeadersTooLarge"
    assert "big" not in headers
    assert headers["keep"] == "me"
    assert dead.body == BODY
    assert app.retry.runtime(app.broker).live.channels.generation == 1  # type: ignore[union-attr]
    assert await queue_depth(amqp, f"{queue}.retry") == 0


@pytest.fixture(params=["classic", "quorum"])
async def dlq_with_an_oversized_letter(
    request: pytest.FixtureRequest, amqp: AbstractRobustConnection
) -> AsyncIterator[str]:
    """A work queue whose ``.dlq`` holds a, b, big, c; big is past the frame limit.

    RabbitMQ's own dead-lettering put big there (out of a queue whose TTL is 0), and
    the ``x-death`` it added takes its headers past ``frame_max``: it can be read, and
    no client can publish it again as it is. The issue's intake DLQ held such a letter.
    """
    queue = unique("frame-dlq")
    dlq = f"{queue}.dlq"
    bounce = f"{queue}.bounce"
    channel = await amqp.channel(publisher_confirms=True)
    await channel.declare_queue(queue, durable=True)
    await channel.declare_queue(dlq, durable=True, arguments={"x-queue-type": request.param})
    await channel.declare_queue(
        bounce,
        durable=True,
        arguments={
            "x-message-ttl": 0,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    await seed(amqp, queue, [(key, "exhausted", b"{}", None) for key in ("a", "b")])
    limit = await frame_payload_limit(amqp)
    await channel.default_exchange.publish(big_message(limit, 40, "big"), routing_key=bounce)
    await depth_reaches(amqp, dlq, 3, what="big in the DLQ")
    await seed(amqp, queue, [("c", "exhausted", b"{}", None)])
    yield queue
    for name in (queue, dlq, bounce):
        await channel.queue_delete(name)
    await channel.close()


async def test_the_dlq_commands_report_a_dead_letter_no_publish_can_carry_and_go_on(
    amqp: AbstractRobustConnection,
    rabbit_url: str,
    dlq_with_an_oversized_letter: str,
    tmp_path: Path,
) -> None:
    """list, show and export read every letter and name the big one; none breaks.

    replay moves a, b and c and keeps big (exit 1, big named); an import of the export
    publishes a, b and c and skips big's line (exit 1). Nothing is lost or doubled.
    """
    queue = dlq_with_an_oversized_letter
    dlq = f"{queue}.dlq"
    for _ in range(2):  # a second pass finds the same, whatever the first put back
        listed = await run_cli("dlq", "list", queue, "--json", url=rabbit_url)
        assert listed.status == 0, listed.stderr
        assert sorted(r["message_id"] for r in listed.rows()) == ["a", "b", "big", "c"]
        assert "(message id 'big')" in listed.stderr
        assert "a frame holds" in listed.stderr
    shown = await run_cli("dlq", "show", queue, "big", "--json", url=rabbit_url)
    assert shown.status == 0, shown.stderr
    assert set(shown.json()["headers"]) >= {"big", "keep", "x-death"}
    saved = tmp_path / "dead.jsonl"
    exported = await run_cli("dlq", "export", queue, str(saved), url=rabbit_url)
    assert exported.status == 0, exported.stderr
    assert len(saved.read_text().splitlines()) == 4
    assert await queue_depth(amqp, dlq) == 4

    replayed = await run_cli("dlq", "replay", queue, "--json", url=rabbit_url)
    assert replayed.status == 1, replayed.stderr
    report = replayed.json()
    assert report["moved"] == 3
    assert [item["message_id"] for item in report["too_large"]] == ["big"]
    assert "was not replayed" in replayed.stderr
    assert sorted(await ids_in(amqp, queue)) == ["a", "b", "c"]
    assert await ids_in(amqp, dlq) == ["big"]

    imported = await run_cli("dlq", "import", str(saved), "--to", queue, url=rabbit_url)
    assert imported.status == 1, imported.stderr
    assert "imported 3 messages" in imported.stderr
    assert "was not imported" in imported.stderr
    assert sorted(await ids_in(amqp, queue)) == ["a", "b", "c"]
