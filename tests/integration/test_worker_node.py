"""The retry worker for a consumer in another language: the Node.js one of examples/polyglot.

The real console script runs the worker; ``examples/polyglot/consumer.js`` (amqplib)
consumes a work queue declared with ``x-dead-letter-exchange: <prefix>.intake`` and a
second queue on the same fanout, and does on each attempt what the message's plan says:
ack, fail (a reject: the queue's backoff), ask for a delay of its own, or give up (the
last two by a marked copy it republishes and then rejects). It prints one JSON line per
arrival, with the time since it started and the ``retry-*`` headers it read;
``examples/polyglot/publish.js`` publishes the orders, each with a ``traceparent`` of its
own. Every count is by message id.

``npm ci`` installs amqplib from the lock file once per session, when node_modules lacks
it (a clean clone, CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import subprocess
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from faststream_retry.core import headers as h
from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name, tier_name
from faststream_retry.core.worker_config import load_worker_config
from tests.cli import ROOT, environment, script
from tests.otlp import Receiver, receiver
from tests.rabbit import drain, eventually, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

__all__ = ["receiver"]  # the fixture

EXAMPLE = ROOT / "examples" / "polyglot"
MAX_ATTEMPTS = 4
DELAYS_S = (1.0, 2.0)
"""The config's schedule: 1 s after the first rejection, 2 s after every later one."""
LATER_S = 3.0
"""What an order that asks for a delay of its own asks for: not on the schedule."""
SLACK_S = 3.0
"""What a loaded 2-core machine may add to a release, on top of the delay itself."""
START_S = 60.0


@pytest.fixture(scope="module")
def node_example() -> Path:
    """``examples/polyglot`` with the node_modules its lock file pins (``npm ci`` when they differ).

    Under a lock: pytest-xdist's workers and the suites of other series run at once, and
    ``npm ci`` starts by deleting node_modules. A stamp written after a whole install
    (the lock file's hash) tells a finished install from a cut one or an older one.
    """
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed: the Node.js example cannot run"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true requires it)")
        pytest.skip(why)
    wanted = hashlib.sha256((EXAMPLE / "package-lock.json").read_bytes()).hexdigest()
    stamp = EXAMPLE / "node_modules" / ".installed-from"
    with (EXAMPLE / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file() or stamp.read_text() != wanted:
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
            stamp.write_text(wanted)
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

    async def finish(self, timeout: float) -> int:
        """Wait for it to exit by itself (``stop`` after ``timeout``); return the exit status."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.process.wait(), timeout)
        return await self.stop()

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

    def env(self, url: str, **extra: str) -> dict[str, str]:
        """The environment of the Node programs (and ``FAIL_TIMES``, which only an older
        consumer.js reads: it rejects each message once, to show a rejection lost)."""
        return {
            **os.environ,
            "RABBITMQ_URL": url,
            "PREFIX": self.prefix,
            "EXCHANGE": self.exchange,
            "QUEUE": self.queue,
            "AUDIT_QUEUE": self.audit,
            "FAIL_TIMES": "1",
            "LOG_FORMAT": "json",
            **extra,
        }

    async def worker(self, url: str, *args: str, **env: str) -> Process:
        return await Process.start(
            "worker",
            *script(),
            "worker",
            "--config",
            str(self.config),
            *args,
            env=environment(url, **env),
            cwd=ROOT,
        )

    async def consumer(self, url: str, example: Path) -> Process:
        return await Process.start(
            "consumer", "node", "consumer.js", env=self.env(url), cwd=example
        )

    async def publish(self, url: str, example: Path, *orders: str) -> dict[str, str]:
        """Publish ``orders`` (publish.js's ID:STEP,... arguments); return each id's traceparent."""
        publisher = await Process.start(
            "publisher", "node", "publish.js", *orders, env=self.env(url), cwd=example
        )
        status = await publisher.finish(START_S)
        assert status == 0, publisher.output
        return {r["id"]: r["traceparent"] for r in publisher.records()}

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


def arrivals(consumer: Process, queue: str, message_id: str | None = None) -> list[dict[str, Any]]:
    """The consumer's reports of the deliveries of ``queue`` it handled (not marked copies)."""
    return [
        r
        for r in consumer.records()
        if "outcome" in r
        and r.get("queue") == queue
        and (message_id is None or r.get("id") == message_id)
        and not r["outcome"].startswith("marked copy")
    ]


def marked(consumer: Process, queue: str, message_id: str) -> list[dict[str, Any]]:
    """The marked copies of ``message_id`` the consumer rejected unread."""
    return [
        r
        for r in consumer.records()
        if r.get("queue") == queue
        and r.get("id") == message_id
        and str(r.get("outcome", "")).startswith("marked copy")
    ]


async def stop_all(worker: Process, *others: Process | None) -> None:
    """Stop the Node programs, then the worker: it exits 0 on SIGTERM, with no traceback."""
    for other in others:
        if other is not None:
            await other.stop()
    status = await worker.stop()
    assert status == 0, worker.output
    assert not worker.said("Traceback"), worker.output


async def test_a_node_consumer_s_rejections_come_back_to_its_queue_only(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    node_example: Path,
    polyglot: Polyglot,
) -> None:
    """A Node.js consumer that only rejects gets the worker's retries, on time, nowhere else.

    A message rejected twice arrives 3 times in its queue, 1 s then 2 s apart (never
    sooner, at most ``SLACK_S`` later), with ``retry-attempt`` 0, 1, 2; one rejected
    every time arrives ``MAX_ATTEMPTS`` times and is in ``<queue>.dlq`` once, reason
    exhausted, ``retry-attempt`` = max_attempts; the other queue on the fanout gets each
    message once. Sent = acked + dead-lettered, each once; the work queue, its ``.retry``,
    the tiers and the intake are empty; the worker stops on SIGTERM with status 0.
    """
    names = polyglot
    worker = await names.worker(rabbit_url)
    consumer: Process | None = None
    try:
        await worker.wait_for(f"consuming {names.intake}", "the worker to start")
        consumer = await names.consumer(rabbit_url, node_example)
        await consumer.wait_for('"ready":true', "the consumer to start")

        ok, bad, fine = unique("twice"), unique("always"), unique("fine")
        sent = await names.publish(
            rabbit_url, node_example, f"{ok}:fail,fail,ok", f"{bad}:fail", f"{fine}:ok"
        )
        assert set(sent) == {ok, bad, fine}
        done = consumer

        await eventually(
            lambda: (
                len(arrivals(done, names.queue, bad)) == MAX_ATTEMPTS
                and len(arrivals(done, names.queue, ok)) == 3
            ),
            timeout=60,
            what=f"{MAX_ATTEMPTS} arrivals of {bad} and 3 of {ok}",
        )

        # Whatever was routed to the queues before this marker arrives before it.
        marker = unique("marker")
        await names.publish(rabbit_url, node_example, marker)
        await eventually(
            lambda: (
                len(arrivals(done, names.queue, marker))
                == 1
                == len(arrivals(done, names.audit, marker))
            ),
            what="the marker in both queues",
        )
        dead = await drain(amqp, names.dlq, expect=1, timeout=30)

        for message_id, count in ((ok, 3), (bad, MAX_ATTEMPTS)):
            seen = arrivals(consumer, names.queue, message_id)
            assert [r["arrival"] for r in seen] == list(range(1, count + 1)), seen
            assert [r["attempt"] for r in seen] == list(range(count)), seen
            times = [r["t"] for r in seen]
            for gap, delay in zip(gaps(times), planned(count), strict=True):
                assert delay <= gap < delay + SLACK_S, (message_id, gaps(times), planned(count))
        assert [r["outcome"] for r in arrivals(consumer, names.queue, ok)] == [
            "reject",
            "reject",
            "ack",
        ]
        assert {r["outcome"] for r in arrivals(consumer, names.queue, bad)} == {"reject"}

        acked = Counter(r["id"] for r in arrivals(consumer, names.queue) if r["outcome"] == "ack")
        assert acked == Counter({ok: 1, fine: 1, marker: 1})
        assert Counter(r["id"] for r in arrivals(consumer, names.audit)) == Counter(
            {ok: 1, bad: 1, fine: 1, marker: 1}
        )

        assert [m.message_id for m in dead] == [bad]
        assert sorted([*acked, bad]) == sorted([*sent, marker])  # each once, by the Counters
        letter = headers_of(dead[0])
        assert letter["retry-reason"] == "exhausted"
        assert letter["retry-attempt"] == MAX_ATTEMPTS
        assert letter["retry-origin-queue"] == names.queue
        assert json.loads(dead[0].body) == {"order": bad, "plan": ["fail"]}

        for queue in names.emptied:
            assert await queue_depth(amqp, queue) == 0, queue
    finally:
        await stop_all(worker, consumer)


async def test_a_node_consumer_asks_for_its_own_delay_and_gives_up_with_its_error(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    node_example: Path,
    polyglot: Polyglot,
) -> None:
    """A Node.js consumer says what a reject cannot: a delay of its own, or "give up", and why.

    It republishes a marked copy and acks the original; the copy, rejected unread, is
    the worker's to answer. An order that asks for ``LATER_S`` arrives again that long
    after (not the schedule's 1 s), with ``retry-attempt`` 1 and the consumer's own
    exception in ``retry-history``; one given up on its 2nd attempt is in ``<queue>.dlq``
    at once as ``permanent``, with attempts 2, the JavaScript exception's name, message
    and stack, and a history of both failures (the reject, then the give-up), the
    marker headers gone. Each order is acked or dead-lettered once, and nothing else
    stays anywhere.
    """
    names = polyglot
    worker = await names.worker(rabbit_url)
    consumer: Process | None = None
    try:
        await worker.wait_for(f"consuming {names.intake}", "the worker to start")
        consumer = await names.consumer(rabbit_url, node_example)
        await consumer.wait_for('"ready":true', "the consumer to start")
        done = consumer
        later, give = unique("later"), unique("give")
        await names.publish(
            rabbit_url, node_example, f"{later}:later:{LATER_S:g}s,ok", f"{give}:fail,give-up"
        )
        await eventually(
            lambda: any(r["outcome"] == "ack" for r in arrivals(done, names.queue, later)),
            timeout=60,
            what=f"{later} acked",
        )
        dead = await drain(amqp, names.dlq, expect=1, timeout=30)

        seen = arrivals(consumer, names.queue, later)
        assert [(r["attempt"], r["outcome"]) for r in seen] == [
            (0, f"later {LATER_S:g}s"),
            (1, "ack"),
        ]
        (gap,) = gaps([r["t"] for r in seen])
        assert LATER_S <= gap < LATER_S + SLACK_S, gap
        (failure,) = seen[1]["history"]
        assert (failure["exception"], failure["error"]) == (
            "RetryLater",
            f"rate limited for {later}",
        )
        assert failure["delay"] == LATER_S * 1000
        assert seen[1]["firstFailedAt"] == failure["at"]
        assert len(marked(consumer, names.queue, later)) == 1

        assert [(r["attempt"], r["outcome"]) for r in arrivals(consumer, names.queue, give)] == [
            (0, "reject"),
            (1, "give up"),
        ]
        assert len(marked(consumer, names.queue, give)) == 1
        (letter,) = dead
        assert letter.message_id == give
        headers = headers_of(letter)
        assert headers[h.REASON] == "permanent"
        assert headers[h.ATTEMPT] == 2
        assert headers[h.EXCEPTION] == "Permanent"
        assert headers[h.ERROR] == f"order {give} has no customer"
        assert headers[h.TRACEBACK].startswith(f"Permanent: order {give} has no customer\n    at ")
        assert "consumer.js" in headers[h.TRACEBACK]
        history = headers[h.HISTORY]
        assert [(e["attempt"], e["exception"]) for e in history] == [
            (1, "rejected"),
            (2, "Permanent"),
        ]
        assert "retry-permanent" not in headers  # the consumer's word was answered
        assert "retry-delay" not in headers
        assert json.loads(letter.body) == {"order": give, "plan": ["fail", "give-up"]}
        assert Counter(r["id"] for r in arrivals(consumer, names.audit)) == Counter(
            {later: 1, give: 1}
        )
        for queue in names.emptied:
            assert await queue_depth(amqp, queue) == 0, queue
    finally:
        await stop_all(worker, consumer)


async def test_a_node_consumer_started_before_the_worker_ever_ran_loses_nothing(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    node_example: Path,
    polyglot: Polyglot,
) -> None:
    """Started first, the consumer waits for the intake, so no rejection is dropped meanwhile.

    Until ``<prefix>.intake`` exists RabbitMQ drops whatever the queue dead-letters into
    it. The consumer declares its queue (which holds the orders) and consumes only once
    the intake exists. Four orders published before the worker ever ran, three of which
    fail once: once the worker runs, three are acked and one is in ``<queue>.dlq``, each
    once, and no queue holds anything else.
    """
    names = polyglot
    consumer = await names.consumer(rabbit_url, node_example)
    worker: Process | None = None
    try:
        await consumer.wait_for('"', "the consumer to start")  # waiting, or (wrongly) ready
        ok, once, later, give = unique("ok"), unique("once"), unique("later"), unique("give")
        await names.publish(
            rabbit_url,
            node_example,
            f"{ok}:ok",
            f"{once}:fail,ok",
            f"{later}:later:1s,ok",
            f"{give}:give-up",
        )
        await asyncio.sleep(1.5)  # the consumer had time to act on them, had it consumed
        early = arrivals(consumer, names.queue)

        worker = await names.worker(rabbit_url)
        await worker.wait_for(f"consuming {names.intake}", "the worker to start")
        done = consumer

        def acked() -> Counter[str]:
            return Counter(r["id"] for r in arrivals(done, names.queue) if r["outcome"] == "ack")

        await eventually(
            lambda: set(acked()) == {ok, once, later},
            timeout=60,
            what=f"{ok}, {once} and {later} acked; the consumer said:\n{consumer.output}",
        )
        dead = await drain(amqp, names.dlq, expect=1, timeout=30)
        assert consumer.said('"waiting":'), consumer.output
        assert not early, early  # it consumed nothing before the intake existed
        assert acked() == Counter({ok: 1, once: 1, later: 1})
        assert [m.message_id for m in dead] == [give]
        assert headers_of(dead[0])[h.REASON] == "permanent"
        for queue in names.emptied:
            assert await queue_depth(amqp, queue) == 0, queue
    finally:
        if worker is None:
            await consumer.stop()
        else:
            await stop_all(worker, consumer)


async def test_the_worker_command_traces_from_the_otel_environment(
    rabbit_url: str,
    node_example: Path,
    polyglot: Polyglot,
    receiver: Receiver,
) -> None:
    """``faststream-retry worker`` with OTEL_* set exports its spans, continuing the producer's.

    No Python written: OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_SERVICE_NAME configure it.
    A Node producer's order fails once: its ``retry scheduled`` span is a child of the
    producer's span (its ``traceparent``), the release a child of that, all under the
    service name given; the consumer's second delivery carries the same trace. A
    dead letter's span is in its own order's trace. The spans are exported by the
    time the worker has stopped (SIGTERM flushes them).
    """
    names = polyglot
    worker = await names.worker(
        rabbit_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.base,
        OTEL_SERVICE_NAME="retry-worker",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    consumer: Process | None = None
    try:
        await worker.wait_for(f"consuming {names.intake}", "the worker to start")
        consumer = await names.consumer(rabbit_url, node_example)
        await consumer.wait_for('"ready":true', "the consumer to start")
        done = consumer
        once, give = unique("once"), unique("give")
        sent = await names.publish(rabbit_url, node_example, f"{once}:fail,ok", f"{give}:give-up")
        await eventually(
            lambda: any(r["outcome"] == "ack" for r in arrivals(done, names.queue, once)),
            timeout=60,
            what=f"{once} acked",
        )
        await eventually(lambda: worker.said(f"dead-lettered message {give} "), what="the give-up")
    finally:
        await stop_all(worker, consumer)

    spans = receiver.spans()
    assert spans, f"no span reached the receiver; the worker said:\n{worker.output}"
    assert worker.said(f"tracing to OTLP/HTTP {receiver.endpoint} as service 'retry-worker'")
    assert {service for service, _ in spans} == {"retry-worker"}
    by_name = {span.name: span for _, span in spans}
    assert sorted(by_name) == sorted(
        [
            f"{names.queue} retry scheduled",
            f"{names.queue} retry release",
            f"{names.queue} dead-letter",
        ]
    )
    for message_id, first in ((once, "retry scheduled"), (give, "dead-letter")):
        _, trace_id, parent_id, _ = sent[message_id].split("-")
        span = by_name[f"{names.queue} {first}"]
        assert (span.trace_id.hex(), span.parent_span_id.hex()) == (trace_id, parent_id)
    scheduled = by_name[f"{names.queue} retry scheduled"]
    release = by_name[f"{names.queue} retry release"]
    assert release.trace_id == scheduled.trace_id
    assert release.parent_span_id == scheduled.span_id
    second = arrivals(consumer, names.queue, once)[1]
    assert second["traceparent"].split("-")[1:3] == [release.trace_id.hex(), release.span_id.hex()]
