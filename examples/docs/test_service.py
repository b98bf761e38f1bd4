"""Tests of the quickstart's handlers: TestRabbitBroker, no RabbitMQ."""

# --8<-- [start:untouched]
from smtplib import SMTPException

import pytest
from faststream.rabbit import TestRabbitBroker

from examples.docs import service
from examples.docs.service import InvalidAddress, broker, retry


@pytest.mark.asyncio
async def test_bad_address_raises() -> None:
    # Written before the plugin, and unchanged by it: outside retry.testing()
    # the handler runs once and its exception comes out of publish().
    async with TestRabbitBroker(broker) as br:
        with pytest.raises(InvalidAddress):
            await br.publish({"to": "nope", "text": "hi"}, queue="email-queue")


# --8<-- [end:untouched]


# --8<-- [start:retried]
@pytest.mark.asyncio
async def test_smtp_outage_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [
        SMTPException("connection refused"),
        SMTPException("connection refused"),
    ]

    async def deliver(to: str, text: str) -> None:
        if failures:
            raise failures.pop()

    # The SMTP server is down twice.
    monkeypatch.setattr(service, "deliver", deliver)
    async with TestRabbitBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish(
                {"to": "ada@example.com", "text": "hi"}, queue="email-queue"
            )
    assert [e.delay_ms for e in recorder.scheduled] == [1000, 2000]
    assert recorder.dead_letters == []


@pytest.mark.asyncio
async def test_bad_address_is_dead_lettered() -> None:
    async with TestRabbitBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish({"to": "nope", "text": "hi"}, queue="email-queue")
    assert recorder.dead_letters[0].reason == "permanent"


# --8<-- [end:retried]


# --8<-- [start:raises]
@pytest.mark.asyncio
async def test_bad_address_is_dead_lettered_and_raises() -> None:
    async with TestRabbitBroker(broker) as br:
        with (
            retry.testing(raise_on_dead_letter=True) as recorder,
            pytest.raises(InvalidAddress),
        ):
            await br.publish({"to": "nope", "text": "hi"}, queue="email-queue")
    assert recorder.dead_letters[0].attempt == 1


# --8<-- [end:raises]
