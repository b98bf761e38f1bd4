"""The fault suite's parts: a deterministic workload, a tally by message id, brokers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry import PermanentError
from faststream_retry.core import headers as h
from faststream_retry.core.tiers import Tiers
from faststream_retry.core.topology import tier_name

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from aio_pika.abc import AbstractIncomingMessage

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "rabbitmq"

# The brokers the suite starts itself, beside the one it tests on: a node it restarts and
# kills (R1), and a three-node cluster (R4, on CLUSTER_PORT and the two ports after it).
# scripts/test gives each RabbitMQ series its own, so that two series' runs never meet.
RESTART_PORT = int(os.environ.get("RMQ_RESTART_PORT", "5690"))
CLUSTER_PORT = int(os.environ.get("RMQ_CLUSTER_PORT", "5680"))

MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Workload:
    """``n`` messages whose fate depends only on their id and attempt, so a duplicate
    delivery behaves exactly like the original:

    - ``i % 10 == 0``: permanent failure, dead-lettered at once;
    - ``i % 10 == 4``: always transient, dead-lettered as exhausted;
    - ``i % 10 in (1, 2, 3)``: two transient failures, then processed;
    - otherwise processed at once.
    """

    n: int
    prefix: str = "m"

    @property
    def ids(self) -> list[str]:
        return [f"{self.prefix}{i:05d}" for i in range(self.n)]

    @staticmethod
    def index(message_id: str) -> int:
        return int(message_id[-5:])

    def expected_dead(self) -> set[str]:
        return {m for m in self.ids if self.index(m) % 10 in (0, 4)}

    def behave(self, message_id: str | None, headers: dict[str, Any] | None) -> None:
        """Raise what the handler of ``message_id`` raises on this delivery."""
        if message_id is None:
            raise PermanentError("no message id")
        kind = self.index(message_id) % 10
        if kind == 0:
            raise PermanentError(f"{message_id} is malformed")
        if kind == 4:
            raise TimeoutError(f"{message_id}: upstream timed out")
        if kind in (1, 2, 3) and h.read_attempt(headers) < 2:
            raise ConnectionError(f"{message_id}: upstream refused")


async def publish_all(url: str, queue: str, ids: list[str], batch: int = 200) -> None:
    """Publish persistent messages with confirms, straight to ``queue``."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for start in range(0, len(ids), batch):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            m.encode(),
                            message_id=m,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=queue,
                    )
                    for m in ids[start : start + batch]
                )
            )


@dataclass
class Tally:
    """What became of every id: processed (handler returned) or dead-lettered."""

    sent: list[str]
    processed: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    """Ids still queued once every id settled and the app stopped: copies that would
    have come back as duplicates (see ``count_late``)."""

    @property
    def settled(self) -> set[str]:
        return set(self.processed) | set(self.dead)

    @property
    def lost(self) -> set[str]:
        return set(self.sent) - self.settled

    @property
    def duplicates(self) -> int:
        processed, dead = len(self.processed), len(self.dead)
        return processed - len(set(self.processed)) + dead - len(set(self.dead)) + len(self.late)


class DeadLetterWatch:
    """Consumes ``<queue>.dlq`` as the test runs, recording the ids that arrive.

    It connects again by itself after a broker restart rather than through aio-pika's robust
    connection: under load that one once came back without its consumer (CI saw 200 dead
    letters wait in a .dlq with no consumer, and the test call them lost).
    """

    def __init__(self, url: str, dlq: str, into: list[str]) -> None:
        self.url, self.dlq, self.into = url, dlq, into
        self.why: dict[str, str] = {}
        """Id -> retry-reason, or the broker's own x-death reason (a delivery limit, say)."""
        self._task: asyncio.Task[None] | None = None
        self._consuming = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch())
        await asyncio.wait_for(self._consuming.wait(), 60)

    async def _watch(self) -> None:
        while True:
            # Whatever ended the last connection (a restart, a refused connect, the queue
            # not there yet on a node that is starting), connect again.
            with contextlib.suppress(Exception):
                await self._consume_until_closed()
            await asyncio.sleep(0.5)

    async def _consume_until_closed(self) -> None:
        connection = await aio_pika.connect(self.url)
        closed = asyncio.Event()
        connection.close_callbacks.add(lambda *_: closed.set())
        try:
            channel = await connection.channel()
            channel.close_callbacks.add(lambda *_: closed.set())
            queue = await channel.get_queue(self.dlq, ensure=True)
            await queue.consume(self._record)
            self._consuming.set()
            await closed.wait()
        finally:
            with contextlib.suppress(Exception):
                await connection.close()

    async def _record(self, message: AbstractIncomingMessage) -> None:
        identity = message.message_id or "?"
        await message.ack()
        # A letter handed to this watch before its connection dropped comes again:
        # the broker's redelivery to the watch, not a second dead letter.
        if message.redelivered and identity in self.why:
            return
        self.into.append(identity)
        headers: dict[str, Any] = dict(message.headers or {})
        deaths = headers.get("x-death")
        broker_reason = (
            f"{deaths[0].get('reason')} in {deaths[0].get('queue')}"
            if isinstance(deaths, list) and deaths
            else None
        )
        self.why[identity] = str(headers.get(h.REASON) or broker_reason)

    async def flush(self) -> None:
        """Return once every dead letter confirmed so far is recorded.

        A marker published now queues behind them; when the watch sees it, they are in.
        """
        marker = f"end-of-watch-{uuid.uuid4().hex}"
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b"", message_id=marker), routing_key=self.dlq
            )
        deadline = time.monotonic() + 30
        while marker not in self.into:
            if time.monotonic() > deadline:
                pytest.fail(f"the marker never came back from {self.dlq}")
            await asyncio.sleep(0.05)
        self.into.remove(marker)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def wait_settled(tally: Tally, timeout: float, what: str, *, may_lose: int = 0) -> float:
    """Wait until every id is processed or dead-lettered; return the seconds it took.

    Fails with the missing ids on timeout, unless no more than ``may_lose`` are missing
    (a documented limit of a non-default setup; the report shows them as lost).
    Duplicates still on their way are counted afterwards, exactly, by ``count_late``.
    """
    started = time.monotonic()
    while tally.lost:
        if time.monotonic() - started > timeout:
            missing = sorted(tally.lost)
            if len(missing) <= may_lose:
                break
            pytest.fail(f"{what}: {len(missing)} ids neither processed nor dead: {missing[:10]}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def count_late(tally: Tally, url: str, queues: list[str], watch: DeadLetterWatch) -> None:
    """Count the duplicates that had not arrived yet when every id settled.

    Call it once the app is stopped: its unacked messages are back in their queues, and
    no handler or re-check consumer moves anything any more. Every message still in the
    work queue, ``.retry`` or a tier is then a copy of a settled id that would have come
    back later; every dead letter confirmed before now reaches the watch.
    """
    connection = await aio_pika.connect(url)
    async with connection:
        for name in queues:
            channel = await connection.channel()
            try:
                queue = await channel.get_queue(name, ensure=True)
            except ChannelNotFoundEntity:
                continue  # a tier the plan never declared holds nothing
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                tally.late.append(message.message_id or "?")
    await watch.flush()


async def stopped(what: str, stop: Awaitable[None], timeout: float = 30.0) -> None:
    """Await a clean-up step within ``timeout`` seconds.

    A stop that hangs after a fault is a finding in itself; bounding it turns a silent
    pytest-timeout into a failure that names the step.
    """
    task = asyncio.ensure_future(stop)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        # Where it hangs is the finding: the tasks show it while the stop still waits.
        dump_tasks()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        pytest.fail(f"{what} did not finish within {timeout} s")
    task.result()


class Timeline:
    """Prints when each phase of a scenario starts; pytest shows it when a test fails."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, phase: str) -> None:
        print(f"{time.monotonic() - self.started:7.1f} s  {phase}", flush=True)  # noqa: T201


def dump_tasks() -> None:
    """Print where every pending task waits, one line per frame.

    pytest-timeout prints the threads, which for asyncio only shows the idle selector;
    the coroutines are where a hang is.
    """
    print("pending tasks:", flush=True)  # noqa: T201
    for task in asyncio.all_tasks():
        print(f"  {task.get_name()}", flush=True)  # noqa: T201
        # Task.get_stack() gives one frame of a suspended coroutine; the await chain
        # gives them all, down to what it waits on.
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                print(f"      waits on {awaited!r}"[:300], flush=True)  # noqa: T201
                break
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
            print(f"      {where}", flush=True)  # noqa: T201
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)


def check_outcomes(
    workload: Workload,
    tally: Tally,
    watch: DeadLetterWatch | None = None,
    *,
    may_lose: int = 0,
) -> None:
    """sent = processed + dead-lettered + lost, each id where its handler sent it.

    ``lost`` must be empty, or no larger than ``may_lose`` where a documented limit
    allows it (classic queues across broker restarts).
    """
    lost = tally.lost
    assert len(lost) <= may_lose, f"lost: {sorted(lost)[:10]}"
    why = watch.why if watch is not None else {}
    unexpected = sorted(set(tally.dead) - workload.expected_dead())
    assert not unexpected, (
        f"dead-lettered, but meant to succeed: {[(i, why.get(i)) for i in unexpected]}"
    )
    assert set(tally.dead) == workload.expected_dead() - lost
    assert set(tally.processed) == set(workload.ids) - workload.expected_dead() - lost
    assert set(tally.processed) & set(tally.dead) == set()


class Node:
    """A RabbitMQ node of the project's broker script, on a port of its own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base = Path(os.environ.get("TMPDIR", "/tmp")) / f"rabbitmq-test-{port}"  # noqa: S108
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"

    def _run(self, script: str, **env: str) -> None:
        done = subprocess.run(
            ["bash", str(SCRIPTS / script)],
            env={**os.environ, "RMQ_PORT": str(self.port), **env},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"{script} on port {self.port} failed:\n{done.stderr}")
        if "docker container" in done.stderr:
            # A container loses its data on stop, and cannot join a loopback cluster.
            self._run("stop.sh")
            pytest.skip("restarts need a local rabbitmq-server (the Debian package), not Docker")

    def start(self, *, fresh: bool) -> None:
        self._run("start.sh", RMQ_FRESH="1" if fresh else "0")

    def stop(self, *, keep_data: bool = False) -> None:
        self._run("stop.sh", RMQ_KEEP_DATA="1" if keep_data else "0")

    def kill(self) -> None:
        """SIGKILL the broker: a crash, no graceful shutdown.

        Returns once the process is gone and its AMQP port refuses connections, so
        that a start right after does not find the port of the dying node still open.
        """
        pid = int((self.base / "rabbitmq.pid").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not _alive(pid) and not _port_open(self.port):
                return
            time.sleep(0.05)
        pytest.fail(f"the broker on port {self.port} (pid {pid}) outlived SIGKILL by 30 s")


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie holds no sockets)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def tier_names(prefix: str, tick_ms: int, max_ms: int) -> list[str]:
    """The delay tiers a plugin with this prefix, tick and max_delay declares."""
    return [tier_name(prefix, ttl) for ttl in Tiers.build(tick_ms, max_ms).ttls_ms]


async def delete_topology(
    url: str, queues: list[str], prefix: str, tick_ms: int, max_ms: int
) -> None:
    """Delete a scenario's queues and its delay tiers from a shared broker."""
    connection = await aio_pika.connect(url)
    async with connection:
        for name in [*queues, *tier_names(prefix, tick_ms, max_ms)]:
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
                await channel.exchange_delete(name)
