"""The documentation's examples that need RabbitMQ itself, run on a real broker."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry import load_worker_config
from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name
from tests.integration.test_cli_dlq import declare, delete, ids_in, seed
from tests.rabbit import consumers, eventually, eventually_async, queue_depth, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "docs"


async def test_the_dead_letter_consumer_alerts_then_acks_on_a_real_broker(
    amqp: AbstractRobustConnection, rabbit_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON order that fails for good reaches the alert as bytes, and leaves orders.dlq empty."""
    monkeypatch.setenv("RABBITMQ_URL", rabbit_url)
    example = importlib.reload(importlib.import_module("examples.docs.dead_letters"))
    alerts: list[tuple[bytes, str]] = []

    async def alert_on_call(body: bytes, reason: str, error: str) -> None:
        alerts.append((body, reason))

    monkeypatch.setattr(example, "alert_on_call", alert_on_call)
    await example.broker.start()
    try:
        await example.broker.publish({"id": 7}, queue="orders")
        await eventually(lambda: bool(alerts), timeout=15, what="the alert")
    finally:
        await example.broker.stop()
    try:
        assert alerts == [(b'{"id":7}', "permanent")]
        # Acked once alerted: had it stayed unacked, stopping would have put it back.
        assert await queue_depth(amqp, "orders.dlq") == 0
    finally:
        await delete(amqp, "orders", "orders.dlq", "orders.retry")


async def test_the_replay_example_replays_only_the_exhausted(
    amqp: AbstractRobustConnection, rabbit_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.docs.replay import replay_exhausted  # noqa: PLC0415

    queue = unique("docs-replay")
    await declare(amqp, queue, "classic")
    await declare(amqp, f"{queue}.dlq", "quorum")
    try:
        await seed(
            amqp,
            queue,
            [
                ("e1", "exhausted", b'{"id": 1}', "application/json"),
                ("p1", "permanent", b'{"id": 2}', "application/json"),
                ("e2", "exhausted", b'{"id": 3}', "application/json"),
            ],
        )
        assert await replay_exhausted(rabbit_url, queue) == 2
        assert await ids_in(amqp, queue) == ["e1", "e2"]
        assert await ids_in(amqp, f"{queue}.dlq") == ["p1"]
        printed = capsys.readouterr().out.splitlines()
        assert [line.split()[:3] for line in printed] == [
            ["e1", "exhausted", "3"],
            ["p1", "permanent", "3"],
            ["e2", "exhausted", "3"],
        ]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_the_worker_example_runs_the_example_config(
    amqp: AbstractRobustConnection, rabbit_url: str, tmp_path: Path
) -> None:
    """run_worker with retry.toml (under a prefix of its own) consumes its intake until cancelled."""
    from examples.docs.worker import run_worker  # noqa: PLC0415

    prefix = unique("docs")
    config = tmp_path / "retry.toml"
    config.write_text(
        (EXAMPLES / "retry.toml").read_text().replace('prefix = "retry"', f'prefix = "{prefix}"')
    )
    task = asyncio.create_task(run_worker(rabbit_url, config))
    try:
        intake = f"{prefix}.intake"

        async def consumed() -> bool:
            try:
                return await consumers(amqp, intake, timeout=1) == 1
            except ChannelNotFoundEntity:  # not declared yet
                return False

        await eventually_async(consumed, timeout=20, what=f"a consumer on {intake}")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ttls = load_worker_config(config).tiers.ttls_ms
        channel = await amqp.channel()
        for name in [intake_name(prefix), intake_dlq_name(prefix), registry_name(prefix)] + [
            f"{prefix}.delay.{ttl}" for ttl in ttls
        ]:
            await channel.queue_delete(name)
        for name in [intake_name(prefix)] + [f"{prefix}.delay.{ttl}" for ttl in ttls]:
            await channel.exchange_delete(name)
        await channel.close()
