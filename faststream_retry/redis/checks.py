"""What the server must offer before the transport starts, read from the server.

Refused, with every problem named in one ``RetryTopologyError``: Redis older than 7.0
(``XAUTOCLAIM``'s reply as read here, ``XADD``'s options in scripts) or a Valkey older
than 7.2; scripting refused (some managed plans deny ``EVAL``); an ``allkeys-*``
eviction policy, which may drop a schedule or a dead-letter stream when memory is
full; a read-only replica; and a covered stream read by more than one consumer group:
a copy goes back into the stream, and every group reads it, so the groups that
handled the message well would handle it again. ``noeviction`` (Redis' default) is
fine: a full server refuses new messages and a retry step whole (its entry stays
pending), lets a dead-letter step through whole (``lua``), and refuses the mover's
``XADD``, so copies wait in the schedule until memory is freed.
Everything is read with ``INFO``, ``EVAL`` and ``XINFO GROUPS``; ``CONFIG`` (often
renamed or denied on managed services) is not needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from faststream_retry.core.versions import parse_version
from faststream_retry.errors import RetryTopologyError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from faststream_retry.redis.client import Client

__all__ = ["MIN_REDIS", "MIN_VALKEY", "Server", "check_server", "problems", "read_server"]

MIN_REDIS = (7, 0)
MIN_VALKEY = (7, 2)


@dataclass(frozen=True, slots=True)
class Server:
    """What the checks read from the server."""

    flavour: str
    """``redis`` or ``valkey`` (Valkey reports a ``redis_version`` of 7.2.4 too)."""
    version: tuple[int, int] | None
    maxmemory_policy: str
    role: str
    scripting: str | None
    """``None`` when ``EVAL`` works; else the server's answer."""
    groups: dict[str, int]
    """Consumer groups per covered stream that exists."""


def _text(info: dict[str, Any], key: str) -> str:
    value = info.get(key, "")
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_server(client: Client, streams: Sequence[str] = ()) -> Server:
    """Read what ``problems`` judges."""
    info = await client.info()
    valkey = _text(info, "valkey_version")
    flavour = "valkey" if valkey else "redis"
    version = parse_version(valkey or _text(info, "redis_version"))
    scripting: str | None = None
    try:
        await client.eval("return 1", 0)
    except ResponseError as exc:
        scripting = str(exc)
    groups = {stream: n for stream in streams if (n := await _groups(client, stream)) is not None}
    return Server(
        flavour=flavour,
        version=version,
        maxmemory_policy=_text(info, "maxmemory_policy"),
        role=_text(info, "role"),
        scripting=scripting,
        groups=groups,
    )


async def _groups(client: Client, stream: str) -> int | None:
    try:
        return len(await client.xinfo_groups(stream))
    except ResponseError:  # no such stream yet: its subscriber creates it
        return None


def problems(server: Server) -> list[str]:
    """Return each reason the transport cannot run on ``server``, with its fix (pure)."""
    found = []
    least = MIN_VALKEY if server.flavour == "valkey" else MIN_REDIS
    name = "Valkey" if server.flavour == "valkey" else "Redis"
    if server.version is None or server.version < least:
        shown = ".".join(map(str, server.version)) if server.version else "an unknown version"
        found.append(
            f"the server runs {name} {shown}; the Redis transport needs {name} "
            f"{least[0]}.{least[1]} or later: upgrade it"
        )
    if server.scripting is not None:
        found.append(
            f"the server refuses Lua scripts ({server.scripting}); each retry step is one "
            "atomic script: allow EVAL/EVALSHA for the app's user (ACL +@scripting)"
        )
    if server.maxmemory_policy.startswith("allkeys-"):
        found.append(
            f"maxmemory-policy is {server.maxmemory_policy}: a full server may evict the "
            "retry schedules and dead letters; set maxmemory-policy noeviction (a full server "
            "then refuses new messages and holds retries until memory is freed)"
        )
    if server.role and server.role != "master":
        found.append(
            f"the server is a {server.role}, which cannot be written to: point the app at "
            "the primary"
        )
    for stream, count in sorted(server.groups.items()):
        if count > 1:
            found.append(
                f"stream {stream!r} is read by {count} consumer groups: a retry's copy goes "
                "back into the stream, where every group would read it again; give each "
                "group a stream of its own"
            )
    return found


async def check_server(client: Client, streams: Sequence[str] = ()) -> Server:
    """Read the server and raise ``RetryTopologyError`` naming every problem; return it."""
    server = await read_server(client, streams)
    found = problems(server)
    if found:
        raise RetryTopologyError(
            "the Redis transport cannot start: " + "; ".join(found),
        )
    return server
