"""Read a subscriber's dead letters on NATS without consuming them (nats-py)."""

import json
from typing import Any

import nats
from nats.js.errors import NotFoundError


def _value(text: str) -> Any:
    """A retry-* header's value: JSON text on NATS (kept as text if garbled)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def list_dead_letters(
    url: str, stream: str, durable: str, prefix: str = "retry"
) -> list[dict[str, Any]]:
    """Print and return the dead letters of ``stream``'s consumer ``durable``.

    Direct gets, one message at a time by subject: no consumer is made, and
    nothing is acked, moved or redelivered.
    """
    dlq_stream = f"{prefix}-dlq-{stream}"
    subject = f"{prefix}.dlq.{stream}.{durable}"
    connection = await nats.connect(url)
    letters: list[dict[str, Any]] = []
    try:
        js = connection.jetstream()
        try:
            await js.stream_info(dlq_stream)
        except NotFoundError:  # no dead letter yet: the plugin makes it at start
            return letters
        seq = 1
        while True:
            try:
                msg = await js.get_msg(
                    dlq_stream, seq, subject=subject, direct=True, next=True
                )
            except NotFoundError:  # none after seq
                break
            headers = msg.headers or {}
            letter = {
                k: _value(v) for k, v in headers.items() if k.startswith("retry-")
            }
            letter["seq"] = msg.seq
            letter["message_id"] = headers.get("message_id")
            letter["body"] = msg.data
            letters.append(letter)
            print(
                msg.seq,
                letter["message_id"],
                letter.get("retry-reason"),
                letter.get("retry-attempt"),
                letter.get("retry-exception"),
                str(letter.get("retry-error", ""))[:60],
            )
            seq = (msg.seq or seq) + 1
    finally:
        await connection.close()
    return letters
