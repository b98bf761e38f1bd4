"""What a NatsBroker's retries tell OpenTelemetry, on a real nats-server: spans that say
``messaging.system = nats`` and the subject each copy went to, and the dead-letter gauge
reading the real count of the subscriber's dead-letter subject."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage

from faststream_retry import Fixed, PermanentError, RetryMiddleware, RetryPolicy
from faststream_retry.reporting.telemetry import ATTR
from tests.nats.helpers import drained, running, stream_count
from tests.observed import Observed
from tests.rabbit import eventually
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

RETRIED = 5
DEAD = 3


async def test_a_retried_and_a_dead_lettered_message_say_nats_and_their_subjects(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Retry spans name the tier's delay subject, releases the ready subject, dead letters
    the dead-letter subject; the gauge reads the dead-letter stream's count of the
    subscriber, and follows it when an operator purges."""
    stream, subject = names.stream(), names.subject()
    prefix, key = names.prefix, f"{stream}.d"
    observed = Observed()
    retry = RetryMiddleware(
        RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
        prefix=prefix,
        tick=timedelta(milliseconds=100),
        max_delay=120,
        **observed.providers(),
    )
    broker = NatsBroker(nats_url, middlewares=[retry], logger=None)
    retry.install(broker)
    done: set[str] = set()

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        if body.startswith("bad"):
            raise PermanentError(f"{body} is bad")
        if "retry-attempt" not in msg.headers:
            raise ConnectionError(f"{body}: link down")
        done.add(body)

    dlq_stream = f"{prefix}-dlq-{stream}"
    async with running(broker):
        for n in range(RETRIED):
            await broker.publish(f"ok-{n}", subject, stream=stream)
        for n in range(DEAD):
            await broker.publish(f"bad-{n}", subject, stream=stream)
        await eventually(lambda: len(done) == RETRIED, what="every retried message handled")

        async def all_dead() -> bool:
            return await stream_count(js, dlq_stream) == DEAD

        await until(all_dead, 20.0, f"{DEAD} dead letters")
        await drained(js, prefix)
        await eventually(
            lambda: observed.dead_letter_gauge().get(key) == DEAD,
            what=f"the gauge at the dead-letter stream's {DEAD}",
        )
        await js.purge_stream(dlq_stream, subject=f"{prefix}.dlq.{key}")
        await eventually(
            lambda: observed.dead_letter_gauge().get(key) == 0, what="the gauge following"
        )
        await js.delete_stream(dlq_stream)  # an operator removed it: no figure, not a false 0
        await eventually(
            lambda: key not in observed.dead_letter_gauge(), what="the gauge dropping the queue"
        )
    scheduled = observed.attributes("retry scheduled")
    assert len(scheduled) == RETRIED
    for attributes in scheduled:
        assert attributes[ATTR.SYSTEM] == "nats"
        tier = attributes[ATTR.TIER_MS]
        assert attributes[ATTR.DESTINATION] == f"{prefix}.delay.{tier}.{key}"
        assert ATTR.ROUTING_KEY not in attributes
    released = observed.attributes("retry release")
    assert len(released) == RETRIED
    for attributes in released:
        assert attributes[ATTR.DESTINATION] == f"{prefix}.ready.{key}"
    dead = observed.attributes("dead-letter")
    assert len(dead) == DEAD
    for attributes in dead:
        assert attributes[ATTR.DESTINATION] == f"{prefix}.dlq.{key}"
        assert attributes[ATTR.QUEUE] == key
    assert observed.systems() == {"nats"}
