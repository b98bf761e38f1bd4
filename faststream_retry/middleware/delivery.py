"""Whose a message is: its broker's runtime, its queue's route and its handler's policy.

The scope resolves a message once, when it first needs to: before the handler runs in
outage mode (for its queue's gate), otherwise at its failure. The gate (``gate``) and the
failure path read the same ``Delivery``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from faststream_retry.core.policy import HandlerPolicy
    from faststream_retry.core.topology import Route
    from faststream_retry.middleware.nats_runtime import NatsRuntime
    from faststream_retry.middleware.redis_runtime import RedisRuntime
    from faststream_retry.middleware.runtime import Runtime

__all__ = ["Delivery"]


# A NamedTuple: immutable, and the cheapest record to build (one per message in outage mode).
class Delivery(NamedTuple):
    """A message of a queue the plugin covers, as the plugin sees it."""

    runtime: Runtime | NatsRuntime | RedisRuntime
    """The plugin's runtime of the broker the message came from."""
    route: Route
    """The route of the queue the message came from."""
    handler: HandlerPolicy | None
    """The policy of the handler that took it (``None``: it has no ``@retry_policy``)."""
    enabled: bool
    """Whether the plugin retries that handler's failures; if not, they are FastStream's."""

    @property
    def queue(self) -> str:
        """Return the work queue the message came from."""
        return self.route.queue

    @classmethod
    def of(
        cls,
        runtime: Runtime | NatsRuntime | RedisRuntime,
        route: Route,
        handler: HandlerPolicy | None,
    ) -> Delivery:
        """Resolve a message of ``route``'s queue that ``handler`` took (``select_policy``)."""
        default = runtime.config.default
        # effective_policy(handler, default).enabled, without building a policy per message.
        enabled = (
            default.enabled if handler is None else handler.options.get("enabled", default.enabled)
        )
        return cls(runtime, route, handler, enabled)
