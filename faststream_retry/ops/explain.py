"""``explain``: what the plugin does for an application's queues, with no connection.

The policies, classification and schedule come from the same functions on every broker;
what the plugin makes for them differs: RabbitMQ's queues, exchanges and tiers; NATS's
delay stream (a subject per tier), re-check and hand-over consumers and dead-letter
streams (``nats.naming``); Redis's schedule and dead-letter keys (``redis.keys``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from faststream_retry.nats import naming
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.explanation import Declared, Explanation, explain_plan
from faststream_retry.redis.keys import stream_keys

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.explanation import QueueExplanation

__all__ = ["explain"]

NATS_NOTES = (
    (
        "NATS: a queue is a covered subscriber's key (<stream>.<durable>). A copy waits in the "
        "delay stream under its tier's subject; the tier's re-check consumer sends it round the "
        "next tier or, when due, to the key's ready subject (each leg's 'to'), which a consumer "
        "of the plugin's hands to that subscriber alone"
    ),
    "NATS has no queue types: queue_type is null",
)
REDIS_NOTES = (
    (
        "Redis: a queue is a covered stream. A copy waits in the stream's schedule (a sorted set "
        "scored by its due time, to the millisecond) and every running replica of the app moves "
        "it back into the stream when due: there are no tiers, and no legs"
    ),
    "Redis has no queue types and its keys no prefix: queue_type and prefix are null",
)


def explain(loaded: LoadedApp) -> Explanation:
    """Return, for every subscriber of ``loaded``, its policy, schedule and declared objects.

    Pure: reads the app's plan and policies, connects to nothing. ``to_json()`` of the
    result is the stable shape ``faststream-retry explain --json`` prints, on every broker.

    Raises:
        OperationError: a custom ``Backoff`` of the app raised while computing delays.
    """
    try:
        explanation = explain_plan(
            loaded.spec,
            loaded.plan,
            loaded.config.default,
            list(zip(loaded.routes, loaded.handler_names, strict=True)),
            declared=not (loaded.nats or loaded.redis),
        )
    except Exception as exc:  # the app's own backoff code: report it, do not crash
        raise OperationError(
            f"{loaded.spec}: computing the retry schedule raised {type(exc).__name__}: {exc}"
        ) from exc
    if loaded.nats:
        return _on_nats(explanation)
    if loaded.redis:
        return _on_redis(explanation)
    return explanation


def _on_nats(explanation: Explanation) -> Explanation:
    prefix = explanation.prefix or ""
    delay = naming.delay_stream(prefix)
    shared = [
        Declared(
            "stream",
            {
                "name": delay,
                "subjects": [f"{prefix}.delay.>", f"{prefix}.ready.>"],
                "retention": "workqueue",
            },
        ),
        *(
            Declared(
                "consumer",
                {
                    "stream": delay,
                    "durable": naming.recheck_durable(prefix, ttl),
                    "filter_subject": naming.tier_filter(prefix, ttl),
                },
            )
            for ttl in explanation.tiers_ms
        ),
    ]

    def queue(found: QueueExplanation) -> QueueExplanation:
        ready = naming.ready_subject(prefix, found.queue)
        handlers = tuple(
            dataclasses.replace(
                handler,
                schedule=tuple(
                    dataclasses.replace(
                        step,
                        legs_min=tuple(dataclasses.replace(g, to=ready) for g in step.legs_min),
                        legs_max=tuple(dataclasses.replace(g, to=ready) for g in step.legs_max),
                    )
                    for step in handler.schedule
                ),
            )
            for handler in found.handlers
        )
        stream = naming.key_stream(found.queue)
        objects = (
            (
                Declared(
                    "stream",
                    {
                        "name": naming.dlq_stream(prefix, stream),
                        "subjects": [naming.dlq_filter(prefix, stream)],
                        "dead_letters": naming.dlq_subject(prefix, found.queue),
                    },
                ),
                Declared(
                    "consumer",
                    {
                        "stream": delay,
                        "durable": naming.ready_durable(prefix, found.queue),
                        "filter_subject": ready,
                    },
                ),
            )
            if found.covered
            else ()
        )
        return dataclasses.replace(found, home_from_tier=None, handlers=handlers, objects=objects)

    return dataclasses.replace(
        explanation,
        system="nats",
        queue_type=None,
        shared=tuple(shared),
        queues=tuple(queue(q) for q in explanation.queues),
        notes=NATS_NOTES,
    )


def _on_redis(explanation: Explanation) -> Explanation:
    def queue(found: QueueExplanation) -> QueueExplanation:
        handlers = tuple(
            dataclasses.replace(
                handler,
                schedule=tuple(
                    dataclasses.replace(step, legs_min=(), legs_max=()) for step in handler.schedule
                ),
            )
            for handler in found.handlers
        )
        objects: tuple[Declared, ...] = ()
        if found.covered:
            keys = stream_keys(found.queue)
            objects = (
                Declared("sorted set", {"name": keys.schedule, "holds": "copies by due time"}),
                Declared("hash", {"name": keys.data, "holds": "each scheduled copy"}),
                Declared("stream", {"name": keys.dlq, "holds": "dead letters"}),
            )
        return dataclasses.replace(found, home_from_tier=None, handlers=handlers, objects=objects)

    return dataclasses.replace(
        explanation,
        system="redis",
        prefix=None,
        queue_type=None,
        tiers_ms=(),
        shared=(),
        queues=tuple(queue(q) for q in explanation.queues),
        notes=REDIS_NOTES,
    )
