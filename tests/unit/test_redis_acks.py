"""Handled entries' XACKs beside their handlers (redis.acks): batched, bounded, kept alive, drained;
and the engine's stop waits for them (and its release) within one bound."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from faststream_retry.redis import acks as acks_module
from faststream_retry.redis.acks import Acks


class FakeRedis:
    """Answers each ``XACK`` once ``gate`` is set; records every call's ids; refuses the
    first ``fail`` calls."""

    def __init__(self, *, fail: int = 0) -> None:
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        self.gate = asyncio.Event()
        self.fail = fail

    async def xack(self, stream: str, group: str, *ids: str) -> int:
        self.calls.append((stream, group, ids))
        await self.gate.wait()
        if len(self.calls) <= self.fail:
            raise ConnectionError("Redis went away")
        return len(ids)


class Hold:
    """A keep-alive hold that counts, and like the claimer's is entered once."""

    def __init__(self, held: dict[str, int], entry: str) -> None:
        self.held, self.entry = held, entry

    def __enter__(self) -> None:
        assert self.entry not in self.held, "entered twice"
        self.held[self.entry] = 1

    def __exit__(self, *exc: object) -> None:
        del self.held[self.entry]


async def test_entries_handled_while_an_xack_is_in_flight_go_in_one_next_xack() -> None:
    """The first success is sent alone at once; those meanwhile wait and go together after it."""
    redis = FakeRedis()
    acks = Acks(redis)
    held: dict[str, int] = {}
    await acks.add("s", "g", "1-0", Hold(held, "1-0"))
    await asyncio.sleep(0)
    for n in range(2, 6):
        await acks.add("s", "g", f"{n}-0", Hold(held, f"{n}-0"))
    await asyncio.sleep(0.01)
    assert redis.calls == [("s", "g", ("1-0",))], "one XACK in flight per stream"
    assert acks.waiting == 5
    redis.gate.set()
    assert await acks.drain(1) == 0
    assert redis.calls == [("s", "g", ("1-0",)), ("s", "g", ("2-0", "3-0", "4-0", "5-0"))]
    assert held == {}, "every hold let go once its XACK answered"


async def test_an_entry_is_kept_alive_until_its_xack_answers() -> None:
    """The hold (the claimer's keep-alive) is taken when queued and let go after the answer."""
    redis = FakeRedis()
    acks = Acks(redis)
    held: dict[str, int] = {}
    await acks.add("s", "g", "7-0", Hold(held, "7-0"))
    await asyncio.sleep(0.01)
    assert held == {"7-0": 1}
    redis.gate.set()
    await acks.drain(1)
    assert held == {}


async def test_a_full_bound_holds_the_next_success_until_an_xack_answers() -> None:
    """Backpressure: with ``bound`` entries waiting, the next add waits; nothing is dropped."""
    redis = FakeRedis()
    acks = Acks(redis, bound=3)
    for n in range(3):
        await acks.add("s", "g", f"{n}-0", Hold({}, f"{n}-0"))
    fourth = asyncio.ensure_future(acks.add("s", "g", "3-0", Hold({}, "3-0")))
    await asyncio.sleep(0.05)
    assert not fourth.done(), "a fourth success waits for room"
    redis.gate.set()
    await asyncio.wait_for(fourth, 1)
    assert await acks.drain(1) == 0
    sent = [entry for _, _, ids in redis.calls for entry in ids]
    assert sorted(sent) == ["0-0", "1-0", "2-0", "3-0"], "each acknowledged once"


async def test_streams_are_acknowledged_apart_each_with_its_group() -> None:
    """One XACK names one stream and its group (a cluster's slot); two streams, two XACKs."""
    redis = FakeRedis()
    redis.gate.set()
    acks = Acks(redis)
    await acks.add("a", "ga", "1-0", Hold({}, "1-0"))
    await acks.add("b", "gb", "1-0", Hold({}, "1-0"))
    await acks.drain(1)
    assert sorted(redis.calls) == [("a", "ga", ("1-0",)), ("b", "gb", ("1-0",))]


async def test_a_refused_xack_is_sent_again_its_entries_kept_alive_meanwhile(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A blip (two refusals): the same XACK again after a pause, the entry held until it
    is in, nothing said; a handled entry is not left to be claimed and run again."""
    monkeypatch.setattr(acks_module, "_PAUSE_S", 0.01)
    redis = FakeRedis(fail=2)
    redis.gate.set()
    acks = Acks(redis, retry_s=5)
    held: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        await acks.add("s", "g", "1-0", Hold(held, "1-0"))
        await asyncio.sleep(0.005)
        assert held == {"1-0": 1}, "kept alive while refused"
        assert await acks.drain(1) == 0
    assert redis.calls == [("s", "g", ("1-0",))] * 3
    assert held == {}
    assert not caplog.records


async def test_an_xack_refused_past_retry_s_is_said_once_and_let_go(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused for longer than ``retry_s``: a WARNING (at most one a minute), the holds let
    go (the claimer takes the entries once idle), and later successes are still sent."""
    monkeypatch.setattr(acks_module, "_PAUSE_S", 0.01)
    redis = FakeRedis(fail=1_000)
    redis.gate.set()
    acks = Acks(redis, retry_s=0.03)
    held: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        for n in range(3):
            await acks.add("s", "g", f"{n}-0", Hold(held, f"{n}-0"))
            assert await acks.drain(1) == 0
    assert held == {}
    assert {ids for _, _, ids in redis.calls} == {("0-0",), ("1-0",), ("2-0",)}
    warnings = [r for r in caplog.records if "could not be acknowledged" in r.getMessage()]
    assert len(warnings) == 1, "said once a minute, not at every batch"


async def test_close_gives_up_what_is_still_refused_and_lets_every_hold_go() -> None:
    """The stop's last word: a Redis that never answers leaves no task and no hold behind."""
    redis = FakeRedis()
    acks = Acks(redis)
    held: dict[str, int] = {}
    await acks.add("s", "g", "1-0", Hold(held, "1-0"))
    await asyncio.sleep(0)
    await acks.add("s", "g", "2-0", Hold(held, "2-0"))
    await acks.close()
    assert held == {}
    assert acks.waiting == 0
    assert await acks.drain(0.01) == 0


async def test_drain_is_bounded_and_says_how_many_still_wait() -> None:
    """A Redis that does not answer holds the stop only ``timeout_s``: the count is returned."""
    redis: Any = FakeRedis()
    acks = Acks(redis)
    await acks.add("s", "g", "1-0", Hold({}, "1-0"))
    await acks.add("s", "g", "2-0", Hold({}, "2-0"))
    assert await acks.drain(0.05) == 2
    redis.gate.set()
    assert await acks.drain(1) == 0


async def test_a_success_waiting_for_room_is_kept_alive_meanwhile_and_let_go_if_cancelled() -> None:
    """The hold is taken in the handler's turn, before waiting for room (as a failure's
    step's is, ``sink``): a success that waits behind a slow XACK is kept alive by the
    claimer like the ones queued. Its task cancelled meanwhile (the app's stop past
    ``graceful_timeout``): nothing queued, its hold let go, the count unchanged, so the
    entry is left pending for the claimer, as FastStream leaves a cancelled handler's."""
    redis = FakeRedis()
    acks = Acks(redis, bound=1)
    held: dict[str, int] = {}
    await acks.add("s", "g", "1-0", Hold(held, "1-0"))
    second = asyncio.ensure_future(acks.add("s", "g", "2-0", Hold(held, "2-0")))
    await asyncio.sleep(0.05)
    assert not second.done(), "it waits for room"
    assert held == {"1-0": 1, "2-0": 1}, "kept alive while it waits"
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert held == {"1-0": 1}
    assert acks.waiting == 1
    redis.gate.set()
    assert await acks.drain(1) == 0
    assert redis.calls == [("s", "g", ("1-0",))], "the cancelled one was never sent"


async def test_the_engine_s_drain_waits_for_steps_and_xacks_within_one_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Redis that answers neither a failure's step nor an XACK holds a drain (each stop
    runs one before the release and one before the client closes) for ``settle_wait_s``
    in all, not that for the steps and that again for the XACKs; both counts are said."""
    from redis.asyncio import Redis  # noqa: PLC0415 - the engine's client type; never connected

    from faststream_retry.redis.engine import RedisRetryEngine  # noqa: PLC0415

    wait_s = 0.5
    engine = RedisRetryEngine(Redis(port=1), [("s", "g")], settle_wait_s=wait_s)
    engine.acks = Acks(FakeRedis())
    await engine.acks.add("s", "g", "1-0", Hold({}, "1-0"))
    never = asyncio.Event()

    async def step() -> None:
        await never.wait()

    await engine.settlements.submit(step)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        await engine._drain()  # the stop's wait, alone
    took = loop.time() - started
    assert wait_s <= took < 1.6 * wait_s, f"drained in {took:.2f} s"
    assert "1 failure step(s) and 1 handled entries' XACK" in caplog.text


async def test_a_stream_whose_xack_is_slow_holds_up_no_other_stream() -> None:
    """The bound is a stream's: with stream a's 2 waiting on an unanswered XACK, a success
    on stream b is queued and acknowledged at once, while a third on a waits for room."""

    class OneSlow(FakeRedis):
        async def xack(self, stream: str, group: str, *ids: str) -> int:
            self.calls.append((stream, group, ids))
            if stream == "a":
                await self.gate.wait()
            return len(ids)

    redis = OneSlow()
    acks = Acks(redis, bound=2)
    await acks.add("a", "g", "1-0", Hold({}, "1-0"))
    await acks.add("a", "g", "2-0", Hold({}, "2-0"))
    third = asyncio.ensure_future(acks.add("a", "g", "3-0", Hold({}, "3-0")))
    await asyncio.wait_for(acks.add("b", "g", "1-0", Hold({}, "1-0")), 1)
    await asyncio.sleep(0.05)
    assert ("b", "g", ("1-0",)) in redis.calls
    assert not third.done(), "stream a's own bound still holds its next success"
    redis.gate.set()
    await asyncio.wait_for(third, 1)
    assert await acks.drain(1) == 0


async def test_the_stop_s_release_is_bounded_as_its_drain_is(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that stops answering the release scripts holds ``release()`` (at the stop)
    for ``settle_wait_s``, not for ever: what was released is counted, the rest said."""
    from redis.asyncio import Redis  # noqa: PLC0415 - the engine's client type; never connected

    from faststream_retry.redis.engine import RedisRetryEngine  # noqa: PLC0415

    wait_s = 0.3
    engine = RedisRetryEngine(
        Redis(port=1),
        [("s", "g")],
        own_consumers=[("s", "c1")],
        claim_idle_ms=60_000,
        settle_wait_s=wait_s,
    )
    assert engine.claimer is not None

    async def unstarted(*_: object) -> list[str]:
        return ["1-0", "2-0"]

    answered = asyncio.Event()

    async def release(**_: object) -> int:
        if answered.is_set():
            await asyncio.Event().wait()  # no answer, ever
        answered.set()
        return 1

    monkeypatch.setattr(engine.claimer, "unstarted", unstarted)
    monkeypatch.setattr(engine._scripts, "release", release)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        assert await engine.release() == 1
    took = loop.time() - started
    assert wait_s <= took < 1.6 * wait_s, f"released in {took:.2f} s"
    assert "not all released within" in caplog.text
