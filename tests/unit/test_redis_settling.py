"""The failures' steps beside their handlers (redis.settling): bounded, none dropped, drained."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from faststream_retry.redis.settling import DEFAULT_BOUND, Settlements, bound_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def test_a_full_bound_holds_the_next_handler_until_a_step_ends() -> None:
    """Backpressure: with ``bound`` steps running, the next submit waits; nothing is dropped."""
    gate = asyncio.Event()
    ran: list[int] = []
    settlements = Settlements(bound=2)

    def step(n: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await gate.wait()
            ran.append(n)

        return run

    await settlements.submit(step(0))
    await settlements.submit(step(1))
    third = asyncio.ensure_future(settlements.submit(step(2)))
    await asyncio.sleep(0.05)
    assert not third.done(), "a third step waits for a slot"
    assert settlements.running == 2
    gate.set()
    await asyncio.wait_for(third, 1)
    await asyncio.wait_for(settlements.drain(), 1)
    assert sorted(ran) == [0, 1, 2]
    assert settlements.running == 0


async def test_drain_waits_for_every_step_and_a_raising_one_does_not_stop_it() -> None:
    """The stop's drain returns once each step submitted ended, one that raised included."""
    ended: list[str] = []

    async def slow() -> None:
        await asyncio.sleep(0.1)
        ended.append("slow")

    async def broken() -> None:
        raise RuntimeError("a bug in a step")

    settlements = Settlements()
    await settlements.submit(slow)
    await settlements.submit(broken)
    assert ended == []
    await asyncio.wait_for(settlements.drain(), 1)
    assert ended == ["slow"]
    await settlements.submit(slow)
    await asyncio.wait_for(settlements.drain(), 1)
    assert ended == ["slow", "slow"]


def test_a_pool_of_few_connections_lowers_the_bound() -> None:
    """Under the broker's max_connections the steps leave room for the engine's other tasks
    (redis-py refuses a command past the pool's cap); never below one, and an open pool, or
    a client without one (a cluster's), keeps the default."""

    class Pool:
        def __init__(self, most: int | None) -> None:
            self.max_connections = most

    class Client:
        def __init__(self, most: int | None) -> None:
            self.connection_pool = Pool(most)

    assert bound_for(Client(2**31)) == DEFAULT_BOUND
    assert bound_for(Client(None)) == DEFAULT_BOUND
    assert bound_for(object()) == DEFAULT_BOUND
    assert bound_for(Client(16)) == 10
    assert bound_for(Client(3)) == 1


async def test_a_step_redis_never_answers_holds_the_drain_no_longer_than_its_bound() -> None:
    """A Redis that stopped answering must not hold broker.stop() for ever: the drain
    returns at its bound and says how many steps still run (their entries stay pending)."""
    settlements = Settlements()
    answered = asyncio.Event()

    async def unanswered() -> None:
        await answered.wait()

    await settlements.submit(unanswered)
    left = await asyncio.wait_for(settlements.drain(0.05), 1)
    assert (left, settlements.running) == (1, 1)
    answered.set()  # the test's own clean-up: no task left behind
    assert await asyncio.wait_for(settlements.drain(), 1) == 0
