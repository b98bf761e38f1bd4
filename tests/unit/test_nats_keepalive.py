"""The keep-alive of the messages whose handlers run (``nats.keepalive``), on fake ``Msg``s."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from faststream_retry.nats.keepalive import KeepAlive

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
    start = asyncio.get_running_loop().time()
    with KeepAlive().holding(msg, 0.3):  # a beat every 100 ms
        await _wait_for(lambda: msg.beats >= 3)
    took = asyncio.get_running_loop().time() - start
    assert 0.25 <= took < 1.0  # three beats, a third of ack_wait apart
    beats = msg.beats
    await asyncio.sleep(0.25)
    assert msg.beats == beats  # none after the block


async def test_a_block_shorter_than_a_third_of_ack_wait_sends_nothing() -> None:
    msg = _Msg()
    keep_alive = KeepAlive()
    for _ in range(5):  # one after the other, as a subscriber takes them
        with keep_alive.holding(msg, 0.3):
            await asyncio.sleep(0.005)
    await asyncio.sleep(0.25)  # the beat came, with nothing in hand
    assert msg.beats == 0


async def test_each_message_in_hand_is_told_and_one_that_left_is_not() -> None:
    keep_alive = KeepAlive()
    long, short = _Msg(), _Msg()
    with keep_alive.holding(long, 0.15):
        with keep_alive.holding(short, 0.15):
            await asyncio.sleep(0.01)
        await _wait_for(lambda: long.beats >= 2)
    assert short.beats <= 1  # told once at most: it left before a second beat
    assert long.beats >= 2


async def test_a_message_the_server_will_not_keep_is_not_told_again() -> None:
    msg = _Msg(fails=True)  # settled meanwhile, or the connection is gone
    with KeepAlive().holding(msg, 0.06):
        await _wait_for(lambda: msg.beats >= 1)
        await asyncio.sleep(0.15)
        assert msg.beats == 1


async def test_a_block_inside_another_of_the_same_message_leaves_it_in_hand() -> None:
    msg = _Msg()
    keep_alive = KeepAlive()
    with keep_alive.holding(msg, 0.15):
        with keep_alive.holding(msg, 0.15):
            pass
        await _wait_for(lambda: msg.beats >= 1)
