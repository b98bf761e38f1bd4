"""The dead-letter streams: one per covered stream, made with that stream's replicas.

A flood of dead letters in one cannot push out another's, they live where their stream
lives, and deleting them is one call. Limits retention: a dead letter stays until an
operator replays or purges it, or, past ``max_msgs`` (``RetryMiddleware(dlq_max_length=...)``),
the server discards the oldest for a new one. ``allow_direct``: listing them reads without
consuming.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from faststream_retry.errors import RetryTopologyError
from faststream_retry.nats import naming
from faststream_retry.nats.streams import DUPLICATE_WINDOW_S
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from nats.js import JetStreamContext

__all__ = ["dead_letter_config", "declare_dead_letter_stream"]


def dead_letter_config(
    prefix: str, stream: str, replicas: int = 1, max_msgs: int | None = None
) -> StreamConfig:
    """The dead-letter stream of the covered stream ``stream``; ``max_msgs`` ``None``: no cap."""
    return StreamConfig(
        name=naming.dlq_stream(prefix, stream),
        subjects=[naming.dlq_filter(prefix, stream)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
        max_msgs=-1 if max_msgs is None else max_msgs,
        discard=DiscardPolicy.OLD,
    )


async def declare_dead_letter_stream(
    js: JetStreamContext,
    prefix: str,
    stream: str,
    replicas: int = 1,
    max_msgs: int | None = None,
) -> str:
    """Create the dead-letter stream of ``stream`` with ``replicas``, or check the one there.

    ``replicas``: the covered stream's (``streams.covered_replicas``: the server's, or its
    ``JStream``'s before FastStream made it). ``max_msgs``: its cap (``None``: none); one
    there with another cap gets this one, unless it holds more letters than this one
    allows (a start never deletes dead letters: it says so and leaves the stream as it
    is). Returns its name.

    Raises:
        RetryTopologyError: a stream of that name takes other subjects.
    """
    wanted = dead_letter_config(prefix, stream, replicas, max_msgs)
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
    if info.config.max_msgs != wanted.max_msgs or info.config.discard != DiscardPolicy.OLD:
        held, cap = int(info.state.messages or 0), wanted.max_msgs or -1
        if 0 < cap < held:
            # A start must never delete dead letters (an upgrade from an uncapped stream,
            # or a lowered dlq_max_length): the operator chooses what to keep first.
            log.warning(
                "faststream-retry: dead-letter stream %s holds %d letters, more than its "
                "cap dlq_max_length=%d, so the cap is not applied: a start never deletes "
                "dead letters. Export or replay them (faststream-retry dlq export/replay), "
                "or raise dlq_max_length; the cap applies at the next start below it",
                name,
                held,
                cap,
            )
            return name
        info.config.max_msgs = wanted.max_msgs
        info.config.discard = DiscardPolicy.OLD
        await js.update_stream(info.config)
    return name
