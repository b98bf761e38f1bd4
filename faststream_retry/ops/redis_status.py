"""``status`` on Redis Streams: entries, scheduled copies and dead letters per covered stream.

The same ``Status`` as on RabbitMQ (``ops.status``), read with ``XINFO GROUPS`` and ``CONSUMERS``,
``ZCARD`` and ``XLEN``: nothing is read from a group, acknowledged or claimed. A row is a
covered stream ``S`` (the ``queue`` of its route, ``redis.keys``):

- ``work``: ``S`` and its consumer group; ``messages`` is the entries the group has not
  been given yet (its ``lag``, Redis 7.0 and later), ``consumers`` the group's consumers
  but the plugin's claimer (the app's group when the app is given; every group's, summed,
  otherwise);
- ``retry``: the copies waiting in its schedule, ``P.retry``;
- ``dlq``: its dead letters, ``P.dlq``.

Redis has no delay tiers (a copy waits in its stream's schedule, scored by its due
time) and no prefix: ``tiers`` is empty and ``prefix`` null, and a note says so. The
mover that brings due copies back runs in every replica of the app: ``re-checkers`` is
null.

Imported only for a ``redis://`` URL: it needs redis-py.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from faststream_retry.errors import RetryConfigError
from faststream_retry.ops.common import (
    CONNECT_TIMEOUT_S,
    OperationError,
    safe_redis_url,
    shown_name,
)
from faststream_retry.ops.status import Depth, QueueStatus, Status
from faststream_retry.redis.keys import CLAIMER, DLQ_SUFFIX, RETRY_SUFFIX, stream_keys

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from faststream_retry.middleware.app import LoadedApp

__all__ = ["status", "stream_of_key"]

NOTES = (
    (
        "Redis: ready is the entries the stream's consumer group has not been given yet (its "
        "lag), .retry the copies in the stream's schedule, .dlq its dead letters; .retry and "
        ".dlq are made at their first copy, so a missing one counts 0"
    ),
    (
        "Redis has no delay tiers and no prefix: a copy waits in its stream's schedule until "
        "due, and every replica of the app moves the due ones back (re-checkers is null)"
    ),
)


def stream_of_key(key: str) -> str:
    """The covered stream whose ``.retry`` or ``.dlq`` key ``key`` is (``{orders}.dlq``)."""
    for suffix in (DLQ_SUFFIX, RETRY_SUFFIX):
        if key.endswith(suffix):
            base = key[: -len(suffix)]
            inner = base[1:-1]
            if base.startswith("{") and base.endswith("}") and not set("{}") & set(inner):
                return inner
            return base
    return key


@asynccontextmanager
async def _client(url: str) -> AsyncIterator[Redis]:
    try:
        client = Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=30.0)
    except ValueError as exc:
        raise OperationError(f"not a Redis URL: {safe_redis_url(url)} ({exc})") from exc
    try:
        yield client
    except (RedisError, OSError) as exc:
        raise OperationError(
            f"cannot read Redis at {safe_redis_url(url)}: {exc!r}; nothing was changed"
        ) from exc
    finally:
        await client.aclose()


async def status(url: str, queues: Sequence[str] = (), *, app: LoadedApp | None = None) -> Status:
    """Count each covered stream's undelivered entries, scheduled copies and dead letters.

    The rows are ``queues`` (streams; a ``.dlq`` or ``.retry`` key means its stream), else
    ``app``'s covered streams, else every stream with a ``.retry`` or ``.dlq`` key on the
    server (found with ``SCAN``).

    Raises:
        OperationError: the server cannot be reached or refused a command.
    """
    notes = list(NOTES)
    groups = _groups_of(app) if app is not None else {}
    async with _client(url) as client:
        if queues:
            names, queues_from = [stream_of_key(q) for q in queues], ("arguments",)
        elif app is not None:
            names, queues_from = sorted(app.plan.routes), ("app",)
        else:
            names, queues_from = await _found(client), ("server",)
        rows = []
        for name in dict.fromkeys(names):
            try:
                keys = stream_keys(name)
            except RetryConfigError:
                notes.append(f"left out {shown_name(name)}: no key of the plugin's follows from it")
                continue
            rows.append(
                QueueStatus(
                    name,
                    await _work(client, name, groups.get(name), notes),
                    Depth(keys.schedule, int(await client.zcard(keys.schedule)), None),
                    Depth(keys.dlq, int(await client.xlen(keys.dlq)), None),
                )
            )
    return Status(None, queues_from, (), tuple(rows), (), tuple(notes), system="redis")


def _groups_of(app: LoadedApp) -> dict[str, str]:
    """Each covered stream of ``app`` and the group its subscriber reads in."""
    from faststream_retry.middleware import redis_subscribers  # noqa: PLC0415 - FastStream's

    found: dict[str, str] = {}
    for sub in app.broker.subscribers:
        stream, group = redis_subscribers.key_of(sub), redis_subscribers.group_of(sub)
        if stream is not None and group is not None:
            found.setdefault(stream, group)
    return found


async def _found(client: Redis) -> list[str]:
    streams: set[str] = set()
    for pattern, kind in ((f"*{DLQ_SUFFIX}", "stream"), (f"*{RETRY_SUFFIX}", "zset")):
        async for key in client.scan_iter(match=pattern, _type=kind, count=1000):
            streams.add(stream_of_key(_text(key)))
    return sorted(streams)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


async def _work(client: Redis, stream: str, group: str | None, notes: list[str]) -> Depth:
    """The stream's undelivered entries (the group's lag) and consumers; ``None``: no stream."""
    try:
        found: list[dict[str, Any]] = await client.xinfo_groups(stream)
    except ResponseError:  # no such key
        return Depth(stream, None, None)
    chosen = [g for g in found if group is None or _text(g.get("name")) == group]
    if not chosen:
        named = f"group {group!r}" if group else "consumer group"
        notes.append(f"stream {stream!r} has no {named} yet: it is made when the app starts")
        return Depth(stream, int(await client.xlen(stream)), 0)
    lags = [g.get("lag") for g in chosen]
    if any(lag is None for lag in lags):
        notes.append(
            f"stream {stream!r}: Redis cannot tell its group's lag now (an entry was deleted "
            "from the middle): ready is not known"
        )
        messages = None
    else:
        messages = sum(int(str(lag)) for lag in lags)
    if len(chosen) > 1:
        notes.append(f"stream {stream!r} has {len(chosen)} groups: its counts are their sums")
    consumers = 0
    for g in chosen:
        listed = await client.xinfo_consumers(stream, _text(g.get("name")))
        # The plugin's claimer is listed once it claimed (or looked): not one of the app's.
        consumers += sum(1 for c in listed if _text(c.get("name")) != CLAIMER)
    return Depth(stream, messages, consumers)
