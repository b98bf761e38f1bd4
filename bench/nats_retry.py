"""The plugin on NATS JetStream against a hand-written FastStream retry, side by side (issue 39).

Two scenarios, each variant on fresh streams, rounds interleaved (ABAB...), medians,
spread and ratios printed (see bench/burst.py for how each figure is read off the
handler's calls):

- **burst**: N (2,000) messages published to a work stream, then a FastStream pull
  subscriber (durable, `PullSub(batch_size=100)`) starts; each message fails once and
  succeeds on its retry 1 s later. Variants:
  - *plugin*: `RetryMiddleware(RetryPolicy(max_attempts=4, backoff=Fixed(1 s)))` on the
    `NatsBroker` (`install()`ed); the handler raises.
  - *hand-written*: the cheapest correct retry we could write on FastStream and nats-py,
    with the delay held by the server: the handler catches its failure, publishes a copy
    (attempt and due time in headers) to a delay stream on a connection of its own and
    awaits its PubAck, then returns (FastStream acks the original: confirm, then ack). One
    re-check loop (a nats-py pull consumer, `ack_wait` 30 s) fetches 200 copies at a time;
    every copy has the same delay, so it waits for the head's due time, publishes every
    due copy back to the work subject at once (PubAcks awaited together), then acks them.
    No `nak(delay)`: it holds the message in the work consumer's pending set and stalls it
    (docs/explanation/nats-design.md). Left out, as in bench-peers' minimal RabbitMQ
    adapter: classification, dead letters, spans, metrics, `Nats-Msg-Id` dedupe, and
    `in_progress` for delays longer than `ack_wait`.
- **happy**: N (5,000) good messages, FastStream's bare subscriber against the same with
  a no-op `BaseMiddleware` (the noise floor) and with `RetryMiddleware`.

    NATS_URL=nats://127.0.0.1:4301 python -m bench.nats_retry [burst] [happy] [N] [ROUNDS]

N applies to the burst (the happy path runs 2.5 N); ROUNDS defaults to 5. Start a server
with `NATS_PORT=4301 NATS_SERIES=2.9 bash scripts/nats/start.sh`. Run it under `nice`
on a shared machine and compare ratios, not rates: the load average is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
import nats.errors
from faststream import BaseMiddleware
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from bench.burst import (
    Recorder,
    body,
    cpu_of,
    cpu_self,
    extra_args,
    interleaved,
    rounds_arg,
)
from faststream_retry import Fixed, RetryMiddleware, RetryPolicy

URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4301")
DELAY = 1.0
BATCH = 100
TIMEOUT = 120.0


def server_pid() -> int | None:
    """The nats-server's pid: NATS_PID, or the pid file scripts/nats/start.sh wrote for the port."""
    if os.environ.get("NATS_PID"):
        return int(os.environ["NATS_PID"])
    port = URL.rsplit(":", 1)[-1].strip("/")
    pidfile = Path(os.environ.get("TMPDIR", "/tmp")) / f"nats-test-{port}" / "nats.pid"  # noqa: S108
    with contextlib.suppress(OSError, ValueError):
        return int(pidfile.read_text().strip())
    return None


SERVER = server_pid()
WIRE = "hand-written, plugin's headers"
"""A diagnostic variant (BENCH_DIAG=1): the hand-written retry carrying the plugin's headers."""
RECHECK_FETCH = 200
"""Copies one re-check fetch holds while its head waits (the plugin's figure; 1 s timeout)."""


class TransientError(Exception):
    """The handler's failure."""


class NoopMiddleware(BaseMiddleware):
    """The floor: what FastStream charges for any middleware at all."""


async def fill(js: JetStreamContext, subject: str, n: int) -> None:
    """Publish n bodies to `subject`, PubAcks awaited 500 at a time."""
    for start in range(0, n, 500):
        await asyncio.gather(
            *(js.publish(subject, body(i), timeout=30) for i in range(start, min(n, start + 500)))
        )


async def delete_streams(js: JetStreamContext, *names: str) -> None:
    """Delete what a round made (a stream's consumers go with it)."""
    for name in names:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)


class HandWritten:
    """The cheapest correct FastStream-on-NATS retry (module docstring)."""

    def __init__(
        self, js: JetStreamContext, work_subject: str, base: str, *, wire: bool = False
    ) -> None:
        self.wire = wire
        """Carry what the plugin's copies carry (diagnostic, BENCH_DIAG=1): `Nats-Msg-Id`,
        the target stream named, and its eight `retry-*`/`message_id` headers (425 bytes)."""
        self.js = js
        self.work_subject = work_subject
        self.stream = f"{base}-delay"
        self.subject = f"{base}.delay"
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Make the delay stream, start the re-check loop."""
        await self.js.add_stream(name=self.stream, subjects=[self.subject], retention="workqueue")
        sub = await self.js.pull_subscribe(
            self.subject, durable="recheck", stream=self.stream, config=ConsumerConfig(ack_wait=30)
        )
        self.task = asyncio.create_task(self.recheck(sub))

    async def fail(self, msg: NatsMessage, data: bytes) -> None:
        """Copy the failed message into the delay stream; return once the server has it."""
        attempt = int((msg.headers or {}).get("attempt", "0")) + 1
        due = time.time() + DELAY
        headers = {"attempt": str(attempt), "due": repr(due)}
        if not self.wire:
            await self.js.publish(self.subject, data, headers=headers, timeout=30)
            return
        meta = msg.raw_message.metadata
        now = str(int(time.time() * 1000))
        headers |= {
            "retry-subject": json.dumps(self.work_subject),
            "message_id": str(uuid.uuid4()),
            "retry-version": "1",
            "retry-first-failed-at": now,
            "retry-last-failed-at": now,
            "retry-history": json.dumps(
                [{"attempt": 1, "at": int(now), "exception": "TransientError", "error": ""}]
            ),
            "Nats-Msg-Id": f"{meta.stream}:{meta.consumer}:{meta.sequence.stream}:retry",
        }
        await self.js.publish(self.subject, data, headers=headers, timeout=30, stream=self.stream)

    async def recheck(self, sub: Any) -> None:
        """Release each copy when due: publish back, PubAcks awaited, then ack."""
        while True:
            try:
                msgs = await sub.fetch(RECHECK_FETCH, timeout=1)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            i = 0
            while i < len(msgs):
                wait = float(msgs[i].headers["due"]) - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                now = time.time()
                j = i
                while j < len(msgs) and float(msgs[j].headers["due"]) <= now:
                    j += 1
                due = msgs[i:j]
                await asyncio.gather(
                    *(
                        self.js.publish(
                            self.work_subject,
                            m.data,
                            headers=self.released(m),
                            timeout=30,
                        )
                        for m in due
                    )
                )
                for m in due:
                    await m.ack()
                i = j

    def released(self, copy: Any) -> dict[str, str]:
        """The headers of a copy released to the work subject."""
        if not self.wire:
            return {"attempt": copy.headers["attempt"]}
        headers = {k: v for k, v in copy.headers.items() if not k.startswith("Nats-")}
        return headers | {"Nats-Msg-Id": f"{copy.metadata.sequence.stream}:release"}

    async def stop(self) -> None:
        """Stop the re-check loop."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def burst(js: JetStreamContext, variant: str, n: int) -> dict[str, float]:
    """One round of the burst for `variant` ("plugin" or "hand-written")."""
    base = f"bench-{uuid.uuid4().hex[:8]}"
    subject = f"{base}.work"
    await js.add_stream(name=base, subjects=[subject])
    await fill(js, subject, n)
    rec = Recorder(n, fails=1)
    retry: RetryMiddleware | None = None
    hand: HandWritten | None = None
    if variant == "plugin":
        retry = RetryMiddleware(
            RetryPolicy(max_attempts=4, backoff=Fixed(timedelta(seconds=DELAY))),
            prefix=f"{base}-r",
        )
        broker = NatsBroker(URL, logger=None, middlewares=[retry])
    else:
        broker = NatsBroker(URL, logger=None)
        hand = HandWritten(js, subject, base, wire=variant == WIRE)

    @broker.subscriber(
        subject,
        stream=JStream(base, subjects=[subject]),
        durable="work",
        pull_sub=PullSub(batch_size=BATCH),
    )
    async def handler(data: bytes, msg: NatsMessage) -> None:
        if not rec.call(data):
            return
        if hand is None:
            raise TransientError
        await hand.fail(msg, data)

    if retry is not None:
        retry.install(broker)
    if hand is not None:
        await hand.start()
    server0, self0 = cpu_of(SERVER), cpu_self()
    await broker.start()
    try:
        await rec.wait(TIMEOUT)
    finally:
        server1, self1 = cpu_of(SERVER), cpu_self()
        await broker.stop()
        if hand is not None:
            await hand.stop()
        await delete_streams(js, base, f"{base}-delay", f"{base}-r-delay", f"{base}-r-dlq-{base}")
    return {
        **rec.burst(DELAY),
        "server CPU µs/msg": (server1 - server0) * 1e6 / n,
        "own CPU µs/msg": (self1 - self0) * 1e6 / n,
    }


async def happy(js: JetStreamContext, variant: str, n: int) -> dict[str, float]:
    """One round of the happy path for `variant` ("bare", "no-op middleware", "plugin")."""
    base = f"bench-{uuid.uuid4().hex[:8]}"
    subject = f"{base}.work"
    await js.add_stream(name=base, subjects=[subject])
    await fill(js, subject, n)
    rec = Recorder(n)
    retry = None
    middlewares: list[Any] = []
    if variant == "plugin":
        retry = RetryMiddleware(prefix=f"{base}-r")
        middlewares = [retry]
    elif variant == "no-op middleware":
        middlewares = [NoopMiddleware]
    broker = NatsBroker(URL, logger=None, middlewares=middlewares)

    @broker.subscriber(
        subject,
        stream=JStream(base, subjects=[subject]),
        durable="work",
        pull_sub=PullSub(batch_size=BATCH),
    )
    async def handler(data: bytes) -> None:
        rec.call(data)

    if retry is not None:
        retry.install(broker)
    server0, self0 = cpu_of(SERVER), cpu_self()
    await broker.start()
    rec.started()
    handled, self_started = rec.n_ok, cpu_self()
    try:
        await rec.wait(TIMEOUT)
    finally:
        server1, self1 = cpu_of(SERVER), cpu_self()
        await broker.stop()
        await delete_streams(js, base, f"{base}-r-delay", f"{base}-r-dlq-{base}")
    return {
        **rec.happy(),
        "server CPU µs/msg": (server1 - server0) * 1e6 / n,
        "own CPU µs/msg": (self1 - self0) * 1e6 / n,
        "own CPU after start µs/msg": (self1 - self_started) * 1e6 / max(1, n - handled),
    }


async def main(argv: list[str]) -> None:
    """The scenarios asked for (both by default), rounds interleaved."""
    n, rounds = rounds_arg(argv, 2000, 5)
    scenarios = extra_args(argv) or ["burst", "happy"]
    nc = await nats.connect(URL)
    js = nc.jetstream()
    info = nc._server_info  # noqa: SLF001 - the server's version, for the record
    print(f"{URL}: nats-server {info.get('version')}, pid {SERVER}", file=sys.stderr)
    if "burst" in scenarios:
        variants = ["hand-written", "plugin"] + ([WIRE] if os.environ.get("BENCH_DIAG") else [])
        results = await interleaved(variants, rounds, lambda v: burst(js, v, n))
        results.print(
            f"NATS retry burst: {n:,} messages failing once, {DELAY:g} s delay, {rounds} rounds",
            "hand-written",
        )
    if "happy" in scenarios:
        variants = ["bare", "no-op middleware", "plugin"]
        results = await interleaved(variants, rounds, lambda v: happy(js, v, n * 5 // 2))
        results.print(f"NATS happy path: {n * 5 // 2:,} messages, {rounds} rounds", "bare")
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
