"""How often this process handed a message back to its queue, its copy unconfirmed.

``core.steps.stuck`` ends a requeue loop once a delivery came back ``delivery_limit``
times. RabbitMQ counts that only on a quorum queue (``x-delivery-count``; on 4.3
``x-acquired-count``); a classic queue counts nothing, so a message whose copy is never
confirmed (a tier or a queue that refuses every publish) would come back for ever. Each
runtime therefore also counts its own requeues, per queue and message, and ``stuck``
takes the larger count. The count lives in this process: a restart starts it again, and
replicas that take turns at a message each count theirs, so a loop ends after at most
``delivery_limit`` requeues per process. A first delivery (not ``redelivered``) has
never come back, whatever was counted before under its name.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

from faststream_retry.core import headers as h

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

__all__ = ["Requeues"]

CAPACITY = 10_000
"""Messages remembered at most; the oldest is forgotten first. A loop needs only its own
entry, touched on each turn, so only a flood of distinct stuck messages evicts one."""


class Requeues:
    """Counts, per queue and message, the requeues of copies this process could not confirm."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        """Remember up to ``capacity`` messages."""
        self._capacity = capacity
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()

    def seen(self, queue: str, message: AbstractIncomingMessage) -> int:
        """Return how often this process requeued ``message`` of ``queue`` before."""
        key = _key(queue, message)
        if not message.redelivered:
            self._counts.pop(key, None)
            return 0
        return self._counts.get(key, 0)

    def requeued(self, queue: str, message: AbstractIncomingMessage) -> None:
        """Count one more requeue of ``message`` of ``queue``."""
        key = _key(queue, message)
        count = self._counts.pop(key, 0) + 1 if message.redelivered else 1
        self._counts[key] = count
        while len(self._counts) > self._capacity:
            self._counts.popitem(last=False)

    def settled(self, queue: str, message: AbstractIncomingMessage) -> None:
        """Forget ``message`` of ``queue``: it left the queue."""
        self._counts.pop(_key(queue, message), None)


def _key(queue: str, message: AbstractIncomingMessage) -> tuple[str, str]:
    if message.message_id:
        return queue, message.message_id
    # Known by what it carries: the loop redelivers the same body, properties and headers
    # (but for the broker's counts). Byte-identical messages without an id share a count.
    digest = hashlib.sha256(message.body)
    carried = (
        message.correlation_id,
        message.timestamp,
        message.type,
        sorted(h.without_broker_counts(message.headers).items()),
    )
    digest.update(repr(carried).encode("utf-8", "surrogatepass"))
    return queue, "sha256:" + digest.hexdigest()
