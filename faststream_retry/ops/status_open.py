"""``status`` on any broker: RabbitMQ's over AMQP (``ops.status``), or NATS's or Redis's.

Each broker's module is imported only for its own scheme: a status of NATS needs no
redis-py, and one of Redis no nats-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.ops.common import OperationError, connect, is_nats_url, is_redis_url
from faststream_retry.ops.management import vhost_of
from faststream_retry.ops.status import status as rabbit_status

if TYPE_CHECKING:
    from collections.abc import Sequence

    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.status import Status

__all__ = ["status_of"]


async def status_of(
    url: str,
    queues: Sequence[str] = (),
    *,
    app: LoadedApp | None = None,
    management_url: str | None = None,
    prefix: str,
) -> Status:
    """Return ``status`` of the broker at ``url`` (``amqp://``, ``nats://`` or ``redis://``).

    Raises:
        OperationError: the broker cannot be read, or ``management_url`` (RabbitMQ's
            management API) was given for NATS or Redis.
    """
    store = "NATS" if is_nats_url(url) else "Redis" if is_redis_url(url) else None
    if store is not None and management_url is not None:
        raise OperationError(
            f"--management-url is RabbitMQ's management API: leave it out on {store} (the "
            "server's own listing is read)"
        )
    if is_nats_url(url):
        from faststream_retry.ops import nats_status  # noqa: PLC0415 - needs nats-py

        return await nats_status.status(url, queues, app=app, prefix=prefix)
    if is_redis_url(url):
        from faststream_retry.ops import redis_status  # noqa: PLC0415 - needs redis-py

        return await redis_status.status(url, queues, app=app)
    async with connect(url) as connection:
        return await rabbit_status(
            connection,
            queues,
            app=app,
            management_url=management_url,
            vhost=vhost_of(url),
            prefix=prefix,
        )
