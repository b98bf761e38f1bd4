"""The NATS fault suite's parts: the app process, servers of its own, a cutting proxy, the tally.

The workload and the tally are the RabbitMQ fault suite's (``tests.faults.support``):
sent = processed + dead-lettered, by id, with duplicates counted. Here the processed ids
come from the app's ledger, the dead-lettered ones from the dead-letter stream (read by
sequence, nothing consumed), and the late duplicates from what is left in the work stream
(work-queue retention: a message there was never acked) and the delay stream once the
app stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import nats
import pytest
from nats.js.errors import NotFoundError

from tests.faults.support import Tally
from tests.nats import fault_worker

if TYPE_CHECKING:
    from pathlib import Path

    from nats.aio.client import Client
    from nats.js import JetStreamContext

from tests.nats.conftest import ROOT

SCRIPTS = ROOT / "scripts" / "nats"

# The servers the suite starts itself, beside the one the other tests use: a node it
# restarts and kills, and a three-node cluster (on CLUSTER_PORT and the two after it, routes
# 100 above). scripts/test gives each series its own (scripts/lib.sh).
RESTART_PORT = int(os.environ.get("NATS_RESTART_PORT", "4303"))
CLUSTER_PORT = int(os.environ.get("NATS_CLUSTER_PORT", "4305"))

IN_HAND = fault_worker.BATCH + 20
"""What one app has in hand at most: a pull batch of the work consumer and one of the
hand-over's (``nats.ready.FETCH``). A fault that takes the app's connection away (the app
killed, the connection cut, the server stopped) can make each of those run again, and
nothing else: a copy made again is dropped by ``Nats-Msg-Id``. The duplicates the docs
promise are at most this many per fault."""


def nats_script(script: str, *args: str, **env: str) -> str:
    """Run one of ``scripts/nats``; its stdout."""
    done = subprocess.run(
        ["bash", str(SCRIPTS / script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


class Server:
    """A nats-server of the suite's own (``scripts/nats/start.sh``), stopped and killed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"

    def start(self, *, fresh: bool) -> None:
        nats_script("start.sh", NATS_PORT=str(self.port), NATS_FRESH="1" if fresh else "0")

    def stop(self, *, kill: bool = False, keep_data: bool = True) -> None:
        """SIGTERM (a shutdown: it flushes its store), or SIGKILL (a crash)."""
        nats_script(
            "stop.sh",
            NATS_PORT=str(self.port),
            NATS_KEEP_DATA="1" if keep_data else "0",
            NATS_SIGNAL="KILL" if kill else "TERM",
        )


def version_of(url: str) -> str:
    """The nats-server version behind ``url``, as its start script wrote it."""
    port = url.rsplit(":", 1)[-1].split(",", maxsplit=1)[0]
    base = os.environ.get("TMPDIR", "/tmp")  # noqa: S108 - start.sh's default
    with contextlib.suppress(OSError):
        return (
            open(f"{base}/nats-test-{port}/version").read().strip()  # noqa: PTH123
        )
    return "?"


async def publish_all(url: str, stream: str, subject: str, ids: list[str], batch: int = 50) -> None:
    """Publish ``ids`` to ``subject``, each confirmed by its PubAck, in batches side by side.

    Each carries its id as FastStream's ``message_id`` and as ``Nats-Msg-Id``, so a publish
    repeated after a timeout is stored once.
    """
    client = await nats.connect(url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.5)
    try:
        js = client.jetstream()
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            for _ in range(20):
                done = await asyncio.gather(
                    *(
                        js.publish(
                            subject,
                            m.encode(),
                            timeout=10,
                            stream=stream,
                            headers={"message_id": m, "Nats-Msg-Id": m},
                        )
                        for m in chunk
                    ),
                    return_exceptions=True,
                )
                chunk = [m for m, r in zip(chunk, done, strict=True) if isinstance(r, Exception)]
                if not chunk:
                    break
                await asyncio.sleep(0.5)
            assert not chunk, f"never confirmed: {chunk[:5]}"
    finally:
        await client.close()


class Worker:
    """The app process of ``tests.nats.fault_worker``."""

    def __init__(
        self,
        servers: str,
        stream: str,
        subject: str,
        prefix: str,
        tmp: Path,
        *,
        replicas: int = 1,
    ) -> None:
        self.ledger, self.events, self.log = tmp / "ledger", tmp / "events", tmp / "worker.log"
        self.args = [servers, stream, subject, prefix, str(replicas), str(self.ledger)]
        self.args.append(str(self.events))
        self.process: asyncio.subprocess.Process | None = None
        self.kills = 0

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.nats.fault_worker",
                *self.args,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        assert line == b"ready\n", f"the app did not start: {line!r}\n{self.log.read_text()}"

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        """SIGTERM: the broker stops, its acks sent."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
                pytest.fail(f"the app did not stop within 30 s\n{self.log.read_text()[-3000:]}")

    def lines(self, path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    def count(self, *kinds: str) -> int:
        return sum(line in kinds for line in self.lines(self.events))


class DeadLetters:
    """The ids in a dead-letter stream, read by sequence as they come (nothing consumed)."""

    def __init__(self, js: JetStreamContext, stream: str, into: list[str]) -> None:
        self.js, self.stream, self.into = js, stream, into
        self.next_seq = 1
        self.why: dict[str, str] = {}
        """Id -> its dead letter's ``retry-reason``."""

    async def refresh(self) -> None:
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            return
        except Exception:  # a server restarting or electing: read on the next round
            return
        while self.next_seq <= info.state.last_seq:
            try:
                msg = await self.js.get_msg(self.stream, self.next_seq)
            except NotFoundError:
                self.next_seq += 1
                continue
            except Exception:
                return
            headers = msg.headers or {}
            identity = headers.get("message_id", "?")
            self.into.append(identity)
            self.why[identity] = headers.get("retry-reason", "?")
            self.next_seq += 1


async def settle(
    tally: Tally, app: Worker, letters: DeadLetters, timeout: float, what: str
) -> float:
    """Wait until every id is processed or dead-lettered; the seconds it took."""
    started = time.monotonic()
    while True:
        tally.processed[:] = app.lines(app.ledger)
        await letters.refresh()
        if not tally.lost:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            missing = sorted(tally.lost)
            pytest.fail(
                f"{what}: {len(missing)} ids neither processed nor dead: {missing[:10]}\n"
                f"the app's log:\n{app.log.read_text()[-3000:]}"
            )
        await asyncio.sleep(0.2)


async def count_late(tally: Tally, js: JetStreamContext, stream: str, prefix: str) -> None:
    """Count the duplicates still on their way once every id settled and the app stopped.

    What a consumer of the work stream or the delay stream would still deliver (not yet
    delivered, or delivered and not acked) would come back to a handler or a re-check: a
    settled id again. Counted from the consumers, not the streams' message counts: after a
    SIGKILL a 2.9 server can keep messages a work-queue stream had removed on their ack,
    below every consumer's ack floor, where none delivers them again.
    """
    for name in (stream, f"{prefix}-delay"):
        with contextlib.suppress(NotFoundError):
            info = await js.stream_info(name)
            pending = 0
            for consumer in await js.consumers_info(name):
                pending += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
            tally.late += ["?"] * pending
            print(f"{name}: {info.state.messages} messages, {pending} to deliver")  # noqa: T201


async def connect(servers: str) -> Client:
    """A client of the test's own, for looking at streams."""
    return await nats.connect(
        servers.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.5
    )


def row(
    scenario: str, server: str, faults: str, tally: Tally, *, settled_s: float, total_s: float
) -> dict[str, Any]:
    """One row of the suite's table (printed at the end of the run)."""
    return {
        "scenario": scenario,
        "server": server,
        "faults": faults,
        "sent": len(tally.sent),
        "processed": len(set(tally.processed)),
        "dead-lettered": len(set(tally.dead)),
        "lost": len(tally.lost),
        "duplicates": tally.duplicates,
        "settled after the last fault, s": f"{settled_s:.1f}",
        "test, s": f"{total_s:.1f}",
    }
