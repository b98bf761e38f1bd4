"""The retry worker for a consumer in another language: the Node.js one of examples/polyglot.

The real console script runs the worker; ``examples/polyglot/consumer.js`` (amqplib)
consumes a work queue declared with ``x-dead-letter-exchange: <prefix>.intake`` and a
second queue on the same fanout, and rejects (requeue=false) as its message body says.
It prints one JSON line per arrival, with the time since it started; every count is by
message id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
from collections import Counter
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest

from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name, tier_name
from faststream_retry.core.worker_config import load_worker_config
from tests.cli import ROOT, environment, script
from tests.rabbit import drain, eventually, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

EXAMPLE = ROOT / "examples" / "polyglot"
MAX_ATTEMPTS = 4
DELAYS_S = (1.0, 2.0)
"""The config's schedule: 1 s after the first rejection, 2 s after every later one."""
SLACK_S = 3.0
"""What a loaded 2-core machine may add to a release, on top of the delay itself."""
START_S = 60.0


@pytest.fixture(scope="module")
def node_example() -> Path:
    """``examples/polyglot`` with its node_modules (``npm ci`` once, when they are missing)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed: the Node.js example cannot run"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true requires it)")
        pytest.skip(why)
    if not (EXAMPLE / "node_modules" / "amqplib").is_dir():
        installed = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=EXAMPLE,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if installed.returncode != 0:
            pytest.fail(f"npm ci in {EXAMPLE} failed:\n{installed.stdout}{installed.stderr}")
    return EXAMPLE


class Process:
    """A subprocess whose output lines are collected as they come."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.lines: list[str] = []
        assert process.stdout is not None
        self._reader = asyncio.create_task(self._read(process.stdout))

    @classmethod
    async def start(cls, name: str, *args: str, env: dict[str, str], cwd: Path) -> Process:
        process = await asyncio.create_subprocess_exec(
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
        return cls(name, process)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def records(self) -> list[dict[str, Any]]:
        """Return the lines that are JSON objects (the consumer's)."""
        found = []
        for line in self.lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    found.append(record)
        return found

    async def wait_for(self, text: str, what: str) -> None:
        def ready() -> bool:
            if self.process.returncode is not None:
                pytest.fail(f"the {self.name} exited ({self.process.returncode}):\n{self.output}")
            return self.said(text)

        await eventually(ready, START_S, f"{what}; it said:\n{self.output}")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def stop(self) -> int:
        """SIGTERM, then SIGKILL after 10 s; return the exit status."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)
        assert self.process.returncode is not None
        return self.process.returncode


class Polyglot:
    """Names private to one test, the worker's config, and what to delete afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.prefix = unique("poly")
        self.exchange = unique("orders-fanout")
        self.queue = unique("orders")
        self.audit = unique("orders-audit")
        self.config = tmp_path / "retry.toml"
        self.config.write_text(
            f'prefix = "{self.prefix}"\n'
            'max_delay = "10s"\n'
            "[[queues]]\n"
            f'name = "{self.queue}"\n'
            f"max_attempts = {MAX_ATTEMPTS}\n"
            'backoff = { kind = "schedule", delays = ["1s", "2s"] }\n',
            encoding="utf-8",
        )
        self.tiers = [
            tier_name(self.prefix, ttl) for ttl in load_worker_config(self.config).tiers.ttls_ms
        ]

    @property
    def intake(self) -> str:
        return intake_name(self.prefix)

    @property
    def dlq(self) -> str:
        return f"{self.queue}.dlq"

    @property
    def emptied(self) -> list[str]:
        """Return every queue that holds nothing once the messages are settled."""
        return [
            self.queue,
            self.audit,
            f"{self.queue}.retry",
            self.intake,
            intake_dlq_name(self.prefix),
            *self.tiers,
        ]

    def consumer_env(self, url: str) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_URL": url,
            "PREFIX": self.prefix,
            "EXCHANGE": self.exchange,
            "QUEUE": self.queue,
            "AUDIT_QUEUE": self.audit,
            "FAIL_TIMES": "0",
            "LOG_FORMAT": "json",
        }

    async def cleanup(self, connection: AbstractRobustConnection) -> None:
        channel = await connection.channel()
        queues = [*self.emptied, self.dlq, registry_name(self.prefix)]
        for name in queues:
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        for name in [self.exchange, self.intake, *self.tiers]:
            with contextlib.suppress(Exception):
                await channel.exchange_delete(name)
        with contextlib.suppress(Exception):
            await channel.close()


@pytest.fixture
async def polyglot(tmp_path: Path, amqp: AbstractRobustConnection) -> AsyncIterator[Polyglot]:
    names = Polyglot(tmp_path)
    try:
        yield names
    finally:
        await names.cleanup(amqp)


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def planned(arrivals: int) -> list[float]:
    """Return the delays between ``arrivals`` consecutive arrivals, per the schedule."""
    return [DELAYS_S[min(i, len(DELAYS_S) - 1)] for i in range(arrivals - 1)]


async def test_a_node_consumer_s_rejections_come_back_to_its_queue_only(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    node_example: Path,
    polyglot: Polyglot,
) -> None:
    """A Node.js consumer that only rejects gets the worker's retries, on time, nowhere else.

    A message rejected twice arrives 3 times in its queue, 1 s then 2 s apart (never
    sooner, at most ``SLACK_S`` later), with ``retry-attempt`` absent, 1, 2; one rejected
    every time arrives ``MAX_ATTEMPTS`` times and is in ``<queue>.dlq`` once, reason
    exhausted, ``retry-attempt`` = max_attempts; the other queue on the fanout gets each
    message once. Sent = acked + dead-lettered, each once; the work queue, its ``.retry``,
    the tiers and the intake are empty; the worker stops on SIGTERM with status 0.
    """
    names = polyglot
    worker = await Process.start(
        "worker",
        *script(),
        "worker",
        "--config",
        str(names.config),
        env=environment(rabbit_url),
        cwd=ROOT,
    )
    consumer: Process | None = None
    try:
        await worker.wait_for(f"consuming {names.intake}", "the worker to start")
        consumer = await Process.start(
            "consumer", "node", "consumer.js", env=names.consumer_env(rabbit_url), cwd=node_example
        )
        await consumer.wait_for('"ready":true', "the consumer to start")

        ok, bad, fine = unique("twice"), unique("always"), unique("fine")
        sent = {ok: 2, bad: "always", fine: 0}
        channel = await amqp.channel()
        exchange = await channel.get_exchange(names.exchange)
        for message_id, fail_times in sent.items():
            await exchange.publish(
                aio_pika.Message(
                    json.dumps({"fail_times": fail_times}).encode(),
                    message_id=message_id,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="",
            )

        def arrivals(queue: str, message_id: str | None = None) -> list[dict[str, Any]]:
            assert consumer is not None
            return [
                r
                for r in consumer.records()
                if "outcome" in r
                and r.get("queue") == queue
                and (message_id is None or r.get("id") == message_id)
            ]

        await eventually(
            lambda: (
                len(arrivals(names.queue, bad)) == MAX_ATTEMPTS
                and len(arrivals(names.queue, ok)) == 3
            ),
            timeout=60,
            what=f"{MAX_ATTEMPTS} arrivals of {bad} and 3 of {ok}",
        )

        # Whatever was routed to the queues before this marker arrives before it.
        marker = unique("marker")
        await exchange.publish(
            aio_pika.Message(b'{"fail_times": 0}', message_id=marker), routing_key=""
        )
        await eventually(
            lambda: len(arrivals(names.queue, marker)) == 1 == len(arrivals(names.audit, marker)),
            what="the marker in both queues",
        )
        await channel.close()
        dead = await drain(amqp, names.dlq, expect=1, timeout=30)

        for message_id, count in ((ok, 3), (bad, MAX_ATTEMPTS)):
            seen = arrivals(names.queue, message_id)
            assert [r["arrival"] for r in seen] == list(range(1, count + 1)), seen
            assert [r["retry_attempt"] for r in seen] == [None, *range(1, count)], seen
            times = [r["t"] for r in seen]
            for gap, delay in zip(gaps(times), planned(count), strict=True):
                assert delay <= gap < delay + SLACK_S, (message_id, gaps(times), planned(count))
        assert [r["outcome"] for r in arrivals(names.queue, ok)] == ["reject", "reject", "ack"]
        assert {r["outcome"] for r in arrivals(names.queue, bad)} == {"reject"}

        acked = Counter(r["id"] for r in arrivals(names.queue) if r["outcome"] == "ack")
        assert acked == Counter({ok: 1, fine: 1, marker: 1})
        assert Counter(r["id"] for r in arrivals(names.audit)) == Counter(
            {ok: 1, bad: 1, fine: 1, marker: 1}
        )

        assert [m.message_id for m in dead] == [bad]
        assert sorted([*acked, bad]) == sorted([*sent, marker])  # each once, by the Counters
        letter = headers_of(dead[0])
        assert letter["retry-reason"] == "exhausted"
        assert letter["retry-attempt"] == MAX_ATTEMPTS
        assert letter["retry-origin-queue"] == names.queue
        assert json.loads(dead[0].body) == {"fail_times": "always"}

        for queue in names.emptied:
            assert await queue_depth(amqp, queue) == 0, queue
    finally:
        if consumer is not None:
            await consumer.stop()
        status = await worker.stop()
    assert status == 0, worker.output
    assert not worker.said("Traceback"), worker.output
