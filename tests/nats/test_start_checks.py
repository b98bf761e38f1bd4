"""The start checks on a real nats-server: a consumer or a stream that would fight the plan is
found at start, with one error or one warning that names the fix.

FastStream binds to a durable consumer that exists as it is, whatever the code declares, so
these consumers are made by hand first, as an operator or an earlier version of the app
would have left them; the plugin's streams likewise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.errors import NotFoundError

from faststream_retry import RetryConfigError
from tests.nats.helpers import make_delay_stream, running
from tests.nats.test_retries import FAST, middleware

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's WARNING lines, without their ``faststream-retry: `` prefix."""
    return [
        r.getMessage().removeprefix("faststream-retry: ")
        for r in caplog.records
        if r.name == "faststream_retry" and r.levelno == logging.WARNING
    ]


def app(
    nats_url: str, names: Names, stream: str, subject: str, config: ConsumerConfig | None = None
) -> NatsBroker:
    """One covered pull subscriber, durable ``d``, its consumer declared with ``config``."""
    broker = middleware(names).install(NatsBroker(nats_url, logger=None))

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject]),
        durable="d",
        pull_sub=PullSub(),
        config=config,
    )
    async def handle(body: str) -> None: ...

    return broker


async def test_an_app_as_faststream_makes_it_starts_with_no_finding(
    nats_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """The defaults (ack_wait 30 s, no max_deliver, the plugin's own streams): no warning."""
    stream, subject = names.stream(), names.subject()
    caplog.set_level(logging.WARNING, logger="faststream_retry")
    async with running(app(nats_url, names, stream, subject)):
        pass
    assert warnings_of(caplog) == []


async def test_an_existing_consumer_is_checked_as_the_server_holds_it(
    nats_url: str, names: Names, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """The durable exists with max_deliver=3 and ack_wait 2 s (the code declares neither):
    FastStream binds to it as it is, so the start warns of each once, naming the consumer on
    the server and how to change it there."""
    stream, subject = names.stream(), names.subject()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(
        stream,
        ConsumerConfig(durable_name="d", max_deliver=3, ack_wait=2, filter_subject=subject),
    )
    caplog.set_level(logging.WARNING, logger="faststream_retry")
    async with running(app(nats_url, names, stream, subject)):
        pass
    lines = warnings_of(caplog)
    assert len(lines) == 2, lines
    deliver, wait = sorted(lines, key=lambda line: "max_deliver" not in line)
    assert f"the consumer {stream}/d (of '{stream}.d') on the server has max_deliver=3" in deliver
    assert f"nats consumer edit {stream} d" in deliver
    assert "waits 2 s for an ack" in wait
    assert "publish_timeout (30 s)" in wait


async def test_an_existing_consumer_that_cannot_keep_a_failure_refuses_the_start(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The durable exists with ack_policy none: one RetryConfigError naming the fix, before
    anything is made or consumed (the message waiting in the stream is not delivered)."""
    stream, subject = names.stream(), names.subject()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(
        stream,
        ConsumerConfig(
            durable_name="d",
            ack_policy=AckPolicy.NONE,
            deliver_subject=f"{names.tag}.deliver",
            filter_subject=subject,
        ),
    )
    await js.publish(subject, b"waiting", stream=stream)
    broker = middleware(names).install(NatsBroker(nats_url, logger=None))
    calls: list[str] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str) -> None:
        calls.append(body)

    with pytest.raises(RetryConfigError) as refused:
        await broker.start()
    await broker.stop()
    text = str(refused.value)
    assert f"the consumer {stream}/d (of '{stream}.d') on the server has ack_policy 'none'" in text
    assert f"nats consumer rm {stream} d" in text
    assert text.count("\n- ") == 1
    assert calls == []
    with pytest.raises(NotFoundError):
        await js.stream_info(f"{names.prefix}-delay")
    assert (await js.consumer_info(stream, "d")).num_pending == 1


async def test_a_duplicate_window_shorter_than_a_redelivery_is_warned_of(
    nats_url: str, names: Names, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """The delay stream exists with a 10 s duplicate window (under the re-check's 30 s
    ack_wait), and the consumer waits 3 min for an ack (over the dead-letter stream's
    2 min): each stream is named once, with the window it needs."""
    stream, subject = names.stream(), names.subject()
    await make_delay_stream(js, names.prefix, duplicate_window=10)
    caplog.set_level(logging.WARNING, logger="faststream_retry")
    broker = app(nats_url, names, stream, subject, config=ConsumerConfig(ack_wait=180))
    async with running(broker):
        pass
    lines = sorted(warnings_of(caplog))
    assert len(lines) == 2, lines
    delay, dlq = lines
    assert dlq.startswith(f"the stream '{names.prefix}-dlq-{stream}' drops a repeated")
    assert "above 3 min" in dlq
    assert f"nats stream edit {names.prefix}-dlq-{stream} --dupe-window 360s" in dlq
    assert delay.startswith(f"the stream '{names.prefix}-delay' drops a repeated Nats-Msg-Id")
    assert "within 10 s only" in delay
    assert "above 3 min" in delay
    assert f"nats stream edit {names.prefix}-delay --dupe-window 360s" in delay


async def test_a_dead_letter_stream_too_small_for_a_copy_is_warned_of(
    nats_url: str, names: Names, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    """The dead-letter stream exists with max_msg_size 1 KiB, and the covered stream takes
    up to 64 KiB: one warning naming it and the size a copy needs."""
    stream, subject = names.stream(), names.subject()
    dlq = f"{names.prefix}-dlq-{stream}"
    await js.add_stream(
        StreamConfig(name=dlq, subjects=[f"{names.prefix}.dlq.{stream}.>"], max_msg_size=1024)
    )
    caplog.set_level(logging.WARNING, logger="faststream_retry")
    broker = middleware(names, FAST).install(NatsBroker(nats_url, logger=None))

    @broker.subscriber(
        subject,
        stream=JStream(stream, subjects=[subject], max_msg_size=64 * 1024),
        durable="d",
        pull_sub=PullSub(),
    )
    async def handle(body: str) -> None: ...

    async with running(broker):
        pass
    (line,) = warnings_of(caplog)
    assert line.startswith(f"the stream '{dlq}' takes messages of 1,024 bytes at most")
    assert f"'{stream}' takes messages of up to 65,536 bytes" in line
    assert f"nats stream edit {dlq} --max-msg-size {64 * 1024 + 12 * 1024}" in line
