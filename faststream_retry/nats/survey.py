"""Reading the consumers and streams the plugin depends on, as the server holds them.

Only reads (``consumer_info``, ``stream_info``): nothing is made or changed. The start
reads the durable consumers of the covered subscribers before FastStream binds to them
(it binds to an existing one as it is, whatever the code declares) and, once the plugin's
streams are made, those streams; ``doctor`` reads the same without making anything.
``nats.checks`` says what the configs mean (``consumer_findings``, ``stream_findings``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from nats.js.errors import NotFoundError

from faststream_retry.nats import naming
from faststream_retry.nats.checks import Streams

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nats.js import JetStreamContext

__all__ = ["consumers", "max_payload_of", "streams"]


async def _consumer(js: JetStreamContext, stream: str, name: str) -> Any:  # noqa: ANN401 - nats-py's ConsumerConfig
    try:
        return (await js.consumer_info(stream, name)).config
    except NotFoundError:
        return None


async def _stream(js: JetStreamContext, name: str) -> Any:  # noqa: ANN401 - nats-py's StreamConfig
    try:
        return (await js.stream_info(name)).config
    except NotFoundError:
        return None


async def consumers(
    js: JetStreamContext, durables: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], Any]:
    """The configs of the durable consumers ``(stream, name)`` that exist, as the server has them.

    A consumer that does not exist is left out: FastStream makes it as the code declares.
    """
    wanted = sorted(set(durables))
    found = await asyncio.gather(*(_consumer(js, s, n) for s, n in wanted))
    return {pair: config for pair, config in zip(wanted, found, strict=True) if config is not None}


async def streams(js: JetStreamContext, prefix: str, covered: Iterable[str]) -> Streams:
    """The delay stream of ``prefix``, and each covered stream and its dead-letter stream."""
    names = sorted(set(covered))
    delay, *rest = await asyncio.gather(
        _stream(js, naming.delay_stream(prefix)),
        *(_stream(js, naming.dlq_stream(prefix, s)) for s in names),
        *(_stream(js, s) for s in names),
    )
    return Streams(
        delay=delay,
        dead_letters=dict(zip(names, rest[: len(names)], strict=True)),
        covered=dict(zip(names, rest[len(names) :], strict=True)),
    )


def max_payload_of(connection: Any) -> int:  # noqa: ANN401 - nats-py's Client
    """The largest message the server takes (its ``max_payload``); 1 MiB if it does not say."""
    size = getattr(connection, "max_payload", None)
    return size if isinstance(size, int) and size > 0 else 1024 * 1024
