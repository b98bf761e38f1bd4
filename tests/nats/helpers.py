"""Reading what the plugin left on the server: dead letters, waiting copies (no consuming)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nats.js.errors import NotFoundError

if TYPE_CHECKING:
    from nats.js import JetStreamContext


async def stream_messages(
    js: JetStreamContext, stream: str
) -> list[tuple[str, bytes, dict[str, Any]]]:
    """Every message in ``stream``, read by sequence (nothing consumed): subject, body, headers."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return []
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:
            continue
        headers: dict[str, Any] = {}
        for key, value in (msg.headers or {}).items():
            headers[key] = json.loads(value) if key.startswith("retry-") else value
        found.append((str(msg.subject), bytes(msg.data or b""), headers))
    return found


async def stream_count(js: JetStreamContext, stream: str) -> int:
    """How many messages ``stream`` holds (0 when it does not exist)."""
    try:
        return int((await js.stream_info(stream)).state.messages)
    except NotFoundError:
        return 0
