"""What every operation shares: the connection, the error type, the lock of a queue."""

from __future__ import annotations

import contextlib
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import aio_pika
from aiormq.exceptions import AMQPError, ChannelAccessRefused, ChannelLockedResource

from faststream_retry.core.topology import MAX_NAME_BYTES, lock_name
from faststream_retry.errors import FastStreamRetryError
from faststream_retry.rabbit.connection import connect_failure, safe_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aio_pika.abc import AbstractConnection

__all__ = [
    "DEFAULT_NATS_URL",
    "DEFAULT_REDIS_URL",
    "DEFAULT_URL",
    "OperationError",
    "amqp_of",
    "broker_mismatch",
    "check_name",
    "connect",
    "exclusive",
    "is_nats_url",
    "is_redis_url",
    "name_problem",
    "not_on_nats",
    "not_on_redis",
    "safe_broker_url",
    "safe_nats_url",
    "safe_redis_url",
    "shown_name",
]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
DEFAULT_NATS_URL = "nats://localhost:4222"
"""nats-py's default server, and ``NatsBroker()``'s."""
NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
"""The URL schemes of a NATS server (nats-py's)."""
DEFAULT_REDIS_URL = "redis://localhost:6379"
"""``RedisBroker()``'s server."""
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes of a Redis server (redis-py's ``from_url``)."""
_NOT_IN_A_NAME = re.compile(r"[^a-zA-Z0-9\-_.:@#,/+ ]")
"""A character pamqp refuses in a queue's name (``pamqp.constants.DOMAIN_REGEX``)."""
CONNECT_TIMEOUT_S = 10.0
_SHOWN_CHARS = 80


class OperationError(FastStreamRetryError):
    """An operation could not be done as asked; the text says why and what to do."""


def is_nats_url(url: str) -> bool:
    """Whether ``url`` (or the first of a comma-separated list) names a NATS server."""
    return url.strip().lower().startswith(NATS_SCHEMES)


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server."""
    return url.strip().lower().startswith(REDIS_SCHEMES)


def safe_redis_url(url: str) -> str:
    """Return a Redis URL without its credentials (``redis://***@host:6379/0``)."""
    return safe_nats_url(url)


def safe_nats_url(url: str) -> str:
    """Return ``url`` (a comma-separated list of NATS servers) without any credentials.

    A NATS URL's user part may be a token (``nats://<token>@host``): it goes as a whole.
    """
    shown = []
    for one in url.split(","):
        scheme, sep, rest = one.strip().partition("://")
        _, at, host = rest.rpartition("@")
        shown.append(f"{scheme}://***@{host}" if sep and at else one.strip())
    return ",".join(shown)


def safe_broker_url(url: str) -> str:
    """Return ``url`` (AMQP, NATS or Redis) without its credentials: a NATS token goes whole."""
    if is_nats_url(url) or is_redis_url(url):
        return safe_nats_url(url)
    return safe_url(url)


def broker_mismatch(url: str, app: str, system: str) -> str | None:
    """Why ``url`` is not the server of ``app``, whose broker is of ``system``; ``None``: it is.

    ``system``: ``rabbitmq``, ``nats`` or ``redis``.
    """
    found = "nats" if is_nats_url(url) else "redis" if is_redis_url(url) else "rabbitmq"
    if found == system:
        return None
    kinds = {"rabbitmq": "RabbitBroker", "nats": "NatsBroker", "redis": "RedisBroker"}
    schemes = {"rabbitmq": "amqp://", "nats": "nats://", "redis": "redis://"}
    return (
        f"{app}'s broker is a {kinds[system]} and {safe_broker_url(url)} is not its kind of "
        f"server: give the app's own ({schemes[system]}...) with --url, or leave --url out"
    )


def not_on_nats(what: str) -> str:
    """Say that ``what`` is RabbitMQ's only, and what to use on NATS."""
    return (
        f"{what} works on RabbitMQ only: `migrate` moves a RabbitMQ queue to new "
        "arguments, and NATS JetStream has no such queues (a stream's settings change with "
        "the nats CLI: nats stream edit <stream>). On NATS, status, explain, doctor, dlq "
        "and web take --url nats://... or the app"
    )


def not_on_redis(what: str) -> str:
    """Say that ``what`` is RabbitMQ's only, and what to use on Redis."""
    return (
        f"{what} works on RabbitMQ only: `migrate` moves a RabbitMQ queue to new "
        "arguments, and the plugin's Redis keys have none to change. On Redis, status, "
        "explain, doctor, dlq and web take --url redis://... or the app"
    )


def shown_name(name: str) -> str:
    """Return ``name`` quoted for an error or a log line: control characters escaped, cut.

    A name comes from an operator's typing, a URL or a form: a newline in it must not
    start a new line of a log, and a 200,000-character one must not fill the screen.
    """
    text = repr(name[:_SHOWN_CHARS])
    if len(name) > _SHOWN_CHARS:
        text = f"{text[:-1]}…{text[-1]} ({len(name):,} characters)"
    return text


def name_problem(name: str) -> str | None:
    """Return why the broker cannot take ``name`` as a queue name, or ``None`` if it can.

    pamqp cannot encode a name over 255 bytes, nor one with other characters than
    ASCII letters, digits, space and ``-_.:@#,/+`` (the command would crash), and an
    empty name means "the last queue declared on this channel" to RabbitMQ.
    """
    if not name:
        return "the name is empty"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "the name is not valid Unicode text"
    if size > MAX_NAME_BYTES:
        return f"the name takes {size:,} bytes and AMQP allows {MAX_NAME_BYTES}"
    if (odd := _NOT_IN_A_NAME.search(name)) is not None:
        # pamqp refuses to send such a name (ValueError); RabbitMQ itself takes more.
        return (
            f"it has {odd[0]!r}, and the AMQP client (pamqp) sends only names of "
            "letters, digits, space and - _ . : @ # , / +"
        )
    return None


def check_name(name: str, what: str = "queue") -> str:
    """Return ``name`` if the broker can take it as a queue name (``name_problem``).

    Checked before anything is asked of the broker.

    Raises:
        OperationError: the name is empty or longer than AMQP allows.
    """
    if (problem := name_problem(name)) is not None:
        raise OperationError(f"no {what} {shown_name(name)} can exist: {problem}")
    return name


def _named(url: str, name: str | None) -> str:
    """``url`` with ``?name=`` (aiormq's connection name) set, unless it names one already.

    The URL's query, not aio-pika's ``client_properties``: aio-pika 9 drops those when
    it is given a URL.
    """
    if name is None:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "name" for key, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, ("name", name)], quote_via=quote)))


@asynccontextmanager
async def connect(
    url: str, timeout: float = CONNECT_TIMEOUT_S, *, name: str | None = None
) -> AsyncIterator[AbstractConnection]:
    """Open a plain (not robust) connection to ``url`` and close it on exit.

    Not robust on purpose: an operator's command should fail at once and say so
    rather than reconnect behind a half-done move. ``name``: the connection's name in
    the broker's listings (``connection_name``).

    Raises:
        OperationError: the broker cannot be reached or refused the login.
    """
    if is_nats_url(url):
        raise OperationError(not_on_nats(f"this command, given {safe_nats_url(url)},"))
    if is_redis_url(url):
        raise OperationError(not_on_redis(f"this command, given {safe_redis_url(url)},"))
    if not url.startswith(("amqp://", "amqps://")):
        raise OperationError(f"the broker's URL starts amqp:// or amqps://, got {safe_url(url)}")
    try:
        connection = await aio_pika.connect(_named(url, name), timeout=timeout)
    except Exception as exc:  # any failure to connect is the same answer to an operator
        raise OperationError(connect_failure(url, exc)) from exc
    try:
        yield connection
    finally:
        await connection.close()


def amqp_of(connection: AbstractConnection) -> Any:  # noqa: ANN401 - aiormq's connection
    """Return the aiormq connection under ``connection``.

    Raises:
        OperationError: the connection is closed.
    """
    transport = connection.transport
    if transport is None:
        raise OperationError("the broker connection is closed")
    return transport.connection


@asynccontextmanager
async def exclusive(connection: AbstractConnection, queue: str) -> AsyncIterator[None]:
    """Hold the lock of ``queue``: one command at a time goes through a queue.

    The lock is an exclusive queue, which RabbitMQ deletes when its connection goes,
    however the command ends. A user without the permission to declare it goes on
    without the lock.

    Raises:
        OperationError: another command holds the lock.
    """
    channel = await connection.channel()
    name = lock_name(queue)
    try:
        await channel.declare_queue(name, exclusive=True, auto_delete=True)
    except ChannelLockedResource:
        raise OperationError(
            f"another faststream-retry command is going through {queue!r} (a list, replay, "
            "purge, export or migrate); wait until it ends, then run this again"
        ) from None
    except ChannelAccessRefused:
        pass  # no permission to configure the lock: go on without it
    try:
        yield
    finally:
        if not channel.is_closed:
            # Gone with the connection anyway; a service's connection lives on.
            with contextlib.suppress(AMQPError):
                await channel.queue_delete(name)
            await channel.close()
