"""When the dead-letter depths are sampled for the gauge: the schedule every broker shares.

``METRICS.DLQ_MESSAGES`` reads ``Telemetry.dlq_depths``; a transport fills it by
subclassing ``DepthSampler`` with how it measures one route's dead letters (RabbitMQ: a
passive declare of the ``.dlq``; NATS: the dead-letter stream's info; Redis: ``XLEN``),
each a read that moves nothing. Sampling follows the readers: each read of the metrics
(a Prometheus scrape, an OTLP export) shows the depths measured after the read before
it and asks for new ones; one sample is taken at the start, so the first read has them
too. With no metrics SDK nothing reads them, and after that first sample nothing more
is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["DepthSampler"]

_MIN_GAP_S = 1.0
"""Reads closer together than this share one sample (several readers, a burst of scrapes)."""


class DepthSampler:
    """Samples the dead-letter depth of each route of one runtime into its ``Telemetry``."""

    def __init__(self, telemetry: Telemetry, plan: Callable[[], Plan]) -> None:
        """Sample each route of ``plan()`` (read at each sample) into ``telemetry``."""
        self._telemetry = telemetry
        self._plan = plan
        self._mine: set[str] = set()
        self._wanted: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def depth(self, route: Route) -> int | None:
        """Return the dead letters of ``route`` now; ``None``: they cannot be counted."""
        raise NotImplementedError

    def where(self, route: Route) -> str:
        """Return what ``depth`` reads for ``route``, for the log line when it cannot."""
        return route.dlq

    async def close(self) -> None:
        """Let go of what ``depth`` reads with (after ``stop``)."""

    def start(self) -> None:
        """Sample each time the metrics are read, from now until ``stop``."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wanted = asyncio.Event()
        self._telemetry.on_read.append(self._wake)
        self._task = asyncio.create_task(
            self._run(self._wanted), name="faststream-retry dlq depths"
        )
        # The first read shows depths already: a restarted app's first scrape would
        # otherwise have none, and an alert's `for:` would start again.
        self._wanted.set()

    def _wake(self) -> None:
        # The reader's thread, or the loop's own: either way the loop sets the event.
        loop, wanted = self._loop, self._wanted
        if loop is None or wanted is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under a late reader
            loop.call_soon_threadsafe(wanted.set)

    async def _run(self, wanted: asyncio.Event) -> None:
        while True:
            await wanted.wait()
            wanted.clear()
            await self.sample()
            await asyncio.sleep(_MIN_GAP_S)

    async def sample(self) -> None:
        """Measure every route's dead letters now; one that cannot be measured shows none."""
        routes = self._plan().routes
        depths = self._telemetry.dlq_depths
        for queue in self._mine - set(routes):  # no longer covered here
            depths.pop(queue, None)
        self._mine = set(routes)
        for queue, route in routes.items():
            try:
                found = await self.depth(route)
            except Exception as exc:  # the broker is away: show no stale figure
                log.debug("faststream-retry: could not measure %r: %r", self.where(route), exc)
                found = None
            if found is None:
                depths.pop(queue, None)
            else:
                depths[queue] = found

    async def stop(self) -> None:
        """Stop sampling, and stop showing this runtime's queues."""
        with contextlib.suppress(ValueError):
            self._telemetry.on_read.remove(self._wake)
        task, self._task = self._task, None
        # Cancelled again until it ends: redis-py swallows a cancellation that lands while
        # a command is in flight (``redis.tasks``), and the sampler then waited for a read
        # that never came, and the broker's stop with it (seen in tests/redis).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        if task is not None and not task.cancelled():
            task.exception()  # retrieved: a sample never raises, and it ended on a cancel
        for queue in self._mine:
            self._telemetry.dlq_depths.pop(queue, None)
        self._mine = set()
        await self.close()
