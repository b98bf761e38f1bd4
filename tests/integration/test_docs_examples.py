"""The documentation's examples that need RabbitMQ itself, run on a real broker."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry import load_worker_config
from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name
from tests import stack_dump
from tests.conftest import ROOT
from tests.integration.test_cli_dlq import declare, delete, ids_in, seed
from tests.rabbit import (
    consumers,
    eventually,
    eventually_async,
    queue_depth,
    run_ctl,
    script_broker_ctl,
    unique,
)
from tests.unit.test_docs import fences

if TYPE_CHECKING:
    from collections.abc import Iterator

    from aio_pika.abc import AbstractConnection, AbstractRobustConnection

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


@pytest.fixture
def vhost_url(rabbit_url: str) -> Iterator[str]:
    """A vhost of the test's own, for an example whose queue names are fixed ("email-queue")."""
    ctl = script_broker_ctl(rabbit_url)
    if ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to add a vhost")
    vhost = unique("quickstart")
    run_ctl(ctl, "add_vhost", vhost)
    run_ctl(ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        yield f"{rabbit_url.rstrip('/')}/{vhost}"
    finally:
        # Best effort, in the background: deleting a vhost of some twenty quorum queues
        # took over a minute on a loaded machine, and the broker goes with the run.
        subprocess.Popen(
            [str(ctl), "-q", "delete_vhost", vhost],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class _RateLimited(BaseHTTPRequestHandler):
    """A webhook that answers 429 with Retry-After: 1 the first time, then 200."""

    hits: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.hits.append(time.monotonic())
        if len(self.hits) == 1:
            self.send_response(429)
            self.send_header("Retry-After", "1")
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.timeout(300)  # a first start declares some twenty quorum queues in a new vhost
async def test_the_readme_quickstart_runs_as_written_from_an_empty_folder(
    vhost_url: str, tmp_path: Path
) -> None:
    """The issue's repro: `from .clients import ...` failed under `faststream run quickstart:app`.

    The README's block, saved in an empty folder and started as the README says, on a
    real broker: an invalid address is dead-lettered at once, a mail with no mail server
    is retried, a 429 waits its Retry-After and then succeeds, a non-web address is a
    permanent failure.
    """
    (source,) = fences((ROOT / "README.md").read_text(), "python")
    (tmp_path / "quickstart.py").write_text(source)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        smtp = f"127.0.0.1:{closed.getsockname()[1]}"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RateLimited)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _RateLimited.hits.clear()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "RABBITMQ_URL"}}
    log = tmp_path / "app.log"
    with log.open("w") as output:
        app = subprocess.Popen(
            [str(Path(sys.executable).with_name("faststream")), "run", "quickstart:app"],
            cwd=tmp_path,
            env={
                **env,
                "RABBITMQ_URL": vhost_url,
                "SMTP_HOST": smtp,
                "PYTHONPATH": str(stack_dump.FOLDER),  # its stacks if it will not stop
            },
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        await eventually(
            lambda: "started successfully" in log.read_text() or app.poll() is not None,
            timeout=120,
            what="the app's start",
        )
        assert app.poll() is None, log.read_text()
        connection = await aio_pika.connect(vhost_url)
        async with connection:
            channel = await connection.channel()
            for queue, body in [
                ("email-queue", {"to": "nope", "text": "hi"}),
                ("email-queue", {"to": "ada@example.com", "text": "hi"}),
                ("webhook-queue", {"url": f"http://127.0.0.1:{server.server_port}/hook"}),
                ("webhook-queue", {"url": "file:///etc/passwd"}),
            ]:
                await channel.default_exchange.publish(
                    aio_pika.Message(json.dumps(body).encode(), content_type="application/json"),
                    routing_key=queue,
                )
            await eventually(lambda: len(_RateLimited.hits) == 2, timeout=30, what="two calls")
            await eventually_async(
                lambda: _depths(connection, {"email-queue.dlq": 1, "webhook-queue.dlq": 1}),
                timeout=30,
                what="one dead letter in each .dlq",
            )
        assert _RateLimited.hits[1] - _RateLimited.hits[0] >= 1.0  # Retry-After: 1
        text = log.read_text()
        assert "retry scheduled" in text  # the mail, with no mail server
        assert "ConnectionRefusedError" in text
    finally:
        server.shutdown()
        stack_dump.stop_or_dump(app, log, 30)


async def _depths(connection: AbstractConnection, wanted: dict[str, int]) -> bool:
    channel = await connection.channel()
    try:
        for name, depth in wanted.items():
            queue = await channel.declare_queue(name, passive=True)
            if queue.declaration_result.message_count != depth:
                return False
    finally:
        await channel.close()
    return True
