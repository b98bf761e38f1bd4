"""On a Redis Cluster of three masters every step's keys share one slot: no CROSSSLOT.

The cluster (scripts/redis/cluster.sh) runs on ``REDIS_CLUSTER_PORT`` and the two ports
after it (6407 unless set), each node's bus 10,000 above, of ``REDIS_SERIES``.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import TYPE_CHECKING

import pytest
from redis.asyncio.cluster import RedisCluster

from faststream_retry.core import headers as h
from tests.rabbit import eventually
from tests.redis.conftest import SCRIPTS
from tests.redis.support import App, read_stream, until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from redis.asyncio import Redis

pytestmark = pytest.mark.redis

N = 100
PORT = int(os.environ.get("REDIS_CLUSTER_PORT", "6407"))


def _cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / "cluster.sh"), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "REDIS_CLUSTER_PORT": str(PORT)},
    )


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A three-master cluster this module starts and stops."""
    started = _cluster("start")
    if started.returncode != 0:
        pytest.fail(f"the cluster did not start:\n{started.stderr[-2000:]}")
    try:
        yield started.stdout.split()[0]
    finally:
        _cluster("stop")


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[RedisCluster]:
    """A cluster client, to look inside."""
    client = RedisCluster.from_url(cluster_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.mark.parametrize("name", ["orders", "{tenant}.orders", "a{b"])
async def test_retries_and_dead_letters_on_a_cluster(
    cluster_url: str, cluster_client: RedisCluster, name: str
) -> None:
    """RedisClusterBroker: each message retried once, or dead-lettered, in its stream's slot."""
    stream = f"{name}-{uuid.uuid4().hex[:8]}"
    app = App(
        cluster_url,
        stream,
        fails=lambda n, attempt: attempt == 1 or n % 10 == 0,
        max_attempts=2,
        delay_ms=100,
        cluster=True,
    )
    try:
        await app.start()
        keys = app.engine.keys(stream)
        slots = {
            await cluster_client.cluster_keyslot(key)
            for key in (stream, keys.schedule, keys.data, keys.dlq)
        }
        assert len(slots) == 1, f"keys in slots {slots}"
        await app.publish(range(N))
        good = N - N // 10
        await eventually(lambda: sum(app.done.values()) >= good, what="every retry handled")

        async def all_dead() -> bool:
            return (
                bool(await cluster_client.exists(keys.dlq))
                and int(await cluster_client.xlen(keys.dlq)) >= N // 10
            )

        await until(all_dead, what="the dead letters")
        assert app.done == {n: 1 for n in range(N) if n % 10}
        letters = await read_stream(_plain(cluster_client), keys.dlq)
        assert sorted(json.loads(m.body)["id"] for _, m in letters) == list(range(0, N, 10))
        assert all(m.headers[h.REASON] == "exhausted" for _, m in letters)
        assert app.unsettled == 0
    finally:
        await app.stop()


def _plain(client: RedisCluster) -> Redis:
    """read_stream's one call (XRANGE on one key) is routed by the cluster client alike."""
    return client  # type: ignore[return-value]


async def test_the_middleware_on_a_cluster_broker_retries_and_dead_letters(
    cluster_url: str, cluster_client: RedisCluster
) -> None:
    """RetryMiddleware on a RedisClusterBroker: its engine's own client is a cluster client,
    and each message is retried once or dead-lettered, counted by id."""
    from faststream.redis import RedisClusterBroker, StreamSub  # noqa: PLC0415

    from faststream_retry import Fixed, RetryMiddleware, RetryPolicy  # noqa: PLC0415
    from faststream_retry.redis.keys import stream_keys  # noqa: PLC0415

    stream = f"orders-{uuid.uuid4().hex[:8]}"
    retry = RetryMiddleware(RetryPolicy(max_attempts=2, backoff=Fixed(0.1)))
    broker = RedisClusterBroker(cluster_url, middlewares=[retry])
    done: dict[int, int] = {}
    calls: dict[int, int] = {}

    @broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
    async def handle(body: dict[str, int]) -> None:
        n = body["id"]
        calls[n] = calls.get(n, 0) + 1
        if calls[n] == 1 or n % 10 == 0:
            raise ConnectionError(n)
        done[n] = done.get(n, 0) + 1

    retry.install(broker)
    await broker.start()
    try:
        for n in range(N):
            await broker.publish({"id": n}, stream=stream)
        await eventually(lambda: sum(done.values()) >= N - N // 10, what="every retry handled")
        dlq = stream_keys(stream).dlq

        async def all_dead() -> bool:
            return (
                bool(await cluster_client.exists(dlq))
                and int(await cluster_client.xlen(dlq)) >= N // 10
            )

        await until(all_dead, what="the dead letters")
        live = retry.runtime(broker).live
        assert live is not None
        assert type(live.engine._client).__name__ == "RedisCluster"
    finally:
        await broker.stop()
    assert done == {n: 1 for n in range(N) if n % 10}
    letters = await read_stream(_plain(cluster_client), dlq)
    assert sorted(json.loads(m.body)["id"] for _, m in letters) == list(range(0, N, 10))
    assert calls == dict.fromkeys(range(N), 2)
