"""Why a Redis subscriber cannot be covered, each with its fix (pure).

The RabbitMQ start checks' and ``nats.checks``' equivalent for FastStream's Redis
subscribers: the middleware's runtime reads the subscribers and gathers these texts into
one ``RetryConfigError`` at start.
"""

from __future__ import annotations

__all__ = ["batch", "no_ack", "no_group", "not_a_stream", "outage_refused"]

_OFF = "or switch its retries off with @retry_policy(enabled=False)"


def not_a_stream(kind: str, name: str) -> str:
    """The refusal of a pub/sub channel or a list subscriber whose handlers have retries on."""
    return (
        f"the subscriber of {kind} {name!r} reads a Redis {kind}: a message is gone once it "
        "is delivered, so a failed one has nowhere to wait for its retry and would be lost. "
        f"Use a stream with a consumer group: @broker.subscriber(stream=StreamSub({name!r}, "
        f"group=..., consumer=...)), {_OFF}"
    )


def no_group(stream: str) -> str:
    """The refusal of a stream subscriber that reads without a consumer group."""
    return (
        f"the subscriber of stream {stream!r} reads it without a consumer group (XREAD): "
        "nothing is acknowledged, so a failure cannot be kept. Give it a group and a consumer "
        f"name: StreamSub({stream!r}, group=..., consumer=...), {_OFF}"
    )


def no_ack(stream: str) -> str:
    """The refusal of a stream subscriber that reads with ``NOACK``."""
    return (
        f"the subscriber of stream {stream!r} reads with no_ack=True: an entry is "
        "acknowledged as it is delivered, so a failure cannot be kept. Leave no_ack off, "
        f"{_OFF}"
    )


def batch(stream: str) -> str:
    """The refusal of a batch stream subscriber (not covered yet)."""
    return (
        f"the subscriber of stream {stream!r} takes batches (StreamSub(batch=True)): one "
        "failure of a batch cannot be told apart per entry, and retries of batches are not "
        f"built yet. Use batch=False, {_OFF}"
    )


def outage_refused() -> str:
    """The refusal of outage mode on Redis, which is not built yet."""
    return (
        "outage mode (RetryMiddleware(outage_after=...)) is not available on Redis yet: "
        "leave outage_after unset for a RedisBroker"
    )
