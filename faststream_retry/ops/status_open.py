"""``status`` on any broker: RabbitMQ's over AMQP (``ops.status``), or NATS's or Redis's.

Each broker's module is imported only for its own scheme: a status of NATS needs no
redis-py, and one of Redis no nats-py.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

from faststream_retry.ops.common import OperationError, connect, is_nats_url, is_redis_url
from faststream_retry.ops.management import vhost_of
from faststream_retry.ops.status import status as rabbit_status

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aio_pika.abc import AbstractConnection

    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.status import Status

__all__ = ["StatusReader", "status_of"]


async def status_of(
    url: str,
    queues: Sequence[str] = (),
    *,
    app: LoadedApp | None = None,
    management_url: str | None = None,
    prefix: str,
    connection: AbstractConnection | None = None,
) -> Status:
    """Return ``status`` of the broker at ``url`` (``amqp://``, ``nats://`` or ``redis://``).

    ``connection``: RabbitMQ's, open, to read over (``StatusReader``); ``None``: one is
    opened for this read.

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
    async with contextlib.AsyncExitStack() as opened:
        if connection is None:
            connection = await opened.enter_async_context(connect(url))
        return await rabbit_status(
            connection,
            queues,
            app=app,
            management_url=management_url,
            vhost=vhost_of(url),
            prefix=prefix,
        )


WATCH_CONNECTION = "faststream-retry status --watch"
"""The name a watch's RabbitMQ connection shows in the management UI and ``list_connections``."""


class StatusReader:
    """``status_of`` again and again, as ``status --watch`` reads it.

    On RabbitMQ one connection is kept open from one read to the next: a connection per
    read would be three lines of the broker's log every refresh (accepted, authenticated,
    closed), 130,000 a day for a watch left open in a terminal. A read that finds the
    connection closed (the broker restarted) opens a new one, once. NATS and Redis log no
    client connection by default: each read connects on its own, as ``status`` does.
    """

    def __init__(
        self,
        url: str,
        queues: Sequence[str] = (),
        *,
        app: LoadedApp | None = None,
        management_url: str | None = None,
        prefix: str,
    ) -> None:
        """Read what ``status_of(url, queues, ...)`` reads."""
        self._url = url
        self._ask = functools.partial(
            status_of, url, queues, app=app, management_url=management_url, prefix=prefix
        )
        self._held = contextlib.AsyncExitStack()
        self._connection: AbstractConnection | None = None

    async def __aenter__(self) -> StatusReader:  # noqa: PYI034 - Self needs typing_extensions
        """Nothing is opened before the first read."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the connection held between reads."""
        self._connection = None
        await self._held.aclose()

    async def read(self) -> Status:
        """Return the broker's status now.

        Raises:
            OperationError: the broker cannot be read (as ``status_of``).
        """
        if is_nats_url(self._url) or is_redis_url(self._url):
            return await self._ask()
        held = self._connection is not None and not self._connection.is_closed
        if not held:
            await self._reopen()
        try:
            return await self._ask(connection=self._connection)
        except OperationError:
            raise
        except Exception:
            if not held:
                raise
            # The held connection broke between the check and the read: once, anew.
            await self._reopen()
            return await self._ask(connection=self._connection)

    async def _reopen(self) -> None:
        await self.__aexit__()
        self._held = contextlib.AsyncExitStack()
        self._connection = await self._held.enter_async_context(
            connect(self._url, name=WATCH_CONNECTION)
        )
