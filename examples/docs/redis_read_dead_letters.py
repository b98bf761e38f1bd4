"""Read a stream's dead letters on Redis without consuming them (redis-py)."""

import json
from typing import Any, cast

from faststream.redis import BinaryMessageFormatV1
from redis.asyncio import Redis

Entries = list[tuple[bytes, dict[bytes, bytes]]]


def dead_letter_stream(stream: str) -> str:
    """``{stream}.dlq``, or ``<stream>.dlq`` when its name has a hash tag."""
    start = stream.find("{")
    tagged = start >= 0 and stream.find("}", start + 1) > start + 1
    return f"{stream}.dlq" if tagged else f"{{{stream}}}.dlq"


async def list_dead_letters(url: str, stream: str) -> list[dict[str, Any]]:
    """Print and return the dead letters of ``stream``, oldest first.

    XRANGE only: no group, no consumer, nothing acknowledged, moved or removed.
    """
    client = Redis.from_url(url)
    letters: list[dict[str, Any]] = []
    try:
        # redis-py types a reply loosely: XRANGE's, as it comes back
        entries = cast("Entries", await client.xrange(dead_letter_stream(stream)))
    finally:
        await client.aclose()
    for entry_id, fields in entries:
        body, headers = BinaryMessageFormatV1.parse(fields[b"__data__"])
        letter: dict[str, Any] = {
            k: v for k, v in headers.items() if k.startswith("retry-")
        }
        # Text on Redis: numbers as decimals, the history as JSON.
        letter["retry-attempt"] = int(letter.get("retry-attempt", 0))
        letter["retry-history"] = json.loads(letter.get("retry-history", "[]"))
        letter["entry"] = entry_id.decode()
        letter["message_id"] = headers.get("message_id")
        letter["body"] = body
        letters.append(letter)
        print(
            letter["entry"],
            letter["message_id"],
            letter.get("retry-reason"),
            letter["retry-attempt"],
            letter.get("retry-exception"),
            str(letter.get("retry-error", ""))[:60],
        )
    return letters
