"""Delayed retries on Redis Streams: the candidate designs of issue 40, side by side.

Every design runs the same scenarios against real servers (Redis 7.0, Redis 8.0 and Valkey
9.1, started by scripts/redis/start.sh when not running), with a real FastStream 0.7
``RedisBroker`` stream subscriber in a consumer group (``StreamSub(..., group=, consumer=)``)
as the work consumer:

- **burst**: 2,000 messages that fail once with a 1 s delay, published at once (--burst):
  the fail path (failures turned into scheduled copies per second), the release (retries
  handled per second, first to last), lateness p50/p99 (handled minus due), counted by id.
  Two movers run (two replicas of the app would), on connections of their own.
- **stall**: 10,000 messages that fail once with a 60 s delay (--stall), then 1,000 good
  ones: how long the good ones take against the same 1,000 with nothing waiting, what
  sits in the group's pending list meanwhile, and what the movers cost the server while
  the copies wait (commands per second).
- **cost**: no FastStream: 10,000 pending entries scheduled by the design's atomic step,
  then moved back by its mover, each phase's server CPU (INFO cpu) and the usec Redis
  counts for its commands (INFO commandstats), per copy.
- **race**: 10,000 copies due at once, two movers on two connections: every copy in the
  stream exactly once, counted by id; the same with a mover that is not one atomic step.

The designs:

- **zset** the schedule: a sorted set ``{s}:retry`` scored by due time (server clock), the
  copy's payload in a hash ``{s}:retry:data``. One script acknowledges the original
  (XACK, and schedules nothing if that acknowledged nothing: another consumer settled it)
  and schedules the copy (HSET, ZADD); when the copy becomes the head, it PUBLISHes a
  nudge. The mover: one script moves up to 100 due copies (XADD, ZREM, HDEL) and returns
  the head's due time; the mover sleeps until then, or until a nudge.
- **zset-member**: the same, the payload in the member (``<copy id>:<payload>``, as
  Sidekiq does), no hash.
- **zset-poll**: zset's scripts, the mover waking every 100 ms whatever the head says.
- **zset-keyspace**: zset's scripts, the mover woken by keyspace notifications
  (``notify-keyspace-events Kz``: a server setting) instead of its own nudge.
- **bzpopmin**: zset's schedule, the mover blocked in BZPOPMIN: it pops the head, puts it
  back when it is not due and sleeps until it is, else XADDs it from the hash. Not one
  atomic step: a popped copy lives in the mover's memory until its XADD.
- **tier**: a delay stream per tier, as on RabbitMQ: the script XACKs the original and
  XADDs the copy (with its due time) to ``{s}:delay:<ms>``; every copy of a tier has the
  same delay, so the head is the next due. The mover blocks in XREAD on an empty tier,
  sleeps until the head is due, and moves due copies in one script (XADD, XDEL).
- **pel-claim**: what FastStream offers today: the failing handler raises, FastStream's
  default ack policy (REJECT_ON_ERROR) leaves the entry in the group's pending list, and a
  second subscriber ``StreamSub(..., min_idle_time=<delay>)`` claims it (XAUTOCLAIM) once
  it has been idle that long. One delay per claiming subscriber; the entry cannot carry a
  new attempt count.
- **none**: the same app with no failures (the happy path, the stall's reference).

Then what FastStream's StreamSub does with a dead consumer's pending entry (a worker
process killed -9 mid-message: who claims it, after how long, with what delivery count);
Redis Cluster (keys with and without hash tags, a FastStream RedisClusterBroker app with
the zset design); and durability (a server SIGKILLed while copies move, appendfsync
always and everysec, counted by id).

    python -m bench.redis_delay_designs [--servers 7.0,8.0,valkey-9.1]
        [--designs zset,zset-member,zset-poll,zset-keyspace,bzpopmin,tier,pel-claim]
        [--scenarios burst,stall,cost,race] [--sections designs,claims,cluster,durability]
        [--port-base 6401] [--bus-base 16407] [--rounds 1]

Ports: server i of --servers on PORT_BASE+i, its crash-test server on PORT_BASE+3+i, its
cluster on PORT_BASE+6+3i.. (cluster bus on --bus-base+0..2): the defaults are the
project's ports (CONTRIBUTING.md). A server started here is stopped at the end; one that
was running is reused and left running. Timing on a shared machine is noisy: repeat a run
(--rounds) and compare the designs within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
import redis.asyncio as aredis
from faststream.redis import (
    BinaryMessageFormatV1,
    RedisBroker,
    RedisClusterBroker,
    RedisStreamMessage,
    StreamSub,
)
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "redis"
SERIES = ("7.0", "8.0", "valkey-9.1")
GROUP = "g"
DATA = "__data__"  # FastStream's field for the message in a stream entry
MOVE_BATCH = 100
APPENDFSYNC = "always"  # for the servers started here (--appendfsync)
# Twice each SIGKILL: a loss that happens once in a while should show.
DURABILITY_RUNS = (
    ("always", "KILL"),
    ("always", "KILL"),
    ("everysec", "KILL"),
    ("everysec", "KILL"),
    ("everysec", "TERM"),
)
QUIET = logging.getLogger("bench.redis_delay_designs")  # no line per failure: pel-claim raises
QUIET.setLevel(logging.CRITICAL + 1)

# ---------------------------------------------------------------- servers


@dataclass
class Server:
    series: str
    port: int
    started: bool = False
    version: str = ""
    fsync: str = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"


def script(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def start_server(series: str, port: int, **env: str) -> Server:
    env = {"REDIS_APPENDFSYNC": APPENDFSYNC, **env}
    done = script("start.sh", {"REDIS_SERIES": series, "REDIS_PORT": str(port), **env})
    if done.returncode != 0:
        sys.exit(f"could not start {series} on {port}:\n{done.stderr}")
    server = Server(series, port, started="reusing" not in done.stderr)
    info = redis.Redis(port=port).info("server")
    server.version = str(info.get("valkey_version") or info["redis_version"])
    server.fsync = str(redis.Redis(port=port).config_get("appendfsync")["appendfsync"])
    return server


def stop_server(port: int, **env: str) -> None:
    script("stop.sh", {"REDIS_PORT": str(port), **env})


def server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def command_usec(r: redis.Redis) -> dict[str, int]:
    return {name: int(stats["usec"]) for name, stats in r.info("commandstats").items()}


def total_commands(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


# ---------------------------------------------------------------- figures


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@dataclass
class Tracker:
    """Every handling of every message id, on the wall clock."""

    fails: dict[str, float] = field(default_factory=dict)
    dues: dict[str, float] = field(default_factory=dict)
    handled: dict[str, list[float]] = field(default_factory=dict)
    published: dict[str, float] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def handle(self, mid: str) -> None:
        self.handled.setdefault(mid, []).append(time.time())

    def count(self, ids: list[str], times: int) -> int:
        return sum(1 for mid in ids if len(self.handled.get(mid, ())) >= times)


# ---------------------------------------------------------------- scripts

# KEYS: stream, schedule, payloads. ARGV: group, entry id, copy id, delay ms, payload,
# nudge channel ('' for none). The due time is the server's clock: every replica's mover
# reads the same one.
SCHEDULE_HASH = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
redis.call('ZADD', KEYS[2], due, ARGV[3])
if ARGV[6] ~= '' and redis.call('ZRANGE', KEYS[2], 0, 0)[1] == ARGV[3] then
  redis.call('PUBLISH', ARGV[6], due)
end
return due
"""

# KEYS: stream, schedule, payloads. ARGV: batch. Returns {moved, next due or -1, now}.
MOVE_HASH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then redis.call('XADD', KEYS[1], '*', '__data__', payload) end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {#ids, tonumber(head[2] or -1), now}
"""

# The payload in the member: "<copy id>:<payload>".
SCHEDULE_MEMBER = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
local member = ARGV[3] .. ':' .. ARGV[5]
redis.call('ZADD', KEYS[2], due, member)
if ARGV[6] ~= '' and redis.call('ZRANGE', KEYS[2], 0, 0)[1] == member then
  redis.call('PUBLISH', ARGV[6], due)
end
return due
"""

MOVE_MEMBER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(members) do
  local sep = string.find(member, ':', 1, true)
  redis.call('XADD', KEYS[1], '*', '__data__', string.sub(member, sep + 1))
  redis.call('ZREM', KEYS[2], member)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {#members, tonumber(head[2] or -1), now}
"""

# KEYS: stream, tier. ARGV: group, entry id, delay ms, payload.
SCHEDULE_TIER = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('XADD', KEYS[2], '*', 'due', due, '__data__', ARGV[4])
return due
"""

# KEYS: stream, tier. ARGV: batch. A tier's copies are due in the order they came.
MOVE_TIER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local entries = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', tonumber(ARGV[1]))
local moved, nxt = 0, -1
for _, entry in ipairs(entries) do
  local f = entry[2]
  local due, payload
  for i = 1, #f, 2 do
    if f[i] == 'due' then due = tonumber(f[i + 1]) end
    if f[i] == '__data__' then payload = f[i + 1] end
  end
  if due > now then nxt = due break end
  redis.call('XADD', KEYS[1], '*', '__data__', payload)
  redis.call('XDEL', KEYS[2], entry[1])
  moved = moved + 1
end
if nxt == -1 and moved == #entries and moved < tonumber(ARGV[1]) then
  local head = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
  if head[1] then nxt = tonumber(head[1][2][2]) end
end
return {moved, nxt, now}
"""


# ---------------------------------------------------------------- designs


class Design:
    """One way of holding a failed message's copy until it is due, and of moving it back."""

    name: ClassVar[str] = "none"
    schedules: ClassVar[bool] = True

    def __init__(self, url: str, stream: str, delay_ms: int) -> None:
        self.url = url
        self.stream = stream
        self.delay_ms = delay_ms
        self.r: aredis.Redis = aredis.from_url(url)
        self.tasks: list[asyncio.Task[None]] = []
        self.wakes = 0
        self.moved = 0
        self.stopping = asyncio.Event()

    # Keys: every key one script touches shares the stream's slot ({stream}).
    @property
    def schedule_key(self) -> str:
        return f"{{{self.stream}}}:retry"

    @property
    def data_key(self) -> str:
        return f"{{{self.stream}}}:retry:data"

    @property
    def nudge_channel(self) -> str:
        return f"{{{self.stream}}}:retry:wake"

    def keys(self) -> list[str]:
        return [self.stream, self.schedule_key, self.data_key]

    def subscribers(self) -> list[StreamSub[Any]]:  # type: ignore[type-arg,unused-ignore]
        return [StreamSub(self.stream, group=GROUP, consumer="c1")]

    async def fail(self, entry_id: bytes, copy_id: str, payload: bytes) -> None:
        """Acknowledge the original and schedule its copy, in one atomic step."""
        raise NotImplementedError

    async def start(self, movers: int) -> None:
        for _ in range(movers):
            self.tasks.append(asyncio.create_task(self.mover()))

    async def mover(self) -> None:
        return

    async def stop(self) -> None:
        self.stopping.set()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.r.delete(*self.keys())
        await self.r.aclose()

    async def waiting(self) -> int:
        return int(await self.r.zcard(self.schedule_key))


class ZSet(Design):
    name = "zset"
    schedule_lua = SCHEDULE_HASH
    move_lua = MOVE_HASH
    wake = "nudge"
    cap = 5.0  # a mover wakes at least this often (a replica that died between nudges)
    slack = 0.0  # how long past the head's due time a mover sleeps, to move more at once

    def __init__(self, url: str, stream: str, delay_ms: int) -> None:
        super().__init__(url, stream, delay_ms)
        self.schedule = self.r.register_script(self.schedule_lua)
        self.move = self.r.register_script(self.move_lua)

    async def fail(self, entry_id: bytes, copy_id: str, payload: bytes) -> None:
        await self.schedule(
            keys=[self.stream, self.schedule_key, self.data_key],
            args=[GROUP, entry_id, copy_id, self.delay_ms, payload, self.nudge_channel],
        )

    async def move_once(self, r: aredis.Redis) -> tuple[int, int, int]:
        moved, nxt, now = await self.move(
            keys=[self.stream, self.schedule_key, self.data_key], args=[MOVE_BATCH], client=r
        )
        return int(moved), int(nxt), int(now)

    async def mover(self) -> None:
        r: aredis.Redis = aredis.from_url(self.url)  # a replica of its own
        woken = asyncio.Event()
        listener = None
        if self.wake in {"nudge", "keyspace"}:
            pubsub = r.pubsub()
            channel = (
                self.nudge_channel
                if self.wake == "nudge"
                else f"__keyspace@0__:{self.schedule_key}"
            )
            await pubsub.subscribe(channel)

            async def listen() -> None:
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        woken.set()

            listener = asyncio.create_task(listen())
        try:
            while not self.stopping.is_set():
                moved, nxt, now = await self.move_once(r)
                self.moved += moved
                if moved == MOVE_BATCH:
                    continue
                if self.wake == "poll":
                    await asyncio.sleep(0.1)
                    continue
                wait = (
                    self.cap
                    if nxt < 0
                    else min(self.cap, max(0.0, (nxt - now) / 1000) + self.slack)
                )
                woken.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), wait)
                self.wakes += 1
        finally:
            if listener:
                listener.cancel()
            await r.aclose()


class ZSetMember(ZSet):
    name = "zset-member"
    schedule_lua = SCHEDULE_MEMBER
    move_lua = MOVE_MEMBER


class ZSetTick(ZSet):
    """zset, the mover sleeping 50 ms past the head's due time: one script moves a batch."""

    name = "zset-tick"
    slack = 0.05


class ZSetPoll(ZSet):
    name = "zset-poll"
    wake = "poll"


class ZSetKeyspace(ZSet):
    name = "zset-keyspace"
    wake = "keyspace"

    async def start(self, movers: int) -> None:
        got: Any = await self.r.config_get("notify-keyspace-events")
        self.previous = str(got["notify-keyspace-events"])
        await self.r.config_set("notify-keyspace-events", "Kz")
        await super().start(movers)

    async def fail(self, entry_id: bytes, copy_id: str, payload: bytes) -> None:
        await self.schedule(
            keys=[self.stream, self.schedule_key, self.data_key],
            args=[GROUP, entry_id, copy_id, self.delay_ms, payload, ""],
        )

    async def stop(self) -> None:
        await self.r.config_set("notify-keyspace-events", self.previous)
        await super().stop()


class BZPopMin(ZSet):
    name = "bzpopmin"

    async def mover(self) -> None:
        r: aredis.Redis = aredis.from_url(self.url)
        try:
            while not self.stopping.is_set():
                popped: Any = await r.bzpopmin(self.schedule_key, timeout=int(self.cap))
                self.wakes += 1
                if not popped:
                    continue
                member, score = popped[1], float(popped[2])
                now = time.time() * 1000
                if score > now:
                    # Not due: back it goes, and the mover sleeps until it is (a copy
                    # scheduled meanwhile for earlier waits behind this sleep).
                    await r.zadd(self.schedule_key, {member: score})
                    await asyncio.sleep((score - now) / 1000)
                    continue
                # From here to the XADD the copy exists only in this process.
                payload = await r.hget(self.data_key, member)
                if payload is not None:
                    await r.xadd(self.stream, {DATA: payload})
                await r.hdel(self.data_key, member)
                self.moved += 1
        finally:
            await r.aclose()


class Tier(Design):
    name = "tier"

    def __init__(self, url: str, stream: str, delay_ms: int) -> None:
        super().__init__(url, stream, delay_ms)
        self.schedule = self.r.register_script(SCHEDULE_TIER)
        self.move = self.r.register_script(MOVE_TIER)

    @property
    def tier_key(self) -> str:
        return f"{{{self.stream}}}:delay:{self.delay_ms}"

    def keys(self) -> list[str]:
        return [self.stream, self.tier_key]

    async def fail(self, entry_id: bytes, copy_id: str, payload: bytes) -> None:
        del copy_id
        await self.schedule(
            keys=[self.stream, self.tier_key], args=[GROUP, entry_id, self.delay_ms, payload]
        )

    async def move_once(self, r: aredis.Redis) -> tuple[int, int, int]:
        moved, nxt, now = await self.move(
            keys=[self.stream, self.tier_key], args=[MOVE_BATCH], client=r
        )
        return int(moved), int(nxt), int(now)

    async def mover(self) -> None:
        r: aredis.Redis = aredis.from_url(self.url)
        try:
            while not self.stopping.is_set():
                moved, nxt, now = await self.move_once(r)
                self.moved += moved
                if moved == MOVE_BATCH:
                    continue
                self.wakes += 1
                if nxt < 0:
                    # An empty tier: XREAD blocks until a copy arrives (0-0: any entry).
                    await r.xread({self.tier_key: "0-0"}, count=1, block=5000)
                else:
                    await asyncio.sleep(max(0.0, (nxt - now) / 1000))
        finally:
            await r.aclose()

    async def waiting(self) -> int:
        return int(await self.r.xlen(self.tier_key))


class PelClaim(Design):
    name = "pel-claim"
    schedules = False

    def subscribers(self) -> list[StreamSub[Any]]:  # type: ignore[type-arg,unused-ignore]
        return [
            StreamSub(self.stream, group=GROUP, consumer="c1"),
            StreamSub(self.stream, group=GROUP, consumer="claimer", min_idle_time=self.delay_ms),
        ]

    async def waiting(self) -> int:
        info = await self.r.xpending(self.stream, GROUP)
        return int(info["pending"])


class NoFailures(Design):
    name = "none"
    schedules = False

    async def waiting(self) -> int:
        return 0


DESIGNS: dict[str, type[Design]] = {
    cls.name: cls
    for cls in (ZSet, ZSetTick, ZSetMember, ZSetPoll, ZSetKeyspace, BZPopMin, Tier, PelClaim)
}


# ---------------------------------------------------------------- the app


async def encode(body: dict[str, Any], headers: dict[str, str]) -> bytes:
    return await BinaryMessageFormatV1.encode(
        message=body, reply_to=None, headers=headers, correlation_id=uuid.uuid4().hex
    )


async def publish(r: aredis.Redis, stream: str, bodies: list[dict[str, Any]]) -> None:
    payloads = [await encode(body, {}) for body in bodies]
    for start in range(0, len(payloads), 1000):
        async with r.pipeline(transaction=False) as pipe:
            for payload in payloads[start : start + 1000]:
                pipe.xadd(stream, {DATA: payload})
            await pipe.execute()


def app(url: str, design: Design, tracker: Tracker, *, cluster: bool = False) -> RedisBroker:
    broker: RedisBroker = (RedisClusterBroker if cluster else RedisBroker)(url, logger=QUIET)

    async def handle(body: dict[str, Any], msg: RedisStreamMessage) -> None:
        mid = str(body["id"])
        tracker.handle(mid)
        attempt = int(msg.headers.get("retry-attempt", "0"))
        if not body.get("bad") or attempt > 0 or len(tracker.handled[mid]) > 1:
            return
        tracker.fails[mid] = time.time()
        tracker.dues[mid] = tracker.fails[mid] + design.delay_ms / 1000
        if not design.schedules:
            # pel-claim: FastStream leaves the entry pending (REJECT_ON_ERROR).
            msg_error = "transient"
            raise RuntimeError(msg_error)
        headers = {
            **{k: str(v) for k, v in msg.headers.items()},
            "retry-attempt": "1",
            "retry-due": str(int(tracker.dues[mid] * 1000)),
        }
        try:
            await design.fail(msg.raw_message["message_ids"][0], mid, await encode(body, headers))
        except Exception as e:
            # The entry stays pending (REJECT_ON_ERROR): counted, and said once per kind.
            tracker.errors[type(e).__name__ + ": " + str(e)[:120]] += 1
            raise

    for sub in design.subscribers():
        broker.subscriber(stream=sub)(handle)
    return broker


# ---------------------------------------------------------------- scenarios


@dataclass
class Row:
    server: str
    design: str
    scenario: str
    figures: dict[str, Any]


async def paced(r: aredis.Redis, stream: str, bodies: list[dict[str, Any]], rate: float) -> None:
    t0 = time.monotonic()
    for i, body in enumerate(bodies):
        await r.xadd(stream, {DATA: await encode(body, {})})
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))


async def burst(server: Server, cls: type[Design], n: int, movers: int = 2, rate: float = 0) -> Row:
    """n messages failing once with a 1 s delay: at once, or at `rate` per second."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    design = cls(server.url, stream, 1000)
    tracker = Tracker()
    broker = app(server.url, design, tracker)
    sync = redis.Redis(port=server.port)
    ids = [f"m{i}" for i in range(n)]
    async with broker:
        await broker.start()
        await design.start(movers)
        cpu0 = server_cpu(sync)
        t0 = time.time()
        bad = cls is not NoFailures
        bodies = [{"id": mid, "bad": bad} for mid in ids]
        await (paced(design.r, stream, bodies, rate) if rate else publish(design.r, stream, bodies))
        times = 2 if bad else 1
        done = await until(lambda: tracker.count(ids, times) == n, 120)
        elapsed = time.time() - t0
        cpu = server_cpu(sync) - cpu0
        await asyncio.sleep(0.5)  # a late duplicate would show here
    firsts = sorted(tracker.handled[mid][0] for mid in ids if mid in tracker.handled)
    retries = sorted(
        tracker.handled[mid][1] for mid in ids if len(tracker.handled.get(mid, [])) > 1
    )
    late = [
        tracker.handled[mid][1] - tracker.dues[mid]
        for mid in ids
        if len(tracker.handled.get(mid, [])) > 1 and mid in tracker.dues
    ]
    counts = Counter(len(tracker.handled.get(mid, [])) for mid in ids)
    await design.stop()
    return Row(
        server.series,
        cls.name,
        "paced" if rate else "burst",
        {
            "done": done,
            "1st/s": len(firsts) / max(firsts[-1] - firsts[0], 1e-9) if len(firsts) > 1 else 0,
            "retried/s": len(retries) / max(retries[-1] - retries[0], 1e-9)
            if len(retries) > 1
            else 0,
            "late p50": pct(late, 0.5),
            "late p99": pct(late, 0.99),
            "late max": max(late, default=float("nan")),
            "lost": n - tracker.count(ids, times),
            "extra": sum(c * (k - times) for k, c in counts.items() if k > times),
            "cpu ms/msg": 1000 * cpu / n,
            "wakes": design.wakes,
            "s": elapsed,
            "errors": sum(tracker.errors.values()),
        },
    )


async def good_only(
    server: Server, design: Design, tracker: Tracker, broker: RedisBroker, n: int
) -> tuple[float, float, float]:
    ids = [f"g{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
    t0 = time.time()
    await publish(design.r, design.stream, [{"id": mid} for mid in ids])
    await until(lambda: tracker.count(ids, 1) == n, 120)
    del server, broker
    lat = [tracker.handled[mid][0] - t0 for mid in ids if mid in tracker.handled]
    return (max(lat, default=float("nan")), pct(lat, 0.5), pct(lat, 0.99))


async def stall(server: Server, cls: type[Design], waiting: int, good: int) -> Row:
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    design = cls(server.url, stream, 60_000)
    tracker = Tracker()
    broker = app(server.url, design, tracker)
    sync = redis.Redis(port=server.port)
    async with broker:
        await broker.start()
        await design.start(2)
        ref_all, ref_p50, _ = await good_only(server, design, tracker, broker, good)
        bad = [f"b{i}" for i in range(waiting)]
        t0 = time.time()
        await publish(design.r, stream, [{"id": mid, "bad": True} for mid in bad])
        # Until every copy waits where the design keeps it (the last failure's step done).
        await until(lambda: len(tracker.fails) == waiting, 300)
        held = await design.waiting()
        deadline = time.monotonic() + 300
        while held < waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            held = await design.waiting()
        fail_s = time.time() - t0
        await until(lambda: False, 0.5)
        held = await design.waiting()
        pel = int((await design.r.xpending(stream, GROUP))["pending"])
        all_s, p50, p99 = await good_only(server, design, tracker, broker, good)
        # What the movers (or the claimer) ask of the server while the copies wait.
        c0, cpu0, w0 = total_commands(sync), server_cpu(sync), design.wakes
        await asyncio.sleep(5)
        cmds = (total_commands(sync) - c0) / 5
        idle_cpu = (server_cpu(sync) - cpu0) / 5
        wakes = design.wakes - w0
    await design.stop()
    return Row(
        server.series,
        cls.name,
        "stall",
        {
            "failed in s": fail_s,
            "waiting": held,
            "pending": pel,
            "good all s": all_s,
            "ref all s": ref_all,
            "ratio": all_s / ref_all if ref_all else float("nan"),
            "good p50": p50,
            "ref p50": ref_p50,
            "good p99": p99,
            "idle cmd/s": cmds,
            "idle cpu %": 100 * idle_cpu,
            "mover wakes/5s": wakes,
            "errors": sum(tracker.errors.values()),
        },
    )


async def pending_entries(r: aredis.Redis, stream: str, n: int) -> list[bytes]:
    await r.xgroup_create(stream, GROUP, id="$", mkstream=True)
    for start in range(0, n, 1000):
        async with r.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + 1000)):
                pipe.xadd(stream, {DATA: f"p{i}"})
            await pipe.execute()
    got: Any = await r.xreadgroup(GROUP, "c1", {stream: ">"}, count=n)
    return [entry_id for entry_id, _ in got[0][1]]


async def schedule_all(design: Design, ids: list[bytes], payload: Callable[[int], bytes]) -> None:
    # 50 at a time: redis-py's pool holds that many connections at most by default.
    for start in range(0, len(ids), 50):
        await asyncio.gather(
            *(
                design.fail(ids[i], f"c{i}", payload(i))
                for i in range(start, min(len(ids), start + 50))
            )
        )


async def cost(server: Server, cls: type[Design], n: int) -> Row:
    """Server CPU per copy: the atomic step that schedules, then the mover's."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    design = cls(server.url, stream, 0)
    sync = redis.Redis(port=server.port)
    ids = await pending_entries(design.r, stream, n)
    body = b"x" * 200  # about a small message with its retry-* headers
    cpu0, usec0 = server_cpu(sync), command_usec(sync)
    t0 = time.time()
    await schedule_all(design, ids, lambda _i: body)
    sched_s = time.time() - t0
    cpu1, usec1 = server_cpu(sync), command_usec(sync)
    length0 = await design.r.xlen(stream)
    t1 = time.time()
    await design.start(1)
    await until(lambda: design.moved >= n, 120)
    move_s = time.time() - t1
    cpu2, usec2 = server_cpu(sync), command_usec(sync)
    moved = await design.r.xlen(stream) - length0
    await design.stop()

    def usec(a: dict[str, int], b: dict[str, int]) -> float:
        return sum(b.get(k, 0) - a.get(k, 0) for k in b if k.endswith(("eval", "evalsha")))

    def usec_plain(a: dict[str, int], b: dict[str, int]) -> float:
        # Commands a non-script mover sends itself (BZPOPMIN's).
        names = ("bzpopmin", "zadd", "hget", "xadd", "hdel")
        return sum(b.get(f"cmdstat_{k}", 0) - a.get(f"cmdstat_{k}", 0) for k in names)

    move_usec = usec(usec1, usec2) or usec_plain(usec1, usec2)
    return Row(
        server.series,
        cls.name,
        "cost",
        {
            "schedule cpu us/copy": 1e6 * (cpu1 - cpu0) / n,
            "schedule script us/copy": usec(usec0, usec1) / n,
            "schedule/s": n / sched_s,
            "move cpu us/copy": 1e6 * (cpu2 - cpu1) / n,
            "move cmd us/copy": move_usec / n,
            "moved/s": n / move_s,
            "moved": moved,
        },
    )


async def race(server: Server, cls: type[Design], n: int, *, naive: bool = False) -> Row:
    """Two movers on two connections, n copies due at once: each in the stream once."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    design = cls(server.url, stream, 0)
    ids = await pending_entries(design.r, stream, n)
    await schedule_all(design, ids, lambda i: f"copy-{i}".encode())
    length0 = await design.r.xlen(stream)
    if naive:
        await asyncio.gather(naive_mover(design), naive_mover(design))
    else:
        await design.start(2)
        await until(lambda: design.moved >= n, 120)
        await asyncio.sleep(0.3)
    entries: Any = await design.r.xrange(stream, "-", "+")
    copies = Counter(f[DATA.encode()] for _, f in entries[length0:])
    left = await design.waiting()
    await design.stop()
    return Row(
        server.series,
        cls.name + (" (not atomic)" if naive else ""),
        "race",
        {
            "copies": n,
            "in stream": sum(copies.values()),
            "distinct": len(copies),
            "twice+": sum(1 for c in copies.values() if c > 1),
            "lost": n - len(copies) - left,
            "left": left,
        },
    )


async def naive_mover(design: Design) -> None:
    """ZRANGEBYSCORE, then XADD, then ZREM: three steps, as a first try would have it."""
    r: aredis.Redis = aredis.from_url(design.url)
    try:
        while True:
            now = time.time() * 1000
            due: Any = await r.zrangebyscore(
                design.schedule_key, "-inf", now, start=0, num=MOVE_BATCH
            )
            if not due:
                return
            for copy_id in due:
                payload = await r.hget(design.data_key, copy_id)
                if payload is not None:
                    await r.xadd(design.stream, {DATA: payload})
                await r.zrem(design.schedule_key, copy_id)
                await r.hdel(design.data_key, copy_id)
    finally:
        await r.aclose()


# ---------------------------------------------------------------- dead consumers


WORKER = """
import asyncio, json, sys, time
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub

url, stream, consumer, min_idle, mode = sys.argv[1:6]
broker = RedisBroker(url, logger=None)

def say(**kw):
    print(json.dumps({"t": time.time(), "consumer": consumer, **kw}), flush=True)

sub = StreamSub(stream, group="g", consumer=consumer,
                min_idle_time=int(min_idle) if min_idle != "-" else None)

@broker.subscriber(stream=sub)
async def handle(body: dict, msg: RedisStreamMessage) -> None:
    count = await msg.get_delivery_count()
    say(event="handling", id=body["id"], delivery_count=count)
    if mode == "hang" and body.get("hang"):
        await asyncio.sleep(3600)
    if mode == "fail":
        raise RuntimeError("always")
    say(event="handled", id=body["id"])

async def main():
    async with broker:
        await broker.start()
        say(event="ready")
        await asyncio.Event().wait()

asyncio.run(main())
"""


class Worker:
    """A FastStream app in a process of its own, telling what it handles on stdout."""

    def __init__(
        self, url: str, stream: str, consumer: str, min_idle: int | None, mode: str
    ) -> None:
        self.args = [url, stream, consumer, str(min_idle) if min_idle else "-", mode]
        self.events: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WORKER, *self.args, stdout=asyncio.subprocess.PIPE
        )
        self.reader = asyncio.create_task(self.read())
        await until(lambda: any(e["event"] == "ready" for e in self.events), 30)

    async def read(self) -> None:
        if self.proc is None or self.proc.stdout is None:
            return
        async for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def seen(self, event: str, mid: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event and e.get("id") == mid]

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        await self.proc.wait()
        self.reader.cancel()


async def claims(server: Server) -> list[str]:
    """What FastStream's StreamSub does with a dead consumer's pending entry."""
    out: list[str] = []
    say = out.append
    stream = f"claims-{uuid.uuid4().hex[:6]}"
    r: aredis.Redis = aredis.from_url(server.url)
    await r.xgroup_create(stream, GROUP, id="$", mkstream=True)

    async def pel() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await r.xpending_range(stream, GROUP, "-", "+", 10)
        return rows

    def fmt(rows: list[dict[str, Any]]) -> str:
        return (
            ", ".join(
                f"{row['consumer'].decode()} idle {row['time_since_delivered'] / 1000:.1f} s"
                f" delivered {row['times_delivered']}x"
                for row in rows
            )
            or "empty"
        )

    a = Worker(server.url, stream, "c1", None, "hang")
    await a.start()
    await publish(r, stream, [{"id": "x", "hang": True}])
    await until(lambda: bool(a.seen("handling", "x")), 10)
    await a.kill()
    killed = time.time()
    say(f"c1 killed -9 while handling x: PEL = {fmt(await pel())}")

    b = Worker(server.url, stream, "c2", None, "ok")  # another replica, no min_idle_time
    a2 = Worker(server.url, stream, "c1", None, "ok")  # c1 restarted, same consumer name
    await b.start()
    await a2.start()
    await asyncio.sleep(8)
    say(
        f"8 s with c2 (new consumer) and c1 (restarted, same name) running, no min_idle_time:"
        f" x handled {len(b.seen('handled', 'x')) + len(a2.seen('handled', 'x'))}x;"
        f" PEL = {fmt(await pel())}"
    )
    await a2.kill(signal.SIGTERM)
    await b.kill(signal.SIGTERM)

    c = Worker(server.url, stream, "c3", 5000, "ok")  # StreamSub(min_idle_time=5000)
    await c.start()
    ready = next(e["t"] for e in c.events if e["event"] == "ready")
    await until(lambda: bool(c.seen("handled", "x")), 30)
    got = c.seen("handling", "x")
    say(
        f"c3 with min_idle_time=5000 started: x claimed and handled {got[0]['t'] - ready:.2f} s"
        f" after c3 was ready ({got[0]['t'] - killed:.1f} s after the kill), delivery count"
        f" {got[0]['delivery_count']} (get_delivery_count: XPENDING); PEL = {fmt(await pel())}"
        if got
        else f"c3 with min_idle_time=5000 did not handle x in 30 s; PEL = {fmt(await pel())}"
    )
    # With the claimer already running: how long after a kill is the entry claimed?
    a3 = Worker(server.url, stream, "c1", None, "hang")
    await a3.start()
    await publish(r, stream, [{"id": "y", "hang": True}])
    await until(lambda: bool(a3.seen("handling", "y")), 10)
    await a3.kill()
    killed = time.time()
    await until(lambda: bool(c.seen("handled", "y")), 30)
    got = c.seen("handling", "y")
    say(
        f"c1 killed -9 handling y with c3 (min_idle_time=5000) running: y claimed by c3"
        f" {got[0]['t'] - killed:.2f} s after the kill, delivery count {got[0]['delivery_count']}"
        if got
        else "c1 killed -9 handling y with c3 running: y NOT claimed in 30 s"
    )
    await publish(r, stream, [{"id": "new"}])
    await asyncio.sleep(3)
    handled = len(c.seen("handled", "new"))
    say(
        f"a new message with only c3 (min_idle_time) running: handled {handled}x"
        f" in 3 s (it reads by XAUTOCLAIM alone, never XREADGROUP >);"
        f" PEL = {fmt(await pel())}"
    )
    await c.kill(signal.SIGTERM)
    b2 = Worker(server.url, stream, "c2", None, "ok")
    await b2.start()
    await until(lambda: bool(b2.seen("handled", "new")), 10)
    say(f"c2 started: handled 'new' {len(b2.seen('handled', 'new'))}x")
    await b2.kill(signal.SIGTERM)

    # A handler that always raises: REJECT_ON_ERROR sends no XACK, so the entry stays
    # pending; with a claimer it comes back every min_idle_time, for ever.
    f = Worker(server.url, stream, "c4", 1000, "fail")
    await f.start()
    await publish(r, stream, [{"id": "poison"}])
    g = Worker(server.url, stream, "c5", None, "fail")
    await g.start()
    await asyncio.sleep(10)
    seen = sorted(f.seen("handling", "poison") + g.seen("handling", "poison"), key=lambda e: e["t"])
    counts = [f"{e['consumer']}:{e['delivery_count']}" for e in seen]
    say(
        f"a handler that always raises, c5 reading and c4 claiming (min_idle_time=1000):"
        f" handled {len(counts)}x in 10 s, delivery counts {counts[:3]}...{counts[-2:]};"
        f" PEL = {fmt(await pel())}"
    )
    await f.kill(signal.SIGTERM)
    await g.kill(signal.SIGTERM)
    raw: Any = r  # redis-py types execute_command loosely
    try:
        await raw.execute_command(
            "XREADGROUP",
            "GROUP",
            GROUP,
            "c9",
            "COUNT",
            "1",
            "CLAIM",
            "1000",
            "STREAMS",
            stream,
            ">",
        )
        say("XREADGROUP ... CLAIM (claim_min_idle_time): accepted")
    except ResponseError as e:
        say(f"XREADGROUP ... CLAIM (claim_min_idle_time, Redis 8.4+): refused ({e})")
    await r.delete(stream)
    await r.aclose()
    return out


# ---------------------------------------------------------------- cluster


def slot_rule(name: str) -> str | None:
    """The key prefix that puts a derived key in the slot of stream `name`, or None."""
    start = name.find("{")
    if start != -1:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name  # a tag already: name + suffix keeps it
    if "}" in name:
        return None  # no tag can hold a "}"
    return "{" + name + "}"


async def on_cluster(series: str, port: int, bus: int) -> list[str]:
    out: list[str] = []
    env = {
        "REDIS_SERIES": series,
        "REDIS_CLUSTER_PORT": str(port),
        "REDIS_CLUSTER_BUS": str(bus),
    }
    done = script("cluster.sh", env, "start")
    if done.returncode != 0:
        return [f"cluster did not start: {done.stderr[-500:]}"]
    try:
        rc = RedisCluster(host="127.0.0.1", port=port)
        stream = "orders"
        # The names: the slot of a derived key against the stream's own.
        for name in ("orders", "{tenant}.orders", "a{b", "a}b", "{}x"):
            prefix = slot_rule(name)
            own = await rc.execute_command(
                "CLUSTER KEYSLOT", name, target_nodes=RedisCluster.RANDOM
            )
            plain = await rc.execute_command(
                "CLUSTER KEYSLOT", name + ":retry", target_nodes=RedisCluster.RANDOM
            )
            tagged = (
                await rc.execute_command(
                    "CLUSTER KEYSLOT", f"{prefix}:retry", target_nodes=RedisCluster.RANDOM
                )
                if prefix
                else None
            )
            out.append(
                f"slot of {name!r} {own}; {name + ':retry'!r} {plain};"
                f" {(prefix or '') + ':retry'!r} {tagged if prefix else 'no tag can work'}"
            )
        # Without tags, on the node that owns the stream: the server's own refusal.
        node: Any = rc.get_node_from_key(stream)
        direct: aredis.Redis = aredis.Redis(host="127.0.0.1", port=int(node.port))
        try:
            await direct.eval(MOVE_HASH, 3, stream, "orders:retry", "orders:retry:data", 10)
            out.append("a script on orders + orders:retry: accepted (unexpected)")
        except ResponseError as e:
            out.append(f"a script on orders + orders:retry (no tag), sent to its node: {e}")
        await direct.aclose()
        try:
            await rc.eval(MOVE_HASH, 3, stream, "orders:retry", "orders:retry:data", 10)
        except Exception as e:
            out.append(f"the same through redis-py's RedisCluster: {type(e).__name__}: {e}")
        # With tags: a FastStream RedisClusterBroker app, the zset design, 300 retries.
        design = ZSet(f"redis://127.0.0.1:{port}", stream, 500)
        design.r = RedisCluster(host="127.0.0.1", port=port)  # type: ignore[assignment]
        design.schedule = design.r.register_script(SCHEDULE_HASH)
        design.move = design.r.register_script(MOVE_HASH)
        tracker = Tracker()
        broker = app(f"redis://127.0.0.1:{port}", design, tracker, cluster=True)
        ids = [f"k{i}" for i in range(300)]
        try:
            async with broker:
                await broker.start()
                await design.start(0)
                design.tasks.append(asyncio.create_task(cluster_mover(design, port)))
                await publish(design.r, stream, [{"id": mid, "bad": True} for mid in ids])
                ok = await until(
                    lambda: design.moved >= len(ids) and tracker.count(ids, 2) == len(ids), 60
                )
                await asyncio.sleep(0.3)
            counts = Counter(len(tracker.handled.get(mid, [])) for mid in ids)
            slot = await rc.execute_command(
                "CLUSTER KEYSLOT", design.schedule_key, target_nodes=RedisCluster.RANDOM
            )
            out.append(
                f"RedisClusterBroker + StreamSub(group) + the zset scripts on {stream},"
                f" {design.schedule_key}, {design.data_key} (slot {slot}):"
                f" 300 failing once, 0.5 s: {'all' if ok else 'NOT all'} retried; handled-count"
                f" histogram {dict(counts)}"
            )
        except Exception as e:
            out.append(f"RedisClusterBroker app: {type(e).__name__}: {e}")
        with contextlib.suppress(Exception):
            await design.stop()
        await rc.aclose()
    finally:
        script("cluster.sh", env, "stop")
    return out


async def cluster_mover(design: ZSet, port: int) -> None:
    r = RedisCluster(host="127.0.0.1", port=port)
    move = r.register_script(MOVE_HASH)
    try:
        while not design.stopping.is_set():
            moved, nxt, now = await move(
                keys=[design.stream, design.schedule_key, design.data_key], args=[MOVE_BATCH]
            )
            design.moved += int(moved)
            if int(moved) < MOVE_BATCH:
                wait = 1.0 if int(nxt) < 0 else min(1.0, max(0.0, (int(nxt) - int(now)) / 1000))
                await asyncio.sleep(wait)
    finally:
        await r.aclose()


# ---------------------------------------------------------------- durability


async def durability(series: str, port: int, fsync: str, sig: str) -> Row:
    """Copies scheduled and moved while the server is killed: what an acknowledged step lost."""
    env = {"REDIS_APPENDFSYNC": fsync}
    stop_server(port)
    start_server(series, port, **env)
    stream = "dur"
    design = ZSet(f"redis://127.0.0.1:{port}", stream, 0)
    n = 20_000
    ids = await pending_entries(design.r, stream, n)
    acked: list[str] = []  # copy ids whose schedule step the server acknowledged
    errors = 0

    async def scheduler() -> None:
        nonlocal errors
        for i, entry_id in enumerate(ids):
            try:
                due = await design.schedule(
                    keys=[stream, design.schedule_key, design.data_key],
                    args=[GROUP, entry_id, f"c{i}", (i % 5) * 50, f"c{i}", ""],
                )
            except Exception:
                errors += 1
                return
            if int(due) >= 0:
                acked.append(f"c{i}")

    await design.start(2)
    t0 = time.time()
    task = asyncio.create_task(scheduler())
    await until(lambda: len(acked) >= n // 3, 60)
    rate = len(acked) / (time.time() - t0)
    stop_server(port, REDIS_SIGNAL=sig, REDIS_KEEP_DATA="1")
    killed_at = len(acked)
    await asyncio.gather(task, return_exceptions=True)
    with contextlib.suppress(Exception):
        await design.stop()
    start_server(series, port, REDIS_FRESH="0", **env)
    r: Any = redis.Redis(port=port, decode_responses=True)
    in_stream = Counter(f[DATA] for _, f in r.xrange(stream, "-", "+") if f[DATA].startswith("c"))
    in_schedule = set(r.zrange(design.schedule_key, 0, -1))
    pel = {row["message_id"].encode() for row in r.xpending_range(stream, GROUP, "-", "+", n)}
    lost = [c for c in acked if c not in in_stream and c not in in_schedule]
    twice = [c for c, k in in_stream.items() if k > 1] + [c for c in in_schedule if c in in_stream]
    back_pending = sum(1 for i, e in enumerate(ids) if f"c{i}" in acked and e in pel)
    stop_server(port)
    return Row(
        series,
        f"zset, appendfsync {fsync}, SIG{sig}",
        f"SIG{sig}",
        {
            "acked steps": killed_at,
            "steps/s": rate,
            "lost": len(lost),
            "twice": len(twice),
            "acked original pending again": back_pending,
            "copies in stream": sum(in_stream.values()),
            "in schedule": len(in_schedule),
        },
    )


# ---------------------------------------------------------------- report


def show(title: str, rows: list[Row]) -> None:
    if not rows:
        return
    print(f"\n## {title}\n")
    cols = list(rows[0].figures)
    print("| server | design | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for row in rows:
        cells = []
        for col in cols:
            value = row.figures.get(col, "")
            if isinstance(value, float):
                value = f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
            cells.append(str(value))
        print(f"| {row.server} | {row.design} | " + " | ".join(cells) + " |")


async def designs_round(servers: list[Server], args: argparse.Namespace, rnd: int) -> None:
    designs = [DESIGNS[name] for name in args.designs.split(",")]
    scenarios = args.scenarios.split(",")
    stalls = args.stall_designs.split(",")
    rows: dict[str, list[Row]] = {s: [] for s in ("burst", "paced", "stall", "cost", "race")}
    for server in servers:
        for cls in designs:
            if "burst" in scenarios:
                rows["burst"].append(await burst(server, cls, args.burst))
            if "paced" in scenarios:
                rows["paced"].append(await burst(server, cls, args.paced, rate=args.rate))
            if "stall" in scenarios and cls.name in stalls:
                rows["stall"].append(await stall(server, cls, args.stall, 1000))
            if "cost" in scenarios and cls.schedules:
                rows["cost"].append(await cost(server, cls, args.copies))
            if "race" in scenarios and cls.name in {"zset", "zset-member", "tier"}:
                rows["race"].append(await race(server, cls, args.copies))
        if "burst" in scenarios:
            rows["burst"].append(await burst(server, NoFailures, args.burst, movers=0))
        if "paced" in scenarios:
            rows["paced"].append(
                await burst(server, NoFailures, args.paced, movers=0, rate=args.rate)
            )
        if "stall" in scenarios:
            rows["stall"].append(await stall(server, NoFailures, 0, 1000))
        if "race" in scenarios:
            rows["race"].append(await race(server, ZSet, args.copies, naive=True))
    suffix = f" (round {rnd + 1})" if args.rounds > 1 else ""
    show(f"burst: {args.burst} failing once, 1 s delay, 2 movers{suffix}", rows["burst"])
    show(
        f"paced: {args.paced} failing once, 1 s delay, {args.rate:g} msg/s, 2 movers{suffix}",
        rows["paced"],
    )
    show(f"stall: {args.stall} waiting 60 s, then 1,000 good{suffix}", rows["stall"])
    show(f"cost per copy, {args.copies} copies, no FastStream{suffix}", rows["cost"])
    show(f"race: {args.copies} copies due at once, two movers{suffix}", rows["race"])


async def sections(servers: list[Server], args: argparse.Namespace) -> None:
    wanted = args.sections.split(",")
    if "designs" in wanted:
        for rnd in range(args.rounds):
            await designs_round(servers, args, rnd)
    if "claims" in wanted:
        for server in servers:
            print(f"\n## dead consumers' pending entries: {server.series} ({server.version})\n")
            for line in await claims(server):
                print(f"- {line}")
    if "cluster" in wanted:
        for server in servers:
            port = args.port_base + 6 + 3 * SERIES.index(server.series)
            print(f"\n## Redis Cluster: {server.series}, 3 masters\n")
            for line in await on_cluster(server.series, port, args.bus_base):
                print(f"- {line}")
    if "durability" in wanted:
        rows: list[Row] = []
        for server in servers:
            port = args.port_base + 3 + SERIES.index(server.series)
            rows.extend(
                [await durability(server.series, port, f, sig) for f, sig in DURABILITY_RUNS]
            )
        show("durability: the server killed while copies are scheduled and moved", rows)


async def main(args: argparse.Namespace) -> None:
    servers = [
        start_server(series, args.port_base + SERIES.index(series))
        for series in args.servers.split(",")
    ]
    print("# Redis delay designs (issue 40)\n")
    for s in servers:
        here = " (started here)" if s.started else ""
        print(f"- {s.series}: {s.version} on {s.url}{here}, appendfsync {s.fsync}")
    print(
        f"- FastStream RedisBroker, redis-py {redis.__version__}, Python {sys.version.split()[0]}"
    )
    try:
        await sections(servers, args)
    finally:
        for s in servers:
            if s.started:
                stop_server(s.port)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default=",".join(SERIES))
    p.add_argument("--designs", default=",".join(DESIGNS))
    p.add_argument("--stall-designs", default="zset,zset-tick,zset-poll,tier,pel-claim")
    p.add_argument("--scenarios", default="burst,paced,stall,cost,race")
    p.add_argument("--paced", type=int, default=500, help="messages in the paced scenario")
    p.add_argument("--rate", type=float, default=50, help="its publish rate, msg/s")
    p.add_argument("--sections", default="designs,claims,cluster,durability")
    p.add_argument("--burst", type=int, default=2000)
    p.add_argument("--stall", type=int, default=10_000)
    p.add_argument("--copies", type=int, default=10_000)
    p.add_argument("--port-base", type=int, default=6401)
    p.add_argument("--bus-base", type=int, default=16407)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--appendfsync",
        default="always",
        choices=["always", "everysec"],
        help="for the servers started here (a running one keeps its own)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse()
    APPENDFSYNC = ARGS.appendfsync
    asyncio.run(main(ARGS))
