"""The confirming publisher's own decisions: what counts as confirmed, and header repair.

The channel here stands in for aiormq only as far as the publisher's decisions go (the
encoder's refusal, the broker's answer); confirms, returns and routing are tested
against a real RabbitMQ in tests/integration.
"""

from __future__ import annotations

import decimal
import logging
from typing import Any

import pytest
from aiormq.exceptions import ChannelInvalidStateError, DeliveryError
from pamqp import commands
from pamqp.encode import field_table as encode_table

from faststream_retry.amqp.publisher import Outcome, Publisher


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
