"""The depth of each covered queue's ``.dlq``, sampled for the metrics when they are read.

A passive declare per ``.dlq``, on one channel kept for it: it counts the ready
messages without consuming any (a quorum queue's delivery count is never spent),
creates nothing and changes nothing. Sampling follows the readers: each read of the
metrics (a Prometheus scrape, an OTLP export) shows the depths measured after the read
before it and asks for new ones; one sample is taken at the start, so the first read
has them too. With no metrics SDK nothing reads them, and after that first sample
nothing more is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from faststream_retry.rabbit.probe import Probe
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Callable

    from aio_pika.abc import AbstractConnection

    from faststream_retry.core.topology import Plan
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["DeadLetterDepths"]

_MIN_GAP_S = 1.0
"""Reads closer together than this share one sample (several readers, a burst of scrapes)."""


class DeadLetterDepths:
    """Samples the ``.dlq`` depths of one runtime's routes into its ``Telemetry``."""

    def __init__(
        self, connection: AbstractConnection, telemetry: Telemetry, plan: Callable[[], Plan]
    ) -> None:
        """Sample on ``connection`` the ``.dlq`` of each route of ``plan()`` (read each time)."""
        self._probe = Probe(connection)
        self._telemetry = telemetry
        self._plan = plan
        self._mine: set[str] = set()
        self._wanted: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

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
        """Measure every route's ``.dlq`` now; a queue that cannot be measured shows none."""
        routes = self._plan().routes
        depths = self._telemetry.dlq_depths
        for queue in self._mine - set(routes):  # no longer covered here
            depths.pop(queue, None)
        self._mine = set(routes)
        for queue, route in routes.items():
            try:
                found = await self._probe.depth(route.dlq)
            except Exception as exc:  # the broker is away: show no stale figure
                log.debug("faststream-retry: could not measure %r: %r", route.dlq, exc)
                found = None
            if found is None:
                depths.pop(queue, None)
            else:
                depths[queue] = found.messages

    async def stop(self) -> None:
        """Stop sampling, and stop showing this runtime's queues."""
        with contextlib.suppress(ValueError):
            self._telemetry.on_read.remove(self._wake)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._mine:
            self._telemetry.dlq_depths.pop(queue, None)
        self._mine = set()
        await self._probe.close()
