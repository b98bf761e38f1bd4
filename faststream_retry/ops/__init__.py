"""Operate the plugin's queues from Python: what the ``faststream-retry`` command runs.

Every function here takes an open aio-pika connection (``connect`` opens one) and
moves messages only by confirm-then-ack: a copy is published and confirmed before its
original is acked, so a crash or a kill mid-way duplicates at most, never loses. A
quorum queue's delivery count is never spent: messages are never requeued by a nack
or a closed channel on a quorum queue, only on a classic one, where that costs nothing.

A service can expose these itself (an admin endpoint that replays dead letters, say);
the command line in ``faststream_retry.cli`` is a thin layer over them.
"""

from faststream_retry.ops.app import LoadedApp, load_app
from faststream_retry.ops.common import OperationError, connect
from faststream_retry.ops.diagnosis import Finding, Report
from faststream_retry.ops.doctor import doctor
from faststream_retry.ops.migrate import MigrationResult, migrate

__all__ = [
    "Finding",
    "LoadedApp",
    "MigrationResult",
    "OperationError",
    "Report",
    "connect",
    "doctor",
    "load_app",
    "migrate",
]
