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
from faststream_retry.redis import envelope
from faststream_retry.redis.keys import stream_keys
from tests.cli import run_cli
from tests.rabbit import eventually
from tests.redis.conftest import SCRIPTS
from tests.redis.support import App, read_stream, until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

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
        await eventually(
            lambda: sum(app.done.values()) >= good, timeout=45, what="every retry handled"
        )

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
    each message is retried once or dead-lettered, counted by id, and every entry is
    acknowledged by the stop (the successes' batched XACKs included)."""
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
        await eventually(
            lambda: sum(done.values()) >= N - N // 10, timeout=45, what="every retry handled"
        )
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
    # Each success's XACK went beside its handler (redis.acks), on the cluster client.
    assert (await cluster_client.xpending(stream, "g"))["pending"] == 0


DOCTOR_APP = """
from faststream.redis import RedisClusterBroker, StreamSub
from faststream_retry import RetryMiddleware

broker = RedisClusterBroker({url!r}, middlewares=[RetryMiddleware()])


@broker.subscriber(stream=StreamSub({stream!r}, group="ship", consumer="c1"))
async def handle(body: str) -> None: ...
"""


async def test_doctor_and_dlq_on_a_node_that_does_not_own_the_keys(
    cluster_url: str, cluster_client: RedisCluster, tmp_path: Path
) -> None:
    """``--url`` names one node; the stream and its dead letters live on another. ``dlq list``,
    ``replay`` (to a stream in another slot: refused, nothing moved) and ``doctor`` read each
    key where its slot is, and doctor says it is a cluster and whose settings it read.

    Found in review: a plain client got MOVED, reported as "stopped answering ... run again".
    """
    await cluster_client.initialize()
    host, port = cluster_url.removeprefix("redis://").split("/")[0].split(":")
    named = cluster_client.get_node(host=host, port=int(port))
    assert named is not None

    def owner(key: str) -> str:
        node = cluster_client.get_node_from_key(key)
        assert node is not None
        return node.name

    stream = next(
        s for s in (f"orders-{uuid.uuid4().hex[:8]}" for _ in range(100)) if owner(s) != named.name
    )
    dlq = stream_keys(stream).dlq
    await cluster_client.xgroup_create(stream, "ship", id="$", mkstream=True)
    for n in range(3):
        letter = envelope.build(
            b'{"id": %d}' % n, {h.ORIGIN_QUEUE: stream, h.ATTEMPT: "2", "message_id": f"m{n}"}
        )
        await cluster_client.xadd(dlq, {envelope.DATA_FIELD: letter})

    listed = await run_cli("dlq", "list", stream, "--json", "--url", cluster_url, url=None)
    assert listed.status == 0, listed.stderr
    assert [row["message_id"] for row in listed.rows()] == ["m0", "m1", "m2"]
    elsewhere = next(
        s
        for s in (f"other-{uuid.uuid4().hex[:8]}" for _ in range(100))
        if cluster_client.keyslot(s) != cluster_client.keyslot(dlq)
    )
    await cluster_client.xadd(elsewhere, {"seed": "1"})
    refused = await run_cli(
        "dlq", "replay", stream, "--to", elsewhere, "--url", cluster_url, url=None
    )
    assert refused.status == 3, refused.stderr
    assert "not in the hash slot of" in refused.stderr
    assert await cluster_client.xlen(dlq) == 3
    replayed = await run_cli("dlq", "replay", stream, "--json", "--url", cluster_url, url=None)
    assert replayed.status == 0, replayed.stderr
    assert replayed.json()["moved"] == 3
    assert (await cluster_client.xlen(stream), await cluster_client.xlen(dlq)) == (3, 0)

    (tmp_path / "shop.py").write_text(DOCTOR_APP.format(url=cluster_url, stream=stream))
    done = await run_cli(
        "doctor", "shop:broker", "--url", cluster_url, "--json", url=None, cwd=tmp_path
    )
    assert done.status == 0, done.stderr
    found: dict[str, list[dict[str, str]]] = {}
    for finding in done.json()["findings"]:
        found.setdefault(finding["check"], []).append(finding)
    (cluster,) = found["cluster"]
    assert cluster["what"].startswith("a Redis Cluster of 3 primaries")
    assert f"node {named.name}, the one --url names" in cluster["what"]
    (mine,) = found["stream"]
    assert mine["what"].startswith(f"stream {stream!r}, group 'ship': 0 pending")
