"""What a copy can carry on NATS: header names a client may send, and ``max_payload`` (pure).

Two things a message from another client can carry that a copy of it cannot:

- **A header name outside HTTP's token set** (``x/y``, a space, non-ASCII): legal on the
  wire, and some clients (Go's, the ``nats`` CLI, a raw ``HPUB``) send it, but nats-py
  refuses to publish it (``BadHeaderError``), so its copy and its dead letter would never
  be written and the message would come back to its handler for ever. Such a name is
  renamed, percent-encoded (``x%2Fy``), and ``retry-error`` says so.
- **A copy larger than the server's ``max_payload``**: a message near the limit plus the
  plugin's ``retry-*`` headers. nats-py checks the body alone against the limit; the server
  measures headers and body, and closes the connection on a message above it (every
  delivery in flight on it comes back). So a copy is measured first: one that does not fit
  goes lean (``core.fit.lean``: no history, traceback or replay record); a dead letter that
  still does not fit leaves out the message's own largest headers, each named in
  ``retry-error`` (``core.fit.make_room``); a retry that does not fit lean is not
  published (the caller dead-letters the message as ``HeadersTooLarge``). The body is never
  touched, and it fits: the server took the message.

Measuring means encoding the headers, which the publish does again; ``fits_surely`` is a
bound that needs no encoding, and only a copy whose bound comes near the limit is measured.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from faststream_retry.core import fit
from faststream_retry.core import headers as h
from faststream_retry.nats import wire

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ADDED_BOUND",
    "encoded_size",
    "fits_surely",
    "fitted",
    "is_token",
    "max_payload_of",
    "prepared",
    "sendable",
]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""The header names nats-py publishes (RFC 7230's token)."""
_SAFE = "!#$&'*+^`|"
"""Token characters ``quote`` would escape; ``%`` is not among them, so a rename reads back."""
_FRAME = len(b"NATS/1.0\r\n") + len(b"\r\n")
"""A header block's bytes besides its lines: the version line, the blank line after."""
_LINE = len(b": \r\n")
_ESCAPE = 6
"""The most bytes one UTF-8 byte of a value can take once JSON-escaped (``\\u0001``)."""
ADDED_BOUND = 12 * h.MAX_ADDED_BYTES
"""More than the plugin's ``retry-*`` headers take on NATS: JSON escapes a character to at
most 12 bytes (a surrogate pair), and core bounds the characters (``MAX_ADDED_BYTES``)."""
_DEFAULT_MAX_PAYLOAD = 1024 * 1024


def max_payload_of(msg: Any) -> int:  # noqa: ANN401 - nats-py's Msg
    """The largest message the server of ``msg``'s connection takes (1 MiB if unknown)."""
    size = getattr(getattr(msg, "_client", None), "max_payload", None)
    return size if isinstance(size, int) and size > 0 else _DEFAULT_MAX_PAYLOAD


_TOKENS: set[str] = set()
"""Names found to be tokens: every copy carries the same few, checked once each here."""
_TOKENS_KEPT = 1024
"""At most this many: names are the senders' to choose, past it they are checked each time."""


def is_token(name: str) -> bool:
    """Whether nats-py sends a header of this name (an empty one it skips)."""
    if name in _TOKENS:
        return True
    token = _TOKEN.fullmatch(name.strip() or "x") is not None
    if token and len(_TOKENS) < _TOKENS_KEPT:
        _TOKENS.add(name)
    return token


def sendable(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``headers`` with each name nats-py refuses renamed (percent-encoded).

    ``retry-error`` says which were renamed, first. A renamed name that is taken already
    is left out (and said so).
    """
    if all(isinstance(k, str) and is_token(k) for k in headers):
        return dict(headers)
    kept: dict[str, Any] = {}
    said: list[str] = []
    for key, item in headers.items():
        if not isinstance(key, str):
            continue
        name = key.strip()
        if not name or _TOKEN.fullmatch(name):
            kept[key] = item
            continue
        renamed = quote(name, safe=_SAFE)
        if renamed in headers or renamed in kept:
            said.append(f"{key!r} left out ({renamed!r} is taken)")
        else:
            kept[renamed] = item
            said.append(f"{key!r} as {renamed!r}")
    error = kept.get(h.ERROR)
    note = "Header names NATS clients cannot send, renamed: " + ", ".join(said) + "."
    kept[h.ERROR] = h.truncate(
        f"{note} {error}" if isinstance(error, str) and error else note, h.ERROR_LIMIT
    )
    return kept


def encoded_size(headers: Mapping[str, str], body_bytes: int) -> int:
    """The bytes the server counts against ``max_payload``: the header block and the body."""
    lines = sum(
        len(k.strip().encode(errors="surrogateescape"))
        + len(v.strip().encode(errors="surrogateescape"))
        + _LINE
        for k, v in headers.items()
        if k.strip()
    )
    return body_bytes + _FRAME + lines


def fits_surely(incoming: Mapping[str, Any] | None, body_bytes: int, limit: int) -> bool:
    """Whether a copy of a message certainly fits, without encoding it.

    ``incoming``: the message's own headers as received (text). Each of its bytes takes at
    most ``_ESCAPE`` once a ``retry-*`` value is JSON text again; the plugin adds at most
    ``ADDED_BOUND``.
    """
    own = sum(
        (len(k) + len(v) + _LINE) * 4 * _ESCAPE
        for k, v in (incoming or {}).items()
        if isinstance(k, str) and isinstance(v, str)
    )
    return body_bytes + _FRAME + own + ADDED_BOUND <= limit


_BARE = (h.REASON, h.ORIGIN_QUEUE, h.EXCEPTION, h.ATTEMPT, h.LAST_FAILED_AT, h.ERROR)
"""What a dead letter whose body leaves almost no room keeps first: why, whose, what."""


def fitted(
    headers: Mapping[str, Any], body_bytes: int, *, msg_id: str, limit: int, room: bool
) -> tuple[dict[str, Any], str | None] | None:
    """Return ``headers`` cut so that the copy fits in ``limit``, and its ``Nats-Msg-Id``.

    As built, then lean, then (``room``: a dead letter) without the message's own largest
    headers, then with only as much of the retry state as fits (``_BARE``, in that order),
    and, for a body that leaves no room for any header, none at all and no
    ``Nats-Msg-Id`` (a dead letter kept without its record, rather than lost). ``None``: a
    retry that does not fit lean. The names are sendable (``sendable``) already.
    """

    def weigh(candidate: Mapping[str, Any], ident: str | None = msg_id) -> int:
        return encoded_size(wire.encode(candidate, msg_id=ident), body_bytes)

    if weigh(headers) <= limit:
        return dict(headers), msg_id
    lean = fit.lean(headers)
    if weigh(lean) <= limit:
        return lean, msg_id
    if not room:
        return None
    made = fit.make_room(lean, weigh, limit, where="in the server's max_payload")
    if made is not None:
        return made[0], msg_id
    if weigh({}) > limit:
        return {}, None
    bare: dict[str, Any] = {}
    for key in _BARE:
        if key in lean and weigh({**bare, key: lean[key]}) <= limit:
            bare[key] = lean[key]
    return bare, msg_id


def prepared(
    headers: Mapping[str, Any],
    incoming: Mapping[str, Any] | None,
    body: bytes,
    *,
    msg_id: str,
    limit: int,
    room: bool,
) -> tuple[dict[str, Any], str | None] | None:
    """A copy's headers and ``Nats-Msg-Id`` as they can be sent; ``None``: it cannot fit.

    ``incoming``: the headers of the message it is made of, as received (``fits_surely``).
    """
    sent = sendable(headers)
    if fits_surely(incoming, len(body), limit):
        return sent, msg_id
    return fitted(sent, len(body), msg_id=msg_id, limit=limit, room=room)
