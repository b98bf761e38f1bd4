"""The dead letters of each covered stream on Redis, for the dead-letter gauge.

``XLEN`` of the stream's ``.dlq`` (``keys``): a read that moves nothing; a ``.dlq``
not made yet (no dead letter so far) counts 0, as Redis says. When it samples is
``reporting.depths``'s, on the same schedule and gauge as RabbitMQ's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.redis.keys import stream_keys
from faststream_retry.reporting.depths import DepthSampler

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.redis.client import Client
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["RedisDeadLetterDepths"]


class RedisDeadLetterDepths(DepthSampler):
    """Samples each covered stream's ``.dlq`` length into its runtime's ``Telemetry``."""

    def __init__(self, client: Client, telemetry: Telemetry, plan: Callable[[], Plan]) -> None:
        """Read the ``.dlq`` streams through ``client`` (the engine's: not closed here)."""
        super().__init__(telemetry, plan)
        self._client = client

    def where(self, route: Route) -> str:
        """Return the ``.dlq`` key of ``route``'s stream."""
        return stream_keys(route.queue).dlq

    async def depth(self, route: Route) -> int | None:
        """Return ``XLEN`` of the stream's ``.dlq``."""
        return int(await self._client.xlen(self.where(route)))
