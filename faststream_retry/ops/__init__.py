"""Operate the plugin's queues from Python: what the ``faststream-retry`` command runs.

Every function here takes an open aio-pika connection (``connect`` opens one) and
moves messages only by confirm-then-ack: a copy is published and confirmed before its
original is acked, so a crash or a kill mid-way duplicates at most, never loses. A
quorum queue's delivery count is never spent: messages are never requeued by a nack
or a closed channel on a quorum queue, only on a classic one, where that costs nothing.
The one exception is a message no publish can carry, whose headers do not fit in a
frame: it is given back with one requeue and reported (``Pass.too_large``).

A service can expose these itself (an admin endpoint that replays dead letters, say);
the command line in ``faststream_retry.cli`` is a thin layer over them.
"""

from typing import TYPE_CHECKING

from faststream_retry.ops.app import load_app
from faststream_retry.ops.common import OperationError, connect
from faststream_retry.ops.diagnosis import Finding, Report
from faststream_retry.ops.dlq import (
    Imported,
    Outcome,
    export_dead_letters,
    import_messages,
    list_dead_letters,
    purge_dead_letters,
    purge_exported,
    replay_dead_letters,
    show_dead_letter,
)
from faststream_retry.ops.doctor import doctor
from faststream_retry.ops.explain import explain
from faststream_retry.ops.explanation import Explanation
from faststream_retry.ops.migrate import MigrationResult, migrate
from faststream_retry.ops.records import DeadLetter, Selection, parse_time
from faststream_retry.ops.status import Depth, QueueStatus, Status, TierStatus, status
from faststream_retry.ops.walk import Pass, TooLarge
from faststream_retry.rabbit.registry import Registry, registered_queues

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp

__all__ = [
    "DeadLetter",
    "Depth",
    "Explanation",
    "Finding",
    "Imported",
    "LoadedApp",
    "MigrationResult",
    "OperationError",
    "Outcome",
    "Pass",
    "QueueStatus",
    "Registry",
    "Report",
    "Selection",
    "Status",
    "TierStatus",
    "TooLarge",
    "connect",
    "doctor",
    "explain",
    "export_dead_letters",
    "import_messages",
    "list_dead_letters",
    "load_app",
    "migrate",
    "parse_time",
    "purge_dead_letters",
    "purge_exported",
    "registered_queues",
    "replay_dead_letters",
    "show_dead_letter",
    "status",
]


def __getattr__(name: str) -> object:
    # FastStream is imported with the first loaded app, not with the operator API.
    if name == "LoadedApp":
        from faststream_retry.middleware.app import LoadedApp  # noqa: PLC0415

        globals()[name] = LoadedApp
        return LoadedApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
