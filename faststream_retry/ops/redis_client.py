"""A connection to Redis for an operator's command: a plain server, or a Redis Cluster.

Shared by ``doctor`` on Redis and the dead-letter store. The URL names one server; if
that server runs in cluster mode (``INFO cluster``: ``cluster_enabled:1``), a plain
client would get ``MOVED`` for every key another node owns, so the command gets redis-py's
cluster client instead, started from that node: each key's command goes to the node that
owns its slot, and a command about the server (``INFO``, ``CONFIG GET``, ``TIME``) still to
the node the URL names. Needs redis-py.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from faststream_retry.ops.common import OperationError, safe_redis_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["Client", "connect", "is_cluster"]

Client = Redis | RedisCluster
"""What a command gets: either client answers the same key commands."""


def is_cluster(client: object) -> bool:
    """Whether ``client`` is redis-py's cluster client (``connect`` found cluster mode)."""
    return isinstance(client, RedisCluster)


@asynccontextmanager
async def connect(url: str, *, connect_timeout: float, timeout: float) -> AsyncIterator[Client]:
    """Connect to the server at ``url`` (a cluster client if it is a cluster's node); close it.

    Raises:
        OperationError: ``url`` is not a Redis URL, or the server cannot be reached.
    """
    shown = safe_redis_url(url)
    try:
        plain = Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=timeout)
    except ValueError as exc:
        raise OperationError(f"not a Redis URL: {shown} ({exc})") from exc
    try:
        try:
            info: dict[str, Any] = await plain.info("cluster")
        except ResponseError:  # INFO denied to this user: take it for a plain server
            info = {}
        except (RedisError, OSError) as exc:
            raise OperationError(f"cannot reach the Redis server at {shown}: {exc!r}") from exc
        kwargs = plain.connection_pool.connection_kwargs
        node = (str(kwargs.get("host", "")), int(kwargs.get("port", 6379)))
        if str(info.get("cluster_enabled", 0)) != "1":
            yield plain
            return
    finally:
        await plain.aclose()
    async with _cluster(url, node, shown, connect_timeout, timeout) as cluster:
        yield cluster


@asynccontextmanager
async def _cluster(
    url: str, node: tuple[str, int], shown: str, connect_timeout: float, timeout: float
) -> AsyncIterator[RedisCluster]:
    client = RedisCluster.from_url(
        url, socket_connect_timeout=connect_timeout, socket_timeout=timeout
    )
    try:
        try:
            await client.initialize()
        except (RedisError, OSError) as exc:
            raise OperationError(
                f"the Redis server at {shown} is a cluster's node, and the cluster's map "
                f"could not be read ({exc!r})"
            ) from exc
        named = client.get_node(*node)
        if named is not None:
            client.set_default_node(named)  # INFO, CONFIG GET: the node the URL names
        yield client
    finally:
        await client.aclose()
