"""``faststream-retry status``: what waits where, counted on a real broker, changing nothing.

Each test writes a small app into ``tmp_path`` (unique queue names and prefix), starts it
once so the plugin declares its topology and records its queues in the registry, stops
it, then publishes raw messages (confirmed) where they would wait and runs the command
as an operator does.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import textwrap
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from faststream.rabbit import RabbitBroker

from faststream_retry.core import headers
from faststream_retry.middleware.app import LoadedApp
from faststream_retry.ops.app import load_app
from faststream_retry.ops.status_open import WATCH_CONNECTION
from tests.cli import environment, run_cli, script
from tests.rabbit import delete_declared, queue_depth, run_ctl, script_broker_ctl, unique
from tests.unit.test_management import Recorder, server  # noqa: F401 - a fixture

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

APP = """
from faststream.rabbit import RabbitBroker

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy, retry_policy

retry = RetryMiddleware(
    RetryPolicy(max_attempts=3, backoff=Fixed(1)), prefix="{prefix}", tick=0.1, max_delay=60
)
broker = RabbitBroker("{url}", middlewares=[retry], logger=None)
retry.install(broker)


@broker.subscriber("{orders}")
async def take_order(body: str) -> None: ...


@broker.subscriber("{emails}")
async def send_email(body: str) -> None: ...


@broker.subscriber("{audit}")
@retry_policy(enabled=False)
async def audit(body: str) -> None: ...
"""

TTLS = [100 * 2**k for k in range(10)]  # tick 100 ms, up to 60 s


class Started:
    """An app module written to ``tmp_path``, started once and stopped: its topology exists."""

    def __init__(self, folder: Path, loaded: LoadedApp, names: dict[str, str]) -> None:
        self.folder = folder
        self.loaded = loaded
        self.module = names["module"]
        self.prefix = names["prefix"]
        self.orders = names["orders"]
        self.emails = names["emails"]
        self.audit = names["audit"]


@pytest.fixture
async def started(
    tmp_path: Path, rabbit_url: str, amqp: AbstractRobustConnection
) -> AsyncIterator[Started]:
    names = {
        "module": unique("status_app").replace("-", "_"),
        "prefix": unique("st"),
        "orders": unique("orders"),
        "emails": unique("emails"),
        "audit": unique("audit"),
    }
    source = textwrap.dedent(APP).format(url=rabbit_url, **names)
    (tmp_path / f"{names['module']}.py").write_text(source)
    loaded = load_app(f"{names['module']}:broker", cwd=tmp_path)
    assert isinstance(loaded.broker, RabbitBroker)
    await loaded.broker.start()
    await loaded.broker.stop()
    try:
        yield Started(tmp_path, loaded, names)
    finally:
        await delete_declared(amqp, loaded.middleware, loaded.broker)
        channel = await amqp.channel()
        await channel.queue_delete(names["audit"])
        await channel.close()


async def publish(connection: AbstractRobustConnection, queue: str, count: int) -> None:
    """Publish ``count`` messages to ``queue`` by the default exchange, each confirmed."""
    channel = await connection.channel(publisher_confirms=True)
    try:
        for n in range(count):
            await channel.default_exchange.publish(
                aio_pika.Message(f"m{n}".encode()), routing_key=queue
            )
    finally:
        await channel.close()


def depth(found: dict[str, Any]) -> tuple[bool, int | None, int | None]:
    return found["exists"], found["messages"], found["consumers"]


async def test_named_queues_show_ready_waiting_and_dead_letters_and_a_missing_queue_as_missing(
    started: Started, rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """``status Q.dlq nothere --json``: a ``.dlq`` name means its work queue; exit 0."""
    orders = started.orders
    await publish(amqp, orders, 3)
    await publish(amqp, f"{orders}.retry", 2)
    await publish(amqp, f"{orders}.dlq", 4)
    missing = unique("nothere")
    result = await run_cli("status", f"{orders}.dlq", missing, "--json", url=rabbit_url)
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["queues_from"] == ["arguments"]
    assert data["tiers"] == []
    assert data["tiers_from"] == []
    assert any("cannot be listed over AMQP" in note for note in data["notes"])
    first, second = data["queues"]
    assert first["queue"] == orders
    assert depth(first["work"]) == (True, 3, 0)
    assert depth(first["retry"]) == (True, 2, 0)
    assert depth(first["dlq"]) == (True, 4, 0)
    assert first["dlq"]["name"] == f"{orders}.dlq"
    assert second["queue"] == missing
    for part in ("work", "retry", "dlq"):
        assert depth(second[part]) == (False, None, None)


async def test_an_apps_status_shows_its_covered_queues_and_every_tier_of_its_plan(
    started: Started, rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """``--app``: the covered queues (not the retries-off one) and the plan's tiers, counted."""
    await publish(amqp, f"{started.emails}.dlq", 1)
    # A copy waiting in the longest tier, as the plugin sends one (tier exchange, .retry key).
    channel = await amqp.channel(publisher_confirms=True)
    tier = await channel.get_exchange(f"{started.prefix}.delay.51200")
    await tier.publish(aio_pika.Message(b"waiting"), routing_key=f"{started.emails}.retry")
    await channel.close()
    spec = f"{started.module}:broker"
    result = await run_cli("status", "--app", spec, "--json", url=rabbit_url, cwd=started.folder)
    assert result.status == 0, result.stderr
    data = result.json()
    assert (data["prefix"], data["queues_from"], data["tiers_from"]) == (
        started.prefix,
        ["app"],
        ["app"],
    )
    by_name = {q["queue"]: q for q in data["queues"]}
    assert set(by_name) == {started.orders, started.emails}
    assert depth(by_name[started.emails]["dlq"]) == (True, 1, 0)
    assert depth(by_name[started.orders]["retry"]) == (True, 0, 0)
    assert [(t["name"], t["ttl_ms"]) for t in data["tiers"]] == [
        (f"{started.prefix}.delay.{ttl}", ttl) for ttl in TTLS
    ]
    waiting = {t["ttl_ms"]: t["messages"] for t in data["tiers"]}
    assert waiting == {ttl: int(ttl == 51200) for ttl in TTLS}
    assert any("shared by every queue" in note for note in data["notes"])


async def test_with_no_queue_named_the_registrys_queues_are_shown_and_it_keeps_every_record(
    started: Started, rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """Neither QUEUE nor --app: the registry names the covered queues; reading it consumes none."""
    registry = f"{started.prefix}.queues"
    before = await queue_depth(amqp, registry)
    assert before == 2
    await publish(amqp, f"{started.orders}.retry", 1)
    result = await run_cli("status", "--prefix", started.prefix, "--json", url=rabbit_url)
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["queues_from"] == ["registry"]
    assert [q["queue"] for q in data["queues"]] == sorted([started.orders, started.emails])
    by_name = {q["queue"]: q for q in data["queues"]}
    assert depth(by_name[started.orders]["retry"]) == (True, 1, 0)
    # The records were handed back when the command's channel closed.
    assert await queue_depth(amqp, registry) == before
    again = await run_cli("status", "--prefix", started.prefix, "--json", url=rabbit_url)
    assert [q["queue"] for q in again.json()["queues"]] == sorted([started.orders, started.emails])


async def test_a_registry_that_is_not_a_classic_queue_is_not_read(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """On a quorum queue every hand-back spends a delivery: status leaves it alone and says so."""
    prefix = unique("quorum-registry")
    registry = f"{prefix}.queues"
    channel = await amqp.channel()
    await channel.declare_queue(registry, durable=True, arguments={"x-queue-type": "quorum"})
    await channel.close()
    try:
        await publish(amqp, registry, 1)
        result = await run_cli("status", "--prefix", prefix, "--json", url=rabbit_url)
        assert result.status == 0, result.stderr
        data = result.json()
        assert data["queues"] == []
        assert any("is not a classic queue" in note for note in data["notes"])
        assert await queue_depth(amqp, registry) == 1
        channel = await amqp.channel()
        queue = await channel.get_queue(registry)
        record = await queue.get(no_ack=True)
        # Never delivered before: the command did not take it.
        assert headers.read_requeues(record.headers) == 0
        await channel.close()
    finally:
        channel = await amqp.channel()
        await channel.queue_delete(registry)
        await channel.close()


async def test_with_no_registry_status_says_no_app_started_and_exits_0(rabbit_url: str) -> None:
    prefix = unique("never-started")
    result = await run_cli("status", "--prefix", prefix, url=rabbit_url)
    assert result.status == 0, result.stderr
    assert "no work queues found" in result.stdout
    assert f"no registry queue {prefix}.queues" in " ".join(result.stdout.split())


async def test_the_human_table_shows_counts_and_missing_queues(
    started: Started, rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    await publish(amqp, f"{started.emails}.dlq", 2)
    missing = unique("gone")
    result = await run_cli("status", started.emails, missing, url=rabbit_url)
    assert result.status == 0, result.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in result.stdout.splitlines()]
    assert [started.emails, "0", "0", "0", "0", "2"] in rows, result.stdout
    assert [missing, "missing", "", "missing", "", "missing"] in rows, result.stdout


async def test_watch_prints_a_snapshot_every_refresh_and_ctrl_c_ends_it_with_status_0(
    started: Started, rabbit_url: str
) -> None:
    """And it keeps one named connection open from refresh to refresh (when rabbitmqctl
    can list them): a connection per refresh would be three lines of the broker's log
    every 2 s."""
    ctl = script_broker_ctl(rabbit_url)
    process = await asyncio.create_subprocess_exec(
        *script(),
        "status",
        started.orders,
        "--watch",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(rabbit_url),
        # A shell's background job ignores SIGINT, and a child keeps that: give it Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    stdout = process.stdout

    async def two_snapshots() -> None:
        seen = ""
        while seen.count(started.orders) < 2:
            line = await stdout.readline()
            assert line, "the watch ended by itself"
            seen += line.decode()

    try:
        await asyncio.wait_for(two_snapshots(), 30)
        if ctl is not None:
            first = await _watch_connections(ctl)
            await asyncio.wait_for(two_snapshots(), 30)
            assert await _watch_connections(ctl) == first
            assert len(first) == 1, first
    finally:
        process.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()


async def _watch_connections(ctl: Path) -> set[str]:
    """The peer ports of the connections a ``status --watch`` has open at the broker."""
    listed = await asyncio.to_thread(
        run_ctl, ctl, "list_connections", "peer_port", "client_properties"
    )
    return {line.split()[0] for line in listed.stdout.splitlines() if WATCH_CONNECTION in line}


async def test_status_exits_2_when_the_broker_the_app_or_the_management_api_cannot_be_read(
    tmp_path: Path, rabbit_url: str
) -> None:
    result = await run_cli("status", "--app", "no_such_module:app", url=None, cwd=tmp_path)
    assert result.status == 3
    assert "cannot import 'no_such_module'" in result.stderr
    down = await run_cli("status", "orders", url="amqp://guest:guest@127.0.0.1:1/")
    assert down.status == 3
    assert "cannot connect to amqp://guest:***@127.0.0.1:1/" in down.stderr
    no_api = await run_cli(
        "status", "--management-url", "http://guest:guest@127.0.0.1:1", url=rabbit_url
    )
    assert no_api.status == 3
    assert "cannot read the management API at http://127.0.0.1:1" in no_api.stderr


async def test_the_workers_intake_has_no_retry_queue_and_is_not_shown_missing_one(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """The retry worker's intake has no .retry by design: '-', and a note saying why."""
    intake = f"{unique('w')}.intake"
    channel = await amqp.channel()
    for name in (intake, f"{intake}.dlq"):
        await channel.declare_queue(name, durable=True)
    try:
        table = await run_cli("status", intake, url=rabbit_url)
        assert table.status == 0, table.stderr
        (row,) = [line for line in table.stdout.splitlines() if f"│ {intake} " in line]
        assert [cell.strip() for cell in row.split("│")[1:-1]] == [intake, "0", "0", "-", "", "0"]
        assert "missing" not in row
        assert f"{intake} is the retry worker's intake" in table.stdout
        as_json = await run_cli("status", intake, "--json", url=rabbit_url)
        assert any("the retry worker's intake" in note for note in as_json.json()["notes"])
    finally:
        for name in (intake, f"{intake}.dlq"):
            await channel.queue_delete(name)
        await channel.close()


async def test_copies_a_tier_cannot_hand_back_are_counted_through_the_management_api(
    started: Started,
    rabbit_url: str,
    server: str,  # noqa: F811 - the fixture, imported above
) -> None:
    """AMQP does not count a quorum tier's dead-letter backlog; status and doctor say it.

    The management API's answer is stood in for (the test broker runs without the
    plugin): ``messages_dlx`` is the field RabbitMQ 3.10 and 4.3 give for it, measured
    by hand (copies addressed to a deleted queue: 0 by a passive declare, 5 there).
    """
    tier = f"{started.prefix}.delay.400"
    Recorder.answer = (200, json.dumps([{"name": tier, "messages_dlx": 5}]).encode())
    spec = f"{started.module}:broker"
    management = f"http://guest:guest@{server}"
    shown = await run_cli(
        "status", "--app", spec, "--management-url", management, url=rabbit_url, cwd=started.folder
    )
    assert shown.status == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if f"│ {tier} " in line]
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [tier, "400 ms", "0", "5"]
    assert f"{tier} holds 5 copies whose queue would not take them" in shown.stdout
    without = await run_cli("status", "--app", spec, url=rabbit_url, cwd=started.folder)
    assert "give --management-url to see them" in without.stdout
    doctor = await run_cli(
        "doctor", spec, "--management-url", management, "--json", url=rabbit_url, cwd=started.folder
    )
    assert doctor.status == 1, doctor.stderr
    (finding,) = [f for f in doctor.json()["findings"] if f["check"] == "undeliverable"]
    assert (finding["severity"], finding["subject"]) == ("action", tier)
