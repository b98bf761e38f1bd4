"""The plugin on Redis Streams against a hand-written FastStream retry, side by side (issue 40).

Two scenarios, each variant on a fresh stream, rounds interleaved (ABAB...), medians,
spread and ratios printed (see bench/burst.py for how each figure is read off the
handler's calls):

- **burst**: N (2,000) messages added to a stream whose group exists, then a FastStream
  stream subscriber (`StreamSub(stream, group=..., consumer=...)`) starts; each message
  fails once and succeeds on its retry 1 s later. Variants:
  - *plugin*: `RetryMiddleware(RetryPolicy(max_attempts=4, backoff=Fixed(1 s)))` on the
    `RedisBroker` (`install()`ed); the handler raises.
  - *hand-written*: the cheapest correct retry we could write on FastStream and redis-py,
    a sorted set and atomic scripts, as Sidekiq does: the handler catches its failure,
    encodes the copy (FastStream's binary format, the attempt in a header) and runs one
    script that `XACK`s the entry and, only if that acknowledged it, stores the copy in a
    hash and scores it by its due time (the server's clock) in a sorted set; then it
    marks the message settled, so FastStream sends no second `XACK`. One mover task runs
    one script that moves up to 100 due copies back to the stream (`XADD`, `ZREM`,
    `HDEL`) and returns the head's due time; it sleeps until then (at most 5 s), woken
    early in-process when a failure's copy is the new head. Left out, as in bench-peers'
    minimal RabbitMQ adapter: classification, dead letters, spans, metrics, history
    headers, claiming a dead consumer's entries, and a nudge other replicas hear.
- **happy**: N (5,000) good messages, FastStream's bare subscriber against the same with
  a no-op `BaseMiddleware` (the noise floor) and with `RetryMiddleware`.

Besides the handler's figures, each round of the burst reports per message: Redis'
CPU (`INFO cpu`, user + sys) and this process' CPU (client + FastStream + the plugin or
the hand-written retry), both in µs; and the mover's cost per copy moved: its time
inside the move scripts (send, run, answer) per copy, and scripts run per copy.

    REDIS_URL=redis://127.0.0.1:6401 python -m bench.redis_retry [burst] [happy] [N] [ROUNDS]

N applies to the burst (the happy path runs 2.5 N); ROUNDS defaults to 5. Start a server
with `REDIS_PORT=6401 REDIS_SERIES=7.0 bash scripts/redis/start.sh` (AOF on, `appendfsync
always`: every write script costs an fsync; `REDIS_APPENDFSYNC` changes it). Run it under
`nice` on a shared machine and compare ratios, not rates: the load average is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import redis.asyncio as aredis
from faststream import BaseMiddleware
from faststream.message import AckStatus
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub
from faststream.redis.parser.binary import BinaryMessageFormatV1

from bench.burst import (
    Recorder,
    body,
    cpu_self,
    extra_args,
    interleaved,
    rounds_arg,
)
from faststream_retry import Fixed, RetryMiddleware, RetryPolicy
from faststream_retry.redis.mover import Mover
from faststream_retry.redis.sink import RedisSink

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6401")
DELAY = 1.0
GROUP = "bench"
TIMEOUT = 120.0
MOVE_BATCH = 100
CAP_S = 5.0
QUIET = logging.getLogger("bench.redis_retry")
"""FastStream's logger for the brokers: silent, as `logger=None` is on NATS (typed here)."""
QUIET.setLevel(logging.CRITICAL + 1)

FAIL = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
redis.call('ZADD', KEYS[2], due, ARGV[3])
if redis.call('ZRANGE', KEYS[2], 0, 0)[1] == ARGV[3] then return 1 end
return 0
"""
"""KEYS stream, schedule, data; ARGV group, entry id, copy id, delay ms, copy. 1: new head."""

MOVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local copy = redis.call('HGET', KEYS[3], id)
  if copy then redis.call('XADD', KEYS[1], '*', '__data__', copy) end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {#ids, tonumber(head[2] or -1), now}
"""
"""KEYS stream, schedule, data; ARGV batch. Returns moved, head's due ms or -1, now ms."""


class TransientError(Exception):
    """The handler's failure."""


class NoopMiddleware(BaseMiddleware):
    """The floor: what FastStream charges for any middleware at all."""


class MoveTimer:
    """Time inside move scripts, scripts run and copies moved (the mover's cost)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.scripts = 0
        self.moved = 0

    def figures(self) -> dict[str, float]:
        """Per copy moved: µs inside move scripts, scripts run."""
        per = max(self.moved, 1)
        return {
            "mover µs/copy": self.seconds * 1e6 / per,
            "move scripts/copy": self.scripts / per,
        }


class HandWritten:
    """The cheapest correct FastStream-on-Redis retry (module docstring)."""

    def __init__(self, r: aredis.Redis, stream: str, timer: MoveTimer) -> None:
        self.r = r
        self.keys = [stream, f"{{{stream}}}.retry", f"{{{stream}}}.retry.data"]
        self.fail_script = r.register_script(FAIL)
        self.move_script = r.register_script(MOVE)
        self.nudged = asyncio.Event()
        self.timer = timer
        self.task: asyncio.Task[None] | None = None

    async def fail(self, msg: RedisStreamMessage, data: bytes) -> None:
        """Acknowledge the entry and schedule its copy, in one script; FastStream acks nothing."""
        attempt = int(msg.headers.get("attempt", "0")) + 1
        copy = await BinaryMessageFormatV1.encode(
            message=data,
            reply_to=None,
            headers={"attempt": str(attempt)},
            correlation_id=msg.correlation_id,
        )
        (entry_id,) = msg.raw_message["message_ids"]
        head = await self.fail_script(
            keys=self.keys,
            args=[GROUP, entry_id, f"{entry_id.decode()}/{GROUP}", int(DELAY * 1000), copy],
        )
        if head == 1:
            self.nudged.set()
        # The script acknowledged it: FastStream's own XACK would be a second round trip.
        msg.committed = AckStatus.ACKED

    def start(self) -> None:
        """Start the mover."""
        self.task = asyncio.create_task(self.mover())

    async def mover(self) -> None:
        """Move due copies back; sleep until the head is due, a nudge, or CAP_S."""
        while True:
            self.nudged.clear()
            started = time.perf_counter()
            moved, head, now = await self.move_script(keys=self.keys, args=[MOVE_BATCH])
            self.timer.seconds += time.perf_counter() - started
            self.timer.scripts += 1
            self.timer.moved += int(moved)
            if moved >= MOVE_BATCH:
                continue
            wait = CAP_S if head < 0 else min(CAP_S, (head - now) / 1000)
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.nudged.wait(), wait)

    async def stop(self) -> None:
        """Stop the mover."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


NO_XACK = "plugin, no second XACK"
"""A diagnostic variant (BENCH_DIAG=1): the plugin with FastStream's own `XACK` of a message
the plugin's script acknowledged already left out (the message marked settled)."""


@contextlib.contextmanager
def no_second_xack() -> Any:
    """Mark a message whose failure the plugin's script settled as acked, for the block."""
    original = RedisSink._send  # noqa: SLF001 - a diagnostic patch

    async def send(self: RedisSink, msg: Any, *args: Any, **kwargs: Any) -> None:
        await original(self, msg, *args, **kwargs)
        msg.committed = AckStatus.ACKED

    RedisSink._send = send  # type: ignore[method-assign]  # noqa: SLF001
    try:
        yield
    finally:
        RedisSink._send = original  # type: ignore[method-assign]  # noqa: SLF001


@contextlib.contextmanager
def timed_plugin_mover(timer: MoveTimer) -> Any:
    """Time the plugin's `Mover.move_once` calls into `timer` for the block."""
    original = Mover.move_once

    async def move_once(self: Mover, keys: Any) -> tuple[int, int, int]:
        started = time.perf_counter()
        result = await original(self, keys)
        timer.seconds += time.perf_counter() - started
        timer.scripts += 1
        timer.moved += result[0]
        return result

    Mover.move_once = move_once  # type: ignore[method-assign]
    try:
        yield
    finally:
        Mover.move_once = original  # type: ignore[method-assign]


async def fill(r: aredis.Redis, stream: str, n: int) -> None:
    """Make the stream and its group (from 0), then add n messages in FastStream's format."""
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    for start in range(0, n, 1000):
        async with r.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + 1000)):
                payload = await BinaryMessageFormatV1.encode(
                    message=body(i), reply_to=None, headers={}, correlation_id=uuid.uuid4().hex
                )
                pipe.xadd(stream, {"__data__": payload})
            await pipe.execute()


async def cpu_server(r: aredis.Redis) -> float:
    """Redis' CPU seconds (user + sys), main thread and others."""
    info = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def cleanup(r: aredis.Redis, stream: str) -> None:
    """Delete a round's stream and what either variant made for it."""
    await r.delete(stream, f"{{{stream}}}.retry", f"{{{stream}}}.retry.data", f"{{{stream}}}.dlq")


async def burst(r: aredis.Redis, variant: str, n: int) -> dict[str, float]:
    """One round of the burst for `variant` ("plugin" or "hand-written")."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    await fill(r, stream, n)
    rec = Recorder(n, fails=1)
    timer = MoveTimer()
    retry: RetryMiddleware | None = None
    hand: HandWritten | None = None
    if variant in {"plugin", NO_XACK}:
        retry = RetryMiddleware(
            RetryPolicy(max_attempts=4, backoff=Fixed(timedelta(seconds=DELAY)))
        )
        broker = RedisBroker(URL, logger=QUIET, middlewares=[retry])
    else:
        broker = RedisBroker(URL, logger=QUIET)
        hand = HandWritten(r, stream, timer)

    @broker.subscriber(stream=StreamSub(stream, group=GROUP, consumer="c1"))
    async def handler(data: bytes, msg: RedisStreamMessage) -> None:
        if not rec.call(data):
            return
        if hand is None:
            raise TransientError
        await hand.fail(msg, data)

    if retry is not None:
        retry.install(broker)
    server0, self0 = await cpu_server(r), cpu_self()
    patch = no_second_xack() if variant == NO_XACK else contextlib.nullcontext()
    with patch, timed_plugin_mover(timer) if retry is not None else contextlib.nullcontext():
        await broker.start()
        if hand is not None:
            hand.start()
        try:
            await rec.wait(TIMEOUT)
        finally:
            server1, self1 = await cpu_server(r), cpu_self()
            if hand is not None:
                await hand.stop()
            await broker.stop()
            await cleanup(r, stream)
    return {
        **rec.burst(DELAY),
        "redis CPU µs/msg": (server1 - server0) * 1e6 / n,
        "own CPU µs/msg": (self1 - self0) * 1e6 / n,
        **timer.figures(),
    }


async def happy(r: aredis.Redis, variant: str, n: int) -> dict[str, float]:
    """One round of the happy path for `variant` ("bare", "no-op middleware", "plugin")."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    await fill(r, stream, n)
    rec = Recorder(n)
    retry = None
    middlewares: list[Any] = []
    if variant == "plugin":
        retry = RetryMiddleware()
        middlewares = [retry]
    elif variant == "no-op middleware":
        middlewares = [NoopMiddleware]
    broker = RedisBroker(URL, logger=QUIET, middlewares=middlewares)

    @broker.subscriber(stream=StreamSub(stream, group=GROUP, consumer="c1"))
    async def handler(data: bytes) -> None:
        rec.call(data)

    if retry is not None:
        retry.install(broker)
    self0 = cpu_self()
    await broker.start()
    rec.started()
    handled, self_started = rec.n_ok, cpu_self()
    try:
        await rec.wait(TIMEOUT)
    finally:
        self1 = cpu_self()
        await broker.stop()
        await cleanup(r, stream)
    return {
        **rec.happy(),
        "own CPU µs/msg": (self1 - self0) * 1e6 / n,
        "own CPU after start µs/msg": (self1 - self_started) * 1e6 / max(1, n - handled),
    }


async def main(argv: list[str]) -> None:
    """The scenarios asked for (both by default), rounds interleaved."""
    n, rounds = rounds_arg(argv, 2000, 5)
    scenarios = extra_args(argv) or ["burst", "happy"]
    r = aredis.from_url(URL)
    server = await r.info("server")
    persistence = await r.config_get("appendfsync")
    print(
        f"{URL}: redis {server.get('redis_version')}, appendfsync {persistence.get('appendfsync')}",
        file=sys.stderr,
    )
    if "burst" in scenarios:
        variants = ["hand-written", "plugin"] + ([NO_XACK] if os.environ.get("BENCH_DIAG") else [])
        results = await interleaved(variants, rounds, lambda v: burst(r, v, n))
        results.print(
            f"Redis retry burst: {n:,} messages failing once, {DELAY:g} s delay, {rounds} rounds",
            "hand-written",
        )
    if "happy" in scenarios:
        variants = ["bare", "no-op middleware", "plugin"]
        results = await interleaved(variants, rounds, lambda v: happy(r, v, n * 5 // 2))
        results.print(f"Redis happy path: {n * 5 // 2:,} messages, {rounds} rounds", "bare")
    await r.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
