"""``status`` on NATS JetStream: copies waiting and dead letters per covered subscriber.

The same ``Status`` as on RabbitMQ (``ops.status``), read from the server's stream and
consumer info: nothing is consumed, and no consumer is made. A row is a covered
subscriber's key (``<stream>.<durable>``, the ``queue`` of its route):

- ``work``: its JetStream consumer; ``messages`` is what the consumer has not yet
  delivered (``num_pending``), the nearest to RabbitMQ's *ready*;
- ``retry``: its copies in the delay stream, waiting in a tier or handed over
  (``<prefix>.delay.*.<key>`` and ``<prefix>.ready.<key>``);
- ``dlq``: its dead letters (``<prefix>.dlq.<key>`` in ``<prefix>-dlq-<stream>``).

JetStream does not count the processes that read a consumer: every ``consumers`` is
``null``, and a note says so. The tiers are subjects of the one delay stream.

Imported only for a ``nats://`` URL: it needs nats-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.js.errors import NotFoundError

from faststream_retry.nats import naming
from faststream_retry.ops.nats_dlq import connect
from faststream_retry.ops.status import Depth, QueueStatus, Status, TierStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nats.js import JetStreamContext

    from faststream_retry.middleware.app import LoadedApp

__all__ = ["status"]

NOTES = (
    (
        "NATS: a row is a covered subscriber's key (<stream>.<durable>); ready is what its "
        "JetStream consumer has not delivered yet (num_pending), .retry its copies in the "
        "delay stream (in a tier or handed over), .dlq its dead letters"
    ),
    "NATS does not count the processes that read a consumer: consumers and re-checkers are null",
)


async def status(
    url: str,
    queues: Sequence[str] = (),
    *,
    app: LoadedApp | None = None,
    prefix: str,
) -> Status:
    """Count each covered subscriber's pending messages, copies and dead letters, and the tiers.

    The rows are ``queues`` (keys; a stream name alone means every durable consumer of
    that stream), else ``app``'s covered subscribers, else every key the delay and
    dead-letter streams of ``prefix`` hold a message of. ``app``'s prefix wins.

    Raises:
        OperationError: the server cannot be reached or stopped answering.
    """
    if app is not None:
        prefix = app.plan.options.prefix
    notes = list(NOTES)
    async with connect(url) as client:
        js = client.jetstream()
        delay = await _subjects(js, naming.delay_stream(prefix), f"{prefix}.>")
        if queues:
            keys, queues_from = await _named(js, queues, notes), ("arguments",)
        elif app is not None:
            keys, queues_from = sorted(app.plan.routes), ("app",)
        else:
            keys, queues_from = await _found(js, prefix, delay), ("server",)
        rows = [await _row(js, prefix, key, delay, notes) for key in dict.fromkeys(keys)]
        ttls: set[int] = set(app.plan.tiers.ttls_ms) if app is not None else set()
        tiers_from = ["app"] if app is not None else []
        held = _tier_counts(prefix, delay)
        if delay is not None:
            ttls |= set(held)
            tiers_from.append("server")
    tiers = [
        TierStatus(
            ttl,
            Depth(f"{prefix}.delay.{ttl}", None if delay is None else held.get(ttl, 0), None),
        )
        for ttl in sorted(ttls)
    ]
    if delay is None:
        notes.append(
            f"the delay stream {naming.delay_stream(prefix)} does not exist: no app with "
            f"prefix {prefix!r} has started on this server (or --prefix is not the app's)"
        )
    return Status(
        prefix,
        queues_from,
        tuple(tiers_from),
        tuple(rows),
        tuple(tiers),
        tuple(notes),
        system="nats",
    )


async def _subjects(js: JetStreamContext, stream: str, subjects: str) -> dict[str, int] | None:
    """Messages per subject in ``stream`` (of those ``subjects`` matches); ``None``: no stream."""
    try:
        info = await js.stream_info(stream, subjects_filter=subjects)
    except NotFoundError:
        return None
    return dict(info.state.subjects or {})


def _tier_counts(prefix: str, delay: dict[str, int] | None) -> dict[int, int]:
    held: dict[int, int] = {}
    for subject, count in (delay or {}).items():
        parsed = naming.split_delay_subject(prefix, subject)
        if parsed is not None:
            held[parsed[0]] = held.get(parsed[0], 0) + count
    return held


async def _named(js: JetStreamContext, queues: Sequence[str], notes: list[str]) -> list[str]:
    """The keys ``queues`` name: a key as it is, a stream as its durable consumers' keys."""
    keys: list[str] = []
    for queue in queues:
        if "." in queue:
            keys.append(queue)
            continue
        try:
            consumers = await js.consumers_info(queue)
        except NotFoundError:
            notes.append(f"no stream {queue!r} on this server")
            continue
        durables = sorted(c.config.durable_name for c in consumers if c.config.durable_name)
        keys += [f"{queue}.{durable}" for durable in durables]
    return keys


async def _found(js: JetStreamContext, prefix: str, delay: dict[str, int] | None) -> list[str]:
    """Every key with a copy in the delay stream or a dead letter in a dead-letter stream."""
    keys: set[str] = set()
    for subject in delay or {}:
        parsed = naming.split_delay_subject(prefix, subject)
        if parsed is not None:
            keys.add(parsed[1])
        elif subject.startswith(ready := naming.ready_subject(prefix, "")):
            keys.add(subject[len(ready) :])
    head = naming.dlq_stream(prefix, "")
    dlq_head = naming.dlq_subject(prefix, "")
    async for info in _streams(js):
        if info.config.name and info.config.name.startswith(head):
            found = await _subjects(js, info.config.name, f"{prefix}.dlq.>") or {}
            keys |= {s[len(dlq_head) :] for s in found if s.startswith(dlq_head)}
    return sorted(keys)


async def _streams(js: JetStreamContext):  # type: ignore[no-untyped-def]  # noqa: ANN202
    offset = 0
    while True:
        page = await js.streams_info(offset)
        for info in page:
            yield info
        if len(page) == 0:
            return
        offset += len(page)


async def _row(
    js: JetStreamContext, prefix: str, key: str, delay: dict[str, int] | None, notes: list[str]
) -> QueueStatus:
    stream, _, durable = key.partition(".")
    work = Depth(key, None, None)
    if durable.startswith("_"):
        notes.append(
            f"{key} is a subscriber without a durable name: its consumer has no name to ask "
            "for, so its ready count is not known"
        )
    elif durable:
        try:
            info = await js.consumer_info(stream, durable)
            work = Depth(key, int(info.num_pending or 0), None)
        except NotFoundError:
            pass
    retry = Depth(naming.delay_stream(prefix), None, None)
    if delay is not None:
        waiting = sum(
            count
            for subject, count in delay.items()
            if subject == naming.ready_subject(prefix, key)
            or (naming.split_delay_subject(prefix, subject) or (0, ""))[1] == key
        )
        retry = Depth(naming.delay_stream(prefix), waiting, None)
    dlq_stream = naming.dlq_stream(prefix, stream)
    subject = naming.dlq_subject(prefix, key)
    dead = await _subjects(js, dlq_stream, subject)
    return QueueStatus(
        key,
        work,
        retry,
        Depth(dlq_stream, None if dead is None else dead.get(subject, 0), None),
    )
