"""The middleware's options, validated and normalised to the units the plugin works in (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.core.defaults import (
    CLAIM_IDLE,
    DLQ_MAX_LENGTH,
    MIN_CLAIM_IDLE_MS,
    MIN_PUBLISH_TIMEOUT_MS,
    QUEUE_TYPES,
    is_queue_type,
)
from faststream_retry.core.durations import format_ms
from faststream_retry.core.outage import OutageOptions
from faststream_retry.core.policy import RetryPolicy, to_ms
from faststream_retry.core.tiers import MAX_TTL_MS, Tiers, checked_tick_ms
from faststream_retry.core.topology import TopologyOptions
from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from datetime import timedelta

__all__ = ["RETRY_TRACEBACKS", "RetryConfig", "traceback_on_retry"]

RETRY_TRACEBACKS = ("first", "every", "never")
"""The values of ``log_retry_traceback``: which retry log lines carry the traceback."""


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """What a middleware was configured with: durations in ms or s, everything checked."""

    default: RetryPolicy
    topology: TopologyOptions
    prefetch: int
    pause_s: float
    publish_timeout_s: float
    log_retry_traceback: str
    outage: OutageOptions | None = None
    """Outage mode's options; ``None``: off."""
    claim_idle_ms: int = int(CLAIM_IDLE.total_seconds() * 1000)
    """Redis: how long an entry no replica keeps alive stays pending before it is claimed."""
    dlq_max_length: int | None = DLQ_MAX_LENGTH
    """Redis and NATS: the dead letters a dead-letter stream keeps, the oldest trimmed past
    it (Redis: near it, ``MAXLEN ~``; NATS: exactly, ``max_msgs``); ``None``: no cap."""

    @classmethod
    def build(  # one argument per option; their defaults are core/defaults.py's
        cls,
        default: RetryPolicy | None,
        *,
        prefix: str,
        tick: timedelta | float | None,
        max_delay: timedelta | float,
        queue_type: str,
        delivery_limit: int,
        prefetch: int,
        publish_failure_pause: timedelta | float,
        publish_timeout: timedelta | float,
        log_retry_traceback: str,
        outage_after: int | None,
        outage_probe: timedelta | float | None,
        outage_hold: timedelta | float,
        claim_idle: timedelta | float = CLAIM_IDLE,
        dlq_max_length: int | None = DLQ_MAX_LENGTH,
    ) -> RetryConfig:
        """Validate every option (see ``RetryMiddleware``), naming the one that is wrong."""
        if default is None:
            default = RetryPolicy()
        if not isinstance(default, RetryPolicy):
            raise RetryConfigError(f"default takes a RetryPolicy(...), got {default!r}")
        if not isinstance(prefix, str) or not prefix or len(prefix) > 100:
            raise RetryConfigError(f"prefix must be a short non-empty str, got {prefix!r}")
        if not is_queue_type(queue_type):
            valid = " or ".join(map(repr, QUEUE_TYPES))
            raise RetryConfigError(f"queue_type is {valid}, got {queue_type!r}")
        if log_retry_traceback not in RETRY_TRACEBACKS:
            raise RetryConfigError(
                f"log_retry_traceback is 'first', 'every' or 'never', got {log_retry_traceback!r}"
            )
        _positive_int(delivery_limit, "delivery_limit")
        _positive_int(prefetch, "prefetch")
        _cap(dlq_max_length)
        tick_ms = None if tick is None else to_ms(tick, "tick")
        max_delay_ms = to_ms(max_delay, "max_delay")
        if max_delay_ms > MAX_TTL_MS:
            problem = (
                f"must be at most {format_ms(MAX_TTL_MS)} (RabbitMQ's longest queue TTL), "
                f"got {format_ms(max_delay_ms)}"
            )
            raise RetryConfigError(f"max_delay {problem}", option="max_delay", problem=problem)
        publish_timeout_ms = to_ms(publish_timeout, "publish_timeout")
        if publish_timeout_ms < MIN_PUBLISH_TIMEOUT_MS:
            problem = (
                f"must be at least {format_ms(MIN_PUBLISH_TIMEOUT_MS)}, got "
                f"{format_ms(publish_timeout_ms)}: a copy whose confirm comes later is "
                "published again, and its message handled twice"
            )
            raise RetryConfigError(
                f"publish_timeout {problem}", option="publish_timeout", problem=problem
            )
        claim_idle_ms = to_ms(claim_idle, "claim_idle")
        if claim_idle_ms < MIN_CLAIM_IDLE_MS:
            problem = (
                f"must be at least {format_ms(MIN_CLAIM_IDLE_MS)}, got {format_ms(claim_idle_ms)}: "
                "a replica keeps its pending entries alive every quarter of it, and a shorter "
                "one would have live replicas claim each other's"
            )
            raise RetryConfigError(f"claim_idle {problem}", option="claim_idle", problem=problem)
        if tick_ms is not None:
            Tiers.build(checked_tick_ms(tick_ms), max_delay_ms)
        return cls(
            default=default,
            topology=TopologyOptions(
                prefix=prefix,
                max_delay_ms=max_delay_ms,
                queue_type=queue_type,
                delivery_limit=delivery_limit,
                tick_ms=tick_ms,
            ),
            prefetch=prefetch,
            pause_s=to_ms(publish_failure_pause, "publish_failure_pause") / 1000,
            publish_timeout_s=publish_timeout_ms / 1000,
            log_retry_traceback=log_retry_traceback,
            outage=OutageOptions.build(outage_after, outage_probe, outage_hold),
            claim_idle_ms=claim_idle_ms,
            dlq_max_length=dlq_max_length,
        )


def traceback_on_retry(log_retry_traceback: str, attempt: int) -> bool:
    """Return whether the log line of a retry after failed delivery ``attempt`` has a traceback.

    ``first``: only a message's first failure (the one that tells what went wrong; the
    next ones of a transient outage repeat it), ``every``: each one, ``never``: none.
    """
    if log_retry_traceback == "every":
        return True
    return log_retry_traceback == "first" and attempt == 1


def _cap(dlq_max_length: object) -> None:
    if dlq_max_length is not None and (
        isinstance(dlq_max_length, bool)
        or not isinstance(dlq_max_length, int)
        or dlq_max_length < 1
    ):
        raise RetryConfigError(
            f"dlq_max_length must be an int >= 1, or None for no cap, got {dlq_max_length!r}"
        )


def _positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RetryConfigError(f"{name} must be an int >= 1, got {value!r}")
