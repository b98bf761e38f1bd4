"""What a failure leaves behind: nothing the cyclic collector must find."""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import RabbitBroker

from faststream_retry import EventKind, Fixed, RetryEvent, RetryMiddleware, RetryPolicy
from tests.rabbit import delete_declared, eventually, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


FAILURES: list[weakref.ref[FlakyError]] = []


class FlakyError(ConnectionError):
    """The handler's failure; a weak reference to each tells when it is freed."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        FAILURES.append(weakref.ref(self))


@pytest.mark.parametrize("immediate", [0, 1], ids=["through-the-tiers", "once-in-process-first"])
async def test_a_carried_failure_is_freed_when_its_message_settles(
    rabbit_url: str, amqp: AbstractRobustConnection, immediate: int
) -> None:
    """Retried or dead-lettered, a failure and its frames are freed by reference counting.

    A reference cycle through the failure's traceback (a frame of the plugin's holding
    the exception it raises) would keep every failure, its message and FastStream's whole
    stack of it alive until the cyclic collector ran: under a burst of failures, that
    collector's work was a fifth of the consumer's time. With the collector off, every
    failure must be gone once its message has settled.
    """
    attempts = 2 + immediate  # an in-process retry (immediate) fails again inside the plugin
    retry = RetryMiddleware(
        prefix=unique("garbage"),
        default=RetryPolicy(max_attempts=attempts, immediate=immediate, backoff=Fixed(0.2)),
    )
    broker = RabbitBroker(rabbit_url, middlewares=[retry], logger=None)
    retry.install(broker)
    queue = unique("garbage")
    failures = FAILURES
    failures.clear()
    settled: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        # Raised, not bound: a handler's own name for its exception is a cycle of its own.
        raise FlakyError(f"down for {body}")

    def dead(event: RetryEvent) -> None:
        if event.kind is EventKind.DEAD_LETTERED:
            settled.append(event.message_id or "")

    retry.add_hook(dead)

    await broker.start()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for n in range(20):
            await broker.publish(f"m{n}", queue=queue)
        # 20 retried (in process first, if immediate), then dead-lettered.
        await eventually(lambda: len(settled) == 20, timeout=30, what="20 dead letters")
        assert len(failures) == 20 * attempts
        # A dead letter can arrive while its failure is still on its way up FastStream's stack.
        await eventually(
            lambda: all(ref() is None for ref in failures),
            timeout=5,
            what=f"{sum(ref() is not None for ref in failures)} failures to be freed",
        )
    finally:
        if was_enabled:
            gc.enable()
        await broker.stop()
        await delete_declared(amqp, retry, broker)
