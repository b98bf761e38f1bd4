"""Outage mode on NATS: a held message handed back as a copy in a delay tier, not a ``nak``.

On RabbitMQ a message held at its queue's gate for ``outage_hold`` (or when the broker
stops) is requeued, which costs it nothing. JetStream's ``nak`` would cost it a delivery
of the consumer's ``max_deliver`` (and a consumer without one redelivers for ever), and a
message left unacked past the consumer's ``ack_wait`` is redelivered while the first
delivery still waits: a duplicate. So the held message is *parked*: a copy goes into the
delay stream's tier of the probe interval, with the same attempt (the outage spends none),
confirmed by its PubAck before the original is acked (confirm-then-ack, as every copy).
Its tier's re-check hands it back to its subscriber through the ready subject, where it
meets the gate again: let through if the outage is over, held otherwise.

The copy's ``Nats-Msg-Id`` is made of the delivery it parks (``park``), so a delivery
parked twice (redelivered meanwhile) is stored once. It is reported as a hop: a wait in
a tier that spends no attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.nats import naming, wire
from faststream_retry.nats.publisher import confirmed, copy_id

if TYPE_CHECKING:
    from faststream_retry.core.steps import Copy
    from faststream_retry.core.topology import Route
    from faststream_retry.nats.live import NatsLive
    from faststream_retry.nats.sink import Message
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["park"]


async def park(
    live: NatsLive, reporter: Reporter, msg: Message, route: Route, *, wait_ms: int
) -> bool:
    """Park held ``msg`` of ``route`` for about ``wait_ms``; ``True``: copied and acked.

    ``False``: the copy was not confirmed (the server refuses it, or the plugin stops),
    and ``msg`` is untouched: the caller hands it back another way.
    """
    if not live.running:
        return False
    raw = msg.raw_message
    incoming = wire.failed(raw.headers, subject=raw.subject, message_id=msg.message_id)
    tiers = live.plan.tiers
    tier_ms = tiers.pick(max(wait_ms, tiers.tick_ms))
    step = steps.parked(
        live.plan, route, msg.message_id, incoming, now_ms=h.now_ms(), wait_ms=tier_ms
    )
    subject = naming.delay_subject(live.prefix, tier_ms, route.queue)
    stream = naming.delay_stream(live.prefix)
    ident = copy_id(raw.metadata, "park")

    async def send(copy: Copy) -> bool:
        outcome = await live.publisher.publish(
            subject, raw.data, copy.headers, msg_id=ident, stream=stream
        )
        return confirmed(outcome)

    if not await reporter.publish(
        step.event, step.copy, send, incoming=incoming, tier_ms=tier_ms, destination=subject
    ):
        return False
    await msg.ack()
    return True
