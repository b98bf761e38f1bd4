"""The two steps a failure takes on Redis, each one script: retry later, or dead-letter.

Both acknowledge the entry in the same script that writes its copy, the acknowledgement
last (a script stopped part-way keeps its writes, so it must not have acknowledged yet),
and write nothing when another consumer settled the entry: a message two consumers
handled (a claim raced a slow handler) is settled once. An entry gone from the stream
(trimmed by the producer's ``MAXLEN``, or deleted) is written from the caller's copy: it
is the only one left. Each returns the script's outcome (``lua.WRITTEN``, ...).
``entry`` is the delivery as read from the group; ``headers`` are the copy's full headers
(``core.headers.retry_headers`` or ``dead_letter_headers``), written over the entry's
own in FastStream's binary format.

That format holds a header of at most 65,535 bytes: a copy whose headers do not fit
raises ``EnvelopeTooLarge`` before anything is sent (its message then goes to the dead
letters as ``invalid``: ``too_large_headers``), and a dead letter is made to fit
(``fitted``): lean first, then without the message's own largest headers, as on RabbitMQ
(``core.fit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.core import fit
from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason
from faststream_retry.errors import HeadersTooLarge
from faststream_retry.redis import envelope
from faststream_retry.redis.lua import split_due

if TYPE_CHECKING:
    from collections.abc import Mapping

    from faststream_retry.redis.keys import StreamKeys
    from faststream_retry.redis.lua import Scripts

__all__ = [
    "TOO_LARGE_ERROR",
    "StreamEntry",
    "copy_id",
    "dead_letter",
    "encode_copy",
    "fitted",
    "invalid_headers",
    "invalid_letter",
    "place_letter",
    "retry_later",
    "too_large_headers",
]

HEADER_LIMIT = 0xFFFF
"""The most bytes a header's name or value takes in FastStream's binary format."""

TOO_LARGE_ERROR = (
    "with the retry headers its copy would not fit in FastStream's binary format, which "
    f"holds at most {HEADER_LIMIT:,} bytes per header: its own headers leave no room"
)
"""``retry-error`` of a message dead-lettered as ``HeadersTooLarge`` on Redis."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One delivery of a stream entry to a consumer group: where it is pending, and its fields.

    From FastStream's message: ``StreamEntry.from_raw(msg.raw_message, group)``.
    """

    stream: str
    group: str
    id: str
    fields: Mapping[bytes, bytes] = field(default_factory=dict)
    _envelope: envelope.Envelope | None = field(default=None, init=False, repr=False, compare=False)
    """``fields`` parsed, at their first read (``parsed``)."""

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

    def parsed(self) -> envelope.Envelope:
        """Return the message in ``fields``, parsed once.

        A failure reads its headers, then its body to build the copy. Its headers are not
        to be changed (``incoming_headers`` copies them).
        """
        found = self._envelope
        if found is None:
            found = envelope.parse(self.fields)
            object.__setattr__(self, "_envelope", found)  # a cache: frozen for the rest
        return found

    def incoming_headers(self) -> dict[str, Any]:
        """Return the headers the entry carries, as ``core.headers`` reads them."""
        return envelope.from_wire(self.parsed().headers)


def copy_id(entry: StreamEntry) -> str:
    """Return the schedule's member for ``entry``'s copy: unique per entry and group.

    An entry is acknowledged once per group, and only a step that finds it pending (and
    acknowledges it) schedules, so no two copies share it.
    """
    return f"{entry.id}/{entry.group}"


def encode_copy(entry: StreamEntry, headers: Mapping[str, Any]) -> bytes:
    """Return the entry's body with ``headers`` (in place of its own), FastStream-encoded."""
    return envelope.build(entry.parsed().body, envelope.to_wire(headers))


async def retry_later(
    scripts: Scripts,
    keys: StreamKeys,
    entry: StreamEntry,
    *,
    delay_ms: int,
    headers: Mapping[str, Any],
) -> tuple[int, int]:
    """Acknowledge ``entry`` and schedule its copy ``delay_ms`` from the server's now.

    Return the outcome (``lua.WRITTEN``, ...) and the copy's due time (epoch ms, the
    server's clock; -1 when another consumer had settled the entry: nothing scheduled).
    """
    reply = await scripts.retry_later(
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
    return split_due(reply)


async def dead_letter(
    scripts: Scripts,
    keys: StreamKeys,
    entry: StreamEntry,
    *,
    headers: Mapping[str, Any],
    maxlen: int,
) -> int:
    """Acknowledge ``entry`` and add its dead letter to ``keys.dlq`` (capped near ``maxlen``).

    Return the outcome: ``lua.SETTLED_ELSEWHERE`` when another consumer had settled the
    entry, and nothing was added.
    """
    try:
        letter = encode_copy(entry, headers)
    except envelope.EnvelopeTooLarge:
        letter = encode_copy(entry, fitted(headers))
    return await place_letter(scripts, keys, entry, letter, maxlen=maxlen)


async def place_letter(
    scripts: Scripts, keys: StreamKeys, entry: StreamEntry, letter: bytes, *, maxlen: int
) -> int:
    """Acknowledge ``entry`` and add ``letter`` (encoded) to ``keys.dlq``; return the outcome."""
    outcome = await scripts.dead_letter(
        keys=[keys.stream, keys.dlq],
        args=[entry.group, entry.id, letter, max(0, int(maxlen))],
    )
    return int(outcome)


_ERROR_CHARS = 1000


def invalid_headers(entry: StreamEntry, exc: BaseException, *, now_ms: int) -> dict[str, Any]:
    """The headers of an entry whose copy could not be built: the retry state alone (pure).

    ``invalid``, with the error building the copy raised; nothing of the entry's own
    headers, which are what could not be read or written. Never raises.
    """
    try:
        said = str(exc)
    except Exception:  # an exception's own __str__ may raise anything
        said = ""
    error = f"its copy could not be built from the entry's bytes ({h.exception_name(exc)}: {said})"
    failure = h.FailureRecord(
        attempt=h.read_attempt(entry.incoming_headers()) + 1,
        at_ms=now_ms,
        exception=h.exception_name(exc),
        error=error[:_ERROR_CHARS].encode(errors="backslashreplace").decode(),
    )
    return h.dead_letter_headers(None, failure, reason=Reason.INVALID, origin_queue=entry.stream)


def invalid_letter(entry: StreamEntry, headers: Mapping[str, Any]) -> bytes:
    """The minimal dead letter of an entry whose copy could not be built (pure, cannot fail).

    Its body is the entry's ``__data__`` as stored (its fields as JSON when it has
    none), its headers ``invalid_headers``.
    """
    data = entry.fields.get(envelope.DATA_FIELD)
    body = bytes(data) if data is not None else entry.parsed().body
    return envelope.build(body, envelope.to_wire(headers))


def _weigh(headers: Mapping[str, Any]) -> int:
    """The bytes of the longest header name or value, as the binary format writes them."""
    sizes = (
        len(text.encode(errors="surrogateescape"))
        for item in envelope.to_wire(headers).items()
        for text in item
    )
    return max(sizes, default=0)


def fitted(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return a dead letter's ``headers`` cut to what the binary format holds (pure).

    Lean first (``fit.lean``: no history, traceback or replay record, the error cut
    short), then without the message's own largest headers, each named in
    ``retry-error`` (``fit.make_room``). The retry state always fits: every text of it
    is bounded.
    """
    kept = fit.lean(headers)
    if _weigh(kept) <= HEADER_LIMIT:
        return kept
    made = fit.make_room(kept, _weigh, HEADER_LIMIT, where="in FastStream's binary format")
    if made is not None:
        return made[0]
    return {k: v for k, v in kept.items() if k in h.RETRY_STATE}  # pragma: no cover - bounded


def too_large_headers(
    incoming: Mapping[str, Any] | None,
    *,
    stream: str,
    attempt: int,
    now_ms: int,
    cause: str = "",
) -> dict[str, Any]:
    """The dead letter's headers of a message whose retry copy would not fit (``invalid``).

    ``cause``: what it had failed with (the retry it could not take), appended.
    """
    error = TOO_LARGE_ERROR + (f"; it had failed with {cause}" if cause else "")
    failure = h.FailureRecord(
        attempt=attempt,
        at_ms=now_ms,
        exception=h.exception_name(HeadersTooLarge()),
        error=error,
    )
    return h.dead_letter_headers(incoming, failure, reason=Reason.INVALID, origin_queue=stream)
