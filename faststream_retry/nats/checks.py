"""What a covered JetStream subscriber must be, read from its consumer's config (pure).

The RabbitMQ start checks' equivalent: each problem says what is wrong, why, and the fix.
Refusals stop the start; warnings are logged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Finding", "consumer_findings", "core_subscriber", "outage_refused"]


class Finding(NamedTuple):
    """One thing found of a subscriber: ``refuse`` stops the start, else it is a warning."""

    refuse: bool
    text: str


def core_subscriber(subject: str) -> str:
    """The refusal of a core-NATS subscriber whose handlers have retries on."""
    return (
        f"the subscriber of {subject!r} is a core-NATS subscriber: nothing is persisted, so a "
        "failed message has nowhere to wait for its retry and would be lost. Give it a "
        f"JetStream stream: @broker.subscriber({subject!r}, stream=JStream(...), durable=...), "
        "or switch its retries off with @retry_policy(enabled=False)"
    )


def outage_refused() -> str:
    """The refusal of outage mode on NATS, which is not built yet."""
    return (
        "outage mode (RetryMiddleware(outage_after=...)) is not available on NATS yet: "
        "leave outage_after unset for a NatsBroker"
    )


def consumer_findings(key: str, config: Any, delivery_limit: int) -> list[Finding]:  # noqa: ANN401 - nats-py's ConsumerConfig
    """What ``config`` (the subscriber's ``ConsumerConfig``) would break in the plan."""
    found: list[Finding] = []
    policy = getattr(getattr(config, "ack_policy", None), "value", None)
    if policy in ("none", "all"):
        found.append(
            Finding(
                refuse=True,
                text=(
                    f"the consumer of {key!r} has ack_policy {policy!r}: "
                    + (
                        "a message is gone once delivered, so a failure cannot be kept"
                        if policy == "none"
                        else "acking one message acks every earlier one still being handled"
                    )
                    + ". Use AckPolicy.EXPLICIT (FastStream's default)"
                ),
            )
        )
    max_deliver = getattr(config, "max_deliver", None)
    if isinstance(max_deliver, int) and 0 < max_deliver < delivery_limit:
        found.append(
            Finding(
                refuse=False,
                text=(
                    f"the consumer of {key!r} has max_deliver={max_deliver}: a retry is a new "
                    "message and never spends it, but a redelivery does (ack_wait expired, a "
                    "copy the server would not take, a crash), and at max_deliver JetStream "
                    "drops the message with an advisory and no dead letter. Leave max_deliver "
                    f"unset (-1) or at least delivery_limit ({delivery_limit})"
                ),
            )
        )
    return found
