"""The ``retry-*`` headers as NATS carries them (pure).

NATS headers are text, one line each: a value cannot hold a line break (a traceback
does) nor a list (``retry-history`` is one). So on NATS every ``retry-*`` header's value
is its JSON text (``retry-attempt: 2``, ``retry-reason: "exhausted"``, ``retry-history:
[{...}]``); any other header is the application's and travels as it came. A copy never
carries a ``Nats-*`` header of the message it was made from: those tell the server what
to do with a publish (``Nats-Msg-Id``, ``Nats-Expected-*``, ``Nats-Rollup``,
``Nats-TTL``, ``Nats-Schedule``...), and only the plugin says that of its copies.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["MESSAGE_ID", "MSG_ID", "SUBJECT", "decode", "encode", "failed", "value"]

MSG_ID = "Nats-Msg-Id"
MESSAGE_ID = "message_id"
"""FastStream's header for a NATS message's id (its parser makes a new one without it)."""
SUBJECT = "retry-subject"
"""The subject the failed message came on: a ready copy arrives on the plugin's subject,
and the handler is given this one back (a subscriber with a subject pattern parses it)."""

_RETRY = "retry-"
_SERVER = "nats-"
_MAX_JSON = 64 * 1024
"""A ``retry-*`` value longer than any the plugin writes is not parsed (untrusted input)."""


def decode(headers: Mapping[str, str] | None) -> dict[str, Any]:
    """Return ``headers`` as the core reads them: each ``retry-*`` value parsed from JSON.

    A value that is not JSON (a garbled or hand-made header) is kept as its text: the
    core's readers take what they can from it and treat the rest as missing.
    """
    decoded: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        if not isinstance(key, str):
            continue
        if key.startswith(_RETRY) and isinstance(value, str) and len(value) <= _MAX_JSON:
            try:
                decoded[key] = json.loads(value)
            except (ValueError, RecursionError):  # nesting a few KB deep is enough for the latter
                decoded[key] = value
            continue
        decoded[key] = value
    return decoded


def failed(headers: Mapping[str, str] | None, *, subject: str, message_id: str) -> dict[str, Any]:
    """Return the headers of a message that failed, as the core reads them for its copy.

    ``subject``: the subject it came on, given back to the handler on its retry
    (``SUBJECT``). ``message_id``: its FastStream id, which FastStream makes anew at each
    delivery of a message without one: a copy carries the first, so that every attempt
    has the same id.
    """
    incoming = decode(headers)
    incoming[SUBJECT] = subject
    incoming.setdefault(MESSAGE_ID, message_id)
    return incoming


def value(retry_value: object) -> str:
    """Return one ``retry-*`` header's value as NATS carries it: its JSON text."""
    return json.dumps(retry_value, ensure_ascii=True, separators=(",", ":"), default=str)


def encode(headers: Mapping[str, Any], *, msg_id: str | None) -> dict[str, str]:
    """Return a copy's NATS headers: ``retry-*`` as JSON, ``Nats-*`` out, ``msg_id`` set.

    ``msg_id`` ``None``: no ``Nats-Msg-Id`` (test mode's dead letters, made of a message
    no stream has stored).
    """
    encoded: dict[str, str] = {}
    for key, item in headers.items():
        if key.lower().startswith(_SERVER):
            continue
        if key.startswith(_RETRY):
            encoded[key] = value(item)
        elif isinstance(item, str):
            encoded[key] = _one_line(item)
        elif isinstance(item, (bytes, bytearray)):
            encoded[key] = _one_line(bytes(item).decode(errors="replace"))
        else:
            encoded[key] = _one_line(str(item))
    if msg_id is not None:
        encoded[MSG_ID] = msg_id
    return encoded


def _one_line(text: str) -> str:
    """A value NATS can carry: no line break (a tracing header injected by a propagator)."""
    return text.replace("\r", " ").replace("\n", " ")
