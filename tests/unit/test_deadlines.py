"""One watchdog bounds every publish's wait for its confirm."""

from __future__ import annotations

import asyncio
import time

import pytest

from faststream_retry.rabbit.deadlines import Deadlines


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


async def _after(seconds: float, value: str) -> str:
    await asyncio.sleep(seconds)
    return value


def test_a_publish_past_its_timeout_raises_timeout_error() -> None:
    """No confirm: asyncio.TimeoutError within the timeout and a quarter of it."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(0.2)
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(deadlines.run(_never()), 5)
        return loop.time() - started

    waited = asyncio.run(main())
    assert 0.2 <= waited < 0.2 + 0.05 + 0.2  # a look every 50 ms, and slack for load


def test_only_the_late_ones_time_out() -> None:
    """Publishes in flight together: the quick ones keep their results."""

    async def main() -> list[object]:
        deadlines = Deadlines(0.3)
        runs = [deadlines.run(_after(0.01 * i, f"r{i}")) for i in range(5)]
        return await asyncio.gather(*runs, deadlines.run(_never()), return_exceptions=True)

    results = asyncio.run(main())
    assert results[:5] == ["r0", "r1", "r2", "r3", "r4"]
    assert isinstance(results[5], asyncio.TimeoutError)


def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    """The caller's own cancellation is not turned into a timeout."""

    async def main() -> None:
        deadlines = Deadlines(10)
        task = asyncio.ensure_future(deadlines.run(_never()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_the_watchdog_stops_when_nothing_is_in_flight() -> None:
    """No publish left: the watchdog task ends (nothing runs between bursts)."""

    async def main() -> bool:
        deadlines = Deadlines(0.04)
        assert await deadlines.run(_after(0, "ok")) == "ok"
        watchdog = deadlines._watchdog
        assert watchdog is not None
        await asyncio.wait_for(watchdog, 2)
        return watchdog.done()

    assert asyncio.run(main())


def test_a_stall_of_the_process_is_not_counted_against_the_broker() -> None:
    """Frozen longer than the timeout (SIGSTOP, a frozen VM): its confirm, read just after
    the thaw, still counts. Cancelled, the message would be requeued with its copy out."""

    async def main() -> str:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(0.5)
        confirm: asyncio.Future[str] = loop.create_future()

        def freeze() -> None:
            time.sleep(1.6)  # the whole process stands still
            loop.call_later(0.2, confirm.set_result, "ack")  # read once it runs again

        loop.call_later(0.05, freeze)
        return await deadlines.run(confirm)

    assert asyncio.run(main()) == "ack"
