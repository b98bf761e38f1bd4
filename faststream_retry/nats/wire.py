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
            decoded[key] = _parsed(value)
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


def _parsed(text: str) -> Any:  # noqa: ANN401 - any JSON value
    """``text`` parsed from JSON; not JSON: ``text`` itself.

    The plugin's own values are mostly numbers and plain quoted texts, read here without
    the JSON parser (the same values it returns: ``json.loads`` reads no leading zero, and
    no control character or escape inside a text).
    """
    if len(text) > 1 and text[0] == text[-1] == '"':
        inner = text[1:-1]
        if '"' not in inner and "\\" not in inner and inner.isprintable():
            return inner
    try:
        if text.isdigit() and text.isascii() and (text[0] != "0" or len(text) == 1):
            return int(text)  # past Python's 4,300 digits: ValueError, as json's
        return json.loads(text)
    except (ValueError, RecursionError):  # nesting a few KB deep is enough for the latter
        return text


_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=str).encode
"""One encoder for every value (``json.dumps`` with options makes a new one each call)."""


def value(retry_value: object) -> str:
    """Return one ``retry-*`` header's value as NATS carries it: its JSON text."""
    # The same text json writes, without it for the plugin's ints and plain ASCII texts.
    if type(retry_value) is int:
        return str(retry_value)
    if (
        type(retry_value) is str
        and retry_value.isascii()
        and retry_value.isprintable()
        and '"' not in retry_value
        and "\\" not in retry_value
    ):
        return f'"{retry_value}"'
    return _JSON(retry_value)


def encode(headers: Mapping[str, Any], *, msg_id: str | None) -> dict[str, str]:
    """Return a copy's NATS headers: ``retry-*`` as JSON, ``Nats-*`` out, ``msg_id`` set.

    ``msg_id`` ``None``: no ``Nats-Msg-Id`` (test mode's dead letters, made of a message
    no stream has stored).
    """
    encoded: dict[str, str] = {}
    for key, item in headers.items():
        # Most names are the plugin's: a ``retry-`` one is never a server's (``nats-``).
        if key.startswith(_RETRY):
            encoded[key] = str(item) if type(item) is int else value(item)
        elif key.lower().startswith(_SERVER):
            continue
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
