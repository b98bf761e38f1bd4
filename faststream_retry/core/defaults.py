"""The one table of option defaults, and the queue types (pure).

``RetryMiddleware``'s signature, the worker's config file, ``TopologyOptions``, the
operator API and the commands (``migrate``, ``status``) take their defaults from here,
so a default changes in one place. A handler policy's own defaults (``max_attempts``,
``backoff``) are ``RetryPolicy``'s fields, and the worker's ``[defaults]`` table starts
from ``RetryPolicy()``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, TypeGuard, get_args

__all__ = [
    "CLAIM_IDLE",
    "DELIVERY_LIMIT",
    "DLQ_MAX_LENGTH",
    "LOG_RETRY_TRACEBACK",
    "MAX_DELAY",
    "MIN_CLAIM_IDLE_MS",
    "MIN_PUBLISH_TIMEOUT_MS",
    "OUTAGE_HOLD",
    "PREFETCH",
    "PREFIX",
    "PUBLISH_FAILURE_PAUSE",
    "PUBLISH_TIMEOUT",
    "QUEUE_TYPE",
    "QUEUE_TYPES",
    "QueueType",
    "is_queue_type",
]

QueueType = Literal["classic", "quorum"]
"""The queue types the plugin declares."""
QUEUE_TYPES: tuple[QueueType, ...] = get_args(QueueType)
"""``QueueType``'s values, for checks and choices."""

PREFIX = "retry"
"""Of every name the plugin declares: ``<prefix>.delay.<ms>``, ``<prefix>.intake``, ..."""
MAX_DELAY = timedelta(days=1)
"""The longest delay; the tiers reach up to it."""
QUEUE_TYPE: QueueType = "quorum"
DELIVERY_LIMIT = 20
"""``x-delivery-limit`` of the quorum ``<queue>.retry`` queues (and the worker's intake)."""
PREFETCH = 200
"""Unacked messages per re-check (and intake) consumer channel."""
PUBLISH_FAILURE_PAUSE = timedelta(seconds=1)
PUBLISH_TIMEOUT = timedelta(seconds=30)
MIN_PUBLISH_TIMEOUT_MS = 1000
"""The shortest ``publish_timeout``: a copy whose confirm comes after it was delivered all
the same, and the original, requeued, is handled again (a duplicate). Shorter ones made a
message be retried several times over in a tryout."""
LOG_RETRY_TRACEBACK = "first"
OUTAGE_HOLD = timedelta(minutes=5)
"""How long a message may wait at the outage gate before it is requeued.

RabbitMQ closes a channel whose delivery stays unacked past its ``consumer_timeout``
(30 minutes by default), and that requeues every delivery of the channel; a held
message is requeued well before that, by itself.
"""


def is_queue_type(value: object) -> TypeGuard[QueueType]:
    """Return whether ``value`` is one of ``QUEUE_TYPES``."""
    return value in QUEUE_TYPES


CLAIM_IDLE = timedelta(minutes=1)
"""Redis: how long an entry stays pending, not kept alive by the replica that read it (one
killed, frozen or cut off), before another replica claims it as a lost attempt."""
DLQ_MAX_LENGTH = 100_000
"""Redis and NATS: the dead letters each dead-letter stream keeps; past it the oldest go."""
MIN_CLAIM_IDLE_MS = 1000
"""The shortest ``claim_idle``: the replicas keep their entries alive every quarter of it,
and a shorter one would have them claim each other's over a pause of the event loop."""
