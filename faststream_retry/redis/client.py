"""The client the transport works through: redis-py's asyncio client, plain or cluster.

Either is what FastStream's ``RedisBroker`` (``Redis``) or ``RedisClusterBroker``
(``RedisCluster``) connects with; the transport wants one with ``decode_responses``
off (FastStream's default), since entries are bytes. Keys are routed by their slot,
every step's keys share one (``keys``), and the nudge channel is published to the
whole cluster by a script, so a subscription on any node hears it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["Client"]

Client: TypeAlias = "Redis | RedisCluster"
"""A redis-py asyncio client, plain or cluster (``decode_responses`` off)."""
