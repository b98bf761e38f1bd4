"""The Redis fault suite's parts: the app process, the publisher, the tally by id, the table.

The workload and the tally are the RabbitMQ fault suite's (``tests.faults.support``): a
message's fate depends on its id and attempt only, so a duplicate behaves as the original,
and every id ends processed (the app's ledger, a file) or dead-lettered (``P.dlq``, read by
id): sent = processed + dead-lettered + lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from faststream_retry.redis import envelope
from faststream_retry.redis.keys import stream_keys
from tests.faults.support import Tally, Workload, check_outcomes, wait_settled
from tests.redis.support import until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

__all__ = [
    "ROWS",
    "Ledger",
    "Tally",
    "Worker",
    "Workload",
    "check_outcomes",
    "dead_ids",
    "late",
    "publish",
    "record",
    "settle",
    "until_up",
]

ROOT = Path(__file__).resolve().parents[2]
GROUP = "g"

ROWS: list[dict[str, Any]] = []
"""One row per scenario, printed at the end of the run (``conftest``)."""


class Worker:
    """One replica of ``tests.redis.fault_worker``: a process the test starts, kills, stops."""

    def __init__(self, url: str, stream: str, consumer: str, ledger: Path, **env: str) -> None:
        self.env = {
            **os.environ,
            "REDIS_URL": url,
            "STREAM": stream,
            "CONSUMER": consumer,
            "LEDGER": str(ledger),
            **env,
        }
        self.process: asyncio.subprocess.Process | None = None
        self.kills = 0

    async def start(self) -> None:
        """Start it and wait until its broker consumes (it writes ``READY``).

        Its output (FastStream's log lines) goes to ``<LEDGER>.<CONSUMER>.log``.
        """
        ready = Path(f"{self.env['LEDGER']}.{self.env['CONSUMER']}.ready")
        ready.unlink(missing_ok=True)
        with Path(f"{self.env['LEDGER']}.{self.env['CONSUMER']}.log").open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.redis.fault_worker",
                cwd=ROOT,
                env={**self.env, "READY": str(ready)},
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.process.returncode is None, f"the app exited: see {log.name}"
            assert time.monotonic() < deadline, f"the app did not start in 60 s: see {log.name}"
            await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL: no stop, no drain; its pending entries stay in the group."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        """SIGTERM: FastStream's graceful stop (the plugin's too), bounded."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.send_signal(signal.SIGKILL)
                await self.process.wait()
                raise AssertionError("the app did not stop within 30 s of SIGTERM") from None


class Ledger:
    """The processed ids the replicas appended (one ``O_APPEND`` line per success)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def ids(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []


def message(m: str) -> dict[bytes, bytes]:
    """``{"id": m}`` as FastStream's producer writes it (its binary format, JSON body)."""
    body = json.dumps({"id": m}).encode()
    headers = {"content-type": "application/json", "correlation_id": m}
    return {envelope.DATA_FIELD: envelope.build(body, headers)}


async def publish(client: Redis, stream: str, ids: list[str], chunk: int = 1000) -> None:
    """``XADD`` each id's message, a pipeline per ``chunk`` (not one round trip each)."""
    for start in range(0, len(ids), chunk):
        pipe = client.pipeline(transaction=False)
        for m in ids[start : start + chunk]:
            pipe.xadd(stream, message(m))  # type: ignore[arg-type]
        await pipe.execute()


async def dead_ids(client: Redis, stream: str) -> list[str]:
    """The id of every dead letter in ``stream``'s ``P.dlq``, once per letter."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(  # type: ignore[assignment]
        stream_keys(stream).dlq
    )
    return [str(json.loads(envelope.parse(f).body)["id"]) for _, f in entries]


async def settle(
    tally: Tally, client: Redis, stream: str, ledger: Ledger, *, timeout: float, what: str
) -> float:
    """Follow the ledger and the dead letters until every id settled; return the seconds.

    A server that is down or restarting is asked again at the next look.
    """

    async def follow() -> None:
        while True:
            tally.processed[:] = ledger.ids()
            with contextlib.suppress(RedisError, OSError):
                tally.dead[:] = await dead_ids(client, stream)
            await asyncio.sleep(0.1)

    following = asyncio.create_task(follow())
    try:
        return await wait_settled(tally, timeout, what)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


async def late(client: Redis, stream: str) -> int:
    """Copies and entries that would still come back once every id settled (duplicates).

    Call it with every replica stopped: what waits in the schedule, what the group has not
    read yet, and what is still pending in it.
    """
    keys = stream_keys(stream)
    waiting = int(await client.zcard(keys.schedule))
    (group,) = [
        g for g in await client.xinfo_groups(stream) if g["name"] in (GROUP, GROUP.encode())
    ]
    unread = int(group["lag"] or 0)  # Redis 7.0 and later; nothing deleted, so never unknown
    return waiting + unread + int(group["pending"])


async def drained(client: Redis, stream: str) -> None:
    """Wait until nothing is pending in the group and nothing waits in the schedule.

    Once every id settled, what is left is a duplicate on its way, or an entry stranded:
    pending for ever, behind a live replica that will never hand it to a handler.
    """
    keys = stream_keys(stream)

    async def empty() -> bool:
        pending = (await client.xpending(stream, GROUP))["pending"]
        return pending == 0 and int(await client.zcard(keys.schedule)) == 0

    try:
        await until_up(empty, "nothing pending, nothing waiting")
    except BaseException:
        with contextlib.suppress(RedisError, OSError):
            rows = await client.xpending_range(stream, GROUP, min="-", max="+", count=10)
            print(f"still pending: {rows}")  # noqa: T201 - shown with the failure
        raise


async def server_of(client: Redis) -> str:
    """``redis 7.0.15``, ``valkey 9.1.2``: what the rows were measured on."""
    info = await client.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info['redis_version']}"


def record(
    scenario: str, server: str, tally: Tally, extra_duplicates: int, seconds: float, **more: Any
) -> None:
    """Add a scenario's row: sent / processed / dead-lettered / lost / duplicates / time."""
    ROWS.append(
        {
            "scenario": scenario,
            "server": server,
            "sent": len(tally.sent),
            "processed": len(set(tally.processed)),
            "dead-lettered": len(set(tally.dead)),
            "lost": len(tally.lost),
            "duplicates": tally.duplicates + extra_duplicates,
            "of them still to come": extra_duplicates,
            "settled after the last fault, s": f"{seconds:.1f}",
            **more,
        }
    )


async def until_up(
    condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 60
) -> None:
    """``tests.redis.support.until``, asking again when the server is down or restarting."""

    async def asked() -> bool:
        try:
            return await condition()
        except (RedisError, OSError):
            return False

    await until(asked, timeout=timeout, what=what)
