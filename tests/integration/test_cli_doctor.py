"""``faststream-retry doctor`` on a real RabbitMQ: the startup checks as a report, changing nothing.

The app the command loads is a module written into the test's own folder, configured
like the tests' ``App`` (same prefix, tick and ``max_delay``), so the plan doctor checks
is the one a running ``App`` declared.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry.core.topology import (
    Route,
    TopologyOptions,
    registry_name,
    route_specs,
    tier_name,
)
from faststream_retry.rabbit.probe import refuses_transient_queues
from tests.cli import run_cli
from tests.rabbit import App, consumers, script_broker_ctl, series_of, unique

if TYPE_CHECKING:
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

APP = """
from faststream import FastStream
from faststream.rabbit import RabbitBroker
from faststream_retry import RetryMiddleware

retry = RetryMiddleware(prefix={prefix!r}, tick=0.1, max_delay=60)
broker = RabbitBroker({url!r}, middlewares=[retry], logger=None)
retry.install(broker)
app = FastStream(broker)


@broker.subscriber({queue!r})
async def handle(body: str) -> None:
    pass
"""


def write_app(folder: Path, url: str, prefix: str, queue: str, *, declared: str = "") -> str:
    """Write the app module doctor loads; return its ``module:attribute``.

    ``declared``: the subscriber's queue as Python source (``RabbitQueue(...)``), else its name.
    """
    text = APP.format(url=url, prefix=prefix, queue=queue)
    if declared:
        text = "from faststream.rabbit import RabbitQueue\n" + text.replace(
            f"@broker.subscriber({queue!r})", f"@broker.subscriber({declared})"
        )
    (folder / "doctored.py").write_text(text)
    return "doctored:app"


async def exists(amqp: AbstractRobustConnection, name: str, kind: str = "queue") -> bool:
    channel = await amqp.channel()
    try:
        if kind == "queue":
            await channel.declare_queue(name, passive=True)
        else:
            await channel.get_exchange(name, ensure=True)
    except ChannelNotFoundEntity:
        return False
    with contextlib.suppress(Exception):
        await channel.close()
    return True


async def publish(amqp: AbstractRobustConnection, queue: str, n: int) -> None:
    channel = await amqp.channel()
    for i in range(n):
        await channel.default_exchange.publish(
            aio_pika.Message(f"{i}".encode(), message_id=f"{queue}-{i}"), routing_key=queue
        )
    await channel.close()


def by_check(report: dict[str, Any], check: str) -> list[dict[str, str]]:
    return [f for f in report["findings"] if f["check"] == check]


async def test_doctor_names_a_mismatch_a_missing_consumer_a_stranded_retry_and_an_old_tier(
    rabbit_url: str, amqp: AbstractRobustConnection, make_app: Any, tmp_path: Path
) -> None:
    """Each finding names the object, why it matters and the fix; exit status 1."""
    prefix, queue, gone = unique("doc"), unique("orders"), unique("renamed")
    # An earlier app covered `gone`: its registry record and .retry stay behind.
    earlier: App = make_app(prefix=prefix)

    @earlier.broker.subscriber(gone)
    async def handle(body: str) -> None:
        pass

    await earlier.start()
    await earlier.stop()
    await publish(amqp, f"{gone}.retry", 3)
    # The .dlq exists as classic queues were; the app wants quorum.
    channel = await amqp.channel()
    await channel.declare_queue(f"{queue}.dlq", durable=True, arguments={"x-queue-type": "classic"})
    # The .retry has what the app declares, messages, and no consumer: the app is down.
    retry_args = dict(route_specs(Route(queue, ()), TopologyOptions(prefix, 60_000))[0].arguments)
    await channel.declare_queue(f"{queue}.retry", durable=True, arguments=retry_args)
    await publish(amqp, f"{queue}.retry", 2)
    # A tier of an earlier tick (250 ms) still holds a message.
    old_tier = tier_name(prefix, 250)
    await channel.declare_queue(old_tier, durable=True)
    await publish(amqp, old_tier, 1)
    # A migration of the .dlq was killed: one message waits in its temporary queue.
    await channel.declare_queue(f"{queue}.dlq.migrating", durable=True)
    await publish(amqp, f"{queue}.dlq.migrating", 1)
    spec = write_app(tmp_path, rabbit_url, prefix, queue)

    result = await run_cli("doctor", spec, "--json", url=rabbit_url, cwd=tmp_path)

    assert result.status == 1, result.stderr
    report = result.json()
    assert report["status"] == "action"
    assert report["prefix"] == prefix
    assert report["queue_type"] == "quorum"
    assert report["server_version"]
    assert set(report["counts"]) == {"ok", "warning", "action"}
    for finding in report["findings"]:
        assert set(finding) == {"severity", "check", "subject", "what", "why", "fix"}
    (mismatch,) = by_check(report, "arguments")
    assert mismatch["severity"] == "action"
    assert mismatch["subject"] == f"{queue}.dlq"
    assert "argument 'x-queue-type' is 'classic' on the broker" in mismatch["what"]
    assert "the app declares 'quorum'" in mismatch["what"]
    assert (
        f"faststream-retry migrate {queue}.dlq --queue-type quorum --prefix {prefix}"
        in mismatch["fix"]
    )
    waiting = [f for f in by_check(report, "consumers") if f["subject"] == f"{queue}.retry"]
    assert [f["severity"] for f in waiting] == ["action"]
    assert "2 message(s) wait" in waiting[0]["what"]
    (stranded,) = by_check(report, "stranded")
    assert stranded["subject"] == f"{gone}.retry"
    assert "3 message(s) wait" in stranded["what"]
    (cut,) = by_check(report, "migration")
    assert (cut["subject"], cut["severity"]) == (f"{queue}.dlq", "action")
    assert "1 message(s) wait in" in cut["what"]
    assert f"faststream-retry migrate {queue}.dlq --queue-type quorum" in cut["fix"]
    (old,) = by_check(report, "old-tier")
    assert (old["subject"], old["severity"]) == (old_tier, "warning")

    text = await run_cli("doctor", spec, url=rabbit_url, cwd=tmp_path)
    assert text.status == 1
    assert f"faststream-retry migrate {queue}.dlq --queue-type quorum" in text.stdout
    assert "need action" in text.stdout

    for name in (f"{queue}.dlq", f"{queue}.dlq.migrating", f"{queue}.retry", old_tier):
        await channel.queue_delete(name)
    await channel.close()


async def test_doctor_passes_a_running_app(
    rabbit_url: str, amqp: AbstractRobustConnection, make_app: Any, tmp_path: Path
) -> None:
    """The app runs with the topology it planned: every finding is ok, exit status 0."""
    app: App = make_app()
    queue = unique("healthy")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        pass

    await app.start()
    assert await consumers(amqp, f"{queue}.retry") == 1
    spec = write_app(tmp_path, rabbit_url, app.prefix, queue)

    result = await run_cli("doctor", spec, "--json", url=rabbit_url, cwd=tmp_path)

    assert result.status == 0, result.stdout + result.stderr
    report = result.json()
    assert report["status"] == "ok", report
    assert {f["check"] for f in report["findings"]} >= {"version", "arguments", "consumers"}


async def test_doctor_warns_of_a_work_queue_rabbitmq_4_deprecates(
    rabbit_url: str, amqp: AbstractRobustConnection, tmp_path: Path
) -> None:
    """A work queue declared transient and not exclusive: a broker restart deletes it with
    its messages, and RabbitMQ 4.x deprecates it. A warning names it, with the fix; on a
    broker that refuses such queues (the suite's 4.3 does), the app cannot start: an action.
    """
    prefix, queue = unique("doc-transient"), unique("orders")
    declared = f"RabbitQueue({queue!r}, durable=False)"
    spec = write_app(tmp_path, rabbit_url, prefix, queue, declared=declared)
    refused = await refuses_transient_queues(rabbit_url)
    assert refused is not None
    if series_of(amqp) >= (4, 3) and script_broker_ctl(rabbit_url) is not None:
        assert refused  # scripts/rabbitmq/start.sh denies them on 4.3

    result = await run_cli("doctor", spec, "--json", url=rabbit_url, cwd=tmp_path)

    assert result.status == (1 if refused else 0), result.stderr
    (found,) = by_check(result.json(), "rabbitmq-4")
    assert (found["severity"], found["subject"]) == ("action" if refused else "warning", queue)
    assert "declared transient (durable=False) and not exclusive" in found["what"]
    assert "transient_nonexcl_queues" in found["why"]
    assert f"RabbitQueue({queue!r}, durable=True)" in found["fix"]


async def test_doctor_creates_nothing(
    rabbit_url: str, amqp: AbstractRobustConnection, tmp_path: Path
) -> None:
    """On a broker the app never ran on, every planned object is reported missing and is
    still missing afterwards: no queue, exchange, binding or registry is created."""
    prefix, queue = unique("doc-none"), unique("never")
    spec = write_app(tmp_path, rabbit_url, prefix, queue)

    result = await run_cli("doctor", spec, "--json", url=rabbit_url, cwd=tmp_path)

    assert result.status == 0, result.stderr  # warnings only: nothing is wrong yet
    report = result.json()
    assert report["status"] == "warning"
    (missing,) = by_check(report, "missing")
    assert f"{queue}.retry" in missing["subject"]
    assert tier_name(prefix, 100) in missing["subject"]
    for name in (f"{queue}.retry", f"{queue}.dlq", queue, registry_name(prefix)):
        assert not await exists(amqp, name), name
    assert not await exists(amqp, tier_name(prefix, 100))
    assert not await exists(amqp, tier_name(prefix, 100), kind="exchange")


async def test_doctor_without_a_broker_is_an_error(tmp_path: Path) -> None:
    """Exit status 2 when the broker cannot be reached: no report, the reason."""
    spec = write_app(tmp_path, "amqp://guest:guest@127.0.0.1:1/", unique("p"), "q")
    result = await run_cli("doctor", spec, url="amqp://guest:guest@127.0.0.1:1/", cwd=tmp_path)
    assert result.status == 3
    assert "cannot connect" in result.stderr
