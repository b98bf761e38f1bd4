"""Outage mode on Redis: a held entry handed back through the schedule, in one atomic step.

On RabbitMQ a message held at its queue's gate for ``outage_hold`` (or when the broker
stops) is requeued, which costs it nothing. A Redis stream has no requeue: an entry left
pending is the claimer's, which claims it ``claim_idle`` later and counts a lost attempt.
So the held entry is *parked*: the retry-later script acknowledges it and schedules its
copy, with the same attempt (the outage spends none), the probe interval from the
server's now, in one step (never half done, and nothing written if the entry is no
longer pending). The mover puts it back in its stream when due, where it meets the gate
again: let through if the outage is over, held otherwise. It is reported as a hop: a
wait in the schedule that spends no attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.redis.envelope import EnvelopeTooLarge
from faststream_retry.redis.keys import stream_keys
from faststream_retry.redis.sink import MESSAGE_ID
from faststream_retry.redis.steps import StreamEntry

if TYPE_CHECKING:
    from faststream_retry.core.steps import Copy
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.redis.engine import RedisRetryEngine
    from faststream_retry.redis.sink import Message
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["park"]


async def park(
    engine: RedisRetryEngine,
    plan: Plan,
    reporter: Reporter,
    msg: Message,
    route: Route,
    *,
    wait_ms: int,
) -> bool:
    """Park held ``msg`` of ``route`` for ``wait_ms``; ``True``: acknowledged, its copy scheduled.

    Also ``True`` when the entry was no longer pending (another consumer settled it: there
    is nothing to hand back). ``False``: Redis did not take the step (the entry stays
    pending, given up to the claimer), or the copy cannot be encoded: the caller hands
    it back another way.
    """
    entry = StreamEntry.from_raw(msg.raw_message, engine.group(route.queue))
    incoming = entry.incoming_headers()
    incoming.setdefault(MESSAGE_ID, msg.message_id)
    step = steps.parked(plan, route, msg.message_id, incoming, now_ms=h.now_ms(), wait_ms=wait_ms)

    async def send(copy: Copy) -> bool:
        await engine.retry_later(entry, delay_ms=wait_ms, headers=copy.headers)
        return True  # scheduled, or no longer pending: either way nothing is left to do

    try:
        return await reporter.publish(
            step.event,
            step.copy,
            send,
            incoming=incoming,
            tier_ms=wait_ms,
            destination=stream_keys(entry.stream).schedule,
        )
    except EnvelopeTooLarge:
        return False
    except (RedisError, OSError):
        engine.abandon(entry)
        return False
