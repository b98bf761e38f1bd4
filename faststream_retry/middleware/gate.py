"""Which gate of outage mode a message passes: its broker's, its queue's (FastStream side).

The gates themselves are ``faststream_retry.outages``; this finds a resolved message's
(``delivery``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faststream_retry.middleware.delivery import Delivery
    from faststream_retry.outages import Gate

__all__ = ["gate_of"]


def gate_of(delivery: Delivery) -> Gate | None:
    """Return the gate the message of ``delivery`` passes; ``None``: it passes none.

    None for a broker the plugin has not started (test mode under ``TestRabbitBroker``:
    no gate there), outage mode off, and a handler with ``enabled=False`` (its messages
    are left alone, and its outcomes do not count).
    """
    live = delivery.runtime.live
    outages = None if live is None else live.outages
    if outages is None or not delivery.enabled:
        return None
    return outages.gate(delivery.queue)
