"""The fault suite on NATS JetStream: the server restarted and killed with copies waiting, the
app killed -9 mid-burst, its connection cut, a cluster node killed. Each runs the real
``RetryMiddleware`` on a real FastStream ``NatsBroker`` app in a process of its own
(``tests.nats.fault_worker``), counts by id (sent = processed + dead-lettered, none lost),
and holds the duplicates to what the docs promise: at most what the app had in hand per
fault (``faults.IN_HAND``), since a copy made again is dropped by ``Nats-Msg-Id``.

Run alone (``scripts/test`` runs them after the parallel part, one at a time): each is
bound by time, and two side by side compete for the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from tests.faults.support import Tally, Workload, check_outcomes
from tests.nats import proxy as cutting
from tests.nats.faults import (
    CLUSTER_PORT,
    IN_HAND,
    RESTART_PORT,
    DeadLetters,
    Server,
    Worker,
    connect,
    count_late,
    nats_script,
    publish_all,
    row,
    settle,
    version_of,
)
from tests.rabbit import eventually, eventually_async

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from nats.aio.client import Client

pytestmark = [pytest.mark.nats, pytest.mark.fault, pytest.mark.timeout(300)]


class Scenario:
    """One scenario's names, app, tally and dead-letter reader."""

    def __init__(self, servers: str, tmp: Path, n: int = 600, replicas: int = 1) -> None:
        tag = uuid.uuid4().hex[:8]
        self.servers = servers
        self.stream, self.subject, self.prefix = f"F_{tag}", f"f{tag}.work", f"f{tag}"
        self.workload = Workload(n)
        self.tally = Tally(self.workload.ids)
        self.app = Worker(servers, self.stream, self.subject, self.prefix, tmp, replicas=replicas)
        self.started = time.monotonic()
        self.client: Client | None = None
        self.letters: DeadLetters | None = None

    async def open(self) -> None:
        self.client = await connect(self.servers)
        self.letters = DeadLetters(
            self.client.jetstream(), f"{self.prefix}-dlq-{self.stream}", self.tally.dead
        )

    async def publish(self) -> None:
        await publish_all(self.servers, self.stream, self.subject, self.workload.ids)

    async def waiting(self) -> int:
        """How many copies wait in the delay stream now."""
        assert self.client is not None
        info = await self.client.jetstream().stream_info(f"{self.prefix}-delay")
        return int(info.state.messages)

    async def finish(
        self, what: str, faults: int, timeout: float = 120, *, server_killed: bool = False
    ) -> float:
        """Wait until settled, stop the app, count the late duplicates, check the outcome.

        ``server_killed``: a server was SIGKILLed, and may deliver again what it had acked
        in its last moments (its store had not recorded those acks yet: docs,
        nats-guarantees.md): the duplicates are then held to once more per id and fault,
        not to what the app had in hand.
        """
        assert self.client is not None
        assert self.letters is not None
        seconds = await settle(self.tally, self.app, self.letters, timeout, what)
        await self.app.stop()
        await count_late(self.tally, self.client.jetstream(), self.stream, self.prefix)
        await self.letters.refresh()  # a dead letter confirmed since the last look
        unexpected = sorted(set(self.tally.dead) - self.workload.expected_dead())
        why = [(i, self.letters.why.get(i)) for i in unexpected]
        assert not unexpected, f"dead-lettered, but meant to succeed: {why[:10]}"
        check_outcomes(self.workload, self.tally)
        print(  # noqa: T201 - shown when a test fails
            f"processed twice: {len(self.tally.processed) - len(set(self.tally.processed))}, "
            f"dead twice: {len(self.tally.dead) - len(set(self.tally.dead))}, "
            f"late: {len(self.tally.late)}"
        )
        seen = Counter(self.tally.processed + self.tally.dead)
        assert max(seen.values()) <= 1 + faults, f"multiplied: {seen.most_common(3)}"
        if not server_killed:
            assert self.tally.duplicates <= faults * IN_HAND, (
                f"{self.tally.duplicates} duplicates after {faults} faults: more than the "
                f"{IN_HAND} a fault may make (what the app had in hand)"
            )
        return seconds

    async def close(self) -> None:
        await self.app.stop()
        if self.client is not None:
            js = self.client.jetstream()
            for name in (self.stream, f"{self.prefix}-delay", f"{self.prefix}-dlq-{self.stream}"):
                with contextlib.suppress(Exception):  # never made, or the server is gone
                    await asyncio.wait_for(js.delete_stream(name), 10)
            await self.client.close()


@pytest.fixture
async def scenario_factory(tmp_path: Path) -> AsyncIterator[list[Scenario]]:
    made: list[Scenario] = []
    yield made
    for scenario in made:
        await scenario.close()


@pytest.fixture(scope="module")
def restart_server() -> Iterator[Server]:
    server = Server(RESTART_PORT)
    server.start(fresh=True)
    yield server
    server.stop(keep_data=False)


async def test_server_restarts_with_copies_waiting_lose_nothing(
    restart_server: Server,
    tmp_path: Path,
    scenario_factory: list[Scenario],
    fault_rows: list[dict[str, object]],
) -> None:
    """600 messages; the server stops (SIGTERM) and starts again on its store while copies
    wait in the delay stream, then is SIGKILLed while the re-checks release them. Every id
    is processed or dead-lettered once the server is back; none lost."""
    s = Scenario(restart_server.url, tmp_path)
    scenario_factory.append(s)
    await s.app.start()
    await s.open()
    await s.publish()
    await eventually(lambda: s.app.count("scheduled") >= 120, 60, "retries scheduled")
    waiting_term = await s.waiting()
    assert waiting_term > 0, "copies wait in the delay stream when the server stops"
    await asyncio.to_thread(restart_server.stop)
    await asyncio.to_thread(restart_server.start, fresh=False)
    released = s.app.count("released", "hop")
    await eventually(
        lambda: s.app.count("released", "hop") >= released + 60, 60, "the re-checks busy again"
    )
    waiting_kill = await s.waiting()
    await asyncio.to_thread(restart_server.stop, kill=True)
    await asyncio.to_thread(restart_server.start, fresh=False)
    seconds = await s.finish("server restarts", faults=2, server_killed=True)
    fault_rows.append(
        row(
            "server SIGTERM + SIGKILL",
            version_of(restart_server.url),
            f"SIGTERM with {waiting_term} copies waiting, SIGKILL with {waiting_kill}",
            s.tally,
            settled_s=seconds,
            total_s=time.monotonic() - s.started,
        )
    )


async def test_the_app_killed_three_times_mid_burst_loses_nothing(
    nats_url: str,
    tmp_path: Path,
    scenario_factory: list[Scenario],
    fault_rows: list[dict[str, object]],
) -> None:
    """600 messages; the app is SIGKILLed three times and started again each time: during
    first deliveries, during the re-checks' hops and releases, and once more with both
    mixed. What it held comes back (the work consumer's ack_wait, the re-check's 30 s)."""
    s = Scenario(nats_url, tmp_path)
    scenario_factory.append(s)
    await s.app.start()
    await s.open()
    publishing = asyncio.create_task(s.publish())
    await eventually(lambda: len(s.app.lines(s.app.ledger)) >= 150, 60, "handler calls")
    await s.app.kill()
    await publishing
    await s.app.start()
    hops = s.app.count("hop", "released")
    await eventually(lambda: s.app.count("hop", "released") >= hops + 50, 60, "re-check hops")
    await s.app.kill()
    await s.app.start()
    await asyncio.sleep(0.8)  # where the kill lands, not a wait for a condition
    await s.app.kill()
    await s.app.start()
    seconds = await s.finish("app killed", faults=3)
    fault_rows.append(
        row(
            "app SIGKILL x3 mid-burst",
            version_of(nats_url),
            f"{s.app.kills} SIGKILLs of the app",
            s.tally,
            settled_s=seconds,
            total_s=time.monotonic() - s.started,
        )
    )


async def test_cut_connections_lose_nothing(
    nats_url: str,
    tmp_path: Path,
    scenario_factory: list[Scenario],
    fault_rows: list[dict[str, object]],
) -> None:
    """600 messages; the app's connection goes through a proxy that cuts it five times:
    twice just before a copy's publish to the delay stream, twice just before an ack,
    once everything at once. nats-py connects again by itself; none lost."""
    proxy = cutting.NatsCuttingProxy(int(nats_url.rsplit(":", 1)[-1]))
    await proxy.start()
    s = Scenario(f"nats://127.0.0.1:{proxy.port}", tmp_path)
    s.servers = nats_url  # the test's own client and publisher go straight to the server
    scenario_factory.append(s)
    try:
        await s.app.start()
        await s.open()
        publishing = asyncio.create_task(s.publish())

        def progress() -> int:
            return len(s.app.lines(s.app.ledger)) + s.app.count("scheduled", "released")

        async def recovered(connections: int) -> None:
            before = progress()
            await eventually(
                lambda: proxy.accepted > connections and progress() >= before + 20,
                60,
                "work after the reconnect",
            )

        copy = cutting.publish_to(f"{s.prefix}.delay.")
        for match in (copy, cutting.an_ack(), copy, cutting.an_ack()):
            connections = proxy.accepted
            fired = proxy.arm_on(match)
            await asyncio.wait_for(fired.wait(), 60)
            print(f"cut {proxy.cuts} at {time.monotonic() - s.started:.1f} s")  # noqa: T201
            await recovered(connections)
        connections = proxy.accepted
        proxy.cut_all()
        await recovered(connections)
        await publishing
        seconds = await s.finish("connection cut", faults=proxy.cuts)
    finally:
        await proxy.close()
    assert proxy.cuts == 5
    assert proxy.accepted >= 1 + proxy.cuts, "the app connected again after every cut"
    fault_rows.append(
        row(
            "connection cut x5",
            version_of(nats_url),
            "2 mid-publish of a copy, 2 mid-ack, 1 all",
            s.tally,
            settled_s=seconds,
            total_s=time.monotonic() - s.started,
        )
    )


def cluster(*args: str) -> str:
    return nats_script("cluster.sh", *args, NATS_CLUSTER_PORT=str(CLUSTER_PORT))


@pytest.fixture(scope="module")
def cluster_urls() -> Iterator[list[str]]:
    urls = cluster("start").split()
    assert len(urls) == 3
    yield urls
    cluster("stop")


async def test_a_node_killed_in_an_r3_cluster_loses_nothing(
    cluster_urls: list[str],
    tmp_path: Path,
    scenario_factory: list[Scenario],
    fault_rows: list[dict[str, object]],
) -> None:
    """A three-node cluster, the work stream R3: the plugin's delay and dead-letter streams
    are made R3 too (the dead-letter stream before FastStream made the work stream). 600
    messages; the node leading the delay stream is SIGKILLed mid-burst and stays down;
    none lost."""
    servers = ",".join(cluster_urls)
    s = Scenario(servers, tmp_path, replicas=3)
    scenario_factory.append(s)
    await s.app.start()
    await s.open()
    assert s.client is not None
    js = s.client.jetstream()
    for name in (s.stream, f"{s.prefix}-delay", f"{s.prefix}-dlq-{s.stream}"):
        assert (await js.stream_info(name)).config.num_replicas == 3, name
    publishing = asyncio.create_task(s.publish())
    await eventually(lambda: s.app.count("scheduled") >= 120, 90, "retries scheduled")
    placed = (await js.stream_info(f"{s.prefix}-delay")).cluster
    leader = (placed.leader if placed is not None else None) or ""
    node = next(
        k + 1 for k, url in enumerate(cluster_urls) if leader.endswith(url.rsplit(":", 1)[-1])
    )
    waiting = await s.waiting()
    await asyncio.to_thread(cluster, "kill", str(node))

    async def new_leader() -> bool:
        try:
            info = await js.stream_info(f"{s.prefix}-delay")
        except Exception:
            return False
        now = info.cluster.leader if info.cluster is not None else None
        return bool(now) and now != leader

    await eventually_async(new_leader, 60, "a new leader of the delay stream")
    await publishing
    seconds = await s.finish("cluster node killed", faults=1, timeout=180)
    fault_rows.append(
        row(
            "R3 cluster, a node SIGKILLed",
            version_of(cluster_urls[0]),
            f"node {node} of 3 (the delay stream's leader, {waiting} copies waiting) SIGKILLed",
            s.tally,
            settled_s=seconds,
            total_s=time.monotonic() - s.started,
        )
    )
