"""Subscribers that join a running ``NatsBroker`` or ``RedisBroker``: followed, checked, covered.

A subscriber can join a running broker: ``broker.subscriber(...)`` then ``await
sub.start()``, or a router included after start (then ``broker.start()`` again, which
starts the new subscribers). ``watch`` wraps ``broker.subscriber`` and
``broker.include_router`` so that each such subscriber is followed: before it consumes,
its runtime checks it as the start checks the others and covers it (``Joining.join``: a
refusal raises there, and it does not start); once it consumes, its runtime starts what
feeds it (``Joining.joined``: NATS's hand-over; Redis's mover and claimer); when it stops,
its runtime stops that (``Joining.leave``). RabbitMQ's runtime does the same in its own
way (``rabbit.runtime.watch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.middleware import _internals, checks

if TYPE_CHECKING:
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.middleware.checks import Middleware

__all__ = ["Joining", "cover_failed", "follow", "watch"]

_FOLLOWED_ATTR = "__faststream_retry_followed__"


class Joining(Protocol):
    """What a runtime does for a subscriber that joins its running broker."""

    @property
    def running(self) -> bool:
        """Whether the plugin runs on the broker now (between its start and its stop)."""
        ...

    @property
    def plan(self) -> Plan:
        """The plan, the routes of the subscribers that joined included."""
        ...

    async def join(self, sub: Any) -> bool:  # noqa: ANN401 - a subscriber
        """Check ``sub`` and cover it before it consumes; ``True``: covered.

        Raises:
            RetryConfigError: the start would refuse it; it must not start.
        """
        ...

    async def joined(self, sub: Any) -> None:  # noqa: ANN401
        """``sub``, covered, consumes now: start what feeds it."""
        ...

    async def leave(self, sub: Any) -> None:  # noqa: ANN401
        """``sub`` stops: stop what feeds it, unless another running subscriber needs it."""
        ...


def watch(broker: Any, runtime: Joining, middleware: Middleware) -> None:  # noqa: ANN401
    """Follow every subscriber that joins ``broker`` while the plugin runs on it."""
    original_subscriber = broker.subscriber
    original_include = broker.include_router

    def subscriber(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - FastStream's
        sub = original_subscriber(*args, **kwargs)
        if runtime.running:
            follow(runtime, sub)
        return sub

    def include_router(router: Any, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        original_include(router, *args, **kwargs)
        if runtime.running:
            # A second instance on the new router would decide its failures too.
            checks.refuse_other_instances(broker, middleware)
            for sub in router.subscribers:
                follow(runtime, sub)

    broker.subscriber = subscriber
    broker.include_router = include_router


def follow(runtime: Joining, sub: Any) -> None:  # noqa: ANN401 - a subscriber
    """Check and cover ``sub`` each time it starts, and let it go when it stops (once per sub)."""
    if getattr(sub, _FOLLOWED_ATTR, False):
        return
    original_start, original_stop = sub.start, sub.stop

    async def start(*args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - FastStream's
        covered = runtime.running and await runtime.join(sub)
        await original_start(*args, **kwargs)
        if covered and runtime.running:
            await runtime.joined(sub)

    async def stop(*args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        if runtime.running:
            await runtime.leave(sub)
        await original_stop(*args, **kwargs)

    sub.start, sub.stop = start, stop
    setattr(sub, _FOLLOWED_ATTR, True)


async def cover_failed(runtime: Joining, sub: Any) -> Route | None:  # noqa: ANN401 - a subscriber
    """Return the route for a failure of ``sub``, which the plan does not cover.

    A subscriber that reached the running broker unfollowed (``watch`` follows those made
    by ``broker.subscriber`` and ``include_router``): checked and covered now, and
    followed from here on. A stopped one is not covered again.

    Raises:
        RetryConfigError: it is refused (the message is requeued after a pause).
    """
    if not runtime.running or not getattr(sub, "running", True):
        return None
    follow(runtime, sub)
    if not await runtime.join(sub):
        return None
    await runtime.joined(sub)
    return runtime.plan.route(_internals.queue_of(sub) or "")
