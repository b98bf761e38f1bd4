"""Before the first worker runs: ``worker --declare`` and ``worker --doctor`` on a real broker.

Until the worker's intake exists, RabbitMQ drops without a word whatever a work queue
dead-letters into it. ``--declare`` makes it exist before any consumer rejects;
``--doctor`` finds a covered queue whose dead letters lead nowhere. Both run as the real
console script, as an operator or a deploy step runs them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry.core import headers as h
from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name
from faststream_retry.core.worker_config import load_worker_config
from faststream_retry.worker.worker import RetryWorker
from tests.cli import run_cli
from tests.rabbit import drain, eventually_async, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


class Names:
    """One test's prefix, its covered queues, and the config naming them."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = unique("ws")
        self.orders = unique("orders")
        self.no_dlx = unique("nodlx")
        self.typo = unique("typo")
        self.absent = unique("absent")
        self.config = tmp_path / "retry.toml"
        self.config.write_text(
            f'prefix = "{self.prefix}"\n'
            'tick = "250ms"\n'
            'max_delay = "2s"\n'
            "[defaults]\n"
            'backoff = { kind = "fixed", delay = "500ms" }\n'
            + "".join(
                f'[[queues]]\nname = "{q}"\n'
                for q in (self.orders, self.no_dlx, self.typo, self.absent)
            ),
            encoding="utf-8",
        )

    @property
    def intake(self) -> str:
        return intake_name(self.prefix)

    async def cleanup(self, connection: AbstractRobustConnection) -> None:
        channel = await connection.channel()
        tiers = [
            f"{self.prefix}.delay.{ttl}" for ttl in load_worker_config(self.config).tiers.ttls_ms
        ]
        queues = [self.intake, intake_dlq_name(self.prefix), registry_name(self.prefix), *tiers]
        for queue in (self.orders, self.no_dlx, self.typo, self.absent):
            queues += [queue, f"{queue}.retry", f"{queue}.dlq"]
        for name in queues:
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        for name in [self.intake, *tiers]:
            with contextlib.suppress(Exception):
                await channel.exchange_delete(name)
        with contextlib.suppress(Exception):
            await channel.close()


@pytest.fixture
async def names(tmp_path: Path, amqp: AbstractRobustConnection) -> AsyncIterator[Names]:
    made = Names(tmp_path)
    try:
        yield made
    finally:
        await made.cleanup(amqp)


async def exists(connection: AbstractRobustConnection, kind: str, name: str) -> bool:
    channel = await connection.channel()
    try:
        if kind == "exchange":
            await channel.declare_exchange(name, passive=True)
        else:
            await channel.declare_queue(name, passive=True)
    except ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def test_a_rejection_before_any_worker_ran_waits_in_the_intake_once_declared(
    rabbit_url: str, amqp: AbstractRobustConnection, names: Names
) -> None:
    """``--declare`` first: a message rejected before any worker ran is retried once one runs.

    The command declares the intake and exits 0; a consumer's queue dead-letters into it
    and rejects a message with no worker running: the message waits in the intake
    (not dropped). A worker started later sends it back to its queue, ``retry-attempt``
    1, once; nothing else stays anywhere.
    """
    declared = await run_cli("worker", "--config", str(names.config), "--declare", url=rabbit_url)
    assert declared.status == 0, declared.stderr
    assert f"declared {names.intake} (exchange and queue)" in declared.stdout
    assert await exists(amqp, "exchange", names.intake)

    channel = await amqp.channel()
    queue = await channel.declare_queue(
        names.orders, durable=True, arguments={"x-dead-letter-exchange": names.intake}
    )
    message_id = unique("early")
    await channel.default_exchange.publish(
        aio_pika.Message(b"{}", message_id=message_id), routing_key=names.orders
    )
    delivered = await queue.get(timeout=10)
    assert delivered is not None
    await delivered.reject(requeue=False)  # no worker has ever run

    async def waiting() -> bool:
        return await queue_depth(amqp, names.intake) == 1

    await eventually_async(waiting, what="the rejected message in the intake")

    async with RetryWorker(load_worker_config(names.config), url=rabbit_url):
        (back,) = await drain(amqp, names.orders, expect=1, timeout=30)
    assert back.message_id == message_id
    assert (back.headers or {})[h.ATTEMPT] == 1
    for empty in (names.intake, intake_dlq_name(names.prefix), f"{names.orders}.dlq"):
        assert await queue_depth(amqp, empty) == 0, empty


async def test_doctor_finds_each_covered_queue_whose_dead_letters_lead_nowhere(
    rabbit_url: str, amqp: AbstractRobustConnection, names: Names
) -> None:
    """``--doctor`` names every covered queue whose rejections are dropped, and changes nothing.

    Before any worker ran: the missing intake, and a queue that dead-letters into it, need
    action (exit 1); a queue dead-lettering into an exchange that does not exist needs
    action; one without the argument is a warning (a policy may give it one); a missing
    one is a warning. Nothing was created by looking, and every queue keeps its arguments
    (a quorum queue with several among them). After ``--declare``, the queue that
    dead-letters into the intake is ok and the misspelled one still needs action.
    """
    channel = await amqp.channel()
    await channel.declare_queue(
        names.orders,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-message-ttl": 60_000,
            "x-delivery-limit": 5,
            "x-dead-letter-exchange": names.intake,
        },
    )
    await channel.declare_queue(names.no_dlx, durable=True)
    typo_arguments: dict[str, Any] = {
        "x-max-length": 100,
        "x-dead-letter-exchange": f"{names.intake}x",
    }
    # auto_delete: the look learns the flags too (RabbitMQ 4.3 refuses transient queues).
    await channel.declare_queue(
        names.typo, durable=True, auto_delete=True, arguments=typo_arguments
    )

    def findings(result: Any) -> dict[str, set[tuple[str, str]]]:
        found: dict[str, set[tuple[str, str]]] = {}
        for f in result.json()["findings"]:
            found.setdefault(f["subject"], set()).add((f["severity"], f["check"]))
        return found

    before = await run_cli(
        "worker", "--config", str(names.config), "--doctor", "--json", url=rabbit_url
    )
    assert before.status == 1, before.stderr
    seen = findings(before)
    assert ("action", "intake") in seen[names.intake]
    assert seen[names.orders] == {("action", "dead-lettering")}
    assert seen[names.typo] == {("action", "dead-lettering")}
    assert seen[names.no_dlx] == {("warning", "dead-lettering")}
    assert seen[names.absent] == {("warning", "dead-lettering")}
    typo = next(f for f in before.json()["findings"] if f["subject"] == names.typo)
    assert f"'{names.intake}x'" in typo["what"]
    assert "does not exist" in typo["why"]

    # Looking changed nothing: no intake, no work queue made, the arguments as they were.
    assert not await exists(amqp, "exchange", names.intake)
    assert not await exists(amqp, "queue", names.intake)
    assert not await exists(amqp, "queue", names.absent)
    probe = await amqp.channel()
    # A no-op: the same arguments and flags (a 406 otherwise).
    await probe.declare_queue(names.typo, durable=True, auto_delete=True, arguments=typo_arguments)
    await probe.close()

    declared = await run_cli("worker", "--config", str(names.config), "--declare", url=rabbit_url)
    assert declared.status == 0, declared.stderr
    after = await run_cli(
        "worker", "--config", str(names.config), "--doctor", "--json", url=rabbit_url
    )
    assert after.status == 1, after.stderr
    seen = findings(after)
    assert seen[names.orders] == {("ok", "dead-lettering")}
    assert seen[names.typo] == {("action", "dead-lettering")}
    assert ("warning", "consumers") in seen[names.intake]  # declared, but no worker yet
    text = await run_cli("worker", "--config", str(names.config), "--doctor", url=rabbit_url)
    assert f"'{names.orders}' dead-letters into '{names.intake}'" in text.stdout
