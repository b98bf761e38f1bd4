"""Which gate of outage mode a message passes: its broker's, its queue's (FastStream side).

The gates themselves are ``engine.outages``; this finds a message's from FastStream's
context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream_retry.middleware import _internals

if TYPE_CHECKING:
    from faststream._internal.context import ContextRepo
    from faststream.message import StreamMessage

    from faststream_retry.engine.outages import Gate
    from faststream_retry.middleware.runtime import Plugin

__all__ = ["gate_of"]


async def gate_of(plugin: Plugin, context: ContextRepo, msg: StreamMessage[Any]) -> Gate | None:
    """Return the gate ``msg`` passes; ``None``: it passes none.

    None for a broker the plugin has not started (test mode under ``TestRabbitBroker``:
    no gate there), a message without its subscriber, a queue the plugin does not
    cover, and a handler with ``enabled=False`` (its messages are left alone, and its
    outcomes do not count).
    """
    broker = _internals.current_broker(context)
    sub = _internals.current_subscriber(context)
    if broker is None or sub is None:
        return None
    live = plugin.runtime(broker).live
    outages = None if live is None else live.outages
    queue = _internals.queue_of(sub)
    if outages is None or live is None or queue is None:
        return None
    route = live.plan.route(queue)
    if route is None:
        return None
    handler = await _internals.select_policy(route, msg)
    default = plugin.config.default
    # effective_policy(handler, default).enabled, without building a policy per message.
    if not (
        default.enabled if handler is None else handler.options.get("enabled", default.enabled)
    ):
        return None
    return outages.gate(queue)
