"""Test mode for every test that asks for it, through a fixture."""

from collections.abc import Iterator

import pytest
from faststream.rabbit import TestRabbitBroker

from examples.docs.service import broker, retry
from faststream_retry import RetryRecorder


@pytest.fixture
def retries() -> Iterator[RetryRecorder]:
    with retry.testing() as recorder:
        yield recorder


@pytest.mark.asyncio
async def test_bad_address_goes_to_the_dlq(retries: RetryRecorder) -> None:
    async with TestRabbitBroker(broker) as br:
        await br.publish({"to": "nope", "text": "hi"}, queue="email-queue")
    assert [e.reason for e in retries.dead_letters] == ["permanent"]
