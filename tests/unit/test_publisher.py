"""The confirming publisher's own decisions: what counts as confirmed, and header repair.

The channel here stands in for aiormq only as far as the publisher's decisions go (the
encoder's refusal, the broker's answer); confirms, returns and routing are tested
against a real RabbitMQ in tests/integration.
"""

from __future__ import annotations

import asyncio
import decimal
import logging
from typing import Any

import pytest
from aiormq.exceptions import ChannelInvalidStateError, ChannelNotFoundEntity, DeliveryError
from pamqp import commands
from pamqp.encode import field_table as encode_table
from pamqp.header import ContentHeader

from faststream_retry.core import headers as h
from faststream_retry.rabbit.publisher import Outcome, Publisher
from faststream_retry.reporting.log import Throttle


class Channel:
    """Marshals the headers with the installed pamqp, as aiormq does, then answers."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.sent: list[dict[str, Any]] = []

    async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
        headers = dict(kwargs["properties"].headers or {})
        encode_table(headers)  # raises what pamqp raises: TypeError on 4, struct.error on 3
        self.sent.append(headers)
        return self.answer


def publisher(channel: Channel) -> Publisher:
    async def get() -> Any:
        return channel

    return Publisher(get, timeout_s=1)


async def publish(p: Publisher, headers: dict[str, Any]) -> Outcome:
    properties = commands.Basic.Properties(headers=headers, message_id="m-1")
    return await p.publish(exchange="", routing_key="q", body=b"x", properties=properties)


async def test_a_header_the_encoder_refuses_is_left_out_and_the_copy_goes() -> None:
    """Whatever the encoder raises, the copy is sent without that one header.

    A decimal beyond 32 bits decodes fine but cannot be encoded again; pamqp 3 says so
    with a struct.error, which once made the plugin requeue the message for ever.
    """
    channel = Channel(commands.Basic.Ack())
    odd = decimal.Decimal("123456789012.5")
    outcome = await publish(publisher(channel), {"keep": 1, "odd": odd, "retry-attempt": 2})
    assert outcome is Outcome.CONFIRMED
    assert channel.sent == [{"keep": 1, "retry-attempt": 2}]


async def test_only_an_ack_is_a_confirm() -> None:
    """A nack is a refusal (the queue will not take it now); a return is a failure."""
    assert await publish(publisher(Channel(commands.Basic.Ack())), {}) is Outcome.CONFIRMED
    assert await publish(publisher(Channel(commands.Basic.Nack())), {}) is Outcome.REFUSED
    assert await publish(publisher(Channel(object())), {}) is Outcome.FAILED


async def test_a_nack_raised_by_aiormq_is_a_refusal() -> None:
    """aiormq raises DeliveryError for a nack; any other channel error is a failure."""

    class Raising(Channel):
        async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
            raise self.answer  # type: ignore[misc]

    nack = DeliveryError(None, commands.Basic.Nack())
    assert await publish(publisher(Raising(nack)), {}) is Outcome.REFUSED
    closed = ChannelInvalidStateError("closed")
    assert await publish(publisher(Raising(closed)), {}) is Outcome.FAILED


async def test_failures_are_logged_without_the_message_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A returned or nacked copy is logged by id and reason; its body never reaches the log."""

    class Returned:
        delivery = commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE")
        body = b"secret payload"

    class Raising(Channel):
        async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
            raise self.answer  # type: ignore[misc]

    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        assert await publish(publisher(Channel(Returned())), {}) is Outcome.FAILED
        nack = DeliveryError(Returned(), commands.Basic.Nack())  # type: ignore[arg-type]
        assert await publish(publisher(Raising(nack)), {}) is Outcome.REFUSED
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "publish of message m-1 to ''/'q' was returned by the broker: 312 NO_ROUTE",
        "publish of message m-1 to ''/'q' not confirmed: DeliveryError (Nack)",
    ]


class Script(Channel):
    """Answers each publish with the next answer; an exception instance is raised."""

    def __init__(self, *answers: object) -> None:
        super().__init__(None)
        self.answers = list(answers)

    async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
        self.sent.append(dict(kwargs["properties"].headers or {}))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Returned:
    """What aiormq gives back for a returned mandatory publish."""

    def __init__(self, code: int) -> None:
        self.delivery = commands.Basic.Return(reply_code=code, reply_text="x")


class Repairs:
    """A repair callback that records its calls and answers ``done``."""

    def __init__(self, *, done: bool = True, error: Exception | None = None) -> None:
        self.done = done
        self.error = error
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, exchange: str, routing_key: str) -> bool:
        self.calls.append((exchange, routing_key))
        if self.error is not None:
            raise self.error
        return self.done


def repairing(channel: Channel, repair: Repairs, interval_s: float = 60) -> Publisher:
    async def get() -> Any:
        return channel

    return Publisher(get, timeout_s=1, repair=repair, repair_interval_s=interval_s)


NOT_FOUND = ChannelNotFoundEntity("NOT_FOUND - no exchange 'p.delay.100' in vhost '/'")


@pytest.mark.parametrize("missing", [Returned(312), NOT_FOUND], ids=["no-route", "not-found"])
async def test_a_missing_destination_is_repaired_and_published_again(missing: object) -> None:
    """A 312 return or a 404 asks for a repair, then the copy goes once more."""
    channel = Script(missing, commands.Basic.Ack())
    repair = Repairs()
    p = repairing(channel, repair)
    assert await publish(p, {}) is Outcome.CONFIRMED
    assert repair.calls == [("", "q")]
    assert len(channel.sent) == 2
    assert p.repairs == 1


@pytest.mark.parametrize(
    "answer",
    [Returned(313), commands.Basic.Nack(), ChannelInvalidStateError("closed")],
    ids=["other-return", "nack", "closed"],
)
async def test_other_failures_are_not_repaired(answer: object) -> None:
    """Only a missing destination is redeclared; everything else fails as it did."""
    repair = Repairs()
    outcome = await publish(repairing(Script(answer), repair), {})
    assert outcome in {Outcome.FAILED, Outcome.REFUSED}
    assert repair.calls == []


async def test_the_second_try_is_the_last() -> None:
    """Still missing after a repair: failed, no second repair, no third publish."""
    channel = Script(Returned(312), Returned(312))
    repair = Repairs()
    assert await publish(repairing(channel, repair), {}) is Outcome.FAILED
    assert len(repair.calls) == 1
    assert len(channel.sent) == 2


@pytest.mark.parametrize(
    "repair", [Repairs(done=False), Repairs(error=RuntimeError("refused"))], ids=["no", "raises"]
)
async def test_a_repair_that_did_nothing_means_no_second_publish(repair: Repairs) -> None:
    """Not the plugin's own destination (a work queue), or the redeclaration failed."""
    channel = Script(Returned(312))
    p = repairing(channel, repair)
    assert await publish(p, {}) is Outcome.FAILED
    assert len(channel.sent) == 1
    assert p.repairs == 0


async def test_repairs_are_rate_limited() -> None:
    """Within the interval a missing destination fails without a redeclaration."""
    channel = Script(Returned(312), Returned(312), Returned(312), Returned(312))
    repair = Repairs()
    p = repairing(channel, repair, interval_s=60)
    assert await publish(p, {}) is Outcome.FAILED  # repaired, still missing
    assert await publish(p, {}) is Outcome.FAILED  # too soon: not repaired
    assert len(repair.calls) == 1
    assert len(channel.sent) == 3


async def test_after_the_interval_a_repair_runs_again() -> None:
    """The limit is a pause, not a ban."""
    channel = Script(Returned(312), Returned(312), Returned(312), commands.Basic.Ack())
    repair = Repairs(done=False)
    p = repairing(channel, repair, interval_s=0)
    assert await publish(p, {}) is Outcome.FAILED
    repair.done = True
    assert await publish(p, {}) is Outcome.FAILED  # repaired; the second try failed
    assert len(repair.calls) == 2


async def test_a_repair_made_meanwhile_covers_a_publish_in_flight() -> None:
    """A copy returned after another copy's repair is published again, without a repair."""
    gate = asyncio.Event()

    class Slow(Script):
        async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
            if kwargs["properties"].message_id == "slow" and not self.sent:
                self.sent.append({})
                await gate.wait()
                return Returned(312)
            return await super().basic_publish(body, **kwargs)

    channel = Slow(Returned(312), commands.Basic.Ack(), commands.Basic.Ack())
    repair = Repairs()
    p = repairing(channel, repair, interval_s=60)
    slow = asyncio.create_task(
        p.publish(
            exchange="",
            routing_key="q",
            body=b"",
            properties=commands.Basic.Properties(message_id="slow"),
        )
    )
    await asyncio.sleep(0)
    assert await publish(p, {}) is Outcome.CONFIRMED  # returned, repaired, sent again
    gate.set()
    assert await slow is Outcome.CONFIRMED
    assert len(repair.calls) == 1
    assert p.repairs == 1


def test_a_destination_that_keeps_failing_gets_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lines of one key within the interval are held; the next line counts them; keys apart."""
    now = [100.0]
    quiet = Throttle(10.0, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, "faststream_retry")
    for n in range(5):
        quiet.log(logging.WARNING, ("", "q", "refused"), "refused %s", n)
    quiet.log(logging.ERROR, ("", "q", "returned"), "returned %s", 0)
    quiet.log(logging.WARNING, ("", "other", "refused"), "refused elsewhere %s", 0)
    now[0] = 109.9
    quiet.log(logging.WARNING, ("", "q", "refused"), "refused %s", 5)
    now[0] = 110.0
    quiet.log(logging.WARNING, ("", "q", "refused"), "refused %s", 6)
    quiet.log(logging.WARNING, ("", "q", "refused"), "refused %s", 7)
    now[0] = 120.0
    quiet.log(logging.WARNING, ("", "q", "refused"), "refused %s", 8)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "refused 0"),
        (logging.ERROR, "returned 0"),
        (logging.WARNING, "refused elsewhere 0"),
        (logging.WARNING, "refused 6 (and 5 more like it in the last 10 s)"),
        (logging.WARNING, "refused 8 (and 1 more like it in the last 10 s)"),
    ]


class Tuned(Channel):
    """A channel on a connection that agreed on ``frame_max``, as aiormq's say."""

    def __init__(self, frame_max: int) -> None:
        super().__init__(commands.Basic.Ack())
        tune = type("Tune", (), {"frame_max": frame_max})()
        self.connection = type("Connection", (), {"connection_tune": tune})()
        self.properties: list[commands.Basic.Properties] = []

    async def basic_publish(self, body: bytes, **kwargs: Any) -> object:
        self.properties.append(kwargs["properties"])
        return await super().basic_publish(body, **kwargs)


def size(properties: commands.Basic.Properties) -> int:
    return len(ContentHeader(0, 1, properties).marshal())


FRAME_MAX = 4096
LIMIT = FRAME_MAX - 8

STORY: dict[str, Any] = {
    h.ATTEMPT: 2,
    h.REASON: "exhausted",
    h.ERROR: "e" * 1000,
    h.TRACEBACK: "t" * 2000,
    h.HISTORY: [{"attempt": 1, "error": "e" * 150}],
}


async def publish_sized(channel: Tuned, headers: dict[str, Any], *, room: bool = False) -> Outcome:
    properties = commands.Basic.Properties(headers=headers, message_id="m-1")
    p = publisher(channel)
    return await p.publish(
        exchange="", routing_key="q", body=b"x", properties=properties, room=room
    )


async def test_a_copy_that_fits_goes_as_built() -> None:
    channel = Tuned(FRAME_MAX)
    assert await publish_sized(channel, {**STORY, "own": "o" * 500}) is Outcome.CONFIRMED
    assert channel.sent == [{**STORY, "own": "o" * 500}]


async def test_a_copy_too_large_for_the_frame_goes_lean(caplog: pytest.LogCaptureFixture) -> None:
    """Without its traceback and history, the error cut: same destination, one line."""
    channel = Tuned(FRAME_MAX)
    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        outcome = await publish_sized(channel, {**STORY, "own": "o" * 1500})
    assert outcome is Outcome.CONFIRMED
    assert channel.sent == [
        {h.ATTEMPT: 2, h.REASON: "exhausted", h.ERROR: "e" * 197 + "...", "own": "o" * 1500}
    ]
    assert size(channel.properties[0]) <= LIMIT
    full = size(commands.Basic.Properties(headers={**STORY, "own": "o" * 1500}, message_id="m-1"))
    line = (
        f"message m-1: its copy to ''/'q' would take {full} bytes of a frame that holds "
        f"{LIMIT}: sent without retry-history, retry-traceback"
    )
    assert [r.getMessage() for r in caplog.records] == [line]


async def test_a_retry_copy_whose_own_headers_leave_no_room_is_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing reaches the broker: a copy never closes the connection; the caller decides."""
    channel = Tuned(FRAME_MAX)
    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        outcome = await publish_sized(channel, {h.ATTEMPT: 1, "own": "o" * LIMIT})
    assert outcome is Outcome.TOO_LARGE
    assert channel.sent == []
    assert "its own headers leave no room: not published" in caplog.records[-1].getMessage()


async def test_a_dead_letter_whose_own_headers_leave_no_room_leaves_out_the_largest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = Tuned(FRAME_MAX)
    headers = {**STORY, "own": "o" * 3900, "small": "s"}
    with caplog.at_level(logging.WARNING, logger="faststream_retry"):
        outcome = await publish_sized(channel, headers, room=True)
    assert outcome is Outcome.CONFIRMED
    (sent,) = channel.sent
    assert set(sent) == {h.ATTEMPT, h.REASON, h.ERROR, "small"}
    assert sent[h.ERROR].startswith(f"Left out to fit in a frame ({LIMIT:,} bytes): 'own' (")
    assert size(channel.properties[0]) <= LIMIT
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(
            f"message m-1: its own headers leave no room in a frame of {LIMIT} bytes: its copy "
            "to ''/'q' leaves out 'own' ("
        )
    )


async def test_an_unencodable_header_is_left_out_before_the_copy_is_measured() -> None:
    """Near the limit the exact measure encodes: a value pamqp refuses goes first, as ever."""
    channel = Tuned(FRAME_MAX)
    odd = decimal.Decimal("123456789012.5")
    outcome = await publish_sized(channel, {**STORY, "odd": odd, "own": "o" * 1500})
    assert outcome is Outcome.CONFIRMED
    assert "odd" not in channel.sent[0]
    assert h.TRACEBACK not in channel.sent[0]


async def test_a_connection_with_no_frame_limit_takes_any_copy() -> None:
    channel = Tuned(0)
    assert await publish_sized(channel, {"own": "o" * 200_000}) is Outcome.CONFIRMED
