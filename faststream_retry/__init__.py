"""faststream-retry: production-grade retries for FastStream's RabbitMQ consumers.

Transient failures come back later, with backoff held by RabbitMQ itself (delay
tiers with queue-wide TTLs and a re-check loop); permanent ones land in
``<queue>.dlq`` with the reason attached.
"""

from typing import TYPE_CHECKING

from faststream_retry.core.classify import (
    BUILTIN_PERMANENT,
    BUILTIN_PERMANENT_NAMES,
    BUILTIN_TRANSIENT,
    Verdict,
)
from faststream_retry.core.events import EventKind, Reason, RetryEvent, RetryHook, Rule
from faststream_retry.core.policy import (
    Backoff,
    Exponential,
    Fixed,
    RetryPolicy,
    Schedule,
    retry_policy,
)
from faststream_retry.core.worker_config import (
    WorkerConfig,
    load_worker_config,
    worker_config_schema,
)
from faststream_retry.errors import (
    CopyNotConfirmed,
    FastStreamRetryError,
    HeadersTooLarge,
    InvalidDueTime,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryTopologyError,
    RetryWorkerError,
    TransientError,
)
from faststream_retry.middleware.testing import RetryRecorder
from faststream_retry.worker.worker import RetryWorker

if TYPE_CHECKING:
    from faststream_retry.middleware.middleware import RetryMiddleware

__all__ = [
    "BUILTIN_PERMANENT",
    "BUILTIN_PERMANENT_NAMES",
    "BUILTIN_TRANSIENT",
    "Backoff",
    "CopyNotConfirmed",
    "EventKind",
    "Exponential",
    "FastStreamRetryError",
    "Fixed",
    "HeadersTooLarge",
    "InvalidDueTime",
    "PermanentError",
    "Reason",
    "RetryConfigError",
    "RetryEvent",
    "RetryHook",
    "RetryLater",
    "RetryMiddleware",
    "RetryPolicy",
    "RetryRecorder",
    "RetryTopologyError",
    "RetryWorker",
    "RetryWorkerError",
    "Rule",
    "Schedule",
    "TransientError",
    "Verdict",
    "WorkerConfig",
    "__version__",
    "load_worker_config",
    "retry_policy",
    "worker_config_schema",
]


def __getattr__(name: str) -> object:
    # FastStream is imported with RetryMiddleware, not with the package: the standalone
    # worker (``faststream-retry worker``) runs without importing it.
    if name == "RetryMiddleware":
        from faststream_retry.middleware.middleware import RetryMiddleware  # noqa: PLC0415

        globals()[name] = RetryMiddleware  # found directly from now on
        return RetryMiddleware
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("faststream-retry")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
