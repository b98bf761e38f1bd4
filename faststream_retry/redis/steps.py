"""The two steps a failure takes on Redis, each one script: retry later, or dead-letter.

Both acknowledge the entry in the same script that writes its copy, and write nothing
when that acknowledgement finds nothing pending: a message two consumers handled (a
claim raced a slow handler) is settled once. ``entry`` is the delivery as read from
the group; ``headers`` are the copy's full headers (``core.headers.retry_headers`` or
``dead_letter_headers``), written over the entry's own in FastStream's binary format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.redis import envelope

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream_retry.redis.keys import StreamKeys
    from faststream_retry.redis.lua import Scripts

__all__ = ["StreamEntry", "copy_id", "dead_letter", "encode_copy", "retry_later"]


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One delivery of a stream entry to a consumer group: where it is pending, and its fields.

    From FastStream's message: ``StreamEntry.from_raw(msg.raw_message, group)``.
    """

    stream: str
    group: str
    id: str
    fields: Mapping[bytes, bytes] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], group: str) -> StreamEntry:
        """Return the entry of FastStream's ``msg.raw_message`` for a stream subscriber.

        ``raw`` holds ``channel`` (the stream), ``message_ids`` (one, for a subscriber
        that is not a batch) and ``data`` (the fields); ``group`` is the subscriber's.
        """
        (entry_id,) = raw["message_ids"]
        return cls(
            str(raw["channel"]),
            group,
            entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id),
            raw["data"],
        )

    def incoming_headers(self) -> dict[str, Any]:
        """Return the headers the entry carries, as ``core.headers`` reads them."""
        return envelope.from_wire(envelope.parse(self.fields).headers)


def copy_id(entry: StreamEntry) -> str:
    """Return the schedule's member for ``entry``'s copy: unique per entry and group.

    An entry is acknowledged once per group, and only an acknowledging step schedules,
    so no two copies share it.
    """
    return f"{entry.id}/{entry.group}"


def encode_copy(entry: StreamEntry, headers: Mapping[str, Any]) -> bytes:
    """Return the entry's body with ``headers`` (in place of its own), FastStream-encoded."""
    return envelope.build(envelope.parse(entry.fields).body, envelope.to_wire(headers))


async def retry_later(
    scripts: Scripts,
    keys: StreamKeys,
    entry: StreamEntry,
    *,
    delay_ms: int,
    headers: Mapping[str, Any],
) -> int | None:
    """Acknowledge ``entry`` and schedule its copy ``delay_ms`` from the server's now.

    Return the copy's due time (epoch ms, the server's clock), or ``None`` when the
    acknowledgement found nothing pending and nothing was scheduled.
    """
    due = await scripts.retry_later(
        keys=[keys.stream, keys.schedule, keys.data],
        args=[
            entry.group,
            entry.id,
            copy_id(entry),
            encode_copy(entry, headers),
            max(0, int(delay_ms)),
            keys.wake,
        ],
    )
    return None if int(due) < 0 else int(due)


async def dead_letter(
    scripts: Scripts,
    keys: StreamKeys,
    entry: StreamEntry,
    *,
    headers: Mapping[str, Any],
    maxlen: int,
) -> bool:
    """Acknowledge ``entry`` and add its dead letter to ``keys.dlq`` (capped near ``maxlen``).

    Return ``False`` when the acknowledgement found nothing pending and nothing was added.
    """
    added = await scripts.dead_letter(
        keys=[keys.stream, keys.dlq],
        args=[entry.group, entry.id, encode_copy(entry, headers), max(0, int(maxlen))],
    )
    return bool(int(added))
