"""The depth of each covered queue's ``.dlq`` on RabbitMQ, for the dead-letter gauge.

A passive declare per ``.dlq``, on one channel kept for it: it counts the ready
messages without consuming any (a quorum queue's delivery count is never spent),
creates nothing and changes nothing. When it samples is ``reporting.depths``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.rabbit.probe import Probe
from faststream_retry.reporting.depths import DepthSampler

if TYPE_CHECKING:
    from collections.abc import Callable

    from aio_pika.abc import AbstractConnection

    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["DeadLetterDepths"]


class DeadLetterDepths(DepthSampler):
    """Samples the ``.dlq`` depths of one runtime's routes into its ``Telemetry``."""

    def __init__(
        self, connection: AbstractConnection, telemetry: Telemetry, plan: Callable[[], Plan]
    ) -> None:
        """Sample on ``connection`` the ``.dlq`` of each route of ``plan()`` (read each time)."""
        super().__init__(telemetry, plan)
        self._probe = Probe(connection)

    async def depth(self, route: Route) -> int | None:
        """Return the ready messages of ``route``'s ``.dlq``; ``None``: it does not exist."""
        found = await self._probe.depth(route.dlq)
        return None if found is None else found.messages

    async def close(self) -> None:
        """Close the probe's channel."""
        await self._probe.close()
