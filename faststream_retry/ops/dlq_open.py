"""Which dead-letter store a URL names: NATS or Redis (``ops.dlq_store``), else RabbitMQ.

Each store's module is imported only for its own scheme: a command on NATS needs no
redis-py, and one on Redis no nats-py.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from faststream_retry.ops.common import is_nats_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from faststream_retry.ops.dlq_store import Store

__all__ = ["REDIS_SCHEMES", "count", "is_store_url", "open_store"]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes redis-py's ``from_url`` takes."""


def is_store_url(url: str) -> bool:
    """Whether ``url`` names a NATS or Redis server (a ``Store``), not RabbitMQ."""
    return is_nats_url(url) or url.strip().lower().startswith(REDIS_SCHEMES)


async def count(url: str, queue: str, *, prefix: str) -> int | None:
    """How many dead letters ``queue`` names, reading none; ``None``: no dead-letter stream.

    NATS: the dead-letter stream's info (``None`` when the stream does not exist); Redis:
    ``XLEN``, 0 for a ``.dlq`` not made yet (the plugin makes it at the first dead letter).

    Raises:
        OperationError: the server cannot be reached, or the key is not a stream.
    """
    if is_nats_url(url):
        from nats.js.errors import NotFoundError  # noqa: PLC0415 - needs nats-py

        from faststream_retry.ops import nats_dlq  # noqa: PLC0415 - needs nats-py

        async with nats_dlq.connect(url) as client:
            stream = nats_dlq.NatsStore(client.jetstream(), queue, prefix)
            try:
                return await stream.total()
            except NotFoundError:
                return None
    async with open_store(url, queue, prefix=prefix) as store:
        return await store.total()


@asynccontextmanager
async def open_store(url: str, queue: str, *, prefix: str) -> AsyncIterator[Store]:
    """Open the dead letters of ``queue`` on the NATS or Redis server at ``url``.

    ``prefix``: the ``RetryMiddleware(prefix=...)`` whose dead-letter streams to read
    (NATS; Redis keys have none).
    """
    if is_nats_url(url):
        from faststream_retry.ops import nats_dlq  # noqa: PLC0415 - needs nats-py

        async with nats_dlq.open_store(url, queue, prefix=prefix) as store:
            yield store
        return
    from faststream_retry.ops import redis_dlq  # noqa: PLC0415 - needs redis-py

    async with redis_dlq.open_store(url, queue) as store:
        yield store
