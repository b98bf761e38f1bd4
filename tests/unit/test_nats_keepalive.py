"""The keep-alive of a message whose handler runs (``nats.keepalive``), on a fake ``Msg``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from faststream_retry.nats.keepalive import kept_alive

if TYPE_CHECKING:
    from collections.abc import Callable


class _Msg:
    """What the keep-alive calls of nats-py's ``Msg``: counted, and made to fail on demand."""

    def __init__(self, *, fails: bool = False) -> None:
        self.beats = 0
        self.fails = fails

    async def in_progress(self) -> None:
        self.beats += 1
        if self.fails:
            raise RuntimeError("settled")


async def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_message_in_hand_is_told_in_progress_every_third_of_ack_wait() -> None:
    msg = _Msg()
    with kept_alive(msg, 0.15):  # a beat every 50 ms
        await _wait_for(lambda: msg.beats >= 3)
    beats = msg.beats
    await asyncio.sleep(0.2)
    assert msg.beats == beats  # none after the block


async def test_a_block_shorter_than_a_third_of_ack_wait_sends_nothing() -> None:
    msg = _Msg()
    with kept_alive(msg, 0.3):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert msg.beats == 0


async def test_a_message_the_server_will_not_keep_is_not_told_again() -> None:
    msg = _Msg(fails=True)  # settled meanwhile, or the connection is gone
    with kept_alive(msg, 0.06):
        await _wait_for(lambda: msg.beats >= 1)
        await asyncio.sleep(0.15)
        assert msg.beats == 1


async def test_a_beat_being_sent_when_the_block_ends_is_cancelled() -> None:
    started = asyncio.Event()

    class _Slow(_Msg):
        async def in_progress(self) -> None:
            started.set()
            await asyncio.sleep(10)

    msg = _Slow()
    block = kept_alive(msg, 0.03)
    with block:
        await asyncio.wait_for(started.wait(), 5)
    sending = block._sending  # the beat in flight
    assert sending is not None
    await asyncio.sleep(0)
    assert sending.cancelled() or sending.done()
