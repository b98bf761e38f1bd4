"""``RetryMiddleware(dlq_max_length=...)`` on a real nats-server: the dead-letter stream is
made with that ``max_msgs`` (discarding the oldest), keeps exactly the newest letters, and a
stream made earlier with another cap takes the one the app now asks for."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker
from nats.js.api import DiscardPolicy

from faststream_retry import PermanentError, RetryMiddleware
from faststream_retry.nats.dead_letters import dead_letter_config
from tests.nats.helpers import running, stream_messages
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

SENT = 12
CAP = 5


async def test_the_dead_letter_stream_keeps_the_newest_up_to_the_cap(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """An uncapped dead-letter stream there already (an earlier version's): the app's
    cap is applied to it; 12 letters, cap 5: the last 5 are kept, in order."""
    stream, subject = names.stream(), names.subject()
    prefix = names.prefix
    dlq_stream = f"{prefix}-dlq-{stream}"
    await js.add_stream(dead_letter_config(prefix, stream))  # no cap
    retry = RetryMiddleware(prefix=prefix, max_delay=120, dlq_max_length=CAP)
    broker = NatsBroker(nats_url, middlewares=[retry])
    retry.install(broker)
    seen: list[str] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        seen.append(body)
        raise PermanentError(f"{body} is bad")

    async with running(broker):
        config = (await js.stream_info(dlq_stream)).config
        assert (config.max_msgs, config.discard) == (CAP, DiscardPolicy.OLD)
        for n in range(SENT):
            await broker.publish(f"bad-{n:02d}", subject, stream=stream)

        async def last_dead() -> bool:
            letters = await stream_messages(js, dlq_stream)
            return bool(letters) and letters[-1][1] == f"bad-{SENT - 1:02d}".encode()

        await until(last_dead, 20.0, "the last dead letter")
    kept = [body.decode() for _, body, _ in await stream_messages(js, dlq_stream)]
    assert kept == [f"bad-{n:02d}" for n in range(SENT - CAP, SENT)]
    assert len(seen) == SENT


async def test_with_no_cap_the_dead_letter_stream_has_none(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """``dlq_max_length=None``: ``max_msgs`` -1, as the stream was before the option."""
    stream, subject = names.stream(), names.subject()
    retry = RetryMiddleware(prefix=names.prefix, max_delay=120, dlq_max_length=None)
    broker = NatsBroker(nats_url, middlewares=[retry])
    retry.install(broker)

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None: ...

    async with running(broker):
        config = (await js.stream_info(f"{names.prefix}-dlq-{stream}")).config
    assert config.max_msgs == -1


async def test_a_start_never_deletes_dead_letters_past_a_new_cap(
    nats_url: str, names: Names, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """An uncapped stream holding 12 letters (an earlier version's) and a cap of 5: the
    start keeps all 12, leaves the stream uncapped and says why in a WARNING."""
    stream, subject = names.stream(), names.subject()
    prefix = names.prefix
    dlq_stream = f"{prefix}-dlq-{stream}"
    await js.add_stream(dead_letter_config(prefix, stream))  # no cap
    for n in range(SENT):
        await js.publish(f"{prefix}.dlq.{stream}.d", f"old-{n:02d}".encode())
    retry = RetryMiddleware(prefix=prefix, max_delay=120, dlq_max_length=CAP)
    broker = NatsBroker(nats_url, middlewares=[retry])
    retry.install(broker)

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        raise PermanentError(f"{body} is bad")

    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        async with running(broker):
            config = (await js.stream_info(dlq_stream)).config
    assert config.max_msgs == -1
    assert len(await stream_messages(js, dlq_stream)) == SENT
    assert any("never deletes dead letters" in r.getMessage() for r in caplog.records)
