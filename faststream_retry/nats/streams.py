"""The delay stream: every tier's subject and every subscriber's ready subject, for one prefix.

Work-queue retention: a copy is gone once its re-check (or hand-over) acks it, so the
stream holds only what waits. Its consumers' filters never overlap (a tier each, a ready
subject each), which work-queue retention requires. The duplicate window outlasts the
re-check's ``ack_wait``, so that a release repeated after a re-check died is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from faststream_retry.errors import RetryTopologyError
from faststream_retry.nats import naming
from faststream_retry.nats.checks import RECHECK_ACK_WAIT_S

if TYPE_CHECKING:
    from nats.js import JetStreamContext

__all__ = ["DUPLICATE_WINDOW_S", "RECHECK_ACK_WAIT_S", "declare_delay_stream", "delay_config"]


DUPLICATE_WINDOW_S = 120.0
"""The plugin's streams' duplicate window (JetStream's default): longer than
``RECHECK_ACK_WAIT_S``."""


def delay_config(prefix: str, replicas: int = 1) -> StreamConfig:
    """The delay stream of ``prefix``."""
    return StreamConfig(
        name=naming.delay_stream(prefix),
        subjects=[f"{prefix}.delay.>", f"{prefix}.ready.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


async def declare_delay_stream(js: JetStreamContext, prefix: str) -> None:
    """Create the delay stream, or check the one there: its subjects and retention.

    Raises:
        RetryTopologyError: a stream of that name exists with other subjects or
            retention (made by hand, or by another tool).
    """
    wanted = delay_config(prefix)
    name = str(wanted.name)
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(wanted)
        return
    have = info.config
    missing = sorted(set(wanted.subjects or ()) - set(have.subjects or ()))
    # nats-py gives the retention back as the server's word, not always as the enum.
    retention = getattr(have.retention, "value", have.retention)
    if missing or retention != RetentionPolicy.WORK_QUEUE.value:
        raise RetryTopologyError(
            f"the stream {name!r} exists with subjects {have.subjects} and retention "
            f"{retention}; the plugin needs subjects "
            f"{wanted.subjects} and work-queue retention. Delete it if it is a leftover "
            f"(nats stream rm {name}), or pass RetryMiddleware(prefix=...) another prefix"
        )
