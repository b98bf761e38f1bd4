"""What the page asks of its broker, one class per kind: RabbitMQ's queues, or a ``Store``.

The page's endpoints, guard and reads are the same for every broker; only these calls
differ. RabbitMQ's are the ``ops.dlq`` passes (on a quorum DLQ a read republishes every
message, under the queue's lock). NATS's and Redis's are ``ops.dlq_store``'s on the
broker's ``Store``: a read is the stream API's get by sequence (NATS) or ``XRANGE``
(Redis), with no consumer or group, so nothing is delivered, acked or moved by a read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from faststream_retry.core.topology import dlq_of, dlq_owner
from faststream_retry.errors import RetryConfigError
from faststream_retry.ops import dlq as ops
from faststream_retry.ops import dlq_store as stores
from faststream_retry.ops.common import (
    OperationError,
    connect,
    is_nats_url,
    is_redis_url,
    name_problem,
    safe_broker_url,
    shown_name,
)
from faststream_retry.ops.dlq_open import count, open_store
from faststream_retry.ops.status_open import status_of
from faststream_retry.rabbit.probe import depth

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.dlq import Outcome
    from faststream_retry.ops.records import DeadLetter, Selection
    from faststream_retry.ops.status import Status
    from faststream_retry.ops.walk import Pass

__all__ = ["Broker", "broker_for"]

MAX_TARGET_BYTES = 255
"""The longest replay target the page passes on NATS and Redis (a key, a stream's name)."""


class Broker(Protocol):
    """The page's broker: names, counts and the passes over a queue's dead letters."""

    url: str
    system: str
    """``rabbitmq``, ``nats`` or ``redis``."""

    def shown_url(self) -> str:
        """The broker's URL without its credentials."""
        ...

    def work_queue(self, named: str) -> str:
        """The queue (RabbitMQ), subscriber key or stream (NATS), or stream (Redis) a URL names."""
        ...

    def dlq(self, queue: str) -> str:
        """Where ``queue``'s dead letters are, as the page names it (and a purge's confirm)."""
        ...

    def problem(self, queue: str) -> str | None:
        """Why no dead letters of ``queue`` can exist (a 404), or ``None``."""
        ...

    def target_problem(self, to: str) -> str | None:
        """Why a replay cannot go to ``to`` whatever the broker holds, or ``None``."""
        ...

    async def status(self) -> Status:
        """``status`` of the broker."""
        ...

    async def depth(self, queue: str) -> int | None:
        """How many dead letters ``queue`` has now, reading none; ``None``: no such queue."""
        ...

    async def list(
        self,
        queue: str,
        *,
        limit: int,
        progress: Callable[[Pass], None] | None,
        keep: Callable[[DeadLetter], DeadLetter],
    ) -> Outcome:
        """The first ``limit`` dead letters of ``queue`` (``dlq list``)."""
        ...

    async def export(self, queue: str, write: Callable[[str], object]) -> Outcome:
        """Every dead letter of ``queue`` as JSON Lines through ``write`` (``dlq export``)."""
        ...

    async def replay(
        self,
        queue: str,
        *,
        selection: Selection,
        to: str | None,
        dry_run: bool,
        rate: float,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """``dlq replay`` of the selected dead letters of ``queue``."""
        ...

    async def purge(
        self,
        queue: str,
        *,
        selection: Selection | None,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """``dlq purge`` of the selected (or every) dead letter of ``queue``."""
        ...


def broker_for(
    url: str, *, app: LoadedApp | None, management_url: str | None, prefix: str
) -> Broker:
    """The page's broker for ``url``: NATS or Redis by its scheme, else RabbitMQ.

    Raises:
        ValueError: ``management_url`` (RabbitMQ's management API) with a NATS or Redis URL.
    """
    if is_nats_url(url) or is_redis_url(url):
        if management_url is not None:
            raise ValueError(
                "management_url is RabbitMQ's management API: leave it out on NATS and Redis"
            )
        return StoreBroker(url, app=app, prefix=prefix)
    return RabbitBroker(url, app=app, management_url=management_url, prefix=prefix)


class RabbitBroker:
    """RabbitMQ: a work queue and its ``.dlq``, read and moved by ``ops.dlq``'s passes."""

    system = "rabbitmq"

    def __init__(
        self, url: str, *, app: LoadedApp | None, management_url: str | None, prefix: str
    ) -> None:
        """Each call opens a connection of its own to ``url``."""
        self.url = url
        self._app = app
        self._management_url = management_url
        self._prefix = prefix

    def shown_url(self) -> str:
        """The URL without its password."""
        return safe_broker_url(self.url)

    def work_queue(self, named: str) -> str:
        """The work queue ``named`` is (itself, or the owner of a ``.dlq``)."""
        return dlq_owner(dlq_of(named))

    def dlq(self, queue: str) -> str:
        """``<queue>.dlq``."""
        return dlq_of(queue)

    def problem(self, queue: str) -> str | None:
        """Why AMQP cannot name ``queue``'s DLQ (``name_problem``)."""
        dlq = dlq_of(queue)
        if (problem := name_problem(dlq)) is None:
            return None
        return f"no queue {shown_name(dlq)} can exist: {problem}"

    def target_problem(self, to: str) -> str | None:
        """Why AMQP cannot name the queue ``to`` (``name_problem``)."""
        return name_problem(to)

    async def status(self) -> Status:
        """``status`` over AMQP (and the management API when given)."""
        return await status_of(
            self.url, app=self._app, management_url=self._management_url, prefix=self._prefix
        )

    async def depth(self, queue: str) -> int | None:
        """A passive declare of the DLQ: reads no message."""
        async with connect(self.url) as connection:
            now = await depth(connection, dlq_of(queue))
        return None if now is None else now.messages

    async def list(
        self,
        queue: str,
        *,
        limit: int,
        progress: Callable[[Pass], None] | None,
        keep: Callable[[DeadLetter], DeadLetter],
    ) -> Outcome:
        """A pass through the DLQ, under its lock."""
        async with connect(self.url) as connection:
            return await ops.list_dead_letters(
                connection, queue, limit=limit, progress=progress, keep=keep
            )

    async def export(self, queue: str, write: Callable[[str], object]) -> Outcome:
        """A pass through the DLQ, under its lock."""
        async with connect(self.url) as connection:
            return await ops.export_dead_letters(connection, queue, write)

    async def replay(
        self,
        queue: str,
        *,
        selection: Selection,
        to: str | None,
        dry_run: bool,
        rate: float,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """Each copy confirmed before its dead letter is acked, at most ``rate`` a second."""
        async with connect(self.url) as connection:
            return await ops.replay_dead_letters(
                connection,
                queue,
                selection=selection,
                to=to,
                dry_run=dry_run,
                rate=rate,
                progress=progress,
            )

    async def purge(
        self,
        queue: str,
        *,
        selection: Selection | None,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """The selected ones removed, the others handed back in order."""
        async with connect(self.url) as connection:
            return await ops.purge_dead_letters(
                connection, queue, selection=selection, progress=progress
            )


class StoreBroker:
    """NATS JetStream or Redis Streams: a ``Store`` of dead letters, read without consuming.

    A row of the page is what ``status`` shows there: a subscriber's key
    (``orders.billing``) on NATS, a covered stream on Redis; a URL may also name the
    dead-letter stream or key itself.
    """

    def __init__(self, url: str, *, app: LoadedApp | None, prefix: str) -> None:
        """Each call opens a connection of its own to ``url``; ``app``'s prefix wins."""
        self.url = url
        self.system = "nats" if is_nats_url(url) else "redis"
        self._app = app
        self._prefix = app.plan.options.prefix if app is not None else prefix

    def shown_url(self) -> str:
        """The URL without its credentials (a NATS token goes whole)."""
        return safe_broker_url(self.url)

    def work_queue(self, named: str) -> str:
        """As named: the store reads a key, a stream or a dead-letter stream alike."""
        return named

    def dlq(self, queue: str) -> str:
        """NATS: the key's dead-letter subject, or the dead-letter stream; Redis: ``P.dlq``.

        A name no dead letters can follow from (``problem``) is shown as it is.
        """
        try:
            return self._dlq(queue)
        except (OperationError, RetryConfigError):
            return queue

    def _dlq(self, queue: str) -> str:
        if self.system == "nats":
            from faststream_retry.ops.nats_dlq import NatsStore  # noqa: PLC0415 - nats-py

            store = NatsStore(None, queue, self._prefix)  # type: ignore[arg-type]  # names only
            return store.filter if store.key else store.stream
        from faststream_retry.redis.keys import DLQ_SUFFIX, stream_keys  # noqa: PLC0415

        return queue if queue.endswith(DLQ_SUFFIX) else stream_keys(queue).dlq

    def problem(self, queue: str) -> str | None:
        """Why no dead letters can follow from ``queue`` (a name the store refuses)."""
        if not queue:
            return "no dead letters of the empty name can exist"
        try:
            self._dlq(queue)
        except (OperationError, RetryConfigError) as exc:
            return str(exc)
        return None

    def target_problem(self, to: str) -> str | None:
        """Only a bound: the store checks the target itself before anything moves."""
        if len(to.encode(errors="replace")) > MAX_TARGET_BYTES:
            return f"the name takes more than {MAX_TARGET_BYTES} bytes"
        return None

    async def status(self) -> Status:
        """``status`` of the server (its streams, consumers and keys)."""
        return await status_of(self.url, app=self._app, prefix=self._prefix)

    async def depth(self, queue: str) -> int | None:
        """The store's count (stream info, or ``XLEN``): reads no dead letter."""
        return await count(self.url, queue, prefix=self._prefix)

    async def list(
        self,
        queue: str,
        *,
        limit: int,
        progress: Callable[[Pass], None] | None,  # noqa: ARG002 - a read here is one quick pass
        keep: Callable[[DeadLetter], DeadLetter],
    ) -> Outcome:
        """Read by sequence or ``XRANGE``: nothing consumed."""
        async with open_store(self.url, queue, prefix=self._prefix) as store:
            return await stores.list_dead_letters(store, limit=limit, keep=keep)

    async def export(self, queue: str, write: Callable[[str], object]) -> Outcome:
        """Read as ``list``; every dead letter stays."""
        async with open_store(self.url, queue, prefix=self._prefix) as store:
            return await stores.export_dead_letters(store, write)

    async def replay(
        self,
        queue: str,
        *,
        selection: Selection,
        to: str | None,
        dry_run: bool,
        rate: float,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """Each copy confirmed (NATS: PubAck; Redis: one script) before its letter goes.

        At most ``rate`` a second, as on RabbitMQ.
        """
        async with open_store(self.url, queue, prefix=self._prefix) as store:
            return await stores.replay_dead_letters(
                store, selection=selection, to=to, dry_run=dry_run, rate=rate, progress=progress
            )

    async def purge(
        self,
        queue: str,
        *,
        selection: Selection | None,
        progress: Callable[[Pass], None] | None,
    ) -> Outcome:
        """Each selected dead letter deleted by its place (sequence, entry id)."""
        async with open_store(self.url, queue, prefix=self._prefix) as store:
            return await stores.purge_dead_letters(store, selection=selection, progress=progress)
