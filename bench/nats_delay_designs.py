"""Delayed retries on NATS JetStream: the candidate designs of issue 39, side by side.

Each design runs the same scenarios against a real nats-server (2.9 and 2.15, started by
scripts/nats/start.sh when not running), with a real FastStream 0.7 ``NatsBroker``
JetStream subscriber as the work consumer (durable, ``max_ack_pending=100``):

- **stall**: 1,000 messages that fail once with a 60 s delay, then 1,000 good ones. When
  is each good one handled, how late are the 60 s retries, and what sits in whose pending
  set meanwhile (the most acks pending seen on the work consumer and on the re-check
  consumers, sampled every 0.25 s).
- **1 s**: 1,000 messages that fail once with a 1 s delay, published at 80 msg/s (--rate)
  so that the work consumer is never behind: how late is each retry. The baseline row is
  the same stream of messages that never fail: publish to handled, the consumer's own part.
- **burst**: 2,000 messages that fail once with a 1 s delay, published at once: the fail
  path (failures turned into confirmed copies per second) and the release (retries handled
  per second, first to last). Its lateness is mostly queueing: a copy released to the work
  subject waits behind the first attempts still in the work stream.
- **1 s+backlog**, **burst+backlog**: the same, with 100,000 copies (--backlog) already
  waiting an hour where the design keeps them (the 60 s tier; schedules in the work stream).

The designs:

- **a** ``nak(delay)``: the handler naks the failed message with the delay (JetStream's
  own answer). ``a-push`` is the same on a push consumer.
- **b** a delay stream per tier: the handler publishes a copy into the tier's stream,
  confirmed by its PubAck, and returns (FastStream acks the original). A re-check consumer
  per tier fetches, waits for its head's due time (every copy in a tier has the same
  delay, so nothing behind the head is due before it), publishes the copy back to the
  work subject (PubAck), then acks it. ``Nats-Msg-Id`` makes each publish idempotent.
- **c** scheduled messages (2.12+): the handler publishes the copy with ``Nats-Schedule:
  @at <due>`` (FastStream's ``Schedule``) on a subject of its own inside the work stream
  (the server refuses a target in another stream), confirmed by its PubAck; the server
  publishes it to the work subject when due. Also: what a restart does to schedules.
- **d** one delay stream for every tier, a subject and a filtered re-check consumer per
  tier: (b) with one stream to create and replicate instead of one per tier.
- **e** (b), but the re-check hands each due copy to the subscriber's own pipeline
  (FastStream's ``consume``) instead of publishing it back to the work subject: one hop
  fewer, and no other consumer of that subject sees the retry.
- **f** (d), releasing each due copy (PubAck) to a ready subject of the subscriber's own in
  the delay stream, read by a consumer of the plugin's that hands it to the subscriber's
  pipeline: one re-check consumer per tier for every subscriber, and only the failing
  subscriber sees its retry.

Then what dead letters cost, a stream per covered stream against one shared, and whether
a dead-letter stream lists without consuming (an ordered consumer, direct get); with
--cluster, the same with R3 streams on a three-node cluster (scripts/nats/cluster.sh,
NATS_CLUSTER_PORT), and on 2.12+ schedules in an R3 stream whose leader is killed.

    python -m bench.nats_delay_designs [--designs a,a-push,b,c,d,e,f] [--servers 2.9,2.15]
        [--scenarios stall,1 s,burst,1 s+backlog,burst+backlog] [--stall-window 75]
        [--full-stall] [--skip-restart] [--skip-dlq] [--cluster 2.9,2.15] [--rounds 1]

Servers: NATS_URL_2_9 (default nats://127.0.0.1:4301) and NATS_URL_2_15 (4302); one
started here is stopped at the end. Timing on a shared machine is noisy: repeat a run
(--rounds) and compare the designs within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from faststream.nats import (
    ConsumerConfig,
    JStream,
    NatsBroker,
    NatsMessage,
    PullSub,
    RetentionPolicy,
    Schedule,
    StorageType,
    StreamConfig,
)
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from rich.console import Console
from typing_extensions import override

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "nats"
DEFAULT_PORTS = {"2.9": 4301, "2.15": 4302}
MAX_ACK_PENDING = 100
PULL_BATCH = 20
RECHECK_BATCH = 200
RECHECK_ACK_WAIT = 30.0
# JetStream API calls (creating, deleting streams) wait this long: the machine is shared.
JS_TIMEOUT = 30.0
BODY = b"x" * 256
console = Console(stderr=True)

# Header names, as the plugin writes them (core/headers.py spells the RabbitMQ ones).
ID = "bench-id"
BAD = "bench-bad"
ATTEMPT = "retry-attempt"
DUE = "retry-due"


# ---------------------------------------------------------------- servers


@dataclass
class Server:
    series: str
    url: str
    port: int
    version: str = ""
    started_here: bool = False

    @property
    def base(self) -> Path:
        return Path(tempfile.gettempdir()) / f"nats-test-{self.port}"

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.base / "nats.pid").read_text())
        return None

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system), 0 when it is not ours to read."""
        pid = self.pid()
        if pid is None:
            return 0.0
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return 0.0

    def rss_mb(self) -> float:
        pid = self.pid()
        if pid is None:
            return 0.0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def store_mb(self) -> float:
        total = 0
        # The server creates and renames files as we walk: skip what vanished.
        for folder, _, files in os.walk(self.base / "data"):
            for name in files:
                with contextlib.suppress(OSError):
                    total += (Path(folder) / name).stat().st_size
        return total / 2**20


def script(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def ensure_server(series: str) -> Server:
    env_name = "NATS_URL_" + series.replace(".", "_")
    url = os.environ.get(env_name, f"nats://127.0.0.1:{DEFAULT_PORTS[series]}")
    port = int(url.rsplit(":", 1)[1].strip("/"))
    done = script("start.sh", {"NATS_PORT": str(port), "NATS_SERIES": series})
    if done.returncode != 0:
        raise SystemExit(f"nats-server {series} did not start on {port}:\n{done.stderr}")
    return Server(series, url, port, started_here="reusing" not in done.stderr)


def restart_server(server: Server, signal: str, down_for: float = 0.0) -> float:
    """Stop the server (its store kept) with SIGTERM or SIGKILL, then start it again.

    Returns how long it was down.
    """
    t0 = time.time()
    env = {"NATS_PORT": str(server.port), "NATS_KEEP_DATA": "1", "NATS_SIGNAL": signal}
    if script("stop.sh", env).returncode != 0:
        raise RuntimeError("stop.sh failed")
    time.sleep(down_for)
    done = script(
        "start.sh", {"NATS_PORT": str(server.port), "NATS_SERIES": server.series, "NATS_FRESH": "0"}
    )
    if done.returncode != 0:
        raise RuntimeError(f"start.sh failed:\n{done.stderr}")
    return time.time() - t0


# ---------------------------------------------------------------- bookkeeping


@dataclass
class Tracker:
    """What happened to each message, by id (wall-clock times: due times travel in headers)."""

    failed: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    copied: dict[str, float] = field(default_factory=dict)
    published: dict[str, float] = field(default_factory=dict)

    def handled(self, key: str) -> None:
        if key in self.done:
            self.duplicates += 1
        else:
            self.done[key] = time.time()

    def lateness_ms(self, keys: list[str]) -> list[float]:
        return sorted(
            (self.done[k] - self.due[k]) * 1000 for k in keys if k in self.done and k in self.due
        )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def publish_all(
    js: JetStreamContext, subject: str, keys: list[str], tracker: Tracker, *, bad: bool, rate: float
) -> None:
    """Publish one message per key, each confirmed by its PubAck.

    rate=0: as fast as the server takes them (250 in flight); else rate messages a second.
    """

    async def one(key: str) -> None:
        tracker.published[key] = time.time()
        await js.publish(subject, BODY, headers={ID: key, BAD: "1" if bad else "0"})

    if not rate:
        for start in range(0, len(keys), 250):
            await asyncio.gather(*(one(k) for k in keys[start : start + 250]))
        return
    t0 = time.monotonic()
    for i, key in enumerate(keys):
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        await one(key)


async def delete_streams(js: JetStreamContext, *names: str) -> None:
    for name in names:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)


# ---------------------------------------------------------------- designs


class Design:
    """One way of holding a failed message until its retry is due."""

    key = ""
    label = ""
    push = False
    needs = (2, 9)

    def __init__(self, run: str) -> None:
        self.run = run
        self.work_stream = f"W_{run}"
        self.work_subject = f"w.{run}.work"
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self.recheck_durables: list[tuple[str, str]] = []

    def streams(self) -> list[StreamConfig]:
        return [self.work_config([self.work_subject])]

    def work_config(self, subjects: list[str]) -> StreamConfig:
        return StreamConfig(
            name=self.work_stream,
            subjects=subjects,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )

    def attempt(self, msg: NatsMessage) -> int:
        return int(msg.headers.get(ATTEMPT, "1"))

    async def start(self, js: JetStreamContext) -> None:
        """Start what runs beside the work consumer (re-check consumers)."""

    def backlog_message(self, key: str, due: float) -> tuple[str, dict[str, str]]:
        """The subject and headers of a copy waiting for its retry until due."""
        raise NotImplementedError

    async def fill_backlog(self, js: JetStreamContext, n: int) -> None:
        """n copies that fail once and wait an hour, 1,000 publishes in flight."""
        due = time.time() + 3600
        for start in range(0, n, 1000):
            copies = [
                self.backlog_message(f"k{i}", due) for i in range(start, min(n, start + 1000))
            ]
            await asyncio.gather(*(js.publish(s, BODY, headers=h) for s, h in copies))

    async def fail(self, broker: NatsBroker, msg: NatsMessage, key: str, delay: float) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        self.stop.set()
        if self.tasks:
            # A loop ends at its next fetch's timeout; one waiting on a head is cancelled.
            _, pending = await asyncio.wait(self.tasks, timeout=2)
            for task in pending:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await task

    def all_streams(self) -> list[str]:
        return [str(c.name) for c in self.streams()]


class NakDelay(Design):
    key = "a"
    label = "nak(delay)"

    def attempt(self, msg: NatsMessage) -> int:
        raw: Msg = msg.raw_message
        return int(raw.metadata.num_delivered)

    @override
    async def fail(self, broker: NatsBroker, msg: NatsMessage, key: str, delay: float) -> None:
        await msg.nack(delay=delay)


class NakDelayPush(NakDelay):
    key = "a-push"
    label = "nak(delay), push consumer"
    push = True


async def hold_until(due: float, held: list[Msg]) -> None:
    """Sleep until due, telling the server every RECHECK_ACK_WAIT / 3 that held is in progress."""
    while (left := due - time.time()) > 0:
        await asyncio.sleep(min(left, RECHECK_ACK_WAIT / 3))
        if due - time.time() > 0:
            await asyncio.gather(*(m.in_progress() for m in held))


def copy_headers(msg: NatsMessage, key: str, attempt: int, due: float) -> dict[str, str]:
    return {ID: key, BAD: msg.headers.get(BAD, "0"), ATTEMPT: str(attempt), DUE: f"{due:.6f}"}


class TierStreams(Design):
    """A delay stream per tier, each read by its own re-check consumer."""

    key = "b"
    label = "delay stream per tier + re-check"
    tiers = (1, 60)

    def tier_stream(self, tier: int) -> str:
        return f"D_{self.run}_{tier}s"

    def tier_subject(self, tier: int) -> str:
        return f"w.{self.run}.delay.{tier}s"

    def streams(self) -> list[StreamConfig]:
        return [
            *super().streams(),
            *(
                StreamConfig(
                    name=self.tier_stream(t),
                    subjects=[self.tier_subject(t)],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                )
                for t in self.tiers
            ),
        ]

    async def start(self, js: JetStreamContext) -> None:
        for tier in self.tiers:
            durable = f"recheck_{tier}s"
            self.recheck_durables.append((self.tier_stream(tier), durable))
            sub = await js.pull_subscribe(
                self.tier_subject(tier),
                durable=durable,
                stream=self.tier_stream(tier),
                # Short, whatever the tier: a held copy is kept alive by in_progress, so
                # the copies of a re-check that died come back within RECHECK_ACK_WAIT.
                config=ConsumerConfig(ack_wait=RECHECK_ACK_WAIT, max_ack_pending=-1),
            )
            self.tasks.append(asyncio.create_task(self.recheck(js, sub)))

    async def recheck(self, js: JetStreamContext, sub: JetStreamContext.PullSubscription) -> None:
        while not self.stop.is_set():
            try:
                batch = await sub.fetch(RECHECK_BATCH, timeout=0.5)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            i = 0
            while i < len(batch):
                # Every copy in a tier has the tier's delay: nothing behind the head is due
                # before it, so waiting for the head holds back no due copy.
                await hold_until(float((batch[i].headers or {})[DUE]), batch[i:])
                now = time.time()
                j = i
                while j < len(batch) and float((batch[j].headers or {})[DUE]) <= now:
                    j += 1
                await self.release_all(js, batch[i:j])
                i = j

    async def release_all(self, js: JetStreamContext, due: list[Msg]) -> None:
        # Each copy confirmed on the work subject before its tier message is acked.
        await asyncio.gather(*(self.release(js, m) for m in due))
        await asyncio.gather(*(m.ack() for m in due))

    @override
    def backlog_message(self, key: str, due: float) -> tuple[str, dict[str, str]]:
        headers = {ID: key, BAD: "1", ATTEMPT: "2", DUE: f"{due:.6f}"}
        return self.tier_subject(self.tiers[-1]), headers

    async def release(self, js: JetStreamContext, m: Msg) -> None:
        headers = dict(m.headers or {})
        headers["Nats-Msg-Id"] = f"{headers[ID]}:{headers[ATTEMPT]}:release"
        await js.publish(self.work_subject, m.data, headers=headers, stream=self.work_stream)

    async def fail(self, broker: NatsBroker, msg: NatsMessage, key: str, delay: float) -> None:
        tier = int(delay)
        due = time.time() + delay
        headers = copy_headers(msg, key, 2, due)
        headers["Nats-Msg-Id"] = f"{key}:2:copy"
        await broker.publish(
            msg.body, self.tier_subject(tier), headers=headers, stream=self.tier_stream(tier)
        )


class OneDelayStream(TierStreams):
    """One delay stream with a subject per tier; a filtered re-check consumer per tier."""

    key = "d"
    label = "one delay stream, subject per tier"

    @override
    def tier_stream(self, tier: int) -> str:
        return f"D_{self.run}"

    def streams(self) -> list[StreamConfig]:
        return [
            self.work_config([self.work_subject]),
            StreamConfig(
                name=f"D_{self.run}",
                subjects=[self.tier_subject(t) for t in self.tiers],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
            ),
        ]


class HandOver(TierStreams):
    """(b), but the re-check hands each due copy to the subscriber's own pipeline.

    No release publish, and no other consumer of the work subject ever sees the copy: the
    handler runs on the tier message itself, which FastStream acks when it succeeds.
    """

    key = "e"
    label = "delay stream per tier, re-check runs the handler"
    subscriber: Any = None

    @override
    async def release_all(self, js: JetStreamContext, due: list[Msg]) -> None:
        await asyncio.gather(*(self.subscriber.consume(m) for m in due))


class ReadySubject(OneDelayStream):
    """(d), releasing each due copy to a ready subject of the subscriber's own in the delay
    stream, where a consumer of the plugin's hands it to the subscriber's pipeline.

    One re-check consumer per tier serves every subscriber; only the failing subscriber
    sees its retry; nothing is added to the work stream or its consumers.
    """

    key = "f"
    label = "one delay stream, ready subject per subscriber, handed over"
    subscriber: Any = None

    @property
    def ready_subject(self) -> str:
        return f"w.{self.run}.ready.work"

    @override
    def streams(self) -> list[StreamConfig]:
        work, delay = super().streams()
        delay.subjects = [*(delay.subjects or []), self.ready_subject]
        return [work, delay]

    @override
    async def start(self, js: JetStreamContext) -> None:
        await super().start(js)
        self.recheck_durables.append((self.tier_stream(0), "ready"))
        sub = await js.pull_subscribe(
            self.ready_subject,
            durable="ready",
            stream=self.tier_stream(0),
            config=ConsumerConfig(ack_wait=RECHECK_ACK_WAIT, max_ack_pending=1000),
        )
        self.tasks.append(asyncio.create_task(self.hand_over(sub)))

    async def hand_over(self, sub: JetStreamContext.PullSubscription) -> None:
        while not self.stop.is_set():
            try:
                batch = await sub.fetch(PULL_BATCH, timeout=0.5)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            # The subscriber's own pipeline acks each one when its handler succeeds.
            await asyncio.gather(*(self.subscriber.consume(m) for m in batch))

    @override
    async def release(self, js: JetStreamContext, m: Msg) -> None:
        headers = dict(m.headers or {})
        headers["Nats-Msg-Id"] = f"{headers[ID]}:{headers[ATTEMPT]}:release"
        await js.publish(self.ready_subject, m.data, headers=headers, stream=self.tier_stream(0))


class Scheduled(Design):
    """NATS 2.12+ message schedules, inside the work stream."""

    key = "c"
    label = "Nats-Schedule (2.12+)"
    needs = (2, 12)

    @property
    def schedule_prefix(self) -> str:
        return f"w.{self.run}.schedule"

    def streams(self) -> list[StreamConfig]:
        config = self.work_config([self.work_subject, f"{self.schedule_prefix}.>"])
        config.allow_msg_schedules = True
        return [config]

    @override
    def backlog_message(self, key: str, due: float) -> tuple[str, dict[str, str]]:
        at = dt.datetime.fromtimestamp(due, dt.timezone.utc).isoformat()
        headers = {ID: key, "Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": self.work_subject}
        return f"{self.schedule_prefix}.{key}.2", headers

    async def fail(self, broker: NatsBroker, msg: NatsMessage, key: str, delay: float) -> None:
        due = time.time() + delay
        # A schedule's subject is its identity (one schedule per subject): one per copy.
        await broker.publish(
            msg.body,
            f"{self.schedule_prefix}.{key}.2",
            headers={**copy_headers(msg, key, 2, due), "Nats-Msg-Id": f"{key}:2:copy"},
            stream=self.work_stream,
            schedule=Schedule(dt.datetime.fromtimestamp(due, dt.timezone.utc), self.work_subject),
        )


DESIGNS: dict[str, type[Design]] = {
    d.key: d
    for d in (
        NakDelay,
        NakDelayPush,
        TierStreams,
        Scheduled,
        OneDelayStream,
        HandOver,
        ReadySubject,
    )
}


# ---------------------------------------------------------------- one scenario


@dataclass
class Result:
    design: str
    server: str
    scenario: str
    figures: dict[str, float] = field(default_factory=dict)
    note: str = ""


class Sampler:
    """The most acks pending seen on each consumer, polled every 0.25 s while it runs."""

    def __init__(self, js: JetStreamContext, consumers: dict[str, tuple[str, str]]) -> None:
        self.js = js
        self.consumers = consumers
        self.peak: dict[str, int] = dict.fromkeys(consumers, 0)
        self.task: asyncio.Task[None] | None = None

    async def loop(self) -> None:
        while True:
            for role, (stream, durable) in self.consumers.items():
                with contextlib.suppress(Exception):  # a consumer not created yet
                    info = await self.js.consumer_info(stream, durable)
                    self.peak[role] = max(self.peak[role], info.num_ack_pending or 0)
            await asyncio.sleep(0.25)

    def start(self) -> None:
        self.task = asyncio.create_task(self.loop())

    def stop(self) -> None:
        if self.task:
            self.task.cancel()


@dataclass(frozen=True)
class Scenario:
    """n_bad messages that fail once with delay, then n_good that never fail."""

    name: str
    n_bad: int
    n_good: int
    delay: float
    wait: float
    rate: float = 0.0
    backlog: int = 0


async def scenario(server: Server, cls: type[Design], plan: Scenario) -> Result:
    slug = "".join(c for c in plan.name if c.isalnum())
    run = f"{cls.key.replace('-', '')}{slug}{uuid.uuid4().hex[:6]}"
    design = cls(run)
    nc: Client = await nats.connect(server.url)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    for config in design.streams():
        await js.add_stream(config)
    tracker = Tracker()
    broker = NatsBroker(server.url, logger=None)

    async def handle(msg: NatsMessage) -> None:
        key = msg.headers[ID]
        if msg.headers.get(BAD) == "1" and design.attempt(msg) == 1:
            tracker.failed[key] = time.time()
            tracker.due[key] = tracker.failed[key] + plan.delay
            await design.fail(broker, msg, key, plan.delay)
            tracker.copied[key] = time.time()
            return
        tracker.handled(key)

    subscriber = subscribe(broker, design, plan)
    subscriber(handle)
    if isinstance(design, HandOver | ReadySubject):
        design.subscriber = subscriber
    if plan.backlog:
        # Copies of earlier failures, due in an hour, waiting where this design keeps them.
        await design.fill_backlog(js, plan.backlog)
    await broker.start()
    await design.start(js)
    bad = [f"b{i}" for i in range(plan.n_bad)]
    good = [f"g{i}" for i in range(plan.n_good)]
    cpu0 = server.cpu_seconds()
    consumers = {"work": (design.work_stream, "work")}
    consumers |= {f"recheck {i}": c for i, c in enumerate(design.recheck_durables)}
    sampler = Sampler(js, consumers)
    sampler.start()
    try:
        t0 = time.time()
        await publish_all(js, design.work_subject, bad, tracker, bad=True, rate=plan.rate)
        await publish_all(js, design.work_subject, good, tracker, bad=False, rate=plan.rate)
        complete = await until(lambda: len(tracker.done) >= len(bad) + len(good), plan.wait)
        t_end = time.time()
    finally:
        sampler.stop()
    result = Result(cls.key, server.version, plan.name)
    if not complete:
        result.note = f"cut off after {plan.wait:.0f} s"
    result.figures = figures(tracker, bad, good)
    result.figures |= {
        "server cpu s": server.cpu_seconds() - cpu0,
        "work pending peak": sampler.peak["work"],
        "recheck pending peak": max((v for k, v in sampler.peak.items() if k != "work"), default=0),
        "total s": t_end - t0,
    }
    await design.close()
    await broker.stop()
    await delete_streams(js, *design.all_streams())
    await nc.close()
    return result


def subscribe(broker: NatsBroker, design: Design, plan: Scenario) -> Any:
    """The work consumer: durable, max_ack_pending=100, pull (or push)."""
    consumer = ConsumerConfig(max_ack_pending=MAX_ACK_PENDING, ack_wait=max(30.0, plan.delay + 30))
    stream = JStream(design.work_stream, declare=False)
    if design.push:
        return broker.subscriber(
            design.work_subject, stream=stream, durable="work", config=consumer
        )
    return broker.subscriber(
        design.work_subject,
        stream=stream,
        durable="work",
        config=consumer,
        pull_sub=PullSub(batch_size=PULL_BATCH, timeout=0.5),
    )


def figures(tracker: Tracker, bad: list[str], good: list[str]) -> dict[str, float]:
    out: dict[str, float] = {"duplicates": tracker.duplicates}
    if good:
        waited = [tracker.done[k] - tracker.published[k] for k in good if k in tracker.done]
        out["good handled"] = len(waited)
        out["good p50 s"] = pct(waited, 0.5)
        out["good max s"] = max(waited) if len(waited) == len(good) else float("nan")
    late = tracker.lateness_ms(bad)
    out["retried"] = len(late)
    out["late p50 ms"] = pct(late, 0.5)
    out["late p99 ms"] = pct(late, 0.99)
    out["late max ms"] = max(late) if late else float("nan")
    fails = sorted(tracker.copied.values())
    if len(fails) > 1:
        out["fail path msg/s"] = (len(fails) - 1) / (fails[-1] - fails[0])
    releases = sorted(tracker.done[k] for k in bad if k in tracker.done)
    if len(releases) > 1:
        out["release msg/s"] = (len(releases) - 1) / (releases[-1] - releases[0])
    return out


# ---------------------------------------------------------------- schedules across a restart


async def collect(
    sub: JetStreamContext.PullSubscription, n: int, deadline: float
) -> tuple[dict[str, float], int]:
    """Fetch and ack until n ids were seen or the deadline: when each first came, and repeats."""
    seen: dict[str, float] = {}
    dups = 0
    while len(seen) < n and time.time() < deadline:
        # While a server restarts or a cluster elects leaders: timeouts, no responders, 503s.
        with contextlib.suppress(asyncio.TimeoutError, nats.errors.Error):
            for m in await sub.fetch(250, timeout=0.5):
                key = (m.headers or {}).get(ID, "?")
                if key in seen:
                    dups += 1
                else:
                    seen[key] = time.time()
                await m.ack()
    return seen, dups


async def schedules_across_restart(
    server: Server, signal: str, n: int, due_in: float, down_for: float
) -> Result:
    """Publish n schedules due in due_in s, restart the server, and count what fires."""
    run = f"r{signal.lower()}{uuid.uuid4().hex[:6]}"
    design = Scheduled(run)
    nc = await nats.connect(server.url)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    for config in design.streams():
        await js.add_stream(config)
    await js.add_consumer(
        design.work_stream,
        ConsumerConfig(durable_name="work", filter_subject=design.work_subject, ack_wait=30),
    )
    due = time.time() + due_in
    at = dt.datetime.fromtimestamp(due, dt.timezone.utc).isoformat()
    for start in range(0, n, 250):
        await asyncio.gather(
            *(
                js.publish(
                    f"{design.schedule_prefix}.m{i}",
                    BODY,
                    headers={
                        ID: f"m{i}",
                        "Nats-Schedule": f"@at {at}",
                        "Nats-Schedule-Target": design.work_subject,
                    },
                )
                for i in range(start, min(n, start + 250))
            )
        )
    await nc.close()
    down = await asyncio.to_thread(restart_server, server, signal, down_for)
    nc = await nats.connect(server.url)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    sub = await js.pull_subscribe_bind("work", design.work_stream)
    seen, dups = await collect(sub, n, max(due, time.time()) + 30)
    late = sorted((t - due) * 1000 for t in seen.values())
    info = await js.stream_info(design.work_stream, subjects_filter=f"{design.schedule_prefix}.>")
    result = Result("c", server.version, f"restart SIG{signal}")
    result.figures = {
        "scheduled": n,
        "fired": len(seen),
        "duplicates": dups,
        "down s": down,
        "late p50 ms": pct(late, 0.5),
        "late max ms": max(late) if late else float("nan"),
        "schedules left": len(info.state.subjects or {}),
    }
    result.note = f"due {due_in:.0f} s after publishing; server down {down:.1f} s"
    await delete_streams(js, design.work_stream)
    await nc.close()
    return result


# ---------------------------------------------------------------- dead letters


async def dead_letter_cost(
    server: Server, covered: int, per_stream: int, replicas: int = 1
) -> list[Result]:
    """A dead-letter stream per covered stream against one shared, and listing without consuming.

    With replicas=3 (on a cluster) each stream is also a Raft group of its own.
    """
    results = []
    nc = await nats.connect(server.url)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    tag = uuid.uuid4().hex[:6]
    for layout in ("per stream", "shared"):
        names = (
            [f"DLQ_{tag}_{i}" for i in range(covered)] if layout == "per stream" else [f"DLQ_{tag}"]
        )
        subjects = [f"dlq.{tag}.s{i}" for i in range(covered)]
        rss0, store0 = server.rss_mb(), server.store_mb()
        t0 = time.perf_counter()
        if layout == "per stream":
            for name, subject in zip(names, subjects, strict=True):
                await js.add_stream(
                    StreamConfig(
                        name=name, subjects=[subject], allow_direct=True, num_replicas=replicas
                    )
                )
        else:
            await js.add_stream(
                StreamConfig(
                    name=names[0], subjects=subjects, allow_direct=True, num_replicas=replicas
                )
            )
        created = time.perf_counter() - t0

        t0 = time.perf_counter()
        for subject in subjects:
            await asyncio.gather(
                *(
                    js.publish(subject, BODY, headers={ID: f"{subject}.{i}", "retry-reason": "x"})
                    for i in range(per_stream)
                )
            )
        published = time.perf_counter() - t0
        await asyncio.sleep(0.5)
        rss1, store1 = server.rss_mb(), server.store_mb()

        # List one covered stream's dead letters, twice each way; nothing may move.
        stream = names[-1]
        subject = subjects[-1]
        before = await js.stream_info(stream)
        t0 = time.perf_counter()
        listed = await list_ordered(js, stream, subject, per_stream)
        ordered_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        direct = await list_direct(js, stream, subject)
        direct_s = time.perf_counter() - t0
        again = await list_direct(js, stream, subject)
        after = await js.stream_info(stream)
        untouched = (
            before.state.messages == after.state.messages
            and before.state.first_seq == after.state.first_seq
            and before.state.last_seq == after.state.last_seq
            and listed == direct == again == per_stream
        )
        # An ordered consumer is an ephemeral consumer on the server: it outlives the
        # unsubscribe until its inactivity threshold.
        left = after.state.consumer_count - before.state.consumer_count
        t0 = time.perf_counter()
        while (await js.stream_info(stream)).state.consumer_count > before.state.consumer_count:
            if time.perf_counter() - t0 > 30:
                break
            await asyncio.sleep(0.1)
        lingered = time.perf_counter() - t0
        result = Result("dlq", server.version, f"{layout}, R{replicas}")
        result.figures = {
            "streams": len(names),
            "create s": created,
            "publish msg/s": covered * per_stream / published,
            "rss MB +": rss1 - rss0,
            "store MB +": store1 - store0,
            "list ordered ms": ordered_s * 1000,
            "list direct ms": direct_s * 1000,
            "listed untouched": float(untouched),
            "consumers left": float(left),
            "gone after s": lingered,
        }
        result.note = f"{covered} covered streams x {per_stream} dead letters; listed {listed}"
        results.append(result)
        await delete_streams(js, *names)
    await nc.close()
    return results


async def on_cluster(series: str, args: argparse.Namespace) -> tuple[list[Result], list[Result]]:
    """On a three-node cluster (scripts/nats/cluster.sh): dead_letter_cost with R3 streams,
    and on 2.12+ schedules in an R3 stream across a kill -9 of its leader."""
    env = {"NATS_SERIES": series}
    done = script("cluster.sh", env, "start")
    if done.returncode != 0:
        raise SystemExit(f"cluster.sh start failed:\n{done.stderr}")
    urls = done.stdout.split()
    node = Server(series, urls[0], int(urls[0].rsplit(":", 1)[1]))
    try:
        nc = await nats.connect(node.url)
        v = nc.connected_server_version
        node.version = f"{v.major}.{v.minor}.{v.patch} x3"
        await nc.close()
        console.log(f"{node.version}: dead-letter streams, R3")
        dlq = await dead_letter_cost(node, args.covered, args.dead_letters, replicas=3)
        kills = []
        if version_tuple(node.version) >= Scheduled.needs:
            console.log(f"{node.version}: schedules across a leader kill")
            kills.append(await schedules_across_leader_kill(node, urls, env, 1000, 8.0))
        return dlq, kills
    finally:
        script("cluster.sh", env, "stop")


async def schedules_across_leader_kill(
    node: Server, urls: list[str], env: dict[str, str], n: int, due_in: float
) -> Result:
    """n schedules in an R3 stream; its leader is killed (SIGKILL) 2 s before they are due."""
    design = Scheduled(f"k{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    config = design.streams()[0]
    config.num_replicas = 3
    await js.add_stream(config)
    await js.add_consumer(
        design.work_stream,
        ConsumerConfig(durable_name="work", filter_subject=design.work_subject, num_replicas=3),
    )
    due = time.time() + due_in
    for start in range(0, n, 250):
        copies = [design.backlog_message(f"m{i}", due) for i in range(start, min(n, start + 250))]
        await asyncio.gather(*(js.publish(s, BODY, headers=h) for s, h in copies))
    info = await js.stream_info(design.work_stream)
    leader = info.cluster.leader if info.cluster else None
    k = next(i for i, u in enumerate(urls, 1) if leader and leader.endswith(u.rsplit(":", 1)[1]))
    await asyncio.sleep(max(0.0, due - 2 - time.time()))
    await asyncio.to_thread(script, "cluster.sh", env, "kill", str(k))
    sub = await js.pull_subscribe_bind("work", design.work_stream)
    seen, dups = await collect(sub, n, due + 45)
    await asyncio.to_thread(script, "cluster.sh", env, "restart", str(k))
    late = sorted((t - due) * 1000 for t in seen.values())
    result = Result("c", node.version, "leader SIGKILL, R3")
    result.figures = {
        "scheduled": n,
        "fired": len(seen),
        "duplicates": dups,
        "late p50 ms": pct(late, 0.5),
        "late max ms": max(late) if late else float("nan"),
    }
    result.note = f"leader (node {k}) killed 2 s before due; restarted after"
    await delete_streams(js, design.work_stream)
    await nc.close()
    return result


async def list_ordered(js: JetStreamContext, stream: str, subject: str, expect: int) -> int:
    """Read every message on subject with an ordered consumer: no ack, no durable state."""
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    count = 0
    with contextlib.suppress(asyncio.TimeoutError, nats.errors.TimeoutError):
        while count < expect:
            await sub.next_msg(timeout=2)
            count += 1
    await sub.unsubscribe()
    return count


async def list_direct(js: JetStreamContext, stream: str, subject: str) -> int:
    """Walk subject's messages with direct get (next by subject), one request each."""
    seq, count = 1, 0
    while True:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, direct=True, next=True)
        except nats.js.errors.NotFoundError:
            return count
        count += 1
        seq = (msg.seq or 0) + 1


# ---------------------------------------------------------------- report

COLUMNS = [
    ("good handled", "good handled", "{:.0f}"),
    ("good p50 s", "good wait p50 s", "{:.2f}"),
    ("good max s", "good wait max s", "{:.2f}"),
    ("retried", "retried", "{:.0f}"),
    ("late p50 ms", "late p50 ms", "{:.0f}"),
    ("late p99 ms", "late p99 ms", "{:.0f}"),
    ("late max ms", "late max ms", "{:.0f}"),
    ("fail path msg/s", "fail path/s", "{:.0f}"),
    ("release msg/s", "release/s", "{:.0f}"),
    ("work pending peak", "work pending", "{:.0f}"),
    ("recheck pending peak", "re-check pending", "{:.0f}"),
    ("server cpu s", "server cpu s", "{:.1f}"),
    ("duplicates", "dups", "{:.0f}"),
    ("total s", "total s", "{:.1f}"),
]
NAMED = {c[0] for c in COLUMNS}


def show(title: str, results: list[Result]) -> None:
    """Print results as a Markdown table (the docs quote it as it is)."""
    keys = [c for c in COLUMNS if any(c[0] in r.figures for r in results)]
    extra = [k for k in dict.fromkeys(k for r in results for k in r.figures) if k not in NAMED]
    head = ["design", "server", "scenario", *(h for _, h, _ in keys), *extra, "note"]
    rows = []
    for r in results:
        label = DESIGNS[r.design].label if r.design in DESIGNS else r.design
        cells = [label, r.server, r.scenario]
        cells += [fmt.format(r.figures[k]) if k in r.figures else "" for k, _, fmt in keys]
        cells += [f"{r.figures[k]:.4g}" if k in r.figures else "" for k in extra]
        cells.append(r.note)
        rows.append(cells)
    print(f"\n### {title}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head) - 1)) + "|---|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


async def run_design(server: Server, cls: type[Design], args: argparse.Namespace) -> list[Result]:
    nak = cls.key.startswith("a")
    # A nak'd message sits in the consumer's pending set: give each wave of 100 its delay.
    burst_wait = 2 * args.burst / MAX_ACK_PENDING + 30 if nak else 120.0
    stall_wait = (900.0 if args.full_stall else args.stall_window) if nak else 180.0
    plans = [Scenario("stall", args.n, args.n, 60.0, stall_wait)]
    if not cls.push:
        plans += [
            Scenario("1 s", args.n, 0, 1.0, burst_wait, rate=args.rate),
            Scenario("burst", args.burst, 0, 1.0, burst_wait),
        ]
    if not nak:
        # The same with many copies already waiting in the longest tier (or as schedules).
        plans += [
            Scenario("1 s+backlog", args.n, 0, 1.0, 120, rate=args.rate, backlog=args.backlog),
            Scenario("burst+backlog", args.burst, 0, 1.0, 120, backlog=args.backlog),
        ]
    results = []
    for plan in (p for p in plans if p.name in args.scenarios.split(",")):
        console.log(f"{server.version} {cls.label}: {plan.name}")
        results.append(await scenario(server, cls, plan))
    return results


async def designs_round(servers: list[Server], args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    for server in servers:
        if "1 s" in args.scenarios.split(","):
            # The work consumer alone: what any design's lateness starts from.
            console.log(f"{server.version}: baseline")
            plan = Scenario("no failures", 0, args.n, 1.0, 60 + args.n / args.rate, rate=args.rate)
            base = await scenario(server, NakDelay, plan)
            base.design = "bare subscriber"
            results.append(base)
        for key in args.designs.split(","):
            cls = DESIGNS[key]
            if version_tuple(server.version) >= cls.needs:
                results += await run_design(server, cls, args)
    return results


async def restarts(servers: list[Server]) -> list[Result]:
    results: list[Result] = []
    for server in servers:
        if version_tuple(server.version) < Scheduled.needs or not server.base.exists():
            continue
        console.log(f"{server.version}: schedules across a restart")
        results += [
            await schedules_across_restart(server, "TERM", 1000, 10, 0),
            await schedules_across_restart(server, "KILL", 1000, 10, 0),
            await schedules_across_restart(server, "TERM", 1000, 3, 8),
        ]
    return results


async def main(args: argparse.Namespace) -> None:
    servers = [ensure_server(s) for s in args.servers.split(",")]
    try:
        for server in servers:
            nc = await nats.connect(server.url)
            v = nc.connected_server_version
            server.version = f"{v.major}.{v.minor}.{v.patch}"
            await nc.close()
        for round_ in range(1, args.rounds + 1):
            show(
                f"Delayed retries on JetStream, round {round_}", await designs_round(servers, args)
            )
        if not args.skip_restart:
            show("Scheduled messages across a server restart", await restarts(servers))
        if not args.skip_dlq:
            dlq: list[Result] = []
            for server in servers:
                console.log(f"{server.version}: dead-letter streams")
                dlq += await dead_letter_cost(server, args.covered, args.dead_letters)
            kills: list[Result] = []
            for series in filter(None, args.cluster.split(",")):
                on_dlq, on_kill = await on_cluster(series, args)
                dlq += on_dlq
                kills += on_kill
            show("Dead-letter streams: one per covered stream, or one shared", dlq)
            if kills:
                show("Scheduled messages in an R3 stream across a leader kill", kills)
    finally:
        for server in servers:
            if server.started_here:
                script("stop.sh", {"NATS_PORT": str(server.port)})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--designs", default="a,a-push,b,c,d,e,f")
    parser.add_argument("--servers", default="2.9,2.15")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--scenarios", default="stall,1 s,burst,1 s+backlog,burst+backlog")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=80.0, help="msg/s of the paced 1 s scenario")
    parser.add_argument("--stall-window", type=float, default=75.0)
    parser.add_argument("--full-stall", action="store_true", help="wait for nak(delay) to drain")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-restart", action="store_true")
    parser.add_argument("--skip-dlq", action="store_true")
    parser.add_argument("--covered", type=int, default=50)
    parser.add_argument("--dead-letters", type=int, default=200)
    parser.add_argument(
        "--cluster",
        default="",
        help="series (2.9,2.15) whose three-node cluster (NATS_CLUSTER_PORT) measures R3 DLQs",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
