"""Messages as JSON Lines, every byte and type kept: written by ``dlq export``, read by ``import``.

One JSON object per line: ``{"format": 1, "queue": ..., "exported_at": ...,
"properties": {...}, "headers": {...}, "body": "<base64>"}``. Header and property
values that JSON has no type for are tagged objects with one key: ``{"$bytes":
"<base64>"}`` (an AMQP byte array), ``{"$decimal": "1.50"}``, ``{"$datetime":
"<ISO 8601>"}`` (an AMQP timestamp), and ``{"$table": {...}}`` for a table whose keys
start with ``$`` (so it cannot be read as a tag). Everything else is JSON as it is.

``fingerprint`` names a message by its content, the same whether it is read from such
a line or from the queue: ``dlq purge --from-export`` removes exactly what an export
holds by it.
"""

from __future__ import annotations

import base64
import decimal
import hashlib
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pamqp import commands

from faststream_retry.core import headers as h
from faststream_retry.ops.common import OperationError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "FORMAT",
    "Record",
    "decode_value",
    "encode_value",
    "fingerprint",
    "read_line",
    "write_line",
]

FORMAT = 1

_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
    "cluster_id",
)


def encode_value(value: Any) -> Any:  # noqa: ANN401 - any AMQP field value
    """Return ``value`` as JSON, tagging what JSON cannot hold as is."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dict):
        table = {str(k): encode_value(v) for k, v in value.items()}
        return {"$table": table} if any(k.startswith("$") for k in table) else table
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    return value


_TAGS: dict[str, Any] = {
    "$bytes": lambda v: bytearray(base64.b64decode(v, validate=True)),
    "$decimal": decimal.Decimal,
    "$datetime": datetime.fromisoformat,
    "$table": lambda v: {k: decode_value(x) for k, x in v.items()},
}


def decode_value(value: Any) -> Any:  # noqa: ANN401 - any JSON value
    """Undo ``encode_value``: byte arrays come back as ``bytearray`` (what pamqp encodes)."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag in _TAGS:
                return _TAGS[tag](inner)
        return {k: decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    return value


class Record:
    """One exported message: where it was, its properties, headers and body."""

    __slots__ = ("body", "properties", "queue")

    def __init__(self, queue: str, properties: commands.Basic.Properties, body: bytes) -> None:
        """Keep the message as read from ``queue``."""
        self.queue = queue
        self.properties = properties
        self.body = body


def write_line(record: Record) -> str:
    """Return ``record`` as one line of JSON (with its newline)."""
    props = record.properties
    data = {
        "format": FORMAT,
        "queue": record.queue,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "properties": {
            name: encode_value(value)
            for name in _PROPERTIES
            if (value := getattr(props, name, None)) is not None
        },
        # The broker's delivery counts are its own, set again on every delivery.
        "headers": encode_value(h.without_broker_counts(props.headers)),
        "body": base64.b64encode(record.body).decode(),
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def fingerprint(properties: commands.Basic.Properties, body: bytes) -> str:
    """Return a digest of a message's body, properties and headers, as an export keeps them.

    What the broker or a pass changes without the message changing is left out: the
    delivery counts RabbitMQ sets on each delivery, and ``user_id`` (a pass over a
    quorum queue republishes what it keeps, and drops a ``user_id`` that is not the
    connection's user). A message read from a queue and the same message read back
    from its export line have the same fingerprint; any other byte of difference
    gives another one.
    """
    data = {
        "properties": {
            name: encode_value(value)
            for name in _PROPERTIES
            if name != "user_id" and (value := getattr(properties, name, None)) is not None
        },
        "headers": encode_value(h.without_broker_counts(properties.headers)),
        "body": base64.b64encode(body).decode(),
    }
    canonical = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def read_line(line: str, where: str) -> Record:
    """Read one line ``write_line`` wrote; ``where`` names it in errors (``file:line``).

    Raises:
        OperationError: the line is not such a record.
    """
    try:
        data = json.loads(line)
        _check(data)
        props: Mapping[str, Any] = data["properties"]
        headers = decode_value(data.get("headers") or {})
        properties = commands.Basic.Properties(
            headers=headers or None, **{k: decode_value(v) for k, v in props.items()}
        )
        return Record(str(data["queue"]), properties, base64.b64decode(data["body"], validate=True))
    except (ValueError, KeyError, TypeError, decimal.InvalidOperation) as exc:
        raise OperationError(f"{where}: not an exported message ({exc})") from None


def _check(data: object) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} record")
    unknown = set(data["properties"]) - set(_PROPERTIES)
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}")
