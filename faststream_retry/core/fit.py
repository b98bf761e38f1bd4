"""What fits in a frame: every copy measured against the broker's frame limit, and cut to it.

RabbitMQ carries a message's properties, its headers among them, in one frame, and a
frame holds at most ``frame_max`` bytes (131,072 unless the broker is configured
otherwise; agreed per connection when it opens). A publish whose properties do not fit
is not refused like a message: RabbitMQ closes the whole connection (``501
FRAME_ERROR``), and every delivery in flight on it goes back to its queue. Any client
can send a message whose own headers come close to the limit, and a copy with the
plugin's headers added would then close the connection at every failure, for ever. So
a copy is measured before it is published, and one that does not fit is cut, in this
order:

1. as built;
2. lean (``lean``): the headers that only tell the story are left out
   (``retry-history``, ``retry-traceback``, ``retry-replayed``) and ``retry-error`` is
   cut to ``HISTORY_ERROR_LIMIT`` bytes; the copy still goes where it was going;
3. no room: the message's own headers leave none for the plugin's. It is dead-lettered
   as ``invalid`` with ``retry-exception`` ``faststream_retry.HeadersTooLarge``, and
   ``make_room`` leaves out its largest headers of its own, naming each in
   ``retry-error``, until the dead letter fits. Its body is never touched.

Measuring exactly means encoding the headers, which costs as much as the publish
itself; ``frame_bound`` is a bound computed at C speed, and only a copy whose bound
comes near the limit is measured exactly (by the caller's encoder: this module encodes
nothing).
"""

from __future__ import annotations

import marshal
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "FRAME_OVERHEAD",
    "PROPERTIES_BOUND",
    "TOLD",
    "frame_bound",
    "lean",
    "make_room",
    "payload_limit",
]

FRAME_OVERHEAD = 8
"""A frame's bytes around its payload: type, channel and size before it, an end octet after."""

PROPERTIES_BOUND = 2 + 2 + 8 + 2 + 10 * 256 + 1 + 1 + 8 + 4
"""The most a content header's payload holds besides the header table's entries: class,
weight, body size and property flags, ten short strings of at most 255 bytes (content
type and encoding, correlation id, reply-to, expiration, message id, type, user id, app
id, cluster id), delivery mode, priority, timestamp, and the table's own length."""

TOLD = (h.HISTORY, h.TRACEBACK, h.REPLAYED)
"""The plugin's headers that only tell the story, left out of a lean copy."""

_MARSHAL_FACTOR = 3


def payload_limit(frame_max: int) -> int | None:
    """Return the bytes a frame's payload may take; ``None`` when ``frame_max`` is 0 (no limit).

    The AMQP limit is ``frame_max`` minus the frame's own 8 bytes. RabbitMQ itself lets
    8 bytes more through (and names ``frame_max - 8`` when it refuses); the spec's limit
    is the one every broker keeps.
    """
    return None if frame_max == 0 else frame_max - FRAME_OVERHEAD


def frame_bound(headers: Mapping[str, Any] | None) -> int | None:
    """Return at least the bytes of a content header carrying ``headers``, or ``None``.

    ``None`` when no quick bound is known: a value ``marshal`` does not take (a decimal,
    a timestamp, a subclass of a builtin type); measure exactly then.

    Python's ``marshal`` writes every value AMQP can carry with at least a third of the
    bytes the AMQP encoding takes: format 0 spells out each string, key and
    number (no references to repeats, no short forms), and its smallest value for what
    AMQP writes in 9 bytes (an integer, a float) is 5 bytes. Three times its length is a
    bound; it is 2 to 4 times the exact size, computed some 15 times faster than
    encoding, which leaves the exact measure to the few copies near the limit.
    """
    if not headers:
        return PROPERTIES_BOUND
    try:
        return PROPERTIES_BOUND + _MARSHAL_FACTOR * len(marshal.dumps(dict(headers), 0))
    except ValueError:  # a value marshal has no format for
        return None


def lean(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``headers`` without what only tells the story, and ``retry-error`` cut short.

    The attempt count, the due time, the reason, the exception and the failure times
    stay: they decide where the message goes next, and what an operator reads first.
    """
    kept = {k: v for k, v in headers.items() if k not in TOLD}
    error = kept.get(h.ERROR)
    if isinstance(error, str):
        kept[h.ERROR] = h.truncate(error, h.HISTORY_ERROR_LIMIT)
    return kept


def make_room(
    headers: Mapping[str, Any],
    weigh: Callable[[Mapping[str, Any]], int],
    limit: int,
    *,
    where: str = "in a frame",
) -> tuple[dict[str, Any], list[tuple[str, int]]] | None:
    """Leave out the message's own largest headers until ``weigh(headers) <= limit``.

    For a dead letter whose own headers leave no room for the plugin's: those of the
    retry state (``headers.RETRY_STATE``) stay, every other one may go, the largest
    first, as few as it takes. Each one left out is named with its size at the start
    of ``retry-error``, which says ``where`` the limit is. Returns the headers and what
    was left out (name, bytes), or ``None`` when even the retry state alone does not fit.
    """
    kept = dict(headers)
    if weigh(kept) <= limit:
        return kept, []
    empty = weigh({})
    own = sorted(
        ((weigh({key: value}) - empty, key) for key, value in kept.items() if key not in _STATE),
        key=lambda entry: (-entry[0], entry[1]),
    )
    error = kept[h.ERROR] if isinstance(kept.get(h.ERROR), str) else ""
    dropped: list[tuple[str, int]] = []
    for size, key in own:
        del kept[key]
        dropped.append((key, size))
        names = ", ".join(f"{name!r} ({bytes_:,} bytes)" for name, bytes_ in dropped)
        note = f"Left out to fit {where} ({limit:,} bytes): {names}."
        kept[h.ERROR] = h.truncate(f"{note} {error}".strip(), h.ERROR_LIMIT)
        if weigh(kept) <= limit:
            return kept, dropped
    return None


_STATE = frozenset(h.RETRY_STATE)
