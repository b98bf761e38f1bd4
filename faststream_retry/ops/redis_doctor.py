"""``doctor`` on Redis: the server's fitness and durability, and each covered stream, as findings.

The server as the transport's start checks it (``redis.checks``: the version, scripting,
an ``allkeys-*`` eviction policy that may drop schedules, a replica), what a crash can
lose with its persistence settings (``redis.durability``, from ``CONFIG GET appendonly
appendfsync save no-appendfsync-on-rewrite`` and ``INFO persistence``; a renamed or denied
``CONFIG`` is said), what a failover to a replica can lose (``INFO replication``,
``min-replicas-to-write``), and, given an app, its
wiring as the start checks it (``RedisRuntime.check``) and each covered stream's group:
its pending entries, the copies in the stream's schedule (and how many are overdue: no
replica moving them), and the dead letters in its ``P.dlq`` against the app's cap
(``dlq_max_length``: past it the oldest are trimmed, so one near it is a warning). Only
reads, on a client of its own. Imported by the command only for Redis: it needs redis-py.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import redis_subscribers
from faststream_retry.ops import diagnosis, redis_client
from faststream_retry.ops.common import CONNECT_TIMEOUT_S, OperationError, safe_redis_url
from faststream_retry.redis import checks, keys
from faststream_retry.redis.durability import Persistence, Replication, durability, failover

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.redis_client import Client

__all__ = ["OVERDUE_MS", "doctor", "read_persistence", "read_replication"]

OVERDUE_MS = 60_000
"""A copy this long past its due time is overdue: no replica of the app is moving copies."""


async def doctor(
    url: str, app: LoadedApp | None, timeout: float = CONNECT_TIMEOUT_S
) -> diagnosis.Report:
    """Check the server at ``url`` and, given ``app``, its covered streams there.

    Reports, never raises for what it finds.

    Raises:
        OperationError: the server cannot be reached, or ``app`` is not a Redis app.
    """
    if app is not None and not app.redis:
        raise OperationError(f"{app.spec}'s broker is not a RedisBroker")
    async with redis_client.connect(url, connect_timeout=timeout, timeout=timeout) as client:
        try:
            info = await client.info()
        except (RedisError, OSError) as exc:
            raise OperationError(
                f"cannot reach the Redis server at {safe_redis_url(url)}: {exc!r}"
            ) from exc
        try:
            version, found = await _findings(client, info, app)
        except (RedisError, OSError) as exc:
            raise OperationError(
                f"the Redis server at {safe_redis_url(url)} stopped answering: {exc!r}; run "
                "doctor again once it is back"
            ) from exc
    return diagnosis.Report(
        app=app.spec if app is not None else "",
        prefix=app.config.topology.prefix if app is not None else "",
        queue_type="",
        server_version=version,
        findings=tuple(found),
        system="redis",
    )


def _text(info: dict[str, Any], key: str) -> str:
    value = info.get(key, "")
    return value.decode() if isinstance(value, bytes) else str(value)


async def _findings(
    client: Client, info: dict[str, Any], app: LoadedApp | None
) -> tuple[str | None, list[diagnosis.Finding]]:
    streams = _covered(app) if app is not None else {}
    server = await checks.read_server(client, list(streams))
    name = "Valkey" if server.flavour == "valkey" else "Redis"
    version = _text(info, "valkey_version") or _text(info, "redis_version") or None
    found = [
        diagnosis.Finding("action", "server", "", problem, "", "")
        for problem in checks.problems(server)
    ]
    if not found:
        found.append(
            diagnosis.Finding(
                "ok",
                "server",
                "",
                f"{name} {version}, a primary, scripting allowed, maxmemory-policy "
                f"{server.maxmemory_policy or '?'}: the transport can run here",
                "",
                "",
            )
        )
    said = durability(await read_persistence(client))
    found.append(
        diagnosis.Finding(
            said.level,
            "durability",
            "",
            said.loss,
            "the streams, retry schedules and dead letters live in the server's memory; "
            "only its persistence keeps them through a crash",
            said.fix,
        )
    )
    lost = failover(await read_replication(client))
    if lost is not None:
        found.append(
            diagnosis.Finding(
                lost.level,
                "failover",
                "",
                lost.loss,
                "a replica takes over with what it had received; the AOF of the old "
                "primary does not come with it",
                lost.fix,
            )
        )
    if redis_client.is_cluster(client):
        found.append(_cluster(client))
    if app is not None:
        found += _wiring(app)
        now_ms = await _server_ms(client)
        cap = app.config.dlq_max_length
        for stream, group in sorted(streams.items()):
            found += await _stream(client, stream, group, now_ms, cap)
    return version, found


def _cluster(client: Any) -> diagnosis.Finding:  # noqa: ANN401 - redis-py's RedisCluster
    """On a cluster: whose settings the lines above are, and how each stream was read."""
    node = client.get_default_node()
    primaries = len(client.get_primaries())
    return diagnosis.Finding(
        "ok",
        "cluster",
        "",
        f"a Redis Cluster of {primaries} primaries: the server, durability and failover "
        f"lines are those of node {node.name}, the one --url names; each stream was read "
        "on the node that owns its slot",
        "every node keeps its own settings and its own AOF",
        "run doctor --url redis://HOST:PORT on each node to check its settings",
    )


def _covered(app: LoadedApp) -> dict[str, str]:
    """Each stream the app's plan covers, and the group its subscriber reads in."""
    out: dict[str, str] = {}
    for sub in app.broker.subscribers:
        stream, group = redis_subscribers.key_of(sub), redis_subscribers.group_of(sub)
        if stream is not None and group is not None and stream in app.plan.routes:
            with contextlib.suppress(RetryConfigError):  # refused, and said so by _wiring
                keys.stream_keys(stream)
                out.setdefault(stream, group)
    return out


def _wiring(app: LoadedApp) -> list[diagnosis.Finding]:
    """The start's refusal of the app's subscribers, as one finding (none if it would start)."""
    try:
        app.middleware.runtime(app.broker).check(app.middleware)
    except RetryConfigError as refused:
        return [
            diagnosis.Finding(
                "action",
                "wiring",
                "",
                str(refused),
                "the plugin refuses to start with these subscribers",
                "as each line says",
            )
        ]
    return []


async def read_persistence(client: Client) -> Persistence:
    """Read the persistence settings (``CONFIG GET``) and ``INFO persistence``.

    ``appendonly``, ``appendfsync``, ``save`` and ``no-appendfsync-on-rewrite``; only what
    ``INFO`` tells when ``CONFIG`` is refused.
    """
    persistence = await client.info("persistence")
    delayed = persistence.get("aof_delayed_fsync")
    delayed_fsyncs = delayed if isinstance(delayed, int) else None
    try:
        raw = await client.config_get(
            "appendonly", "appendfsync", "save", "no-appendfsync-on-rewrite"
        )
    except ResponseError as exc:  # renamed (unknown command) or denied (NOPERM)
        enabled = _text(persistence, "aof_enabled")
        return Persistence(
            appendonly={"1": "yes", "0": "no"}.get(enabled),
            appendfsync=None,
            save=None,
            config_refused=str(exc),
            last_save_age_s=_age(persistence),
            delayed_fsyncs=delayed_fsyncs,
        )
    settings = {_decode(k): _decode(v) for k, v in raw.items()}
    return Persistence(
        appendonly=settings.get("appendonly"),
        appendfsync=settings.get("appendfsync"),
        save=settings.get("save"),
        last_save_age_s=_age(persistence),
        no_fsync_on_rewrite=settings.get("no-appendfsync-on-rewrite"),
        delayed_fsyncs=delayed_fsyncs,
    )


async def read_replication(client: Client) -> Replication:
    """Read a primary's replicas (``INFO replication``) and ``min-replicas-*`` if allowed."""
    info = await client.info("replication")
    replicas = info.get("connected_slaves")
    settings: dict[str, str] = {}
    with contextlib.suppress(ResponseError):  # CONFIG renamed or denied: said as unknown
        raw = await client.config_get("min-replicas-to-write", "min-replicas-max-lag")
        settings = {_decode(k): _decode(v) for k, v in raw.items()}
    return Replication(
        replicas=replicas if isinstance(replicas, int) else 0,
        min_replicas=_number(settings.get("min-replicas-to-write")),
        max_lag_s=_number(settings.get("min-replicas-max-lag")),
    )


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _decode(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _age(persistence: dict[str, Any]) -> int | None:
    saved = persistence.get("rdb_last_save_time")
    if not isinstance(saved, int) or saved <= 0:
        return None
    return max(0, int(time.time()) - saved)


async def _server_ms(client: Client) -> int:
    """The server's clock, which the schedule's due times are scored by."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _stream(
    client: Client, stream: str, group: str, now_ms: int, cap: int | None
) -> list[diagnosis.Finding]:
    """One covered stream: its group's pending entries, its schedule and its dead letters.

    ``cap``: the app's ``dlq_max_length`` (``None``: no cap).
    """
    named = keys.stream_keys(stream)
    scheduled = await client.zcard(named.schedule)
    overdue = await client.zcount(named.schedule, "-inf", now_ms - OVERDUE_MS)
    dead = await client.xlen(named.dlq)
    pending: int | None = None
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no such stream yet
        groups = []
    for one in groups:
        if _decode(one.get("name")) == group:
            pending = int(one.get("pending", 0))
    found = []
    if pending is None:
        found.append(
            diagnosis.Finding(
                "warning",
                "missing",
                stream,
                f"stream {stream!r} has no consumer group {group!r} yet",
                "FastStream makes the group when the app's subscriber starts",
                "start the app; run doctor again to see its group",
            )
        )
    if overdue:
        found.append(
            diagnosis.Finding(
                "warning",
                "overdue",
                stream,
                f"{overdue} of the {scheduled} copies in {named.schedule!r} are more than "
                f"{OVERDUE_MS // 1000} s past their due time",
                "every running replica of the app moves due copies back into the stream; "
                "none is doing it",
                "start the app (a replica moves them at once)",
            )
        )
    capped = "no cap" if cap is None else f"capped near {cap:,}: past it the oldest are trimmed"
    if dead:
        near = cap is not None and dead >= cap * 0.9
        found.append(
            diagnosis.Finding(
                "warning",
                "dead-letters",
                named.dlq,
                f"{dead} dead letter(s) wait in {named.dlq!r} ({capped})",
                "each is a message the app gave up on, with the reason in its headers"
                + (
                    "; at the cap each new dead letter deletes the oldest, which are lost"
                    if near
                    else ""
                ),
                f"look at them (redis-cli XRANGE '{named.dlq}' - + COUNT 10), fix the cause"
                + (
                    ", then replay or export them, or raise RetryMiddleware(dlq_max_length=...)"
                    if near
                    else ""
                ),
            )
        )
    found.append(
        diagnosis.Finding(
            "ok",
            "stream",
            stream,
            f"stream {stream!r}, group {group!r}: "
            f"{'no group' if pending is None else f'{pending} pending'}, {scheduled} "
            f"waiting in {named.schedule!r}, {dead} dead letter(s) in {named.dlq!r} ({capped})",
            "",
            "",
        )
    )
    return found
