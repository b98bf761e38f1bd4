"""Actions run as jobs: the page shows their progress, and a job can be stopped.

A job is one ``ops`` pass in a task of the server's. Stopping it is cooperative: the
pass stops after the message it is at, with the copies in flight confirmed and their
originals acked (``ops.walk``), so nothing is lost or left twice; what it did not reach
stays in the DLQ. Jobs are kept in memory, the last ``KEEP`` of them.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.ops.common import shown_name
from faststream_retry.ops.walk import PassStoppedError
from faststream_retry.web.guard import audit

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from faststream_retry.ops.walk import Pass

__all__ = ["Job", "Jobs"]

KEEP = 100
_numbers = itertools.count(1)


@dataclass(slots=True)
class Job:
    """One action: what it is, how far it got, and how it ended."""

    id: str
    what: str
    queue: str
    started: float = field(default_factory=time.time)
    total: int | None = None
    visited: int = 0
    state: str = "running"
    """``running``, ``done``, ``stopped`` or ``failed``."""
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    stop_asked: bool = False
    task: asyncio.Task[None] | None = None

    def progress(self, done: Pass) -> None:
        """Record how far the pass got; stop it here when asked (``ops``' progress hook)."""
        self.total, self.visited = done.total, done.visited
        if self.stop_asked:
            raise PassStoppedError(
                f"stopped from the page after {done.visited} of {done.total} messages: "
                "what it went through is settled, the rest stays in the queue"
            )

    def to_json(self) -> dict[str, Any]:
        """Return the job as JSON-able data."""
        return {
            "id": self.id,
            "what": self.what,
            "queue": self.queue,
            "state": self.state,
            "total": self.total,
            "visited": self.visited,
            "result": self.result,
            "error": self.error,
        }


class Jobs:
    """The server's jobs, newest last."""

    def __init__(self) -> None:
        """Start with none."""
        self._jobs: OrderedDict[str, Job] = OrderedDict()

    def get(self, job_id: str) -> Job | None:
        """Return the job ``job_id``, if it is still kept."""
        return self._jobs.get(job_id)

    def running(self, what: str, queue: str) -> Job | None:
        """Return a running ``what`` job of ``queue``, if there is one (a second read joins it)."""
        return next(
            (
                j
                for j in self._jobs.values()
                if (j.what, j.queue, j.state) == (what, queue, "running")
            ),
            None,
        )

    def start(
        self,
        what: str,
        queue: str,
        run: Callable[[Job], Awaitable[dict[str, Any]]],
        who: str = "?",
    ) -> Job:
        """Run ``run(job)`` as a new job; its result (or error) is kept on the job.

        ``run`` writes the audit line of a job that ends well; one that is stopped or
        fails gets its line here (``who`` asked for it).
        """
        job = Job(f"{next(_numbers)}-{secrets.token_hex(4)}", what, queue)

        async def go() -> None:
            try:
                job.result = await run(job)
                job.state = "done"
            except PassStoppedError as exc:
                job.state, job.error = "stopped", str(exc)
            except Exception as exc:  # an operation's failure is the job's outcome
                job.state, job.error = "failed", str(exc)
            if job.error is not None:
                audit("%s %s %s %s: %s", who, job.what, shown_name(job.queue), job.state, job.error)

        job.task = asyncio.get_running_loop().create_task(go(), name=f"faststream-retry {what}")
        self._jobs[job.id] = job
        while len(self._jobs) > KEEP:
            self._jobs.popitem(last=False)
        return job
