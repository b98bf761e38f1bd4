"""The claimer's record of the entries this replica's handlers hold (``Claimer.holding``)."""

from __future__ import annotations

import pytest

from faststream_retry.redis.claimer import Claimer


def _claimer() -> Claimer:
    async def settle(_entry: object) -> None:
        raise AssertionError("nothing is settled here")

    return Claimer(None, [], consumer="claimer", idle_ms=60_000, settle=settle)  # type: ignore[arg-type]


def test_an_entry_held_twice_is_held_until_both_handlers_end() -> None:
    claimer = _claimer()
    with claimer.holding("s", "c1", "5-0"):
        with claimer.holding("s", "c1", "5-0"):
            pass
        assert claimer._reading["s", "c1"].held == {"5-0": 1}
    assert claimer._reading["s", "c1"].held == {}


def test_a_handler_that_raises_lets_go_of_its_entry_and_the_error_goes_on() -> None:
    claimer = _claimer()
    with pytest.raises(ValueError, match="boom"), claimer.holding("s", "c1", "7-1"):
        raise ValueError("boom")
    assert claimer._reading["s", "c1"].held == {}


def test_each_consumer_keeps_its_own_record_and_its_highest_start() -> None:
    claimer = _claimer()
    with claimer.holding("s", "c1", "9-0"), claimer.holding("s", "c2", "3-0"):
        pass
    with claimer.holding("s", "c1", "8-5"):
        still = claimer._reading["s", "c1"].pass_()
    assert claimer._reading["s", "c1"].last == (9, 0)
    assert claimer._reading["s", "c2"].last == (3, 0)
    assert still("8-5")
    assert still("10-0")
    assert not still("8-4")
