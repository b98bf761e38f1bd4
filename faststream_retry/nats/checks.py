"""What a covered JetStream subscriber, its consumer and the streams must be (pure).

The RabbitMQ start checks' equivalent: each finding says what is wrong, why it fights
the plan, and the fix. Refusals stop the start; warnings are logged. ``doctor`` reports
the same findings (``ops.nats_doctor``). A consumer's config is nats-py's
``ConsumerConfig`` as FastStream declares it or as the server returns it (the same type:
an existing durable consumer is bound to as it is, whatever the code declares); a
stream's is its ``StreamConfig`` as the server returns it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core.durations import format_ms
from faststream_retry.core.headers import MAX_ADDED_BYTES
from faststream_retry.nats import naming

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_ACK_WAIT_S",
    "DEFAULT_DUPLICATE_WINDOW_S",
    "RECHECK_ACK_WAIT_S",
    "Covered",
    "Finding",
    "Streams",
    "ack_wait_s",
    "batch_subscriber",
    "consumer_findings",
    "core_subscriber",
    "longest_wait_s",
    "replicas_finding",
    "size_finding",
    "stream_findings",
    "window_finding",
]

DEFAULT_ACK_WAIT_S = 30.0
"""JetStream's ``ack_wait`` when a consumer sets none."""
DEFAULT_DUPLICATE_WINDOW_S = 120.0
"""JetStream's duplicate window when a stream sets none (0)."""
RECHECK_ACK_WAIT_S = 30.0
"""The re-check consumers' ``ack_wait``, whatever the tier: a held copy is kept alive with
``in_progress``, so the copies of a re-check that died come back within this."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing found: ``refuse`` stops the start, else it is a warning."""

    refuse: bool
    check: str
    """Which check found it: ack-policy, max-deliver, ack-wait, duplicate-window, max-msg-size,
    replicas, core-nats, batch, wiring."""
    subject: str
    """The consumer (its key) or the stream it is about."""
    what: str
    why: str
    fix: str

    @property
    def text(self) -> str:
        """The finding as one line: what, why, and the fix."""
        return (
            self.what
            + (f": {self.why}" if self.why else "")
            + (f". {self.fix}" if self.fix else "")
        )


@dataclass(frozen=True, slots=True)
class Covered:
    """A covered subscriber as the checks need it."""

    key: str
    stream: str
    durable: str | None
    consumer: Any
    """Its consumer's config: the server's if the durable exists (``consumers``), else as
    FastStream declares it."""
    declared_max_msg_size: int | None = None
    """Its stream's ``max_msg_size`` as its ``JStream`` declares it (used if the stream
    does not exist yet)."""
    declared_replicas: int | None = None
    """Its stream's ``num_replicas`` as its ``JStream`` declares it (used if the stream
    does not exist yet: FastStream makes it after the plugin's streams)."""


@dataclass(frozen=True, slots=True)
class Streams:
    """The configs of the streams the checks look at (``None``: the stream does not exist)."""

    delay: Any
    dead_letters: Mapping[str, Any]
    """Each covered stream's dead-letter stream, by the covered stream's name."""
    covered: Mapping[str, Any]
    """Each covered stream's own config."""

    def missing(self, prefix: str) -> list[str]:
        """The plugin's streams that do not exist (the app has not started yet)."""
        names = [] if self.delay is not None else [naming.delay_stream(prefix)]
        return names + sorted(
            naming.dlq_stream(prefix, s) for s, c in self.dead_letters.items() if c is None
        )


def core_subscriber(subject: str) -> str:
    """The refusal of a core-NATS subscriber whose handlers have retries on."""
    return (
        f"the subscriber of {subject!r} is a core-NATS subscriber: nothing is persisted, so a "
        "failed message has nowhere to wait for its retry and would be lost. Give it a "
        f"JetStream stream: @broker.subscriber({subject!r}, stream=JStream(...), durable=...), "
        "or switch its retries off with @retry_policy(enabled=False)"
    )


def batch_subscriber(subject: str) -> str:
    """The refusal of a batch pull subscriber (``PullSub(batch=True)``) with retries on."""
    return (
        f"the subscriber of {subject!r} takes its messages in batches (PullSub(batch=True)): "
        "its handler is called once for a whole batch, so a failure cannot be kept, retried "
        "or dead-lettered message by message, and the plugin would lose or repeat the rest "
        "of the batch. Drop batch=True (PullSub(batch_size=N) still pulls N at a time, each "
        "handled and retried on its own), or switch its retries off with "
        "@retry_policy(enabled=False)"
    )


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def ack_wait_s(config: Any) -> float:  # noqa: ANN401 - nats-py's ConsumerConfig
    """How long the server waits for an ack of a first delivery (``backoff[0]`` when set)."""
    backoff = [s for v in getattr(config, "backoff", None) or () if (s := _seconds(v))]
    if backoff:
        return backoff[0]
    return _seconds(getattr(config, "ack_wait", None)) or DEFAULT_ACK_WAIT_S


def longest_wait_s(config: Any) -> float:  # noqa: ANN401 - nats-py's ConsumerConfig
    """The longest the server waits for an ack before it redelivers (``ack_wait``, ``backoff``)."""
    waits = [s for v in getattr(config, "backoff", None) or () if (s := _seconds(v))]
    return max([_seconds(getattr(config, "ack_wait", None)) or DEFAULT_ACK_WAIT_S, *waits])


def _where(key: str, on_server: str | None) -> str:
    return (
        f"the consumer {on_server} (of {key!r}) on the server"
        if on_server
        else (f"the consumer of {key!r}")
    )


def _server_fix(on_server: str | None, editable: bool) -> str:
    """How to change a consumer that exists: FastStream binds to it as it is."""
    if on_server is None:
        return ""
    stream, _, name = on_server.partition("/")
    if editable:
        return (
            f"; the consumer exists, and FastStream binds to an existing durable consumer as "
            f"it is, whatever the code declares: edit it (nats consumer edit {stream} {name}) "
            f"or delete it (nats consumer rm {stream} {name}) for the app to make it anew"
        )
    return (
        f"; the consumer exists, and FastStream binds to an existing durable consumer as it "
        f"is: delete it (nats consumer rm {stream} {name}) for the app to make it anew"
    )


def consumer_findings(
    key: str,
    config: Any,  # noqa: ANN401 - nats-py's ConsumerConfig
    delivery_limit: int,
    publish_timeout_s: float | None = None,
    *,
    on_server: str | None = None,
) -> list[Finding]:
    """What ``config`` (a covered subscriber's consumer) would break in the plan.

    ``on_server``: ``<stream>/<name>`` when ``config`` is the server's, read from an
    existing consumer; ``None``: as FastStream declares it. ``publish_timeout_s``: how
    long the plugin waits for a copy's PubAck (``None``: not checked).
    """
    found: list[Finding] = []
    where = _where(key, on_server)
    policy = getattr(getattr(config, "ack_policy", None), "value", None)
    if policy is None:
        policy = getattr(config, "ack_policy", None)
    if policy in ("none", "all"):
        found.append(
            Finding(
                refuse=True,
                check="ack-policy",
                subject=key,
                what=f"{where} has ack_policy {policy!r}",
                why=(
                    "a message is gone once delivered, so a failure cannot be kept"
                    if policy == "none"
                    else "acking one message acks every earlier one still being handled"
                ),
                fix="Use AckPolicy.EXPLICIT (FastStream's default)"
                + _server_fix(on_server, editable=False),
            )
        )
    max_deliver = getattr(config, "max_deliver", None)
    if isinstance(max_deliver, int) and 0 < max_deliver < delivery_limit:
        found.append(
            Finding(
                refuse=False,
                check="max-deliver",
                subject=key,
                what=f"{where} has max_deliver={max_deliver}",
                why=(
                    "a retry is a new message and never spends it, but a redelivery does "
                    "(ack_wait expired, a copy the server would not take, a crash), and "
                    "JetStream delivers a message no more at max_deliver: the plugin "
                    "dead-letters its last delivery as stuck, unhandled"
                ),
                fix=(
                    "Leave max_deliver unset (-1) or at least delivery_limit "
                    f"({delivery_limit})" + _server_fix(on_server, editable=True)
                ),
            )
        )
    wait = ack_wait_s(config)
    if publish_timeout_s is not None and wait < publish_timeout_s:
        shown = format_ms(round(wait * 1000))
        timeout = format_ms(round(publish_timeout_s * 1000))
        found.append(
            Finding(
                refuse=False,
                check="ack-wait",
                subject=key,
                what=f"{where} waits {shown} for an ack (ack_wait, or backoff[0])",
                why=(
                    f"after a failure the plugin waits up to publish_timeout ({timeout}) for "
                    "its copy's PubAck before it acks the message; the server redelivers it "
                    "after ack_wait, so the handler can run again while the copy is being "
                    "confirmed"
                ),
                fix=(
                    f"Give the consumer an ack_wait above {timeout} plus the handler's longest "
                    "run (ConsumerConfig(ack_wait=...)), or lower "
                    "RetryMiddleware(publish_timeout=...)" + _server_fix(on_server, editable=True)
                ),
            )
        )
    return found


def window_finding(
    stream: str,
    window_s: float | None,
    needed_s: float,
    because: str,
) -> Finding | None:
    """A plugin stream whose duplicate window is too short for the ``Nats-Msg-Id`` it relies on.

    ``window_s``: the stream's ``duplicate_window`` as the server returns it (0 or
    ``None``: JetStream's default, 2 minutes). ``needed_s``: the longest a repeated
    publish can come after the first (a redelivery after ``ack_wait``); ``because``
    names what waits that long.
    """
    window = _seconds(window_s) or DEFAULT_DUPLICATE_WINDOW_S
    if window > needed_s:
        return None
    shown = format_ms(round(window * 1000))
    need = format_ms(round(needed_s * 1000))
    return Finding(
        refuse=False,
        check="duplicate-window",
        subject=stream,
        what=f"the stream {stream!r} drops a repeated Nats-Msg-Id within {shown} only",
        why=(
            f"{because} can come {need} after the first publish: a message redelivered "
            "after a crash between its copy's PubAck and its ack then makes a second copy, "
            "a duplicate retry or dead letter"
        ),
        fix=(
            f"Widen its duplicate window above {need} (nats stream edit {stream} "
            f"--dupe-window {math.ceil(needed_s * 2)}s), or shorten the ack_wait that needs it"
        ),
    )


def size_finding(
    stream: str,
    max_msg_size: int | None,
    covered: str,
    covered_max: int,
) -> Finding | None:
    """A plugin stream too small for the copy of the largest message ``covered`` takes.

    ``max_msg_size``: the plugin stream's, as the server returns it (``-1``: none, the
    server's ``max_payload`` bounds it as it bounds the covered stream). ``covered_max``:
    the largest message the covered stream takes (its ``max_msg_size``, else the
    server's ``max_payload``).
    """
    if not isinstance(max_msg_size, int) or max_msg_size <= 0:
        return None
    needed = covered_max + MAX_ADDED_BYTES
    if max_msg_size >= needed:
        return None
    return Finding(
        refuse=False,
        check="max-msg-size",
        subject=stream,
        what=f"the stream {stream!r} takes messages of {max_msg_size:,} bytes at most",
        why=(
            f"{covered!r} takes messages of up to {covered_max:,} bytes, and a copy is the "
            f"message with up to {MAX_ADDED_BYTES:,} bytes of retry-* headers added: a copy "
            "the stream refuses keeps its message held, then dead-letters it as stuck, or "
            "hands it back to the consumer"
        ),
        fix=(
            f"Raise its max_msg_size to at least {needed:,} (nats stream edit {stream} "
            f"--max-msg-size {needed}), or unset it (-1), or lower {covered!r}'s max_msg_size"
        ),
    )


def replicas_finding(
    stream: str, replicas: int | None, covered: str, needed: int
) -> Finding | None:
    """A plugin stream with fewer replicas than the covered stream ``covered`` it serves.

    ``replicas``: the plugin stream's, as the server returns it. ``needed``: the covered
    stream's (the server's, else as its ``JStream`` declares it).
    """
    have = replicas if isinstance(replicas, int) and replicas > 0 else 1
    if have >= needed:
        return None
    return Finding(
        refuse=False,
        check="replicas",
        subject=stream,
        what=f"the stream {stream!r} has {have} replica{'s' * (have != 1)}",
        why=(
            f"{covered!r} has {needed}: a node's loss that {covered!r} survives takes the "
            "copies waiting there with it, or stops retries and dead letters until it is back"
        ),
        fix=f"Give it {needed} (nats stream edit {stream} --replicas {needed})",
    )


def stream_findings(
    prefix: str, covered: Iterable[Covered], found: Streams, max_payload: int
) -> list[Finding]:
    """What the plugin's streams, as the server holds them, would break for ``covered``.

    Their duplicate windows against the longest a repeated publish can come after the
    first (a redelivery after a consumer's ``ack_wait`` or ``backoff``, a re-check's
    ``ack_wait``), their ``max_msg_size`` against the largest message a covered
    stream takes (``max_payload``: the server's, which bounds every message), and their
    replicas against the covered streams'.
    """
    subs = list(covered)
    waits: dict[str, float] = {}
    largest: dict[str, int] = {}
    replicas: dict[str, int] = {}
    for sub in subs:
        waits[sub.stream] = max(waits.get(sub.stream, 0.0), longest_wait_s(sub.consumer))
        own = found.covered.get(sub.stream)
        count = own.num_replicas if own is not None else sub.declared_replicas
        replicas[sub.stream] = max(
            replicas.get(sub.stream, 1), count if isinstance(count, int) and count > 0 else 1
        )
        limit = own.max_msg_size if own is not None else sub.declared_max_msg_size
        largest[sub.stream] = (
            limit if isinstance(limit, int) and 0 < limit < max_payload else max_payload
        )
    results: list[Finding | None] = []
    delay = naming.delay_stream(prefix)
    if found.delay is not None and subs:
        results += [
            window_finding(
                delay,
                found.delay.duplicate_window,
                max([RECHECK_ACK_WAIT_S, *waits.values()]),
                "a retry's copy repeated after a redelivery (or a re-check's release)",
            ),
            size_finding(
                delay, found.delay.max_msg_size, _largest_of(largest), max(largest.values())
            ),
            replicas_finding(
                delay, found.delay.num_replicas, _largest_of(replicas), max(replicas.values())
            ),
        ]
    for stream, wait in sorted(waits.items()):
        ours = found.dead_letters.get(stream)
        if ours is None:
            continue
        name = naming.dlq_stream(prefix, stream)
        results += [
            window_finding(
                name,
                ours.duplicate_window,
                wait,
                f"a dead letter repeated after a redelivery from {stream!r}",
            ),
            size_finding(name, ours.max_msg_size, stream, largest[stream]),
            replicas_finding(name, ours.num_replicas, stream, replicas[stream]),
        ]
    return [f for f in results if f is not None]


def _largest_of(largest: Mapping[str, int]) -> str:
    """The covered stream that takes the largest messages (the first by name of a tie)."""
    return max(sorted(largest), key=lambda s: largest[s])
