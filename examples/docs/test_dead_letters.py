"""In test mode the dead letter reaches the app's .dlq subscriber."""

import pytest
from faststream.rabbit import TestRabbitBroker

from examples.docs import dead_letters
from examples.docs.dead_letters import broker, retry


@pytest.mark.asyncio
async def test_a_dead_letter_reaches_the_alert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alerts = []

    async def alert_on_call(body: bytes, reason: str, error: str) -> None:
        alerts.append((body, reason, error))

    monkeypatch.setattr(dead_letters, "alert_on_call", alert_on_call)
    async with TestRabbitBroker(broker) as br:
        with retry.testing():
            await br.publish({"id": 7}, queue="orders")
    assert alerts == [(b'{"id":7}', "permanent", "order 7 names no customer")]
