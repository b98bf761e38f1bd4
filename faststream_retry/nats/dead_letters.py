"""The dead-letter streams: one per covered stream, made with that stream's replicas.

A flood of dead letters in one cannot push out another's, they live where their stream
lives, and deleting them is one call. Limits retention: a dead letter stays until an
operator replays or purges it. ``allow_direct``: listing them reads without consuming.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from faststream_retry.errors import RetryTopologyError
from faststream_retry.nats import naming
from faststream_retry.nats.streams import DUPLICATE_WINDOW_S

if TYPE_CHECKING:
    from nats.js import JetStreamContext

__all__ = ["dead_letter_config", "declare_dead_letter_stream"]


def dead_letter_config(prefix: str, stream: str, replicas: int = 1) -> StreamConfig:
    """The dead-letter stream of the covered stream ``stream``."""
    return StreamConfig(
        name=naming.dlq_stream(prefix, stream),
        subjects=[naming.dlq_filter(prefix, stream)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
    )


async def declare_dead_letter_stream(
    js: JetStreamContext, prefix: str, stream: str, replicas: int = 1
) -> str:
    """Create the dead-letter stream of ``stream`` with ``replicas``, or check the one there.

    ``replicas``: the covered stream's (``streams.covered_replicas``: the server's, or its
    ``JStream``'s before FastStream made it). Returns its name.

    Raises:
        RetryTopologyError: a stream of that name takes other subjects.
    """
    wanted = dead_letter_config(prefix, stream, replicas)
    name = str(wanted.name)
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(wanted)
        return name
    if not set(wanted.subjects or ()) <= set(info.config.subjects or ()):
        raise RetryTopologyError(
            f"the stream {name!r} exists with subjects {info.config.subjects}; the plugin "
            f"keeps the dead letters of {stream!r} there on {wanted.subjects}. Delete it if "
            f"it is a leftover (nats stream rm {name}), or pass RetryMiddleware(prefix=...) "
            "another prefix"
        )
    return name
