"""The plugin's channel pair: a reopen lets what is in flight on the old pair finish.

Against fakes of aio-pika's channels on a fake connection: no broker.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from faststream_retry.rabbit import channels
from faststream_retry.rabbit.channels import ChannelPair


class Underlay:
    def __init__(self) -> None:
        self.on_consumer_cancel_callbacks: set[Any] = set()
        self.cancelled: list[str] = []

    async def basic_cancel(self, consumer_tag: str) -> None:
        self.cancelled.append(consumer_tag)


class Channel:
    """What ChannelPair uses of aio-pika's Channel."""

    opened: ClassVar[list[Channel]] = []

    def __init__(self, connection: Any, *, publisher_confirms: bool) -> None:
        self.confirms = publisher_confirms
        self.is_closed = False
        self.close_callbacks: set[Any] = set()
        self.underlay = Underlay()
        Channel.opened.append(self)

    async def initialize(self, timeout: float) -> None:
        pass

    async def set_qos(self, prefetch_count: int, timeout: float) -> None:
        pass

    async def get_underlay_channel(self) -> Underlay:
        return self.underlay

    async def close(self) -> None:
        self.is_closed = True
        for callback in list(self.close_callbacks):
            callback(self, None)


class Connection:
    is_closed = False

    async def ready(self) -> None:
        pass


async def noop(publish: Any, consume: Any) -> None:
    pass


@pytest.fixture
def fake_channels(monkeypatch: pytest.MonkeyPatch) -> list[Channel]:
    Channel.opened = []
    monkeypatch.setattr(channels, "Channel", Channel)
    return Channel.opened


def pair_of(wait_s: float) -> ChannelPair:
    return ChannelPair(Connection(), prefetch=10, wait_s=wait_s, on_open=noop)  # type: ignore[arg-type]


async def reopened(pair: ChannelPair, generation: int) -> None:
    for _ in range(200):
        if pair.generation > generation and pair.ready:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the pair did not reopen")


async def test_a_cancelled_consumer_reopens_the_pair_and_the_old_one_lingers(
    fake_channels: list[Channel],
) -> None:
    """Its queue was deleted, and with it the only other copy of its deliveries in flight:
    the old channels stay open ``wait_s`` for those to be handled and their copies
    confirmed; its other consumers are cancelled at once, so it takes nothing new."""
    pair = pair_of(wait_s=0.3)
    await pair.open()
    publish, consume = fake_channels
    pair.track("t1")
    pair.track("t2")
    for callback in list(consume.underlay.on_consumer_cancel_callbacks):
        callback(type("Frame", (), {"consumer_tag": "t1"})())
    await reopened(pair, 1)
    assert len(fake_channels) == 4  # a new pair
    assert sorted(consume.underlay.cancelled) == ["t1", "t2"]
    assert not publish.is_closed
    assert not consume.is_closed
    await asyncio.sleep(0.5)
    assert publish.is_closed
    assert consume.is_closed
    assert pair.ready  # their late close is not taken for the new pair going down
    await pair.close()
    assert all(channel.is_closed for channel in fake_channels)


async def test_a_closed_channel_is_replaced_and_its_open_peer_lingers(
    fake_channels: list[Channel],
) -> None:
    pair = pair_of(wait_s=30)
    await pair.open()
    publish, consume = fake_channels
    await publish.close()
    await reopened(pair, 1)
    assert not consume.is_closed
    await pair.close()  # a close of the pair closes a lingering channel too
    assert consume.is_closed


async def test_a_supervisor_that_swallows_a_cancellation_still_ends_the_stop(
    fake_channels: list[Channel],
) -> None:
    """Before Python 3.12, asyncio.wait_for can swallow a cancellation (gh-86296): the
    supervisor is cancelled again until it ends, and broker.stop() does not wait for ever."""
    pair = pair_of(wait_s=1.0)
    await pair.open()
    swallowed: list[bool] = []

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.append(True)  # as wait_for does when its future completes meanwhile
        await asyncio.Event().wait()

    assert pair._supervisor is not None
    pair._supervisor.cancel()
    pair._supervisor = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    stop = asyncio.create_task(pair.stop_supervising())
    # asyncio.wait, not wait_for: wait_for's own cancellation would end the stop.
    done, _ = await asyncio.wait([stop], timeout=2)
    assert done == {stop}, "the stop still waits for the supervisor"
    assert swallowed == [True]
    await pair.close()


async def test_channels_closed_by_the_apps_own_close_are_not_reopened(
    fake_channels: list[Channel],
) -> None:
    """FastStream closes the connection at the end of broker.stop(): aio-pika says
    is_closed only once that close is over, and channels reopened meanwhile would be
    RPCs in flight on a closing connection (aiormq 6 held the close for their timeout)."""

    class Closing(Connection):
        close_called = True  # aio-pika's: close() was called, it is not over yet

    pair = ChannelPair(Closing(), prefetch=10, wait_s=1.0, on_open=noop)  # type: ignore[arg-type]
    await pair.open()
    assert pair._supervisor is not None
    opened = len(fake_channels)
    await fake_channels[-1].close()
    await asyncio.wait_for(asyncio.shield(pair._supervisor), 1)  # it ends of itself
    assert (len(fake_channels), pair.ready) == (opened, False)
    await pair.close()
