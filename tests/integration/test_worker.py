"""The standalone retry worker on a real broker, with plain aio-pika consumers (not FastStream).

A consumer only rejects what it could not handle; its queue dead-letters into the
worker's intake, and the worker sends the message back to that queue alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import shlex
import signal
import subprocess
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelAccessRefused
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faststream_retry.core import headers as h
from faststream_retry.core.topology import intake_dlq_name, intake_name, registry_name
from faststream_retry.core.worker_config import WorkerConfig, policy_command, worker_config
from faststream_retry.reporting.telemetry import ATTR, METRICS
from faststream_retry.worker.worker import RetryWorker
from tests.cli import environment, run_cli, script
from tests.integration.test_frame_limit import BODY, big_message, frame_payload_limit
from tests.integration.test_metrics import points, total
from tests.no_faststream import refuse_faststream
from tests.rabbit import (
    LATE_SLACK_MS,
    close_all_connections,
    drain,
    eventually,
    eventually_async,
    queue_depth,
    run_ctl,
    script_broker_ctl,
    unique,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

pytestmark = pytest.mark.timeout(120)


class Setup:
    """One test's names: a prefix, a work queue fed by a fanout, a second queue on that fanout."""

    def __init__(self) -> None:
        self.prefix = unique("w")
        self.queue = unique("orders")
        self.audit = unique("audit")
        self.fanout = unique("orders-fanout")
        self.declared: list[str] = [self.queue, self.audit]

    def config(self, *queues: dict[str, Any], **top: Any) -> WorkerConfig:
        entries = list(queues) or [{"name": self.queue}]
        data = {
            "prefix": self.prefix,
            "tick": 0.25,
            "max_delay": 60,
            "publish_failure_pause": 0.2,
            "defaults": {"max_attempts": 3, "backoff": {"kind": "schedule", "delays": [0.5, 1]}},
            "queues": entries,
            **top,
        }
        return worker_config(data)

    @property
    def intake(self) -> str:
        return intake_name(self.prefix)

    async def declare(
        self,
        connection: AbstractRobustConnection,
        queue: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> aio_pika.abc.AbstractExchange:
        """Declare the fanout, the work queue dead-lettering into the intake, and the audit queue."""
        channel = await connection.channel()
        # Annotated: aio-pika 10 types the declaration as Any, aio-pika 9.4 (the floor) not.
        fanout: aio_pika.abc.AbstractExchange = await channel.declare_exchange(
            self.fanout, aio_pika.ExchangeType.FANOUT, auto_delete=False
        )
        work = await channel.declare_queue(
            queue or self.queue,
            durable=True,
            arguments={"x-dead-letter-exchange": self.intake} if arguments is None else arguments,
        )
        audit = await channel.declare_queue(self.audit, durable=True)
        await work.bind(fanout)
        await audit.bind(fanout)
        return fanout

    async def cleanup(self, connection: AbstractRobustConnection, worker: WorkerConfig) -> None:
        channel = await connection.channel()
        names = [*self.declared, intake_name(self.prefix), intake_dlq_name(self.prefix)]
        names.append(registry_name(self.prefix))
        for queue in list(self.declared):
            names += [f"{queue}.retry", f"{queue}.dlq"]
        names += [f"{self.prefix}.delay.{ttl}" for ttl in worker.tiers.ttls_ms]
        for name in names:
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        exchanges = [self.fanout, intake_name(self.prefix)]
        exchanges += [f"{self.prefix}.delay.{ttl}" for ttl in worker.tiers.ttls_ms]
        for exchange in exchanges:
            with contextlib.suppress(Exception):
                await channel.exchange_delete(exchange)
        with contextlib.suppress(Exception):
            await channel.close()


class Consumer:
    """A plain consumer: rejects (requeue=false) each message until its n-th arrival, then acks."""

    def __init__(self, succeed_on: Callable[[str], int | None]) -> None:
        self.succeed_on = succeed_on
        self.arrivals: dict[str, list[float]] = {}
        self.acked: Counter[str] = Counter()
        self.last: dict[str, AbstractIncomingMessage] = {}

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        key = message.message_id or ""
        self.arrivals.setdefault(key, []).append(time.monotonic())
        self.last[key] = message
        n = self.succeed_on(key)
        if n is not None and len(self.arrivals[key]) >= n:
            self.acked[key] += 1
            await message.ack()
        else:
            await message.reject(requeue=False)


@pytest.fixture
def setup() -> Setup:
    return Setup()


@pytest.fixture
async def consuming(
    amqp: AbstractRobustConnection,
) -> AsyncIterator[Callable[[str, Consumer], Any]]:
    """Start a consumer on a queue, on a channel of its own; stopped afterwards."""
    channels: list[Any] = []

    async def start(queue: str, consumer: Consumer) -> None:
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=50)
        channels.append(channel)
        declared = await channel.get_queue(queue, ensure=False)
        await declared.consume(consumer)

    yield start
    for channel in channels:
        with contextlib.suppress(Exception):
            await channel.close()


async def publish(exchange: aio_pika.abc.AbstractExchange, *ids: str, **extra: Any) -> None:
    for message_id in ids:
        await exchange.publish(
            aio_pika.Message(
                f'{{"id": "{message_id}"}}'.encode(),
                message_id=message_id,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                **extra,
            ),
            routing_key="",
        )


async def test_a_rejected_message_comes_back_to_its_own_queue_only_with_the_planned_gaps(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """Rejected twice, it arrives three times, 0.5 s then 1 s apart; the fanout's other queue
    gets it once: the worker sends it back by the default exchange, never the fanout."""
    config = setup.config()
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: 3)
    audit = Consumer(lambda _: 1)
    try:
        async with RetryWorker(config, url=rabbit_url):
            await consuming(setup.queue, consumer)
            await consuming(setup.audit, audit)
            await publish(fanout, "m1", "m2")
            await eventually(lambda: sum(consumer.acked.values()) == 2, 20, "both acked")
            for key in ("m1", "m2"):
                times = consumer.arrivals[key]
                assert len(times) == 3
                gaps = [b - a for a, b in itertools.pairwise(times)]
                for gap, planned in zip(gaps, (0.5, 1.0), strict=True):
                    assert planned - 0.05 <= gap < planned + LATE_SLACK_MS / 1000, gaps
                assert h.read_attempt(consumer.last[key].headers) == 2
            await asyncio.sleep(0.3)  # an extra copy would land within a tick or two
            assert dict(audit.acked) == {"m1": 1, "m2": 1}
            assert {k: len(v) for k, v in consumer.arrivals.items()} == {"m1": 3, "m2": 3}
            assert await queue_depth(amqp, f"{setup.queue}.dlq") == 0
            assert await queue_depth(amqp, intake_dlq_name(setup.prefix)) == 0
    finally:
        await setup.cleanup(amqp, config)


async def test_a_message_rejected_every_time_ends_in_its_dlq_with_the_dlq_headers(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """After max_attempts rejections: <queue>.dlq, reason exhausted, and dlq list reads it."""
    config = setup.config()
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: None)
    try:
        async with RetryWorker(config, url=rabbit_url):
            await consuming(setup.queue, consumer)
            await publish(fanout, "doomed", headers={"tenant": "acme"}, correlation_id="c-1")
            dlq = f"{setup.queue}.dlq"
            await eventually_async(lambda: _has(amqp, dlq, 1), 20, "the dead letter")
            listed = await run_cli("dlq", "list", setup.queue, "--json", url=rabbit_url)
            assert listed.status == 0, listed.stderr
            assert [(r["message_id"], r["reason"], r["attempts"]) for r in listed.rows()] == [
                ("doomed", "exhausted", 3)
            ]
            dead = await drain(amqp, dlq, 1)
        assert [m.message_id for m in dead] == ["doomed"]
        assert len(consumer.arrivals["doomed"]) == 3
        headers: dict[str, Any] = dict(dead[0].headers or {})
        assert headers[h.REASON] == "exhausted"
        assert headers[h.ATTEMPT] == 3
        assert headers[h.ORIGIN_QUEUE] == setup.queue
        assert headers[h.EXCEPTION] == "rejected"
        assert headers[h.ERROR] == f"rejected (requeue=false) by a consumer of {setup.queue}"
        assert [e["attempt"] for e in headers[h.HISTORY]] == [1, 2, 3]
        assert headers["tenant"] == "acme"
        assert not any(k.startswith(("x-death", "x-first-death")) for k in headers), headers
        assert dead[0].correlation_id == "c-1"
        assert dead[0].body == b'{"id": "doomed"}'
    finally:
        await setup.cleanup(amqp, config)


async def _has(connection: AbstractRobustConnection, queue: str, n: int) -> bool:
    return await queue_depth(connection, queue) >= n


async def test_a_quorum_queues_delivery_limit_is_poison_at_once(
    amqp: AbstractRobustConnection, setup: Setup, rabbit_url: str
) -> None:
    """A consumer that crashes on a message every time: dead-lettered as poison, no retry.

    The crash closes the consumer's channel with the message unacked: every RabbitMQ
    series counts that against the delivery limit (4.3 no longer counts a requeue)."""
    config = setup.config()
    arguments = {
        "x-queue-type": "quorum",
        "x-delivery-limit": 1,
        "x-dead-letter-exchange": setup.intake,
    }
    fanout = await setup.declare(amqp, arguments=arguments)
    deliveries: list[str] = []
    channel = await amqp.channel()
    try:
        async with RetryWorker(config, url=rabbit_url):
            await publish(fanout, "crasher")
            dlq = f"{setup.queue}.dlq"
            while not await _has(amqp, dlq, 1):
                crashing = await amqp.channel()
                queue = await crashing.get_queue(setup.queue, ensure=False)
                message = await queue.get(fail=False)
                if message is not None:
                    deliveries.append(message.message_id or "")
                # The crash: the channel goes with the message unacked.
                await crashing.close()
                await asyncio.sleep(0.05)
                assert len(deliveries) <= 3, "never dead-lettered"
            dead = await drain(amqp, dlq, 1)
        assert deliveries == ["crasher", "crasher"]  # x-delivery-limit=1: two deliveries
        headers = dict(dead[0].headers or {})
        assert (headers[h.REASON], headers[h.ATTEMPT], headers[h.EXCEPTION]) == (
            "poison",
            1,
            "delivery_limit",
        )
        assert await queue_depth(amqp, setup.queue) == 0
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)


async def test_a_forged_x_death_never_sends_a_message_to_a_queue_outside_the_allowlist(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """Dead-lettered from a queue the config does not name, or published straight to the
    intake queue, with an x-death naming an allowed queue: the intake's DLQ, reason invalid.
    Publishing to the intake exchange itself is refused by the broker (it is internal)."""
    config = setup.config()
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: 1)
    outsider = unique("outsider")
    setup.declared.append(outsider)
    forged: dict[str, Any] = {
        "x-death": [{"queue": setup.queue, "reason": "rejected", "count": 1}],
        "x-first-death-queue": setup.queue,
    }
    channel = await amqp.channel()
    try:
        async with RetryWorker(config, url=rabbit_url):
            await consuming(setup.queue, consumer)
            evil = await channel.declare_queue(
                outsider, durable=True, arguments={"x-dead-letter-exchange": setup.intake}
            )
            await channel.default_exchange.publish(
                aio_pika.Message(b"1", message_id="via-outsider", headers=forged),
                routing_key=outsider,
            )
            taken = await evil.get(timeout=5)
            await taken.reject(requeue=False)
            await channel.default_exchange.publish(
                aio_pika.Message(b"2", message_id="straight-in", headers=forged),
                routing_key=setup.intake,
            )
            refused = await drain(amqp, intake_dlq_name(setup.prefix), 2)
            side = await amqp.channel()
            intake = await side.get_exchange(setup.intake, ensure=False)
            with pytest.raises(ChannelAccessRefused, match="internal exchange"):
                await intake.publish(aio_pika.Message(b"3", headers=forged), routing_key="")
            await publish(fanout, "control")  # the queue works: a control message is handled
            await eventually(lambda: consumer.acked["control"] == 1, 10, "the control message")
        assert sorted(m.message_id or "" for m in refused) == ["straight-in", "via-outsider"]
        origins = {m.message_id: dict(m.headers or {})[h.ORIGIN_QUEUE] for m in refused}
        # RabbitMQ's word for the outsider; the forged one is not believed.
        assert origins == {"via-outsider": outsider, "straight-in": setup.intake}
        for message in refused:
            assert dict(message.headers or {})[h.REASON] == "invalid"
        errors = {m.message_id: str(dict(m.headers or {})[h.ERROR]) for m in refused}
        assert "the default exchange" in errors["straight-in"]
        assert f"dead-lettered from {outsider!r}" in errors["via-outsider"]
        assert set(consumer.arrivals) == {"control"}
        assert await queue_depth(amqp, f"{setup.queue}.dlq") == 0
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)


# Three rabbitmqctl runs, each an Erlang VM that boots: on a loaded CI machine one took
# over a minute (the clear_policy, twice), which a 120 s bound does not leave room for.
@pytest.mark.timeout(300)
async def test_a_queue_opted_in_by_a_policy_is_retried_without_being_redeclared(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """An existing queue declared with no dead-letter exchange: the policy --print-policy
    prints gives it one, and the queue keeps its declaration (redeclaring it as before works)."""
    ctl = script_broker_ctl(rabbit_url)
    if ctl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the script's broker, whose rabbitmqctl sets the policy")
        pytest.skip("needs the rabbitmqctl of the broker scripts/rabbitmq/start.sh runs")
    # A pattern, so the policy's own pattern must leave out the .retry and .dlq it matches.
    config = setup.config({"pattern": f"{setup.queue}*"})
    fanout = await setup.declare(amqp, arguments={})
    consumer = Consumer(lambda _: 2)
    command = shlex.split(policy_command(config))
    assert command[:2] == ["rabbitmqctl", "set_policy"]
    policy = command[-3]
    try:
        async with RetryWorker(config, url=rabbit_url):
            run_ctl(ctl, *command[1:])
            await consuming(setup.queue, consumer)
            await publish(fanout, "p1")
            await eventually(lambda: consumer.acked["p1"] == 1, 15, "the retried message")
        assert len(consumer.arrivals["p1"]) == 2
        listing = run_ctl(ctl, "list_queues", "name", "policy", "--no-table-headers").stdout
        policies = dict(line.split("\t", 1) for line in listing.split("\n") if "\t" in line)
        assert policies[setup.queue].strip() == policy
        for own in (f"{setup.queue}.retry", f"{setup.queue}.dlq", setup.intake):
            assert policies[own].strip() == "", own
        channel = await amqp.channel()
        await channel.declare_queue(setup.queue, durable=True)  # same declaration: no 406
        await channel.close()
    finally:
        run_ctl(ctl, "clear_policy", policy, check=False)
        await setup.cleanup(amqp, config)


async def test_a_pattern_queue_is_covered_on_its_first_dead_letter_and_again_after_a_restart(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """A queue a pattern names gets its .retry and .dlq when its first dead letter comes; a
    wait longer than one tier passes .retry, and a worker started later still releases it."""
    pattern_queue = f"{setup.queue}.eu"
    setup.declared.append(pattern_queue)
    config = setup.config(
        {"pattern": f"{setup.queue}.*", "backoff": {"kind": "fixed", "delay": 1.5}}
    )
    await setup.declare(amqp, queue=pattern_queue)
    consumer = Consumer(lambda _: 2)
    channel = await amqp.channel()
    try:
        async with RetryWorker(config, url=rabbit_url) as worker:
            assert pattern_queue not in worker.plan.routes
            await consuming(pattern_queue, consumer)
            await channel.default_exchange.publish(
                aio_pika.Message(b"x", message_id="long"), routing_key=pattern_queue
            )
            await eventually(lambda: pattern_queue in worker.plan.routes, 10, "the route")
        # Stopped while the copy waits (1 s tier, then .retry, then 0.5 s): a new worker
        # finds the queue in the registry and consumes its .retry from the start.
        async with RetryWorker(config, url=rabbit_url) as again:
            assert pattern_queue in again.plan.routes
            await eventually(lambda: consumer.acked["long"] == 1, 15, "the long wait")
        times = consumer.arrivals["long"]
        assert len(times) == 2
        assert times[1] - times[0] >= 1.45
        assert await queue_depth(amqp, f"{pattern_queue}.retry") == 0
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)


async def test_each_step_continues_the_messages_trace_and_is_counted(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str
) -> None:
    """The spans of a retry, its release and the dead letter continue the traceparent the
    message carries, and each step is counted in the middleware's metrics."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    config = setup.config(defaults={"max_attempts": 2, "backoff": {"kind": "fixed", "delay": 0.5}})
    fanout = await setup.declare(amqp)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{trace_id}-00f067aa0ba902b7-01"
    try:
        async with RetryWorker(
            config,
            url=rabbit_url,
            tracer_provider=provider,
            meter_provider=MeterProvider(metric_readers=[reader]),
        ):
            await consuming(setup.queue, Consumer(lambda _: None))
            await publish(fanout, "traced", headers={"traceparent": parent})
            await eventually(lambda: len(exporter.get_finished_spans()) >= 3, 15, "three spans")
        spans = exporter.get_finished_spans()
        assert [s.name for s in spans] == [
            f"{setup.queue} retry scheduled",
            f"{setup.queue} retry release",  # the re-check step releases it
            f"{setup.queue} dead-letter",
        ]
        assert all(format(s.context.trace_id, "032x") == trace_id for s in spans)
        parents = [s.parent.span_id if s.parent else None for s in spans]
        assert format(parents[0] or 0, "016x") == "00f067aa0ba902b7"
        # Each copy carries its step's context on: one chain from the producer's span.
        assert parents[1:] == [spans[0].context.span_id, spans[1].context.span_id]
        # Classified as the middleware classifies: an exhausted message's failures were
        # transient (they could have passed), in its span and in the failures counter.
        verdicts = [(s.attributes or {}).get(ATTR.CLASSIFICATION) for s in spans]
        assert verdicts == ["transient", None, "transient"]
        # And the middleware's metrics, with the same names and labels.
        found = points(reader)
        queue = {ATTR.QUEUE: setup.queue}
        assert total(found, METRICS.SCHEDULED, **queue) == 1
        assert total(found, METRICS.RELEASED, **queue) == 1
        assert total(found, METRICS.DEAD_LETTERED, **queue, **{ATTR.REASON: "exhausted"}) == 1
        transient = {ATTR.CLASSIFICATION: "transient"}
        assert total(found, METRICS.FAILURES, **queue, **transient) == 2
    finally:
        await setup.cleanup(amqp, config)


def _start_worker(config_path: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [*script(), "worker", "--config", str(config_path), "--url", url],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment(url),
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


PREFETCH = 20
"""The workers' prefetch in the kill test: it bounds what a killed worker leaves twice."""


async def test_two_replicas_and_a_worker_killed_mid_flight_lose_nothing(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str, tmp_path: Path
) -> None:
    """Two workers share the intake; one is SIGKILLed while hundreds of messages are in
    flight and a third starts: every message is handled (count by id), nothing is left in
    the intake, the tiers or a DLQ, and SIGTERM stops the others cleanly (exit 0)."""
    total = 300
    config_path = tmp_path / "retry.toml"
    config_path.write_text(
        f'prefix = "{setup.prefix}"\ntick = 0.25\nmax_delay = 60\nprefetch = {PREFETCH}\n'
        "[defaults]\nmax_attempts = 5\n"
        'backoff = { kind = "fixed", delay = "500ms" }\n'
        f'[[queues]]\nname = "{setup.queue}"\n'
    )
    config = setup.config()
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: 3)
    log = tmp_path / "workers.log"
    workers = [_start_worker(config_path, rabbit_url, log) for _ in range(2)]
    try:
        await eventually_async(
            lambda: _consumers(amqp, setup.intake, 2), 30, "two workers consuming the intake"
        )
        await consuming(setup.queue, consumer)
        ids = [f"r{i}" for i in range(total)]
        await publish(fanout, *ids)
        await eventually(
            lambda: sum(len(t) for t in consumer.arrivals.values()) > total * 1.5,
            30,
            "retries in flight",
        )
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        workers.append(_start_worker(config_path, rabbit_url, log))
        # A SIGTERM before the new worker has set its handlers would end it with -15, not 0.
        await eventually_async(
            lambda: _consumers(amqp, setup.intake, 2), 30, "the new worker and the other consuming"
        )
        await eventually(lambda: len(consumer.acked) == total, 60, "every message handled")
        # A copy the killed worker left twice may still be on its way round: wait for it.
        waiting = [setup.intake, f"{setup.queue}.retry", setup.queue]
        waiting += [f"{setup.prefix}.delay.{ttl}" for ttl in config.tiers.ttls_ms]
        for queue in waiting:
            await eventually_async(functools.partial(_empty, amqp, queue), 20, f"{queue} empty")
        for process in workers[1:]:
            process.send_signal(signal.SIGTERM)
        for process in workers[1:]:
            assert process.wait(45) == 0, log.read_text()[-3000:]
        assert set(consumer.acked) == set(ids)
        assert await queue_depth(amqp, f"{setup.queue}.dlq") == 0
        assert await queue_depth(amqp, intake_dlq_name(setup.prefix)) == 0
        assert "Traceback" not in log.read_text()
        # Each delivery the killed worker held unacked (at most PREFETCH on its intake
        # channel and as many on its .retry channel) may have had its copy confirmed, or
        # routed before its confirm came: the broker delivers it again, and that message
        # goes round twice. No more than that: a copy twice, never a loop.
        assert sum(consumer.acked.values()) - total <= 2 * PREFETCH
    finally:
        for process in workers:
            _stop(process)
        await setup.cleanup(amqp, config)


async def _consumers(connection: AbstractRobustConnection, queue: str, n: int) -> bool:
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except Exception:  # not declared yet
        return False
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return bool(declared.declaration_result.consumer_count == n)


async def _empty(connection: AbstractRobustConnection, queue: str) -> bool:
    return await queue_depth(connection, queue) == 0


async def test_the_deployed_worker_runs_where_faststream_cannot_be_imported(
    amqp: AbstractRobustConnection, setup: Setup, consuming: Any, rabbit_url: str, tmp_path: Path
) -> None:
    """``faststream-retry worker`` in a process where importing FastStream raises (and is
    written down): it retries a rejected message back to its queue, stops with exit 0, and
    never tried to import FastStream."""
    refusal = refuse_faststream(tmp_path / "refuse")
    config_path = tmp_path / "retry.toml"
    config_path.write_text(
        f'prefix = "{setup.prefix}"\ntick = 0.25\nmax_delay = 60\n'
        "[defaults]\nmax_attempts = 3\n"
        'backoff = { kind = "fixed", delay = "250ms" }\n'
        f'[[queues]]\nname = "{setup.queue}"\n'
    )
    config = setup.config()
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: 2)
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [*script(), "worker", "--config", str(config_path), "--url", rabbit_url],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **environment(rabbit_url),
                "PYTHONPATH": refusal.pythonpath,
            },
        )
    try:
        await eventually_async(
            lambda: _consumers(amqp, setup.intake, 1), 30, "the worker consuming its intake"
        )
        await consuming(setup.queue, consumer)
        await publish(fanout, "m1")
        await eventually(lambda: consumer.acked["m1"] == 1, 20, "m1 retried and acked")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-3000:]
        assert refusal.installed  # else "nothing tried" would prove nothing
        assert refusal.tried == ""
        assert len(consumer.arrivals["m1"]) == 2
        assert "Traceback" not in log.read_text()
    finally:
        _stop(worker)
        await setup.cleanup(amqp, config)


@pytest.mark.exclusive
async def test_the_worker_comes_back_after_the_broker_drops_its_connections(
    amqp: AbstractRobustConnection, setup: Setup, rabbit_url: str
) -> None:
    """Connections closed while copies wait between tiers: the re-check consumers come back
    and send them home, and the intake is consumed again (later rejections are retried)."""
    ctl = script_broker_ctl(rabbit_url)
    if ctl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the script's broker, whose rabbitmqctl closes connections")
        pytest.skip("needs the rabbitmqctl of the broker scripts/rabbitmq/start.sh runs")
    # 1.5 s is the 1 s tier, .retry, then the 0.5 s tier: the re-check consumer's job.
    config = setup.config(defaults={"max_attempts": 3, "backoff": {"kind": "fixed", "delay": 1.5}})
    fanout = await setup.declare(amqp)
    consumer = Consumer(lambda _: 2)
    before = [f"b{i}" for i in range(20)]
    after = [f"a{i}" for i in range(5)]
    fresh: AbstractRobustConnection | None = None
    try:
        async with RetryWorker(config, url=rabbit_url):
            first = await amqp.channel()
            work = await first.get_queue(setup.queue, ensure=False)
            await work.consume(consumer)
            await publish(fanout, *before)
            await eventually(lambda: len(consumer.arrivals) == 20, 10, "the first rejections")
            await first.close()  # the test's own consumer is not what is under test
            await close_all_connections(ctl, "test: drop everyone")
            # The test's connection was dropped too: a new one, rather than wait for it.
            fresh = await aio_pika.connect_robust(rabbit_url)
            second = await fresh.channel()
            work = await second.get_queue(setup.queue, ensure=False)
            await work.consume(consumer)
            await eventually(lambda: set(consumer.acked) == set(before), 40, "the waiting ones")
            await publish(await second.get_exchange(setup.fanout), *after)
            await eventually(
                lambda: set(consumer.acked) == {*before, *after}, 40, "retries after it"
            )
        assert await queue_depth(fresh, f"{setup.queue}.dlq") == 0
        assert await queue_depth(fresh, f"{setup.queue}.retry") == 0
        assert await queue_depth(fresh, setup.intake) == 0
    finally:
        if fresh is not None:
            await setup.cleanup(fresh, config)
            await fresh.close()


async def test_a_retry_due_while_its_queue_is_full_comes_back_once_there_is_room(
    amqp: AbstractRobustConnection, setup: Setup, rabbit_url: str
) -> None:
    """A queue that refuses publishes when full (x-overflow: reject-publish), which the worker
    cannot see: the release is refused, waits in a tier again, and arrives soon after there is
    room. With direct_release = true (a last tier delivering straight in) it failed: RabbitMQ
    held the refused copy in the tier for minutes."""
    config = setup.config(defaults={"max_attempts": 3, "backoff": {"kind": "fixed", "delay": 0.5}})
    await setup.declare(
        amqp,
        arguments={
            "x-dead-letter-exchange": setup.intake,
            "x-max-length": 1,
            "x-overflow": "reject-publish",
        },
    )
    channel = await amqp.channel()
    try:
        async with RetryWorker(config, url=rabbit_url):
            queue = await channel.get_queue(setup.queue, ensure=False)
            await channel.default_exchange.publish(
                aio_pika.Message(b"a", message_id="A"), routing_key=setup.queue
            )
            first = await queue.get(timeout=5)
            await first.reject(requeue=False)
            await channel.default_exchange.publish(  # the queue is full when A is due
                aio_pika.Message(b"b", message_id="B"), routing_key=setup.queue
            )
            await asyncio.sleep(1.5)  # A is due at 0.5 s: let its release be refused
            blocker = await queue.get(timeout=5)
            assert blocker.message_id == "B"
            await blocker.ack()
            room = time.monotonic()
            back = None
            while back is None and time.monotonic() < room + 10:
                back = await queue.get(fail=False)
                await asyncio.sleep(0.05)
            assert back is not None, "A did not come back within 10 s of there being room"
            assert back.message_id == "A"
            assert h.read_attempt(back.headers) == 1
            await back.ack()
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)


async def test_a_pattern_queue_whose_dlq_exists_otherwise_is_kept_in_the_intakes_dlq(
    amqp: AbstractRobustConnection, setup: Setup, rabbit_url: str
) -> None:
    """Its .dlq exists as a classic queue and the worker declares quorum ones: the dead letter
    is kept in the intake's DLQ with the reason, once, not retried every second."""
    pattern_queue = f"{setup.queue}.eu"
    setup.declared.append(pattern_queue)
    config = setup.config({"pattern": f"{setup.queue}.*"})
    await setup.declare(amqp, queue=pattern_queue)
    channel = await amqp.channel()
    await channel.declare_queue(f"{pattern_queue}.dlq", durable=True)  # classic
    try:
        async with RetryWorker(config, url=rabbit_url):
            await channel.default_exchange.publish(
                aio_pika.Message(b"x", message_id="stuck"), routing_key=pattern_queue
            )
            queue = await channel.get_queue(pattern_queue, ensure=False)
            taken = await queue.get(timeout=5)
            await taken.reject(requeue=False)
            kept = await drain(amqp, intake_dlq_name(setup.prefix), 1)
            await asyncio.sleep(0.5)  # a second copy would follow within the pause
            assert await queue_depth(amqp, intake_dlq_name(setup.prefix)) == 0
        assert [m.message_id for m in kept] == ["stuck"]
        headers = dict(kept[0].headers or {})
        assert headers[h.REASON] == "invalid"
        assert headers[h.ORIGIN_QUEUE] == pattern_queue
        assert str(headers[h.ERROR]).startswith(f"cannot retry in {pattern_queue!r}: ")
        assert await queue_depth(amqp, f"{pattern_queue}.dlq") == 0
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)


async def test_a_message_whose_headers_fill_the_frame_never_stalls_the_worker(
    amqp: AbstractRobustConnection, setup: Setup, rabbit_url: str
) -> None:
    """The issue's 130.7 KB header, rejected by a plain consumer, beside 50 ordinary ones.

    RabbitMQ's own x-death takes the delivery past frame_max on its way into the intake;
    the worker's copy cannot fit even lean. At once, that message is in <queue>.dlq as
    invalid (HeadersTooLarge), its big header left out and named, its body and small
    header as they were; the 50 others each arrive three times and are dead-lettered
    once. No delivery is ever a redelivery and the worker's channels never reopen: no
    connection was closed. Nothing is left in the intake or its DLQ.
    """
    config = setup.config(defaults={"max_attempts": 3, "backoff": {"kind": "fixed", "delay": 0.25}})
    fanout = await setup.declare(amqp)
    arrivals: Counter[str] = Counter()
    redelivered: list[bool] = []

    async def reject(message: AbstractIncomingMessage) -> None:
        arrivals[message.message_id or ""] += 1
        redelivered.append(bool(message.redelivered))
        await message.reject(requeue=False)

    channel = await amqp.channel()
    await channel.set_qos(prefetch_count=50)
    await (await channel.get_queue(setup.queue, ensure=False)).consume(reject)
    small = [f"small-{n}" for n in range(50)]
    try:
        async with RetryWorker(config, url=rabbit_url) as worker:
            limit = await frame_payload_limit(amqp)
            # Its copy into the queue takes room 40 below the limit; the fanout is not
            # in the frame, so the copy the consumer sees is the same.
            await fanout.publish(big_message(limit, 40, "big"), routing_key="")
            await publish(fanout, *small)
            dead = await drain(amqp, f"{setup.queue}.dlq", expect=51, timeout=30)
            assert worker.live is not None
            assert worker.live.channels.generation == 1
        assert Counter(m.message_id for m in dead) == dict.fromkeys(["big", *small], 1)
        assert arrivals == {"big": 1, **dict.fromkeys(small, 3)}
        assert not any(redelivered)
        (big,) = [m for m in dead if m.message_id == "big"]
        headers: dict[str, Any] = dict(big.headers or {})
        assert (headers[h.REASON], headers[h.ATTEMPT]) == ("invalid", 1)
        assert headers[h.EXCEPTION] == "faststream_retry.HeadersTooLarge"
        assert str(headers[h.ERROR]).startswith(
            f"Left out to fit in a frame ({limit:,} bytes): 'big' ("
        )
        assert "it had failed with rejected" in str(headers[h.ERROR])
        assert "big" not in headers
        assert headers["keep"] == "me"
        assert big.body == BODY
        assert await queue_depth(amqp, setup.intake) == 0
        assert await queue_depth(amqp, intake_dlq_name(setup.prefix)) == 0
    finally:
        await channel.close()
        await setup.cleanup(amqp, config)
