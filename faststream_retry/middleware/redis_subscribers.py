"""What the plugin reads of FastStream's Redis subscribers and brokers (FastStream side).

Duck-typed, as ``nats_subscribers`` reads NATS': nothing here imports ``faststream.redis``
or redis-py, so an install without Redis needs neither. A stream subscriber has a
``stream_sub`` (FastStream's ``StreamSub``, router prefix included), a pub/sub one a
``channel`` (``PubSub``), a list one a ``list_sub`` (``ListSub``).

The engine gets a client of its own, made from the broker's connection settings:
FastStream's ``ConnectionState`` (``broker.config.broker_config.connection``, a private
name) copied and connected again, so a plain, a Sentinel and a Cluster broker each give
the same kind of client, with the same address, credentials and TLS.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "Described",
    "Names",
    "broker_url",
    "claims_itself",
    "consumer_of",
    "describe",
    "group_of",
    "is_batch",
    "is_redis",
    "is_redis_subscriber",
    "key_of",
    "names",
    "no_ack",
    "own_client",
    "under_test_redis",
]


def is_redis(broker: object) -> bool:
    """Whether ``broker`` is FastStream's ``RedisBroker`` (its cluster and sentinel ones too)."""
    return any(
        cls.__name__ == "RedisBroker" and cls.__module__.startswith("faststream.redis")
        for cls in type(broker).__mro__
    )


def is_redis_subscriber(sub: object) -> bool:
    """Whether ``sub`` is one of FastStream's Redis subscribers."""
    return type(sub).__module__.startswith("faststream.redis")


def under_test_redis(broker: Any) -> bool:  # noqa: ANN401 - a RedisBroker
    """Whether ``TestRedisBroker`` is active on ``broker`` (it swaps the producer)."""
    producer = getattr(getattr(broker, "config", None), "producer", None)
    kind = type(producer)
    return kind.__name__ == "FakeProducer" and kind.__module__.startswith("faststream.redis")


class Names(NamedTuple):
    """What the plugin reads a stream subscriber by: its stream and consumer, when covered."""

    key: str | None
    """The stream (router prefix included) when read in a group by a named consumer."""
    group: str | None
    consumer: str | None


_NO_NAMES = Names(None, None, None)

_READ: weakref.WeakKeyDictionary[Any, tuple[object, str, Any, Names]] = weakref.WeakKeyDictionary()
"""Each subscriber's ``StreamSub`` as last read, with what it was made of, and its names."""


def _read(sub: Any) -> tuple[Any, Names]:  # noqa: ANN401 - a Redis subscriber
    """The subscriber's ``StreamSub``, router prefix included, and its names, read once.

    FastStream makes a deep copy at each read of ``stream_sub`` (50 µs), and the plugin
    reads it at every message (``RedisRuntime.holding``) and every failure: the copy and
    the names taken from it are kept while the declared ``StreamSub`` and the routers'
    prefix it was made of are the same (a message asks for them four times: 30 calls
    each, read afresh). Only read here, never changed.
    """
    if not is_redis_subscriber(sub):
        return None, _NO_NAMES
    declared = getattr(sub, "_stream_sub", None)
    prefix = getattr(getattr(sub, "_outer_config", None), "prefix", None)
    if declared is None or not isinstance(prefix, str):
        stream = getattr(sub, "stream_sub", None)
        return stream, _names(stream)
    try:
        read = _READ.get(sub)
    except TypeError:  # not weakly referable, or not hashable: read it each time
        stream = getattr(sub, "stream_sub", None)
        return stream, _names(stream)
    if read is not None and read[0] is declared and read[1] == prefix:
        return read[2], read[3]
    stream = getattr(sub, "stream_sub", None)
    names = _names(stream)
    with contextlib.suppress(TypeError):
        _READ[sub] = (declared, prefix, stream, names)
    return stream, names


def _stream_sub(sub: Any) -> Any:  # noqa: ANN401 - FastStream's StreamSub
    """The subscriber's ``StreamSub``, router prefix included, read once per declaration."""
    return _read(sub)[0]


def _names(stream: Any) -> Names:  # noqa: ANN401 - FastStream's StreamSub, or None
    if stream is None:
        return _NO_NAMES
    group = _text(getattr(stream, "group", None))
    consumer = _text(getattr(stream, "consumer", None))
    covered = group is not None and consumer is not None
    return Names(_text(getattr(stream, "name", None)) if covered else None, group, consumer)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def names(sub: Any) -> Names:  # noqa: ANN401 - a Redis subscriber
    """``key_of``, ``group_of`` and ``consumer_of`` of ``sub``, in one read."""
    return _read(sub)[1]


def group_of(sub: Any) -> str | None:  # noqa: ANN401 - a Redis subscriber
    """The consumer group a stream subscriber reads in; ``None``: none (or not a stream)."""
    return _read(sub)[1].group


def consumer_of(sub: Any) -> str | None:  # noqa: ANN401 - a Redis subscriber
    """The consumer name a stream subscriber reads as; ``None``: none (or not a stream)."""
    return _read(sub)[1].consumer


def key_of(sub: Any) -> str | None:  # noqa: ANN401 - a Redis subscriber
    """The stream (router prefix included) of a subscriber the plugin can cover, else ``None``.

    Covered: a stream subscriber in a consumer group, with a consumer name (FastStream
    reads without a group otherwise). A channel, a list, and a stream read without a
    group have none: their messages are gone once delivered (``describe`` names them).
    """
    return _read(sub)[1].key


def no_ack(sub: Any) -> bool:  # noqa: ANN401 - a Redis subscriber
    """Whether a stream subscriber reads with ``NOACK``: its entries are never pending."""
    return getattr(_stream_sub(sub), "no_ack", False) is True


def is_batch(sub: Any) -> bool:  # noqa: ANN401 - a Redis subscriber
    """Whether a stream subscriber hands its handler a batch of entries."""
    return getattr(_stream_sub(sub), "batch", False) is True


def claims_itself(sub: Any) -> tuple[str, int] | None:  # noqa: ANN401 - a Redis subscriber
    """The option by which a stream subscriber claims idle pending entries itself, and its value.

    ``StreamSub(min_idle_time=...)`` (``XAUTOCLAIM``) or ``claim_min_idle_time`` (FastStream
    0.7's ``XREADGROUP ... CLAIM``, Redis 8.4); ``None``: neither.
    """
    stream = _stream_sub(sub)
    for option in ("min_idle_time", "claim_min_idle_time"):
        value = getattr(stream, option, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return option, value
    return None


class Described(NamedTuple):
    """What a Redis subscriber reads: ``kind`` (stream, channel, list) and its name."""

    kind: str
    name: str


def describe(sub: Any) -> Described | None:  # noqa: ANN401 - any subscriber
    """What ``sub`` reads, router prefix included; ``None`` for one that is not Redis'."""
    if not is_redis_subscriber(sub):
        return None
    for kind, attr in (("stream", "stream_sub"), ("channel", "channel"), ("list", "list_sub")):
        found = getattr(sub, attr, None)
        if found is not None:
            return Described(kind, str(getattr(found, "name", None) or "?"))
    return Described("subscriber", "?")


def broker_url(broker: Any) -> str | None:  # noqa: ANN401 - a RedisBroker
    """The URL a plain ``RedisBroker`` connects to (its password kept); ``None``: not known.

    Read from the connection settings ``RedisBroker(url, ...)`` made (``host``, ``port``,
    ``db``, ``username``, ``password``, TLS by its connection class); a cluster or
    sentinel broker, or one reached by a Unix socket, has none.
    """
    config = getattr(getattr(broker, "config", None), "broker_config", None)
    options = getattr(getattr(config, "connection", None), "_options", None)
    if not isinstance(options, dict) or not isinstance(options.get("host"), str):
        return None
    from urllib.parse import quote  # noqa: PLC0415 - only for the operator's commands

    user, password = options.get("username"), options.get("password")
    auth = ""
    if user or password:
        auth = f"{quote(str(user or ''), safe='')}:{quote(str(password or ''), safe='')}@"
    tls = options.get("ssl") or "SSL" in getattr(options.get("connection_class"), "__name__", "")
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{auth}{options['host']}:{options.get('port', 6379)}/{options.get('db', 0)}"


async def own_client(
    broker: Any,  # noqa: ANN401 - a RedisBroker
) -> tuple[Any, Callable[[], Awaitable[None]]] | None:
    """Connect a client of the engine's own with ``broker``'s settings; return it and its close.

    ``None`` when the broker keeps its settings elsewhere than this FastStream's
    ``ConnectionState`` does (a test double, a renamed internal). Entries are bytes to
    the engine, so the client never decodes responses.
    """
    config = getattr(getattr(broker, "config", None), "broker_config", None)
    state: Any = getattr(config, "connection", None)
    options = getattr(state, "_options", None)
    if not isinstance(options, dict) or not callable(getattr(state, "connect", None)):
        return None
    own: Any = copy.copy(state)
    # A new state: its own client and pool (and, for a cluster, its own sync side).
    own._options = {**options, "decode_responses": False}  # noqa: SLF001
    own._client = None  # noqa: SLF001
    own._connected = False  # noqa: SLF001
    if hasattr(own, "_sync_cluster"):
        own._sync_cluster = None  # noqa: SLF001
        own._thread_pool = None  # noqa: SLF001
    client = await own.connect()
    return client, own.disconnect
