"""FastStream's message in a stream entry, read and written without FastStream (pure).

FastStream 0.7's ``RedisBroker`` keeps a message in one entry field, ``__data__``, in
its binary format (``BinaryMessageFormatV1``, the default: a magic, offsets, then each
header as a length-prefixed key and value, then the body) or, from older producers, a
JSON envelope ``{"data": ..., "headers": {...}}``; an entry without ``__data__`` (any
other producer's ``XADD``) is its fields, handed to the handler as a JSON object.

A copy is always written in the binary format, which FastStream reads whatever format
the subscriber was given. Its header values are text: the plugin's integers go as
decimal text (``core.headers`` reads those), its tables (``retry-history``,
``retry-replayed``) as JSON text, turned back into tables on reading (``from_wire``).

Lengths are counted in UTF-8 bytes. FastStream 0.7.8's own writer counts characters,
so a header with a non-ASCII value (an error text in another language) makes its
message unreadable to FastStream's parser, which then hands the whole entry to the
handler as the body, with no headers; a copy written here reads back intact.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faststream_retry.core import headers as h

__all__ = [
    "DATA_FIELD",
    "Envelope",
    "EnvelopeTooLarge",
    "build",
    "from_wire",
    "parse",
    "to_wire",
]

DATA_FIELD = b"__data__"
"""The entry field FastStream keeps its encoded message in."""

_MAGIC = b"\x89BIN\r\n\x1a\n"
_VERSION = 1
_SHORT = struct.Struct(">H")
_PREAMBLE = struct.Struct(">8sHII")
_MAX_SHORT = 0xFFFF
_TABLES = (h.HISTORY, h.REPLAYED)
"""Headers whose value is a list of tables, carried as JSON text."""
_TABLE_JSON = json.JSONEncoder(default=str, ensure_ascii=False)
"""What ``json.dumps(value, default=str, ensure_ascii=False)`` builds at each call (an encoder
is stateless between calls): built once, as a retry's copy encodes its history with it."""


class EnvelopeTooLarge(ValueError):  # noqa: N818 - reads as the finding
    """A header key or value longer than the binary format's 65,535 bytes, or too many headers."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as FastStream encodes it: its body and its headers (values as on the wire)."""

    body: bytes
    headers: dict[str, Any]


def _binary(data: bytes) -> Envelope | None:
    if not data.startswith(_MAGIC) or len(data) < _PREAMBLE.size:
        return None
    try:
        _, version, headers_start, data_start = _PREAMBLE.unpack_from(data)
        if version != _VERSION:
            return None
        (count,) = _SHORT.unpack_from(data, headers_start)
        offset = headers_start + 2
        headers: dict[str, Any] = {}
        for _ in range(count):
            key, offset = _string(data, offset)
            value, offset = _string(data, offset)
            headers[key] = value
    except (struct.error, UnicodeDecodeError):
        return None
    if data_start > len(data):
        return None
    return Envelope(bytes(data[data_start:]), headers)


def _string(data: bytes, offset: int) -> tuple[str, int]:
    (size,) = _SHORT.unpack_from(data, offset)
    end = offset + 2 + size
    if end > len(data):
        raise struct.error("a header runs past the end of the entry")
    return data[offset + 2 : end].decode(), end


def _json_envelope(data: bytes) -> Envelope | None:
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("data"), str):
        return None
    headers = parsed.get("headers")
    # surrogatepass: JSON may spell a lone surrogate ("\ud800"), which UTF-8 cannot encode.
    body = parsed["data"].encode(errors="surrogatepass")
    return Envelope(body, dict(headers) if isinstance(headers, Mapping) else {})


def _text(raw: bytes) -> str:
    return raw.decode(errors="surrogateescape")


def parse(fields: Mapping[bytes, bytes]) -> Envelope:
    """Return the message in a stream entry's ``fields``, as FastStream's parser reads it.

    Never raises: an entry no format explains is its own body, without headers.
    """
    data = fields.get(DATA_FIELD)
    if data is None:
        body = json.dumps({_text(k): _text(v) for k, v in fields.items()}).encode(
            errors="surrogateescape"
        )
        return Envelope(body, {})
    return _binary(data) or _json_envelope(data) or Envelope(bytes(data), {})


def _put(out: bytearray, text: str) -> None:
    try:
        raw = text.encode(errors="surrogateescape")  # bytes read undecoded go back as they were
    except UnicodeEncodeError:  # a lone surrogate from a JSON envelope ("\ud800")
        raw = text.encode(errors="surrogatepass")
    if len(raw) > _MAX_SHORT:
        raise EnvelopeTooLarge(
            f"a header of {len(raw)} bytes: FastStream's binary format holds 65,535 at most"
        )
    out += _SHORT.pack(len(raw))
    out += raw


def build(body: bytes, headers: Mapping[str, str]) -> bytes:
    """Return ``body`` and ``headers`` in FastStream's binary format (lengths in bytes)."""
    if len(headers) > _MAX_SHORT:
        raise EnvelopeTooLarge(f"{len(headers)} headers: FastStream's binary format holds 65,535")
    table = bytearray()
    for key, value in headers.items():
        _put(table, key)
        _put(table, value)
    headers_start = _PREAMBLE.size
    data_start = headers_start + 2 + len(table)
    return (
        _PREAMBLE.pack(_MAGIC, _VERSION, headers_start, data_start)
        + _SHORT.pack(len(headers))
        + bytes(table)
        + body
    )


def _wire_value(value: Any) -> str:  # noqa: ANN401 - any header value the core builds
    if isinstance(value, str):
        return value
    if type(value) is int:  # the most of a copy's headers (a bool is an int: not here)
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return _text(bytes(value))
    if isinstance(value, bool) or value is None or isinstance(value, (list, tuple, dict)):
        return _TABLE_JSON.encode(value)
    return str(value)


def to_wire(headers: Mapping[str, Any]) -> dict[str, str]:
    """Return ``headers`` with every value as text: tables as JSON, numbers as decimals."""
    return {str(k): _wire_value(v) for k, v in headers.items()}


def from_wire(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return headers as ``core.headers`` reads them: the JSON tables turned back into lists.

    A table that is not valid JSON stays text, which the core's readers treat as no
    history (it restarts); never raises.
    """
    out = dict(headers)
    for key in _TABLES:
        value = out.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError, RecursionError):
                out[key] = json.loads(value)
    return out
