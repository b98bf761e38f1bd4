"""A dead letter's log line and hook name the subject it is on, on a real nats-server.

Not RabbitMQ's ``<key>.dlq``, which is nowhere on NATS: the subscriber's dead-letter
subject, in its stream's dead-letter stream, where the letter is found by that name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage

from faststream_retry import EventKind, PermanentError, RetryEvent, RetryMiddleware
from tests.dead_letter_lines import dead_letter_lines
from tests.nats.helpers import running, stream_messages
from tests.rabbit import eventually

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

DEAD = 4


async def test_the_dead_letter_line_names_the_subject_that_holds_the_letter(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Each line's place is the hook event's ``dlq``; the stream that takes that subject
    holds the letter there, with the message's body: by id, one each."""
    stream, subject = names.stream(), names.subject()
    prefix = names.prefix
    events: list[RetryEvent] = []
    retry = RetryMiddleware(prefix=prefix, max_delay=120, hooks=[events.append])
    broker = NatsBroker(nats_url, middlewares=[retry])
    retry.install(broker)
    bodies: dict[str, str] = {}

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        bodies[msg.message_id] = body
        raise PermanentError(f"{body} is bad")

    with dead_letter_lines() as lines:
        async with running(broker):
            for n in range(DEAD):
                await broker.publish(f"bad-{n}", subject, stream=stream)
            await eventually(lambda: len(lines.places) == DEAD, what=f"{DEAD} dead-letter lines")
    assert set(lines.places) == set(bodies)
    for message_id, place in lines.places.items():
        assert place == f"{prefix}.dlq.{stream}.d", lines.lines
        held = await js.find_stream_name_by_subject(place)
        letters = [
            body.decode()
            for on, body, headers in await stream_messages(js, held)
            if on == place and headers.get("retry-reason") == "permanent"
        ]
        assert letters.count(bodies[message_id]) == 1, (place, letters)
    assert not any(f"{stream}.d.dlq" in line for line in lines.lines)
    dead = {e.message_id: e.dlq for e in events if e.kind is EventKind.DEAD_LETTERED}
    assert dead == lines.places, lines.lines
