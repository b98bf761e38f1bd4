"""The dead letters of each covered subscriber on NATS, for the dead-letter gauge.

A subscriber's dead letters are the messages on its subject (``<prefix>.dlq.<key>``) in
its stream's dead-letter stream: the stream's info, filtered to that subject, counts
them without a consumer, so nothing is delivered, moved or made. When it samples is
``reporting.depths``'s, on the same schedule and gauge as RabbitMQ's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.js.errors import NotFoundError

from faststream_retry.nats import naming
from faststream_retry.reporting.depths import DepthSampler

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.js import JetStreamContext

    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["NatsDeadLetterDepths"]


class NatsDeadLetterDepths(DepthSampler):
    """Samples each covered subscriber's dead letters into its runtime's ``Telemetry``."""

    def __init__(
        self, js: JetStreamContext, prefix: str, telemetry: Telemetry, plan: Callable[[], Plan]
    ) -> None:
        """Read the dead-letter streams of ``prefix`` through ``js``."""
        super().__init__(telemetry, plan)
        self._js = js
        self._prefix = prefix

    def where(self, route: Route) -> str:
        """Return the dead-letter stream and subject of ``route``'s subscriber."""
        stream = naming.dlq_stream(self._prefix, naming.key_stream(route.queue))
        return f"{stream} {naming.dlq_subject(self._prefix, route.queue)}"

    async def depth(self, route: Route) -> int | None:
        """Return the messages on the subscriber's dead-letter subject; ``None``: no stream."""
        subject = naming.dlq_subject(self._prefix, route.queue)
        stream = naming.dlq_stream(self._prefix, naming.key_stream(route.queue))
        try:
            info = await self._js.stream_info(stream, subjects_filter=subject)
        except NotFoundError:  # deleted by an operator: no figure, rather than a false 0
            return None
        return (info.state.subjects or {}).get(subject, 0)
