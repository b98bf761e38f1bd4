"""faststream-retry: production-grade retries for FastStream's RabbitMQ consumers.

Transient failures come back later, with backoff held by RabbitMQ itself (delay
tiers with queue-wide TTLs and a re-check loop); permanent ones land in
``<queue>.dlq`` with the reason attached.
"""

from faststream_retry.classify import BUILTIN_PERMANENT, BUILTIN_TRANSIENT, Verdict
from faststream_retry.errors import (
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryTopologyError,
    TransientError,
)
from faststream_retry.events import EventKind, RetryEvent, RetryHook
from faststream_retry.middleware import RetryMiddleware, RetryRecorder
from faststream_retry.policy import (
    Backoff,
    Exponential,
    Fixed,
    RetryPolicy,
    Schedule,
    retry_policy,
)

__all__ = [
    "BUILTIN_PERMANENT",
    "BUILTIN_TRANSIENT",
    "Backoff",
    "EventKind",
    "Exponential",
    "Fixed",
    "PermanentError",
    "RetryConfigError",
    "RetryEvent",
    "RetryHook",
    "RetryLater",
    "RetryMiddleware",
    "RetryPolicy",
    "RetryRecorder",
    "RetryTopologyError",
    "Schedule",
    "TransientError",
    "Verdict",
    "__version__",
    "retry_policy",
]


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("faststream-retry")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
