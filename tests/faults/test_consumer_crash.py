"""R2: the consuming process is SIGKILLed mid-flight, during handler calls and during
re-check hops, and started again. Nothing is lost; duplicates are counted."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.faults import worker
from tests.faults.support import (
    ROOT,
    DeadLetterWatch,
    Tally,
    Workload,
    check_outcomes,
    count_late,
    delete_topology,
    publish_all,
    stopped,
    tier_names,
    wait_settled,
)
from tests.rabbit import eventually, unique

if TYPE_CHECKING:
    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]


class Worker:
    """The app process of ``tests.faults.worker``."""

    def __init__(self, url: str, queue: str, prefix: str, tmp: Path) -> None:
        self.args = [url, queue, prefix, str(tmp / "ledger"), str(tmp / "events")]
        self.ledger, self.events = tmp / "ledger", tmp / "events"
        self.process: asyncio.subprocess.Process | None = None
        self.kills = 0

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.faults.worker",
            *self.args,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        assert line == b"ready\n", f"worker did not start: {line!r}"

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await self.process.wait()

    def lines(self, path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    def count(self, *kinds: str) -> int:
        return sum(line in kinds for line in self.lines(self.events))


async def test_consumer_crashes_lose_nothing(
    rabbit_url: str, tmp_path: Path, report: Report
) -> None:
    """1,000 messages; three SIGKILLs: during handler calls, during re-check hops and
    releases, and once more while first attempts and retries are mixed."""
    workload = Workload(1000)
    queue, prefix = unique("r2"), unique("r2t")
    tally = Tally(workload.ids)
    app = Worker(rabbit_url, queue, prefix, tmp_path)
    watch = DeadLetterWatch(rabbit_url, f"{queue}.dlq", tally.dead)
    try:
        await app.start()
        await watch.start()
        publishing = asyncio.create_task(publish_all(rabbit_url, queue, workload.ids, batch=50))
        # 1: in the middle of first deliveries.
        await eventually(lambda: len(app.lines(app.ledger)) >= 150, 60, "handler calls")
        await app.kill()
        await publishing
        await app.start()
        # 2: while the re-check consumer sends messages round the tiers.
        hops = app.count("hop", "released")
        await eventually(lambda: app.count("hop", "released") >= hops + 50, 60, "re-check hops")
        await app.kill()
        await app.start()
        # 3: a little later, retries and releases mixed.
        await asyncio.sleep(0.8)  # where the kill lands, not a wait for a condition
        await app.kill()
        await app.start()

        def refresh() -> None:
            tally.processed[:] = app.lines(app.ledger)

        async def poll() -> None:
            while True:
                refresh()
                await asyncio.sleep(0.1)

        poller = asyncio.create_task(poll())
        seconds = await wait_settled(tally, 120, "R2")
        await stopped("stopping the app", app.stop())
        poller.cancel()
        refresh()
        retry_queues = tier_names(prefix, int(worker.TICK_S * 1000), worker.MAX_DELAY_S * 1000)
        # Tiers before .retry: a copy expiring out of a tier meanwhile is still counted.
        await count_late(tally, rabbit_url, [queue, *retry_queues, f"{queue}.retry"], watch)
    finally:
        await stopped("stopping the app", app.stop())
        await stopped("closing the DLQ watch", watch.stop())
        await delete_topology(
            rabbit_url,
            [queue, f"{queue}.retry", f"{queue}.dlq"],
            prefix,
            int(worker.TICK_S * 1000),
            worker.MAX_DELAY_S * 1000,
        )
    check_outcomes(workload, tally, watch)
    report.add("R2 consumer SIGKILL", f"{app.kills} SIGKILLs of the app process", tally, seconds)
